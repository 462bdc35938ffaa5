"""The caching-allocator replay (zlayout/core/allocator_sim.py): allocator rules, per-stream
pools, which layouts are replayed, and that skipping the replay never changes the fit verdict."""

from __future__ import annotations

from zlayout.core import allocator_sim as sim
from zlayout.core.memory import estimate_memory, replayed_reserved_bytes
from zlayout import catalog
from zlayout.spec import HardwareSpec, Layout, ModelSpec, PlanInput, TrainingSpec

MiB = 2**20


def _input(stage_grad_accum: int = 1, **training) -> PlanInput:
    model = ModelSpec(layers=4, hidden=1024, heads=16, vocab=32000)
    hardware = HardwareSpec(gpu=catalog.load_gpu("h200"), gpus_per_node=1,
                            intra_link=catalog.load_link("nvlink4"))
    return PlanInput(model=model, hardware=hardware, training=TrainingSpec(seq=1024, micro_batch=2, grad_accum=stage_grad_accum,
                                                        **training))


def test_best_fit_split_and_merge():
    a = sim.CachingAllocator()
    big = a.malloc(100 * MiB)
    a.free(big)
    x, y = a.malloc(30 * MiB), a.malloc(30 * MiB)  # both carved from the cached 100 MiB segment
    assert a.reserved == 100 * MiB
    a.free(x)
    a.free(y)
    assert a.malloc(100 * MiB) is not None and a.reserved == 100 * MiB  # merged back whole


def test_a_stream_does_not_reuse_another_streams_blocks():
    events = [("a", 1, 100 * MiB, sim.ALLGATHER_STREAM), ("f", 1, 0), ("a", 2, 100 * MiB), ("f", 2, 0),
              ("a", 3, 100 * MiB, sim.ALLGATHER_STREAM)]
    pools = sim.replay(events)
    assert pools.peak_reserved == 200 * MiB  # one segment per stream; the third reuses the first
    assert pools.peak_allocated == 100 * MiB


def test_stages_1_and_2_share_a_replay_without_accumulation():
    inp = _input()
    assert sim.allocation_sequence(inp, Layout(stage=1), 2) == sim.allocation_sequence(inp, Layout(stage=2), 2)
    assert sim._key(inp, Layout(stage=1)) == sim._key(inp, Layout(stage=2))


def test_stage1_keeps_per_weight_gradients_between_accumulation_boundaries():
    inp = _input(2)
    one = sim.replay(sim.allocation_sequence(inp, Layout(stage=1), 2))
    two = sim.replay(sim.allocation_sequence(inp, Layout(stage=2), 2))
    assert one.peak_allocated > two.peak_allocated


def test_what_is_replayed():
    inp = _input()
    for layout in (Layout(stage=0), Layout(stage=2), Layout(stage=3),
                   Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")):
        assert replayed_reserved_bytes(inp, layout) is not None, layout
    assert replayed_reserved_bytes(inp, Layout(stage=2, offload_optimizer="cpu")) is None
    assert replayed_reserved_bytes(inp, Layout(stage=3, offload_optimizer="nvme")) is None


def test_fit_verdict_does_not_need_the_replay():
    inp = _input()
    for stage in range(4):
        full, quick = estimate_memory(inp, Layout(stage=stage)), estimate_memory(inp, Layout(stage=stage), replay=False)
        assert (full.fits, full.gpu_needed_bytes, full.gpu_peak_allocated_bytes) == (
            quick.fits, quick.gpu_needed_bytes, quick.gpu_peak_allocated_bytes)


def test_longer_accumulation_reserves_what_three_micro_steps_do(monkeypatch):
    # The replay stops at three micro-steps (first, a middle one, the boundary) because the
    # middle ones leave the allocator as they found it: replaying eight gives the same peak.
    layouts = [Layout(stage=0), Layout(stage=1), Layout(stage=2), Layout(stage=3),
               Layout(stage=3, offload_optimizer="cpu", offload_param="cpu")]
    for layout in layouts:
        inp = _input(stage_grad_accum=8)
        sim._CACHE.clear()
        three = sim.replayed_peak_reserved(inp, layout)
        monkeypatch.setattr(sim, "REPLAYED_MICRO_STEPS", 8)
        sim._CACHE.clear()
        eight = sim.replayed_peak_reserved(inp, layout)
        monkeypatch.setattr(sim, "REPLAYED_MICRO_STEPS", 3)
        assert three is not None and three == eight, layout.label


def test_a_replay_too_long_to_plan_on_a_keystroke_falls_back_to_the_phase_rule():
    long = _input().model_copy(update={"model": ModelSpec(layers=400, hidden=1024, heads=16, vocab=32000)})
    sim._CACHE.clear()
    assert replayed_reserved_bytes(long, Layout(stage=2)) is None  # 400 x 1 x 2 passes > the bound
    est = estimate_memory(long, Layout(stage=2))
    assert est.gpu_peak_reserved_bytes >= est.gpu_peak_allocated_bytes  # the per-phase rule answered
