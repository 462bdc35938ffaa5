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
loss (`core.tensors.stage3_live_param_elements`, at least the head's). Printed: what this
simulation holds there and at most, beside the gap each measured row leaves (peak allocated,
run minus plan, in elements of 2 bytes). Fortieth session: it explains 121M of Phi-3-medium-L6's
188M (h200-2026-12-31g: its fused gate_up, 183.5M elements, overshoots the cap) and a quarter to
a half of the 0.1-0.5% the other one-GPU parameter-offload rows are under. The plan now runs the
same rules over a card's tensors (`zlayout.core.tensors.stage3_gathered_at_loss`); this script is
the first version, on hand-written shapes, kept as the session used it.
"""

from __future__ import annotations

from collections import deque


def simulate(modules: list[tuple[str, list[str]]], sizes: dict[str, int], max_live: float = 1e9,
             bucket: float = 5e7, reuse: float = 1e9) -> list[tuple[str, int]]:
    """(module, elements gathered after it runs and after its release) along the step's trace."""
    queue = deque((p, i) for i, (_, ps) in enumerate(modules) for p in ps)
    available: set[str] = set()
    n, recent, log = 0, {}, []
    for i, (name, ps) in enumerate(modules):
        for p in ps:
            if p not in available:
                available.add(p)
                n += sizes[p]
        need = {p for p in ps if recent.get(p, -1) < i}
        popped: set[str] = set()
        while queue and len(popped) < len(need):
            p, at = queue.popleft()
            recent[p] = at
            popped.add(p)
        most, taken, prefetch = min(max_live - n, bucket), 0, set()
        while queue and taken < most:
            p, at = queue.popleft()
            recent[p] = max(recent.get(p, -1), at)
            if p not in available and p not in prefetch:
                prefetch.add(p)
                taken += sizes[p]
        for p in prefetch:
            available.add(p)
            n += sizes[p]
        log.append((name, n))
        release, seen = set(ps), 0
        release -= {p for p in ps if recent.get(p, -1) > i}
        for _, later in modules[i + 1:]:
            if seen >= reuse:
                break
            for p in later:
                release.discard(p)
                seen += sizes[p]
        for p in release & available:
            available.discard(p)
            n -= sizes[p]
        log.append((name + " released", n))
    return log


def decoder(name: str, layers: int, block: list[tuple[str, list[int]]], vocab: int, hidden: int, tied: bool,
            gap_elements: float) -> None:
    sizes: dict[str, int] = {"embed": vocab * hidden}
    forward: list[tuple[str, list[str]]] = [("embed", ["embed"])]
    blocks = []
    for layer in range(layers):
        mods = []
        for module, shapes in block:
            names = [f"L{layer}.{module}.{j}" for j in range(len(shapes))]
            sizes.update(zip(names, shapes))
            mods.append((f"L{layer}.{module}", names))
        blocks.append(mods)
        forward += mods
    head = ["embed"] if tied else ["head"]
    if not tied:
        sizes["head"] = vocab * hidden
    backward = [("head.b", head)] + [(m + ".b", ps) for mods in reversed(blocks) for m, ps in reversed(mods)]
    log = simulate(forward + [("head", head)] + backward + [("embed.b", ["embed"])], sizes)
    at_loss = dict(log)["head released"]
    plan = max(min(1e9, sum(sizes.values())), vocab * hidden)
    print(f"{name:20s} plan {plan / 1e6:6.0f}M  simulated at the loss {at_loss / 1e6:6.0f}M ({(at_loss - plan) / 1e6:+5.0f}M), "
          f"at most {max(n for _, n in log) / 1e6:6.0f}M; the run's gap {gap_elements / 1e6:4.0f}M")


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
