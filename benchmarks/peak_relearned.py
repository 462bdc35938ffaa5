"""Peak allocated and device used of every measured run planned from a model card: the card its
batch planned with against the same config learned again by today's learner, the memory twin of
steptime_relearned.py (its rows and its relearning; a change to what the learner records is
judged on every measured row at once).

    python benchmarks/peak_relearned.py [--cards DIR] [--only CONFIG-NAME-PART]

Errors are the plan's against the run's (negative: the plan is under, the side that runs out of
memory). Target (issue 27): peak allocated within 3% on every row.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.steptime_relearned import MEASUREMENTS, card_rows, config_path, error, relearn  # noqa: E402

GiB = 2**30


def measured(result: dict) -> tuple[float, float | None]:
    """The run's peak allocated (its worst step) and device used, in bytes."""
    m = result["measured"]
    rank = (result.get("ranks") or [{}])[0]
    return float(max(m["gpu_peak_allocated_bytes_per_step"])), rank.get("device_used_bytes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=Path, help="folder for the relearned cards (kept; default: a temporary one)")
    parser.add_argument("--only", help="only configs whose file name contains this")
    args = parser.parse_args(argv)

    from benchmarks.measurements import card_file, row_cards, verify_results
    from zlayout import cards
    from zlayout.spec import Layout, PlanInput, recorded_inputs
    from zlayout.verify.result import predicted_figures

    files, configs = card_rows(args.only)  # the results files and configs with a carded GPU run
    errs: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        out = args.cards or Path(scratch)
        relearn(configs, out)
        seen: set[tuple] = set()
        print(f"{'batch':18s} {'model':24s} {'layout':28s} {'run GiB':>8s} {'before':>15s} {'after':>15s}"
              f" {'used before':>12s} {'after':>8s}")
        for path, r in verify_results():
            if path not in files or r.get("mode") != "gpu" or r.get("measured_partial") \
                    or not (r.get("measured") or {}).get("gpu_peak_allocated_bytes_per_step"):
                continue
            key = (r["inputs"].get("model") or {}).get("card")
            folder = row_cards(r, path)
            if key not in configs or card_file(folder, key) is None:
                continue
            peak, used = measured(r)
            lay = r["layout"]
            layout = Layout(stage=lay["stage"], offload_optimizer=lay["offload_optimizer"],
                            offload_param=lay["offload_param"])
            name = config_path(r["inputs"]["model"].get("hf_config")).stem
            run = (name, layout.key, r["inputs"].get("training", {}).get("micro_batch"), peak)
            if run in seen:
                continue
            seen.add(run)
            cells, used_cells = [], []
            for which, cards_dir in (("before", folder), ("after", out)):
                os.environ[cards.CARDS_DIR_ENV] = str(cards_dir)
                fig = predicted_figures(PlanInput.model_validate(recorded_inputs(r["inputs"])), layout)
                e = error(fig["gpu_peak_allocated_bytes"], peak)
                errs.setdefault((which, "peak allocated"), []).append(e)
                cells.append(f"{fig['gpu_peak_allocated_bytes'] / GiB:7.2f} {e:+6.1f}%")
                if used and fig.get("gpu_device_used_bytes"):
                    u = error(fig["gpu_device_used_bytes"], used)
                    errs.setdefault((which, "device used"), []).append(u)
                    used_cells.append(f"{u:+7.1f}%")
            batch = path.relative_to(MEASUREMENTS).parts[0]
            print(f"{batch[:18]:18s} {name[:24]:24s} {layout.key[:28]:28s} {peak / GiB:8.2f} "
                  f"{cells[0]:>15s} {cells[1]:>15s} {' '.join(used_cells)}")
    for (which, figure), values in sorted(errs.items()):
        print(f"{which:6s} {figure:14s} n={len(values):3d}  mean |err| {sum(map(abs, values)) / len(values):4.1f}%  "
              f"worst under {min(values):+5.1f}%  worst over {max(values):+5.1f}%  outside 3%: "
              f"{sum(abs(v) > 3 for v in values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
