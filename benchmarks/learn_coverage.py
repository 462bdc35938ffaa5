"""Which model types `zlayout learn` learns: every type transformers' AutoModelForCausalLM maps,
from its config class's defaults (no file downloaded), each learned by the real command in a fresh
process into a temporary cards folder. Prints one line per type and a count per outcome:

    learned       a card was written
    transformers  transformers' own code fails on its default config (a key the defaults leave
                  None, an input the class needs): not a learner failure; real configs set it
    refused       the learner says in one line why it cannot hold the model (a per-token scan, a
                  kernel without a stand-in, values read while it runs, blocks that differ)
    other         anything else (a bug to look at)

    python benchmarks/learn_coverage.py [--jobs N] [--only TYPE ...]

About 35 minutes on 2 cores with --jobs 2 (Gemma-3n's default config alone takes a minute).
2026-12-06 (transformers 5.24.0, torch 2.13.0 CPU, 2 cores): learned 164, transformers 19, refused 13,
other 0 of 196 model types; after Mamba and Falcon-Mamba were learned (c64b6d2), learned 166 and refused 11.
With the buffer-cast check (5adef3e, a7ab3ad): learned 166, transformers 19, refused 11, other 0; four learned
types failed with their buffers as built: openai-gpt and xglm run with them cast (`[buffers cast]`), and
inkling2_text and inkling2_loop_text fail either way (a float32 router input against a weight DeepSpeed casts to
bf16) and are refused since: learned 164, refused 13 (run with --only for those five). With the traces in
DeepSpeed's dtypes (74c360e: buffers as built unless the card casts them), the whole run again: learned 164,
transformers 19, refused 13, other 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# zlayout's one-line refusals of a model it cannot learn (zlayout/learn/learner.py, zlayout/hfconfig.py)
REFUSALS = ("has state-space or recurrent blocks", "which zlayout has no stand-in for", "reads tensor values",
            "have the same weights but ask for different memory", "not a card this learner can fit",
            "ran no forward in a text-only step", "remote code", "cannot train in bf16 under DeepSpeed")


def outcome(code: int, text: str) -> str:
    if code == 0:
        return "learned"
    if any(refusal in text for refusal in REFUSALS):
        return "refused"
    if "code cannot run this config" in text:
        return "transformers"
    return "other"


def learn_default(model_type: str, folder: Path) -> tuple[str, str, str]:
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model(model_type).to_dict()
    except Exception as exc:  # noqa: BLE001: transformers' own config class refuses its defaults
        return model_type, "transformers", f"config class: {str(exc).splitlines()[0][:160]}"
    path = folder / f"{model_type}.json"
    path.write_text(json.dumps(config, default=str))
    env = {**os.environ, "ZLAYOUT_CARDS_DIR": str(folder / model_type)}
    try:
        run = subprocess.run([sys.executable, "-m", "zlayout", "learn", "--hf-config", str(path)], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return model_type, "other", "timed out after 300 s"
    lines = [line for line in (run.stdout + run.stderr).splitlines()
             if line.strip() and not line.startswith("[transformers]")]
    card = [line.split(".toml: ", 1)[1] for line in lines if ".toml: " in line]
    last = card[0] if run.returncode == 0 and card else (lines[-1] if lines else "")
    # learner.buffer_cast_needed: trains only with its float32 buffers cast (the card's buffer_dtype)
    cast = " [buffers cast]" if any("float32 buffers meet" in line for line in lines) else ""
    return model_type, outcome(run.returncode, last), last.replace(str(path), "CONFIG")[:220] + cast


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="these model types only")
    args = parser.parse_args()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = sorted(args.only or MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for model_type, result, line in pool.map(lambda t: learn_default(t, Path(tmp)), types):
            counts[result] = counts.get(result, 0) + 1
            print(f"{model_type:28s} {result:12s} {line}", flush=True)
    print("\n" + ", ".join(f"{name} {counts.get(name, 0)}" for name in ("learned", "transformers", "refused", "other"))
          + f" of {len(types)} model types")
    return 0


if __name__ == "__main__":
    sys.exit(main())
