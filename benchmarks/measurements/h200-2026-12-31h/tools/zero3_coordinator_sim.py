"""ZeRO-3's gathered weights over one steady step, as DeepSpeed 0.19.8's partitioned_param_coordinator
gathers and releases them (trace complete), for the parameter-offload rows whose plan is under.

    python benchmarks/measurements/h200-2026-12-31h/tools/zero3_coordinator_sim.py

What it copies from the coordinator (runtime/zero/partitioned_param_coordinator.py):
- fetch_sub_module: the module's own weights gathered whatever the cap; its entries popped off the
  trace's queue; then a prefetch of at most min(stage3_max_live_parameters - available,
  stage3_prefetch_bucket_size) elements, checked before each weight (`numel_prefetching < max`:
  the last weight taken may overshoot the cap by its whole size);
- release_sub_module / __params_to_release: a module's weights stay gathered where a later use was
  skipped by a prefetch, or where they appear in the modules that follow within
  stage3_max_reuse_distance elements (counted module by module: the module that crosses the
  distance is still looked at).
The plan counts min(stage3_max_reuse_distance, stage3_max_live_parameters, params) gathered at the
loss (`core.tensors.stage3_live_param_elements`, at least the head's). Printed: what the
replay holds there, beside the gap each measured row leaves (peak allocated, run minus plan, in
elements of 2 bytes). Fortieth session: it explains 121M of Phi-3-medium-L6's
188M (h200-2026-12-31g: its fused gate_up, 183.5M elements, overshoots the cap) and a quarter to
a half of the 0.1-0.5% the other one-GPU parameter-offload rows are under. The plan now runs these
rules over a card's tensors (`zlayout.core.tensors.stage3_gathered_at_loss`, which this script
calls on hand-written shapes).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from zlayout.core.tensors import stage3_gathered_at_loss  # noqa: E402
from zlayout.spec import ZeroKnobs  # noqa: E402


def decoder(name: str, layers: int, block: list[tuple[str, list[int]]], vocab: int, hidden: int, tied: bool,
            gap_elements: float) -> None:
    """One decoder's step by hand (each weight its own id, a module's weights together), replayed to
    the loss by the plan's own rules; the cap's count beside it and the run's gap."""
    ids = iter(range(1, 1 << 30))
    embedding = [(0, vocab * hidden)]
    blocks = [[[(next(ids), numel) for numel in shapes] for _, shapes in block] for _ in range(layers)]
    head = embedding if tied else [(next(ids), vocab * hidden)]
    forward = [embedding] + [m for mods in blocks for m in mods] + [head]
    backward = [head] + [m for mods in reversed(blocks) for m in reversed(mods)] + [embedding]
    at_loss = stage3_gathered_at_loss(forward + backward, len(forward) - 1, ZeroKnobs())
    params = sum(numel for m in forward for _, numel in m) - (vocab * hidden if tied else 0)
    plan = max(min(1e9, params), vocab * hidden)
    print(f"{name:20s} plan's cap {plan / 1e6:6.0f}M  replayed at the loss {at_loss / 1e6:6.0f}M "
          f"({(at_loss - plan) / 1e6:+5.0f}M); the run's gap {gap_elements / 1e6:4.0f}M")


def llama(h: int, q: int, kv: int, f: int) -> list[tuple[str, list[int]]]:
    return [("q", [h * q]), ("k", [h * kv]), ("v", [h * kv]), ("o", [q * h]), ("gate", [f * h]), ("up", [f * h]),
            ("down", [f * h])]


if __name__ == "__main__":
    GiB = 2**30
    decoder("phi3-medium L6", 6, [("qkv", [5120 * 7680]), ("o", [5120 * 5120]), ("gate_up", [2 * 17920 * 5120]),
                                  ("down", [17920 * 5120])], 32064, 5120, False, 0.35 * GiB / 2)
    decoder("gemma-7b L6", 6, llama(3072, 4096, 4096, 24576), 256000, 3072, True, 0.086 * GiB / 2)
    decoder("gemma-2-9b L6", 6, llama(3584, 4096, 2048, 14336), 256000, 3584, True, 0.145 * GiB / 2)
    decoder("llama-3.2-3b", 28, llama(3072, 3072, 1024, 8192), 128256, 3072, True, 0.18 * GiB / 2)
    decoder("pythia-6.9b L8", 8, [("qkv", [3 * 4096 * 4096, 3 * 4096]), ("dense", [4096 * 4096, 4096]),
                                  ("fc1", [16384 * 4096, 16384]), ("fc2", [4096 * 16384, 4096])], 50432, 4096, False,
            0.087 * GiB / 2)
