"""Step time of every measured run planned from a model card: the card its batch planned with
against the same config learned again by today's learner (a change to what the learner records
is judged on every row at once, not on the rows it was written for).

    python benchmarks/steptime_relearned.py [--cards DIR] [--only CONFIG-NAME-PART]

Rows: every GPU verify result under benchmarks/measurements/ (not emulated) whose model names a
card and whose config file is in this repository (the recorded path from its
benchmarks/measurements/ or tests/hf/ part on). "before": the card its batch ran with
(benchmarks/measurements.py, `row_cards`: its batch's heldout/cards, else the shipped one);
"after": the config learned now, into `--cards DIR` (kept: a second run reuses it; default a
temporary folder). Needs `zlayout[learn]`; learning takes about ten seconds a config. Targets
(issue 27): within 15% GPU-resident, 25% offloaded.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASUREMENTS = ROOT / "benchmarks" / "measurements"
MARKERS = ("benchmarks/measurements/", "tests/hf/")


def config_path(recorded: str | None) -> Path | None:
    """The recorded config (an absolute path on the machine that ran it) in this checkout."""
    for marker in MARKERS:
        if recorded and marker in recorded:
            path = ROOT / marker / recorded.split(marker, 1)[1]
            return path if path.is_file() else None
    return None


def card_rows(only: str | None):
    """(results file, the card folder its batch planned with) for every results file with a carded GPU run."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.measurements import card_file, row_cards, verify_results

    files: dict[Path, Path] = {}
    configs: dict[str, Path] = {}
    for path, r in verify_results():
        model = r["inputs"].get("model") or {}
        key, config = model.get("card"), config_path(model.get("hf_config"))
        if not key or config is None or r.get("mode") != "gpu" or (only and only not in config.name):
            continue
        folder = row_cards(r, path)  # the cards its batch ran with (benchmarks/measurements.py)
        if card_file(folder, key) is None:
            continue
        files[path] = folder
        configs[key] = config
    return files, configs


def relearn(configs: dict[str, Path], out: Path) -> None:
    from zlayout import cards, hfconfig
    from zlayout.learn.learner import learn

    out.mkdir(parents=True, exist_ok=True)
    for key, path in sorted(configs.items()):
        target = out / f"{key}.toml"
        if target.is_file():
            continue
        config, where = hfconfig.read_config(path)
        assert cards.config_key(config) == key, f"{path}: its key is not the recorded {key}"
        target.write_text(cards.dumps_card(learn(config), key, where.name))
        print(f"  learned {path.relative_to(ROOT)} -> {target.name}", file=sys.stderr)


def error(predicted: float, measured: float) -> float:
    return 100 * (predicted / measured - 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=Path, help="folder for the relearned cards (kept; default: a temporary one)")
    parser.add_argument("--only", help="only configs whose file name contains this")
    args = parser.parse_args(argv)
    from zlayout import cards
    from zlayout.core.calibrate import predict_step
    from zlayout.profile.calibration import read_results

    files, configs = card_rows(args.only)
    with tempfile.TemporaryDirectory() as scratch:
        out = args.cards or Path(scratch)
        relearn(configs, out)
        errs: dict[tuple[str, str], list[float]] = {}
        seen: set[tuple] = set()  # a run kept in two results files (a batch's and its rerun's) counts once
        print(f"{'batch':18s} {'model':22s} {'layout':34s} {'meas s':>7s} {'before':>7s} {'err':>7s} "
              f"{'after':>7s} {'err':>7s}")
        for path, folder in sorted(files.items()):
            runs = {}
            for name, cards_dir in (("before", folder), ("after", out)):
                os.environ[cards.CARDS_DIR_ENV] = str(cards_dir)
                runs[name] = {row.source: row for row in read_results([path])[0]}
            for source in sorted(set(runs["before"]) & set(runs["after"])):
                before, after = runs["before"][source], runs["after"][source]
                if before.inp.model.card is None or after.inp.model.card is None \
                        or after.inp.model.card.key not in configs:
                    continue
                measured = before.measured_step_s
                run = (before.inp.model.hf_config and Path(before.inp.model.hf_config).name, before.label, measured)
                if run in seen:
                    continue
                seen.add(run)
                group = "GPU-resident" if before.layout.offload_optimizer == "gpu" and \
                    before.layout.offload_param == "gpu" else "offloaded"
                cells = []
                for name, row in (("before", before), ("after", after)):
                    t = predict_step(row).step_time_s
                    errs.setdefault((name, group), []).append(abs(error(t, measured)))
                    cells.append(f"{t:7.3f} {error(t, measured):+6.1f}%")
                batch = path.relative_to(MEASUREMENTS).parts[0]
                name = config_path(before.inp.model.hf_config).stem
                print(f"{batch[:18]:18s} {name[:22]:22s} {before.label[:34]:34s} {measured:7.3f} "
                      f"{cells[0]} {cells[1]}")
    for (name, group), values in sorted(errs.items()):
        target = 15 if group == "GPU-resident" else 25
        print(f"{name:6s} {group:12s} n={len(values):3d}  mean |err| {sum(values) / len(values):5.1f}%  "
              f"max |err| {max(values):5.1f}%  over {target}%: {sum(v > target for v in values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
