"""The benchmark suite: what a user reruns on any machine, with what each one measures.

    python -m benchmarks                 # list the benchmarks
    python -m benchmarks NAME [ARGS...]  # run one (ARGS go to it: python -m benchmarks NAME --help)

Each benchmark is a script beside this file and prints its own figures; none needs a GPU. The
measurements they are held against, and the scripts that took them on GPU machines, are the
lab notebook under benchmarks/measurements/ (README.md there is its index).
"""

from __future__ import annotations

import ast
import difflib
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (group, script name): the order the list prints in.
SUITE = (
    ("accuracy", "accuracy"),
    ("accuracy", "allocator_accuracy"),
    ("accuracy", "allocator_trace_compare"),
    ("accuracy", "allocator_model_on_traces"),
    ("accuracy", "breakeven_accuracy"),
    ("accuracy", "card_accuracy"),
    ("accuracy", "host_accuracy"),
    ("accuracy", "steptime_accuracy"),
    ("accuracy", "steptime_families"),
    ("accuracy", "steptime_relearned"),
    ("accuracy", "steptime_moe"),
    ("accuracy", "steptime_fit"),
    ("accuracy", "steptime_overlap"),
    ("accuracy", "steptime_masked"),
    ("accuracy", "steptime_cpu_optimizer"),
    ("accuracy", "peak_relearned"),
    ("coverage", "learn_coverage"),
    ("speed", "speed_plan"),
    ("speed", "speed_breakeven"),
    ("speed", "tui_startup"),
    ("speed", "learn_speed"),
    ("robustness", "fuzz_cli"),
    ("robustness", "fuzz_profiles"),
    ("robustness", "kill_export"),
    ("robustness", "edge_bands"),
)
NAMES = [name for _, name in SUITE]


def what_it_measures(name: str) -> str:
    """The first paragraph of the script's docstring (read, not imported: listing runs nothing)."""
    tree = ast.parse((HERE / f"{name}.py").read_text(encoding="utf-8"))
    doc = (ast.get_docstring(tree) or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def listing() -> str:
    width = max(map(len, NAMES))
    lines = ["Benchmarks (python -m benchmarks NAME [ARGS...]; each prints its own figures):"]
    group = None
    for kind, name in SUITE:
        if kind != group:
            group = kind
            lines.append(f"\n{kind}:")
        lines.append(f"  {name:{width}}  {what_it_measures(name)}")
    lines.append("\nThe measurements they use, and the scripts that took them on GPU machines: "
                 "benchmarks/measurements/README.md")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name, *args = argv
    name = name.removesuffix(".py")
    if name not in NAMES:
        close = difflib.get_close_matches(name, NAMES, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"benchmarks: error: no benchmark {argv[0]!r}{hint}; `python -m benchmarks` lists them",
              file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(HERE / f"{name}.py"), *args], cwd=HERE.parent)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
