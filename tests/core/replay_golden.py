"""Golden request sequences of the caching-allocator replay (allocator_sim.allocation_sequence).

A grid of varied layouts (zlayout's GPT and transformers classes, presets, carded configs,
ZeRO 0-3, offloads, checkpointing, loops, gradient accumulation, several GPUs, MoE) and, per
case, a digest of the exact events the replay writes (allocations, frees, streams, empty_cache,
phase marks) with its figures (events, peak allocated, peak reserved). Recorded on main's code
before a refactor, compared after: a rewrite that means to change nothing must keep every
digest; one that means to change the carded models' head must keep the uncarded ones.

    python tests/core/replay_golden.py            # print the table
    python tests/core/replay_golden.py --write    # record tests/core/replay_golden.json
    python tests/core/replay_golden.py --check    # compare with it; exit 1 on a difference

tests/core/test_replay_golden.py checks every case (the grid replays in about a second).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "tests" / "hf" / "configs" / "published"
HELDOUT = ROOT / "benchmarks" / "measurements" / "h200-2026-12-02c" / "heldout"
GOLDEN = Path(__file__).with_name("replay_golden.json")

GPT = ["--layers", "4", "--hidden", "1024", "--heads", "16", "--vocab", "32000"]
LLAMA = ["--layers", "4", "--hidden", "1024", "--heads", "16", "--kv-heads", "4", "--vocab", "32000",
         "--mlp", "swiglu", "--norm", "rmsnorm", "--no-bias"]
MOE = [*LLAMA, "--experts", "8", "--top-k", "2", "--ffn", "2048"]


def _hf(name: str) -> list[str]:
    return ["--hf-config", str(PUBLISHED / name), "--impl", "hf"]


def _heldout(name: str) -> list[str]:
    return ["--hf-config", str(HELDOUT / "configs" / name), "--impl", "hf"]


# name -> (plan flags, cards folder: "shipped" (presets/cards only), "heldout", or "none" (no card
# anywhere: the hand model, for a config presets/cards now ships), carded)
CASES: dict[str, tuple[list[str], str]] = {
    # zlayout's GPT and a Llama-shaped model, hand-written blocks
    "gpt-z0": ([*GPT, "--stage", "0", "--seq", "1024", "--micro-batch", "2"], "shipped"),
    "gpt-z1-ga3": ([*GPT, "--stage", "1", "--grad-accum", "3", "--seq", "1024", "--micro-batch", "2"], "shipped"),
    "gpt-z2-ga2-ckpt": ([*GPT, "--stage", "2", "--grad-accum", "2", "--checkpointing", "full"], "shipped"),
    "gpt-z2-opt-cpu": ([*GPT, "--stage", "2", "--offload-optimizer", "cpu", "--seq", "4096"], "shipped"),
    "gpt-z2-w2": ([*GPT, "--stage", "2", "--gpus-per-node", "2", "--micro-batch", "3"], "shipped"),
    "gpt-z1-w4-opt-cpu-ga2": ([*GPT, "--stage", "1", "--gpus-per-node", "4", "--offload-optimizer", "cpu",
                               "--grad-accum", "2"], "shipped"),
    "gpt-z3": ([*GPT, "--stage", "3", "--seq", "2048", "--micro-batch", "2"], "shipped"),
    "gpt-z3-w2": ([*GPT, "--stage", "3", "--gpus-per-node", "2"], "shipped"),
    "gpt-z3-w8-ckpt": ([*GPT, "--stage", "3", "--gpus-per-node", "8", "--checkpointing", "full"], "shipped"),
    "gpt-z3-opt-param-cpu": ([*GPT, "--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu"],
                             "shipped"),
    "gpt-z3-opt-cpu-w2-ga2": ([*GPT, "--stage", "3", "--offload-optimizer", "cpu", "--gpus-per-node", "2",
                               "--grad-accum", "2"], "shipped"),
    "gpt-z2-trainer": ([*GPT, "--stage", "2", "--loop", "trainer"], "shipped"),
    "gpt-z2-no-overlap": ([*GPT, "--stage", "2", "--no-overlap-comm", "--reduce-bucket-size", "20000000"],
                          "shipped"),
    "gpt-swiglu-tied": ([*GPT, "--mlp", "swiglu", "--tie-embeddings", "--stage", "1"], "shipped"),
    "llama-zl-z2": ([*LLAMA, "--stage", "2", "--seq", "4096"], "shipped"),
    "llama-hf-z0": ([*LLAMA, "--impl", "hf", "--stage", "0"], "shipped"),
    "llama-hf-z2-ckpt": ([*LLAMA, "--impl", "hf", "--stage", "2", "--checkpointing", "full", "--seq", "8192"],
                         "shipped"),
    "llama-hf-z3-w2-ga3": ([*LLAMA, "--impl", "hf", "--stage", "3", "--gpus-per-node", "2", "--grad-accum", "3"],
                           "shipped"),
    "llama-hf-z3-param-cpu-trainer": ([*LLAMA, "--impl", "hf", "--stage", "3", "--offload-optimizer", "cpu",
                                       "--offload-param", "cpu", "--loop", "trainer"], "shipped"),
    "llama-hf-tied-z1-ga2": ([*LLAMA, "--impl", "hf", "--tie-embeddings", "--stage", "1", "--grad-accum", "2"],
                             "shipped"),
    "mixtral-hf-z2": ([*MOE, "--impl", "hf", "--stage", "2"], "shipped"),
    "mixtral-hf-z3-ckpt": ([*MOE, "--impl", "hf", "--stage", "3", "--checkpointing", "full"], "shipped"),
    # presets (uncarded)
    "preset-llama3-8b-z3-w8": (["--preset", "llama3-8b", "--stage", "3", "--gpus-per-node", "8", "--seq", "1024"],
                               "shipped"),
    "preset-llama3-8b-hf-z2-w8": (["--preset", "llama3-8b", "--impl", "hf", "--stage", "2", "--gpus-per-node",
                                   "8", "--seq", "1024"], "shipped"),
    # uncarded transformers configs
    "gpt2-medium-hf-z2": ([*_hf("gpt2-medium.json"), "--stage", "2", "--seq", "1024"], "none"),
    "qwen2.5-1.5b-hf-z1": ([*_hf("Qwen2.5-1.5B.json"), "--stage", "1", "--seq", "1024"], "shipped"),
    # carded transformers configs (presets/cards)
    "gpt2-hf-z0-card": ([*_hf("gpt2.json"), "--stage", "0", "--seq", "1024", "--micro-batch", "4"], "shipped"),
    "gpt2-hf-z2-ckpt-card": ([*_hf("gpt2.json"), "--stage", "2", "--checkpointing", "full", "--seq", "1024",
                              "--loop", "trainer"], "shipped"),
    "pythia-160m-hf-z3-card": ([*_hf("pythia-160m.json"), "--stage", "3", "--seq", "2048"], "shipped"),
    "llama-3.2-1b-hf-z0-trainer-card": ([*_hf("Llama-3.2-1B.json"), "--stage", "0", "--loop", "trainer",
                                         "--seq", "2048"], "shipped"),
    "llama-3.2-1b-hf-z2-ga2-card": ([*_hf("Llama-3.2-1B.json"), "--stage", "2", "--grad-accum", "2"], "shipped"),
    "gemma-2-2b-hf-z1-card": ([*_hf("gemma-2-2b.json"), "--stage", "1", "--seq", "1024"], "shipped"),
    "gemma-2-2b-hf-z3-w2-ckpt-card": ([*_hf("gemma-2-2b.json"), "--stage", "3", "--gpus-per-node", "2",
                                       "--checkpointing", "full", "--seq", "1024"], "shipped"),
    "qwen2.5-0.5b-hf-z2-opt-cpu-card": ([*_hf("Qwen2.5-0.5B.json"), "--stage", "2", "--offload-optimizer", "cpu"],
                                        "shipped"),
    "olmo2-1b-hf-z3-param-cpu-card": ([*_hf("OLMo-2-0425-1B.json"), "--stage", "3", "--offload-optimizer", "cpu",
                                       "--offload-param", "cpu", "--seq", "1024"], "shipped"),
    "mixtral-8x7b-hf-z3-w8-card": ([*_hf("Mixtral-8x7B-v0.1.json"), "--stage", "3", "--gpus-per-node", "8",
                                    "--seq", "1024"], "shipped"),
    # carded held-out configs (heldout/cards)
    "gemma-2-2b-L8-z0-heldout": ([*_heldout("gemma-2-2b-L8.json"), "--stage", "0", "--seq", "4096"], "heldout"),
    "phi3-mini-L8-z2-heldout": ([*_heldout("phi3-mini-L8.json"), "--stage", "2", "--micro-batch", "2"], "heldout"),
    "pythia-1b-z1-ckpt-heldout": ([*_heldout("pythia-1b.json"), "--stage", "1", "--checkpointing", "full",
                                   "--loop", "trainer"], "heldout"),
    "gpt2-medium-z3-heldout": ([*_heldout("gpt2-medium.json"), "--stage", "3", "--micro-batch", "4",
                                "--seq", "1024"], "heldout"),
    # carded MoE classes other than Mixtral: blocks from the card; not where ZeRO-3 gathers
    "qwen3-moe-L4-z2-heldout": ([*_heldout("qwen3-30b-a3b-L4.json"), "--stage", "2", "--gpus-per-node", "1",
                                 "--seq", "1024"], "heldout"),
    "phimoe-L2-z3-opt-cpu-heldout": ([*_heldout("phi3.5-moe-L2.json"), "--stage", "3", "--offload-optimizer", "cpu",
                                      "--gpus-per-node", "1", "--seq", "1024"], "heldout"),
    "phimoe-L2-z3-param-cpu-heldout": ([*_heldout("phi3.5-moe-L2.json"), "--stage", "3", "--offload-optimizer",
                                        "cpu", "--offload-param", "cpu", "--seq", "1024"], "heldout"),
}

def plan_input(flags: list[str], cards_from: str):
    """The case's PlanInput and layout, its card (if any) from presets/cards or heldout/cards
    only (never the user's cache). The card is read while the input is built; $ZLAYOUT_CARDS_DIR
    and the shipped folder are the caller's again after it (heldout/cards holds older cards of
    shipped keys: left set, it was the cache of every later test in the worker)."""
    from zlayout import cards
    from zlayout.cli import build_parser, plan_input_from_args
    from zlayout.spec import Layout

    saved = os.environ.get(cards.CARDS_DIR_ENV)
    if cards_from == "heldout":
        os.environ[cards.CARDS_DIR_ENV] = str(HELDOUT / "cards")
    else:
        os.environ[cards.CARDS_DIR_ENV] = tempfile.mkdtemp(prefix="zlayout-golden-cards-")
    shipped = cards.SHIPPED_CARDS_DIR
    if cards_from == "none":
        cards.SHIPPED_CARDS_DIR = Path(tempfile.mkdtemp(prefix="zlayout-golden-no-cards-"))
    try:
        args = build_parser().parse_args(["plan", "--gpu", "h200", *flags])
        inp = plan_input_from_args(args)
    finally:
        cards.SHIPPED_CARDS_DIR = shipped
        if saved is None:
            os.environ.pop(cards.CARDS_DIR_ENV, None)
        else:
            os.environ[cards.CARDS_DIR_ENV] = saved
    return inp, Layout(stage=args.stage, offload_optimizer=args.offload_optimizer, offload_param=args.offload_param)


def record(name: str) -> dict:
    """The case's digest and figures (two training steps, as planning replays)."""
    from zlayout.core import allocator_sim as sim

    flags, cards_from = CASES[name]
    inp, layout = plan_input(flags, cards_from)
    seq = sim._Seq()
    events = sim.allocation_sequence(inp, layout, 2, seq)
    if events is None:
        return {"carded": inp.model.card is not None, "replayed": False}
    digest = hashlib.sha256(json.dumps([events, seq.marks], separators=(",", ":")).encode()).hexdigest()
    replay = sim._Seq(live=True)
    sim.allocation_sequence(inp, layout, 2, replay)
    return {"carded": inp.model.card is not None and sim._replays_card(inp.model, inp.training),
            "replayed": True, "digest": digest[:24], "events": len(events),
            "peak_allocated": events_peak_allocated(events), "peak_reserved": replay.reserved}


def events_peak_allocated(events: list) -> int:
    """The most a recorded request sequence holds at once (torch.cuda.max_memory_allocated)."""
    live = peak = 0
    sizes: dict = {}
    for kind, tensor, size, *_ in events:
        if kind == "a":
            sizes[tensor] = size
            live += size
            peak = max(peak, live)
        elif kind == "f":
            live -= sizes.pop(tensor)
    return peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"record {GOLDEN.name}")
    parser.add_argument("--check", action="store_true", help=f"compare with {GOLDEN.name}")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    golden = json.loads(GOLDEN.read_text()) if args.check else {}
    results, changed = {}, []
    for name in CASES:
        results[name] = got = record(name)
        mark = ""
        if args.check:
            want = golden.get(name)
            if want != got:
                changed.append(name)
                mark = "  CHANGED" + ("" if want is None else
                                      f" (was {want.get('digest')} reserved {want.get('peak_reserved', 0) / 2**20:.0f}"
                                      f" MiB, allocated {want.get('peak_allocated', 0) / 2**20:.0f} MiB)")
        if got["replayed"]:
            print(f"{name:34} {'card' if got['carded'] else 'hand'}  {got['digest']}  {got['events']:7d} events  "
                  f"allocated {got['peak_allocated'] / 2**20:9.0f} MiB  reserved {got['peak_reserved'] / 2**20:9.0f} MiB"
                  + mark)
        else:
            print(f"{name:34} not replayed{mark}")
    if args.write:
        GOLDEN.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if args.check:
        print(f"{len(changed)} of {len(CASES)} changed: {', '.join(changed) or '-'}")
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
