"""Behaviour of the discrete-event simulator (horovod_prio.sim).

No TensorFlow here except test_profile_py_measures_keras_model, which is
skipped when TensorFlow is not installed.
"""
import importlib.util
from dataclasses import replace
import json
import os
import statistics
import subprocess
import sys

import pytest
from stack_required import import_stack_module

from horovod_prio.method import policy as policy_mod
from horovod_prio.method.config import PriorityConfig
from horovod_prio.sim import cli
from horovod_prio.sim import engine
from horovod_prio.sim.engine import (JobSpec, LinkConfig, MODES, comm_floor, simulate,
                                     window_steps)
from horovod_prio.sim.profiles import (Layer, Profile, bert_base, get_profile, load_profile,
                                       profile_from_dict, resnet50, save_profile, vgg16)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def toy(fwd=(0.01, 0.01, 0.01), bwd=(0.02, 0.02, 0.02), params=(1000, 2000, 3000)):
    return Profile("toy", tuple(Layer(f"l{i}", p, f, b)
                                for i, (f, b, p) in enumerate(zip(fwd, bwd, params))))


def pcfg(**kw):
    return PriorityConfig.from_env({}, **kw)


def t_allreduce(nbytes, n, link):
    return 2 * (n - 1) * link.latency + 2 * (n - 1) / n * nbytes / link.bandwidth


def mean(xs):
    return statistics.fmean(xs)


# ------------------------------------------------------------------ analytic
def test_single_job_fifo_step_equals_formula_overlapped():
    """Small output-side gradients finish under backprop; the step is
    forward + backward + allreduce of the input-side layer."""
    prof = toy(params=(250_000, 1000, 1000))
    link = LinkConfig(bandwidth=1e9, latency=1e-4, cycle_time=0.0)
    n = 4
    r = simulate([JobSpec(prof, n, 5)], "fifo", link)
    expect = prof.forward_s + prof.backward_s + t_allreduce(250_000 * 4, n, link)
    assert r.step_times(0) == pytest.approx([expect] * 5, rel=1e-9)


def test_single_job_fifo_fusion_formula():
    """All gradients ready at once: one fused allreduce (one latency); with
    fusion off (threshold below every tensor): one allreduce per tensor."""
    prof = toy(bwd=(0.0, 0.0, 0.0), params=(100_000, 200_000, 300_000))
    n = 8
    total = prof.grad_bytes
    link = LinkConfig(bandwidth=1e8, latency=1e-3, cycle_time=0.0)
    r = simulate([JobSpec(prof, n, 3)], "fifo", link)
    assert r.step_times(0)[-1] == pytest.approx(prof.forward_s + t_allreduce(total, n, link),
                                                rel=1e-9)
    link1 = LinkConfig(bandwidth=1e8, latency=1e-3, cycle_time=0.0, fusion_threshold=1)
    r = simulate([JobSpec(prof, n, 3)], "fifo", link1)
    per = sum(t_allreduce(l.params * 4, n, link1) for l in prof.layers)
    assert r.step_times(0)[-1] == pytest.approx(prof.forward_s + per, rel=1e-9)


def test_collective_overhead_is_paid_once_per_collective():
    """A fused step pays it once, one collective per tensor three times; nothing else moves."""
    prof = toy(bwd=(0.0, 0.0, 0.0), params=(100_000, 200_000, 300_000))
    for threshold, collectives in ((128 << 20, 1), (1, 3)):
        base = LinkConfig(bandwidth=1e8, latency=1e-4, cycle_time=0.0,
                          fusion_threshold=threshold)
        slow = LinkConfig(**dict(vars(base), collective_overhead=0.004))
        t0 = simulate([JobSpec(prof, 2, 3)], "fifo", base).step_times(0)[-1]
        t1 = simulate([JobSpec(prof, 2, 3)], "fifo", slow).step_times(0)[-1]
        assert t1 - t0 == pytest.approx(collectives * 0.004, rel=1e-9)


def test_chunks_released_in_one_cycle_share_a_collective():
    """As in Horovod, the chunks the scheduler releases in one cycle are fused
    like any tensors: all three ready at once pay one collective's overhead, as
    plain Horovod's fused step does; with fusion off, one each."""
    prof = toy(bwd=(0.0, 0.0, 0.0), params=(100_000, 200_000, 300_000))
    for threshold, collectives in ((128 << 20, 1), (1, 3)):
        base = LinkConfig(bandwidth=1e8, latency=1e-4, cycle_time=0.0,
                          fusion_threshold=threshold)
        slow = LinkConfig(**dict(vars(base), collective_overhead=0.004))
        for mode in ("fifo", "priority"):
            t0 = simulate([JobSpec(prof, 2, 3)], mode, base, pcfg()).step_times(0)[-1]
            t1 = simulate([JobSpec(prof, 2, 3)], mode, slow, pcfg()).step_times(0)[-1]
            assert t1 - t0 == pytest.approx(collectives * 0.004, rel=1e-9), (mode, threshold)


def test_comm_spans_cover_the_time_a_job_has_tensors_in_horovod():
    """One fused collective per step, handed to Horovod when the backward ends:
    the job's span runs from there to its end, overhead included - the product's
    union of "allreduce" spans (release -> done)."""
    prof = toy(bwd=(0.0, 0.0, 0.0), params=(100_000, 200_000, 300_000))
    link = LinkConfig(bandwidth=1e8, latency=1e-4, cycle_time=0.0, collective_overhead=0.004)
    for mode in ("fifo", "priority"):
        r = simulate([JobSpec(prof, 2, 3)], mode, link, pcfg())
        spans = r.comm_spans[0]
        assert len(spans) == 3, (mode, spans)
        for (a, b), st in zip(spans, r.steps[0]):
            assert a == pytest.approx(st.start + prof.forward_s, abs=1e-12)
            assert b - a == pytest.approx(0.004 + t_allreduce(prof.grad_bytes, 2, link),
                                          rel=1e-9), mode


def test_arbiter_rtt_delays_each_grant_by_the_round_trip():
    """One chunk per step: the request reaches the arbiter half a round trip
    after the job sent it, the grant the job half a round trip after that."""
    prof = toy(fwd=(0.01,), bwd=(0.02,), params=(100_000,))
    base = LinkConfig(bandwidth=1e8, latency=1e-4, cycle_time=0.0)
    rtt = LinkConfig(**dict(vars(base), arbiter_rtt=0.006))
    for mode in ("arbiter", "adaptive"):
        t0 = simulate([JobSpec(prof, 2, 3)], mode, base, pcfg()).step_times(0)
        t1 = simulate([JobSpec(prof, 2, 3)], mode, rtt, pcfg()).step_times(0)
        assert [b - a for a, b in zip(t0, t1)] == pytest.approx([0.006] * 3, rel=1e-9)
    # without an arbiter the round trip is not paid
    t0 = simulate([JobSpec(prof, 2, 3)], "priority", base, pcfg()).step_times(0)
    t1 = simulate([JobSpec(prof, 2, 3)], "priority", rtt, pcfg()).step_times(0)
    assert t0 == t1


def test_bus_topology_multiplies_link_bytes_by_n():
    prof = toy(bwd=(0.0, 0.0, 0.0))
    nic = LinkConfig(bandwidth=1e6, latency=0.0, cycle_time=0.0, topology="nic")
    bus = LinkConfig(bandwidth=1e6, latency=0.0, cycle_time=0.0, topology="bus")
    assert comm_floor(prof, 2, bus) == pytest.approx(2 * comm_floor(prof, 2, nic))
    r = simulate([JobSpec(prof, 2, 2)], "fifo", bus)
    assert r.step_times(0)[-1] == pytest.approx(prof.forward_s + comm_floor(prof, 2, bus))


def test_one_worker_has_no_communication():
    r = simulate([JobSpec(resnet50(), 1, 3)], "fifo", LinkConfig(cycle_time=0.0))
    assert r.step_times(0)[-1] == pytest.approx(resnet50().compute_s, rel=1e-9)
    # with Horovod's cycle the last (empty) allreduce waits for the next tick
    r = simulate([JobSpec(resnet50(), 1, 3)], "fifo", LinkConfig(cycle_time=1e-3))
    assert resnet50().compute_s <= r.step_times(0)[-1] <= resnet50().compute_s + 1e-3 + 1e-9


# ------------------------------------------------------------------ floors
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", ["resnet50", "vgg16", "bert-base"])
def test_steps_respect_compute_and_comm_floor(mode, model):
    prof = get_profile(model)
    link = LinkConfig(bandwidth=10e9 / 8)
    r = simulate([JobSpec(prof, 16, 6), JobSpec(prof, 16, 6, start=0.05)], mode, link)
    floor = comm_floor(prof, 16, link)
    for j in range(2):
        assert len(r.step_times(j)) == 6
        for s in r.step_times(j):
            assert s >= floor * (1 - 1e-9)
            assert s >= prof.compute_s * (1 - 1e-9)
    # two jobs on one link: the link carried at most its capacity while busy
    assert r.link_busy_s <= r.makespan * (1 + 1e-9)
    served = sum(r.link_served[j][-1][1] for j in range(2))
    assert 0 < served <= link.bandwidth * r.link_busy_s * (1 + 1e-9)


# ------------------------------------------------------------------ priority vs fifo
@pytest.mark.parametrize("model", ["toy", "resnet50", "bert-base"])
def test_priority_not_worse_than_fifo_single_job(model):
    """One group per layer and chunks as large as the biggest tensor: the
    priority release does the same work as Horovod, in a better order."""
    prof = toy(params=(300_000, 200_000, 100_000)) if model == "toy" else get_profile(model)
    link = LinkConfig(bandwidth=10e9 / 8, latency=0.0)
    cfg = pcfg(num_groups=prof.num_tasks, partition_bytes=max(l.params for l in prof.layers) * 4,
               credit_bytes=2 * max(l.params for l in prof.layers) * 4)
    fifo = simulate([JobSpec(prof, 8, 8)], "fifo", link, cfg)
    for mode in ("priority", "arbiter", "adaptive"):
        prio = simulate([JobSpec(prof, 8, 8)], mode, link, cfg)
        assert mean(prio.step_times(0)[1:]) <= mean(fifo.step_times(0)[1:]) * 1.01 + 1e-3


# ------------------------------------------------------------------ sharing
@pytest.mark.parametrize("mode", MODES)
def test_two_jobs_share_the_link_each_slower_than_alone(mode):
    prof = bert_base()
    link = LinkConfig(bandwidth=25e9 / 8)
    alone = simulate([JobSpec(prof, 8, 20)], mode, link)
    both = simulate([JobSpec(prof, 8, 20), JobSpec(prof, 8, 20)], mode, link)
    a = mean(alone.step_times(0)[1:])
    for j in range(2):
        assert mean(window_steps(both, j)) > 1.05 * a
    # total link work is conserved: two jobs need twice the bytes
    assert both.link_busy_s == pytest.approx(2 * alone.link_busy_s, rel=1e-6)


def test_fair_share_of_identical_jobs_is_symmetric():
    prof = resnet50()
    r = simulate([JobSpec(prof, 8, 30), JobSpec(prof, 8, 30)], "fifo",
                 LinkConfig(bandwidth=10e9 / 8))
    assert mean(r.step_times(0)) == pytest.approx(mean(r.step_times(1)), rel=1e-9)


# ------------------------------------------------------------------ the product's rules
class _SpyScheduler(engine.Scheduler):
    """The product's scheduler, recording what the simulator asks of it."""
    made = []

    def __init__(self):
        super().__init__()
        self.submits = []
        _SpyScheduler.made.append(self)

    def submit(self, name, priority, nbytes):
        self.submits.append((name, priority, nbytes))
        return super().submit(name, priority, nbytes)


def test_priority_modes_drive_the_product_scheduler_with_the_binding_plan(monkeypatch):
    from horovod_prio.method.plan import TensorSpec, make_plan
    _SpyScheduler.made = []
    monkeypatch.setattr(engine, "Scheduler", _SpyScheduler)
    prof = toy(params=(100000, 300000, 200000))
    cfg = pcfg(num_groups=2, partition_bytes=400000, credit_bytes=500000)
    simulate([JobSpec(prof, 4, 2)], "priority", LinkConfig(), cfg)
    (sched,) = _SpyScheduler.made
    # the chunks are the binding's plan (one tensor per layer, backprop order)
    sizes = [l.params for l in reversed(prof.layers)]
    plan = make_plan([TensorSpec(n, "float32", 4) for n in sizes], [[0], [1], [2]],
                     cfg.make_groups(3), cfg.partition_bytes, prefix="job0")
    step = [(c.name, c.nbytes) for c in plan.chunks]
    got = [(n, b) for n, _, b in sched.submits]
    assert sorted(got) == sorted(step * 2)
    st = sched.stats()
    assert st["completed"] == 2 * len(step) and st["inflight_bytes"] == 0
    # the product's credit held: never more than 500 kB in flight, except one big chunk alone
    assert st["max_inflight_bytes"] <= max(cfg.credit_bytes, max(b for _, b in step))


def test_the_simulated_release_order_is_the_schedulers(monkeypatch):
    """Changing the product's rule changes the simulator's result: the scheduler
    that decides is the product's (here forced to hold everything for one step)."""
    prof = toy(params=(100000, 300000, 200000))
    cfg = pcfg(num_groups=3, partition_bytes=1 << 20, credit_bytes=1 << 20)
    link = LinkConfig(bandwidth=1e8, cycle_time=0.05)
    base = simulate([JobSpec(prof, 4, 3)], "priority", link, cfg)

    class OneAtATime(engine.Scheduler):
        def configure(self, credit_bytes, hold):
            super().configure(0, hold)   # one chunk in flight at a time

    monkeypatch.setattr(engine, "Scheduler", OneAtATime)
    slow = simulate([JobSpec(prof, 4, 3)], "priority", link, cfg)
    assert mean(slow.step_times(0)) > mean(base.step_times(0))


def test_arbiter_modes_run_the_product_arbiter_by_default(monkeypatch):
    from horovod_prio.arbiter import core
    calls, steps = [], set()
    orig = core.Arbiter.request

    def spy(self, job, token, priority, nbytes, chunk="", step=0):
        calls.append(priority)
        steps.add((job.job_id, step))
        return orig(self, job, token, priority, nbytes, chunk, step)
    monkeypatch.setattr(core.Arbiter, "request", spy)
    prof = resnet50()
    r = simulate([JobSpec(prof, 8, 3), JobSpec(prof, 8, 3)], "arbiter",
                 LinkConfig(bandwidth=10e9 / 8))
    assert calls and r.arbiter_grants == len(calls)
    assert set(calls) == {0, 1, 2, 3}
    # every request carries its job's training step (1-based), as the product's jobs send it
    assert steps == {(j, s) for j in ("0", "1") for s in (1, 2, 3)}


# ------------------------------------------------------------------ barrier crossing (overlap)
MIB = 1 << 20


def overlap_toy():
    """Input-side layers small (0.25 MiB of gradients each), the output-side
    one 8 MiB; forward and backward 0.1 s per layer."""
    return Profile("ov", (Layer("in", MIB // 16, 0.1, 0.1), Layer("mid", MIB // 16, 0.1, 0.1),
                          Layer("out", 2 * MIB, 0.1, 0.1)))


def test_overlap_step_time_by_hand():
    """16 MiB/s, 2 workers, nic: a 1 MiB chunk takes 1/16 s, in and mid 1/64 s.

    Without overlap (credit 1 MiB): out's 8 chunks go from 0.4 s (its
    gradient) to 0.9 s, then in: step = 0.9 + 1/32 = 0.93125 s.

    With overlap the next call starts when backward ends. Steady state, from
    the moment D when step k's ``in`` is reduced: step k+1's forward runs in,
    mid (0.2 s; mid was reduced before), waits for step k's out (5 chunks
    left after D: D + 0.3125), forward out, backward out (+0.2) - out's
    gradient ready at D + 0.5125; 2 out chunks, mid (ready at D + 0.6125,
    queued behind the second), 1 out chunk, then in (ready at D + 0.7125,
    the credit lets it overtake the 5 remaining out chunks): reduced at
    D + 0.5125 + 0.125 + 1/64 + 0.0625 + 1/64 = D + 0.73125."""
    link = LinkConfig(bandwidth=16 * MIB, latency=0.0, cycle_time=0.0)
    pc = pcfg(partition_bytes=MIB, credit_bytes=MIB, num_groups=3)
    plain = simulate([JobSpec(overlap_toy(), 2, 12)], "priority", link, pc)
    ov = simulate([JobSpec(overlap_toy(), 2, 12, overlap=True)], "priority", link, pc)
    assert ov.mode == "priority+overlap"
    assert plain.step_times(0) == pytest.approx([0.93125] * 12, rel=1e-9)
    steps = ov.step_times(0)
    assert len(steps) == 12
    assert steps[0] == pytest.approx(0.6, rel=1e-9)          # nothing to wait for yet
    assert steps[1:-1] == pytest.approx([0.73125] * 10, rel=1e-9)
    # the last step ends when its updates are applied (the final flush):
    # its backward ended 0.6125 after the previous D, + the rest as above
    assert sum(steps) == pytest.approx(ov.makespan, rel=1e-12)
    assert steps[-1] > 0.73125
    total = 12 * comm_floor(overlap_toy(), 2, link) * link.bandwidth
    assert ov.link_served[0][-1][1] == pytest.approx(total, rel=1e-12)


def test_overlap_without_a_credit_cannot_reorder_and_gains_nothing():
    """Unlimited credit: every chunk goes to Horovod as soon as it is ready,
    so ``in`` waits behind all of out's chunks and the next forward with it."""
    link = LinkConfig(bandwidth=16 * MIB, latency=0.0, cycle_time=0.0)
    pc = pcfg(partition_bytes=MIB, credit_bytes=None, num_groups=3)
    ov = simulate([JobSpec(overlap_toy(), 2, 12, overlap=True)], "priority", link, pc)
    assert ov.step_times(0)[1:-1] == pytest.approx([0.93125] * 10, rel=1e-9)


@pytest.mark.parametrize("mode", ["priority", "arbiter", "adaptive"])
def test_overlap_respects_the_link_and_compute(mode):
    """Two jobs, both overlapping, comm-bound: every call takes at least the
    compute, every step is recorded, the steps tile the job's run (the last
    one ends at the final flush) and the link carried no more than its
    capacity."""
    prof = overlap_toy()
    link = LinkConfig(bandwidth=8 * MIB, latency=1e-5, cycle_time=1e-3)
    pc = pcfg(partition_bytes=MIB, credit_bytes=MIB, num_groups=3)
    n = 10
    r = simulate([JobSpec(prof, 2, n, overlap=True), JobSpec(prof, 2, n, start=0.05,
                                                             overlap=True)], mode, link, pc)
    floor = comm_floor(prof, 2, link)
    assert floor > prof.compute_s      # comm-bound: the link decides
    for j in range(2):
        steps = r.step_times(j)
        assert len(steps) == n
        assert all(s >= prof.compute_s * (1 - 1e-9) for s in steps)
        assert sum(steps) == pytest.approx(r.steps[j][-1].end - r.steps[j][0].start, rel=1e-9)
        # the last step ended at the final flush: every byte of every step was carried
        assert r.link_served[j][-1][1] == pytest.approx(n * floor * link.bandwidth, rel=1e-9)
    assert r.makespan - 0.05 >= 2 * n * floor * (1 - 1e-9)


def test_overlap_never_puts_a_chunk_name_in_flight_twice(monkeypatch):
    """As in the product (one background call per step, in order): step
    k+1's chunks reach the scheduler only after every chunk of step k is
    reduced - here because the forward waited for every layer (comm-bound:
    without the waits step k+1's backward would produce them earlier)."""
    inflight, dup, seen = {}, [], []

    class Spy(engine.Scheduler):
        def submit(self, name, priority, nbytes):
            if inflight.get(name):
                dup.append(name)
            inflight[name] = True
            t = super().submit(name, priority, nbytes)
            seen.append((t, name))
            return t

        def complete_ticket(self, ticket):
            inflight[dict(seen)[ticket]] = False
            return super().complete_ticket(ticket)

    monkeypatch.setattr(engine, "Scheduler", Spy)
    link = LinkConfig(bandwidth=4 * MIB, latency=0.0, cycle_time=0.0)
    pc = pcfg(partition_bytes=MIB, credit_bytes=MIB, num_groups=3)
    r = simulate([JobSpec(overlap_toy(), 2, 6, overlap=True)], "priority", link, pc)
    assert len(r.step_times(0)) == 6 and len(seen) == 6 * 10
    assert dup == []


def test_overlap_uses_the_products_overlap_defaults(monkeypatch):
    """Nothing given: as the binding under hvd.overlap (PriorityConfig.
    overlap_*): 4 MiB per step / 8 -> the 1 MiB floor, a credit of one chunk;
    given values win."""
    made = []

    class Spy(engine.Scheduler):
        def configure(self, credit_bytes, hold):
            made.append(credit_bytes)
            return super().configure(credit_bytes, hold)

    monkeypatch.setattr(engine, "Scheduler", Spy)
    prof = Profile("one", (Layer("big", MIB, 0.01, 0.01),))     # 4 MiB of gradients
    link = LinkConfig(bandwidth=64 * MIB)
    for given, chunks, credit in (({}, 4, MIB), ({"partition_bytes": 4 * MIB,
                                                  "credit_bytes": 2 * MIB}, 1, 2 * MIB)):
        job = engine._Job(0, JobSpec(prof, 2, 1, overlap=True), engine._Sim(), None, link,
                          pcfg(**given), "priority", [])
        assert len(job.chunks) == chunks and made[-1] == credit


def test_sim_cuts_a_gradient_exactly_where_the_binding_does():
    """The simulated plan follows PriorityConfig.splits_tensors like the
    binding: a 4 MiB gradient (1 MiB chunks) stays whole where no chunk can be
    held back, and is cut where one can (a credit, hvd.overlap's one-chunk
    credit, autotune, an arbiter)."""
    prof = Profile("two", (Layer("big", MIB, 0.01, 0.01), Layer("small", 1000, 0.01, 0.01)))
    link = LinkConfig(bandwidth=64 * MIB)

    def chunks(mode="priority", overlap=False, arbiter=None, **given):
        job = engine._Job(0, JobSpec(prof, 2, 1, overlap=overlap), engine._Sim(), None, link,
                          pcfg(partition_bytes=MIB, **given), mode, [], arbiter=arbiter)
        return sorted(c[3] for c in job.chunks)

    assert chunks() == [4000, 4 * MIB]                       # whole, nothing held back
    cut = [4000] + [MIB] * 4
    assert chunks(credit_bytes=2 * MIB) == cut
    assert chunks(overlap=True) == cut
    assert chunks(autotune=True) == cut
    assert chunks(mode="arbiter", arbiter=object()) == cut


def test_overlap_needs_a_priority_mode():
    with pytest.raises(ValueError, match=r"jobs\[0\]\.overlap.*fifo"):
        simulate([JobSpec(overlap_toy(), 2, 3, overlap=True)], "fifo")


def test_cli_overlap_flag(capsys):
    rc = cli.main(["--model", "resnet50", "--jobs", "1", "--workers", "4", "--steps", "5",
                   "--mode", "all", "--overlap", "--no-plot", "--no-alone"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| fifo |" in text    # plain Horovod stays the baseline
    for m in ("priority", "arbiter", "adaptive"):
        assert f"| {m}+overlap |" in text


# ------------------------------------------------------------------ adaptive
def _two_phase(count_threshold=3):
    """Job 0 alone, then job 1 (same model) joins for a while, then leaves."""
    prof = bert_base()
    link = LinkConfig(bandwidth=25e9 / 8)
    cfg = pcfg(count_threshold=count_threshold, max_boost=3, warmup_batches=1,
               relative_coefficient=0.1)
    alone_step = simulate([JobSpec(prof, 8, 3)], "fifo", link).step_times(0)[-1]
    jobs = [JobSpec(prof, 8, 120), JobSpec(prof, 8, 25, start=10 * alone_step)]
    return simulate(jobs, "adaptive", link, cfg), cfg


def test_adaptive_raises_when_slowed_by_another_job_and_decays_after():
    r, cfg = _two_phase()
    a, b = r.steps
    b_start, b_end = b[0].start, b[-1].end
    raises = [s for s in a if s.outcome == "slow"]
    decays = [s for s in a if s.decayed]
    assert raises, "job 0 never raised its boost while job 1 shared the link"
    assert all(s.end > b_start for s in raises)
    assert any(b_start <= s.start <= b_end for s in raises)
    assert [s for s in decays if s.start >= b_end], "no decay after job 1 left"
    assert max(s.boost for s in a) >= 1
    assert a[-1].boost < max(s.boost for s in a)
    # the policy events are the product policy's records
    kinds = {e["kind"] for e in r.policy_events[0]}
    assert {"slow", "decay", "new_min"} <= kinds


def test_adaptive_uses_the_product_policy_class(monkeypatch):
    calls = []
    orig = policy_mod.AdaptivePriorityPolicy.after_batch

    def spy(self, seconds):
        calls.append(seconds)
        return orig(self, seconds)
    monkeypatch.setattr(policy_mod.AdaptivePriorityPolicy, "after_batch", spy)
    r = simulate([JobSpec(toy(), 2, 7)], "adaptive")
    assert calls == pytest.approx(r.step_times(0))


def test_boost_gives_a_job_precedence_on_the_arbitrated_link():
    """A boosted job's groups outrank the other job's: with the boost applied
    to every group (and no starvation bound) it finishes its steps faster
    than its peer."""
    prof = resnet50()
    # the arbiter's credit below the two jobs' local credits together, so the
    # arbiter has something to order
    link = LinkConfig(bandwidth=10e9 / 8, starvation_bound=0, arbiter_credit=8 << 20)
    cfg = pcfg(adjust_groups=4, step=4, max_boost=4, count_threshold=1000, warmup_batches=1,
               relative_coefficient=0.1)
    jobs = [JobSpec(prof, 8, 60), JobSpec(prof, 8, 60, start=5 * 0.2)]
    r = simulate(jobs, "adaptive", link, cfg)
    a, b = (window_steps(r, j, skip=5) for j in range(2))
    assert max(s.boost for s in r.steps[0]) > 0
    assert mean(a) < mean(b)


def test_a_class0_job_waits_for_grants_while_the_class1_job_sends():
    """Strict classes at the product's arbiter core: the class-0 job is granted
    only the link the class-1 job leaves (its compute phases and the gaps of its
    backward pass), so its step grows with the class-1 job's send time and stays
    well above the class-1 job's, which keeps close to its time alone. Both of
    class 0 (no wait): the two jobs share the link and step alike."""
    link = LinkConfig(bandwidth=1e9 / 8, arbiter_credit=8 << 20, mtu=1500)

    def mlp(k):        # k: the gradient's size (send time) with the compute fixed
        return Profile("mlp", (Layer("in", 400_000 * k, 0.008, 0.016),
                               Layer("mid", 1_000_000 * k, 0.016, 0.04),
                               Layer("out", 100_000, 0.002, 0.004)))

    def steps(k, classes=(1, 0)):
        jobs = [JobSpec(mlp(k), 2, 60, job_class=classes[0]),
                JobSpec(mlp(4), 2, 10, start=0.5, job_class=classes[1])]
        r = simulate(jobs, "arbiter", link, pcfg())
        alone = statistics.median(s.seconds for s in r.steps[0][1:4])
        return [statistics.median(window_steps(r, j)) for j in range(2)], alone

    class0 = []
    for k in (1, 2, 3, 4):
        (hi, lo), alone = steps(k)
        assert hi < 1.25 * alone and lo > 1.5 * hi, (k, alone, hi, lo)
        class0.append(lo)
    assert class0 == sorted(class0) and class0[-1] > 1.5 * class0[0], class0
    (hi, lo), alone = steps(2, classes=(0, 0))
    assert lo == pytest.approx(hi, rel=0.02) and hi > 1.5 * alone, (alone, hi, lo)


def test_the_time_a_collective_takes_decides_how_often_a_class0_job_gets_the_link():
    """The headline's class scenario (the harness's MLP at batch 64, its measured layer
    times at the testbed's compute scale, 2 ranks per job, 1 Gbit/s with MTU 1500
    frames, the 8 MiB credit): the class-0 job is granted only while the class-1 job
    holds nothing. With collectives that take their bytes only, the class-1 job's
    first chunk completes a few ms before its next layer's chunks are requested and
    the class-0 job gets a second window in that gap: 2 class-1 steps per class-0
    step, the class-1 job slower than alone. With 1.5 ms per collective beyond its
    bytes (measured on one job alone, docs/sim.md) the gap closes: one window per
    class-1 step, 4 class-1 steps per class-0 step (the testbed: 3.9), the class-1
    job at its alone time, and the class-0 job's longest grant wait spans more than
    three class-1 steps (the testbed's: 1.02 s, a class-0 step). Both of class 0:
    no wait for a class, the jobs step alike."""
    k = 0.75
    mlp = Profile("mlp", tuple(Layer(n, p, f * k, b * k) for n, p, f, b in (
        ("dense", 1607680, 0.00687, 0.01732), ("dense_1", 4196352, 0.01590, 0.06799),
        ("dense_2", 524544, 0.00170, 0.00500), ("dense_3", 2570, 0.00048, 0.00008))))

    def run(overhead, classes=(1, 0)):
        link = LinkConfig(bandwidth=1e9 / 8, arbiter_credit=8 << 20, mtu=1500,
                          collective_overhead=overhead)
        jobs = [JobSpec(mlp, 2, 40, job_class=classes[0]),
                JobSpec(mlp, 2, 8, start=1.0, job_class=classes[1])]
        r = simulate(jobs, "adaptive", link, pcfg())
        alone = statistics.median(s.seconds for s in r.steps[0][1:4])
        hi, lo = (statistics.median(window_steps(r, j)) for j in range(2))
        t0, t1 = r.steps[1][1].start, r.steps[1][-1].end
        waits = [[b - a for a, b, _ in r.grant_waits[j] if a >= t0 and b <= t1]
                 for j in range(2)]
        assert all(waits) and all(n > 0 for g in r.grant_waits for *_, n in g)
        return alone, hi, lo, waits

    alone, hi, lo, waits = run(0.0)
    assert lo / hi == pytest.approx(2.0, abs=0.2) and hi > 1.1 * alone, (alone, hi, lo)
    assert max(waits[1]) < 2.2 * hi
    alone, hi, lo, waits = run(0.0015)
    assert lo / hi == pytest.approx(4.0, abs=0.3) and hi < 1.05 * alone, (alone, hi, lo)
    assert max(waits[1]) > 3 * hi > 6 * statistics.median(waits[0]), (hi, waits)
    alone, hi, lo, waits = run(0.0015, classes=(0, 0))
    assert lo == pytest.approx(hi, rel=0.02) and hi > 1.5 * alone, (alone, hi, lo)
    assert statistics.median(waits[1]) == pytest.approx(statistics.median(waits[0]), rel=0.1)


def test_inline_order_gives_the_input_side_gradient_first():
    """With one inter-op thread TensorFlow runs the input-gradient chain first and
    the queued weight gradients after it, input side first (the binding's chunk
    trace of the harness's MLP: the first layer's chunks ready at about 70 % of the
    step's compute, every other layer's at its end). By hand: each layer's backward
    is half input gradient, half weight gradient; the backward pass is as long in
    either order."""
    prof = Profile("t", (Layer("in", 10, 0.01, 0.04), Layer("relu", 0, 0.001, 0.002),
                         Layer("mid", 20, 0.02, 0.08), Layer("out", 30, 0.003, 0.006)))
    fwd = 0.034
    ready, end = engine.gradient_ready(prof, "backprop")       # tasks: out, mid, in
    assert ready == pytest.approx([fwd + 0.006, fwd + 0.086, fwd + 0.128])
    assert end == pytest.approx(fwd + 0.128)
    ready, end = engine.gradient_ready(prof, "inline")
    chain = fwd + 0.064                                         # every input-gradient half
    assert ready == pytest.approx([chain + 0.064, chain + 0.061, chain + 0.02])
    assert end == pytest.approx(fwd + 0.128)
    with pytest.raises(ValueError, match="grad_order must be one of backprop, inline, got 'x'"):
        engine.gradient_ready(prof, "x")
    # the simulated job asks the arbiter for each layer's chunks when that layer's
    # gradient is ready: the output side's first in backprop order, the input side's
    # first inline
    link = LinkConfig(bandwidth=1e9, latency=0.0, cycle_time=0.0)
    big = Profile("t", tuple(replace(layer, params=layer.params * 400_000)
                             for layer in prof.layers))
    for order in ("backprop", "inline"):
        r = simulate([JobSpec(big, 2, 3, grad_order=order)], "arbiter", link, pcfg(num_groups=3))
        t0 = r.steps[0][1].start
        asked = sorted({round(a - t0, 9) for a, _, _ in r.grant_waits[0] if t0 <= a < r.steps[0][1].end})
        assert asked == pytest.approx(sorted(engine.gradient_ready(big, order)[0])), (order, asked)
    ready, _ = engine.gradient_ready(big, "inline")
    assert ready[2] < ready[1] < ready[0]           # in, mid, out


def test_in_inline_order_the_class0_job_gets_the_link_once_per_class1_step():
    """The headline's class scenario (the harness's MLP at batch 64 at a testbed
    compute scale, 1 Gbit/s with MTU 1500 frames, the 8 MiB credit, no
    per-collective time). In backprop order the class-1 job's small output-side
    chunk goes first and leaves a gap before its big layer's chunks: class-0 grants
    inside its backward pass, 2 class-1 steps per class-0 step. In the testbed's
    order (inline) the class-1 job asks for nothing until its input-side layer's
    gradient and holds requests or grants from there to its step's end: every
    class-0 grant falls in the one window between the class-1 job's last completion
    of a step and its first request of the next, and the class-0 step is a whole
    number of class-1 steps."""
    k = 0.75
    mlp = Profile("mlp", tuple(Layer(n, p, f * k, b * k) for n, p, f, b in (
        ("dense", 1607680, 0.00687, 0.01732), ("dense_1", 4196352, 0.01590, 0.06799),
        ("dense_2", 524544, 0.00170, 0.00500), ("dense_3", 2570, 0.00048, 0.00008))))
    link = LinkConfig(bandwidth=1e9 / 8, arbiter_credit=8 << 20, mtu=1500)

    def windows(order):
        jobs = [JobSpec(mlp, 2, 40, job_class=1, grad_order=order),
                JobSpec(mlp, 2, 8, start=1.0, job_class=0, grad_order=order)]
        r = simulate(jobs, "adaptive", link, pcfg())
        hi, lo = (statistics.median(window_steps(r, j)) for j in range(2))
        t0, t1 = r.steps[1][1].start, r.steps[1][-1].end
        first = sorted(a for a, _, _ in r.grant_waits[0])    # class-1 requests
        per_step = []
        for s in r.steps[0]:
            if s.start < t0 or s.end > t1:
                continue
            # class-0 grants between this class-1 step's first request and its end
            req = [a for a in first if s.start <= a < s.end]
            inside = [b for _, b, _ in r.grant_waits[1] if req and req[0] < b < s.end - 1e-9
                      and any(a <= b for a in req)]
            per_step.append(len(inside))
        return hi, lo, per_step

    hi, lo, gaps = windows("backprop")
    assert lo / hi == pytest.approx(2.0, abs=0.2) and max(gaps) > 0, (hi, lo, gaps)
    hi, lo, gaps = windows("inline")
    assert len(gaps) > 10 and max(gaps) == 0, gaps
    assert lo / hi == pytest.approx(round(lo / hi), abs=0.2), (hi, lo)


def test_mtu_puts_each_frames_headers_on_the_link():
    """With an MTU the link carries 1514 bytes per 1448 of payload (TCP/IPv4 with
    timestamps over Ethernet, MTU 1500): a job whose step is all communication
    takes that much longer, and so does its comm floor."""
    prof = toy(fwd=(0.0, 0.0, 0.0), bwd=(0.0, 0.0, 0.0), params=(1_000_000, 0, 0))
    bare = LinkConfig(bandwidth=1e8, latency=0.0, cycle_time=0.0)
    framed = LinkConfig(bandwidth=1e8, latency=0.0, cycle_time=0.0, mtu=1500)
    assert framed.wire_factor() == pytest.approx(1514 / 1448)
    t0 = simulate([JobSpec(prof, 2, 3)], "fifo", bare).step_times(0)
    t1 = simulate([JobSpec(prof, 2, 3)], "fifo", framed).step_times(0)
    assert t1 == pytest.approx([t * 1514 / 1448 for t in t0], rel=1e-9)
    assert t0 == pytest.approx([comm_floor(prof, 2, bare)] * 3, rel=1e-9)
    assert comm_floor(prof, 2, framed) == pytest.approx(t1[0], rel=1e-9)
    jumbo = LinkConfig(bandwidth=1e8, mtu=9000)
    assert jumbo.wire_factor() == pytest.approx(9014 / 8948)


def test_class_reserve_serves_the_higher_class_on_the_simulated_link():
    """The simulator runs the product arbiter's class reserve: a class-1 job
    beside a class-0 job steps faster with the reserve than without (the
    class-0 job holds at most half the credit while class 1 computes); with
    two class-0 jobs the reserve changes nothing."""
    prof = resnet50()

    def run(reserve, classes=(1, 0)):
        link = LinkConfig(bandwidth=10e9 / 8, arbiter_credit=16 << 20,
                          arbiter_class_reserve=reserve)
        jobs = [JobSpec(prof, 8, 30, job_class=classes[0]),
                JobSpec(prof, 8, 30, start=0.05, job_class=classes[1])]
        r = simulate(jobs, "arbiter", link, pcfg())
        return [mean(window_steps(r, j, skip=5)) for j in range(2)]

    hi0, hi5 = run(0.0)[0], run(0.5)[0]
    assert hi5 < hi0, (hi0, hi5)
    assert run(0.0, (0, 0)) == run(0.5, (0, 0))


def test_a_finished_job_leaves_the_simulated_arbiter():
    """As the product's job disconnects when it ends, a simulated job leaves
    the arbiter after its last step: the class-1 job's reserve stops holding
    the class-0 job back once the class-1 job is done."""
    prof = resnet50()

    def late_steps(reserve):
        link = LinkConfig(bandwidth=10e9 / 8, arbiter_credit=16 << 20,
                          arbiter_class_reserve=reserve)
        jobs = [JobSpec(prof, 8, 8, job_class=1), JobSpec(prof, 8, 40, start=0.05)]
        r = simulate(jobs, "arbiter", link, pcfg())
        gone = r.steps[0][-1].end
        late = [s.end - s.start for s in r.steps[1] if s.start > gone + 1e-9]
        assert len(late) >= 10
        return late

    assert late_steps(0.5) == pytest.approx(late_steps(0.0), rel=1e-9)


# ------------------------------------------------------------------ scale
def test_thousand_workers_eight_jobs_completes():
    models = [resnet50(), vgg16(), bert_base()]
    jobs = [JobSpec(models[k % 3], 1000, 20, start=0.01 * k) for k in range(8)]
    link = LinkConfig(bandwidth=100e9 / 8)
    for mode in MODES:
        r = simulate(jobs, mode, link)
        assert [len(s) for s in r.steps] == [20] * 8
        assert all(x > 0 for j in range(8) for x in r.step_times(j))


# ------------------------------------------------------------------ profiles
def test_builtin_profiles_match_published_parameter_counts():
    assert resnet50().params == 25_557_032
    assert vgg16().params == 138_357_544
    assert bert_base().params == 109_483_778   # BERT-base 109,482,240 + 2-way classifier
    assert resnet50().num_tasks == 54 and vgg16().num_tasks == 16


def test_profile_roundtrip_and_errors(tmp_path):
    p = tmp_path / "p.json"
    save_profile(toy(), str(p))
    assert load_profile(str(p)) == toy()
    d = json.loads(p.read_text())
    d["layers"][1]["forward_s"] = -1
    with pytest.raises(ValueError, match=r"layers\[1\]\.forward_s"):
        profile_from_dict(d)
    d["layers"][1]["forward_s"] = 0.1
    d["layers"][0]["params"] = "x"
    with pytest.raises(ValueError, match=r"layers\[0\]\.params"):
        profile_from_dict(d)
    with pytest.raises(ValueError, match="'layers'"):
        profile_from_dict({"layers": []})
    d["layers"][0]["params"] = 1000
    d["layers"][0]["tensors"] = [900, 99]          # a layer's gradients add up to its params
    with pytest.raises(ValueError, match=r"layers\[0\]\.tensors"):
        profile_from_dict(d)
    d["layers"][0]["tensors"] = [900, 100]
    two = profile_from_dict(d)
    assert two.layers[0].tensors == (900, 100) and two.gradients()[1][-1] == [0, 1]
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(str(tmp_path / "bad.json"))


def test_simulate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        simulate([JobSpec(toy(), 2, 1)], "lifo")
    with pytest.raises(ValueError, match=r"jobs\[0\]\.workers"):
        simulate([JobSpec(toy(), 0, 1)], "fifo")
    with pytest.raises(ValueError, match="bandwidth"):
        simulate([JobSpec(toy(), 2, 1)], "fifo", LinkConfig(bandwidth=0))
    with pytest.raises(ValueError, match="topology"):
        simulate([JobSpec(toy(), 2, 1)], "fifo", LinkConfig(topology="ring"))
    with pytest.raises(ValueError, match="arbiter_order"):
        simulate([JobSpec(toy(), 2, 1)], "arbiter", LinkConfig(arbiter_order="fifo"))
    with pytest.raises(ValueError, match="collective_overhead"):
        simulate([JobSpec(toy(), 2, 1)], "fifo", LinkConfig(collective_overhead=-1e-3))
    with pytest.raises(ValueError, match="arbiter_rtt"):
        simulate([JobSpec(toy(), 2, 1)], "arbiter", LinkConfig(arbiter_rtt=float("nan")))
    with pytest.raises(ValueError, match="arbiter_class_reserve"):
        simulate([JobSpec(toy(), 2, 1)], "arbiter", LinkConfig(arbiter_class_reserve=1))
    with pytest.raises(ValueError, match=r"jobs\[0\]\.grad_order must be one of backprop, "
                                         r"inline, got 'lifo'"):
        simulate([JobSpec(toy(), 2, 1, grad_order="lifo")], "fifo")
    for bad in (67, -1, 1500.0, True):
        with pytest.raises(ValueError, match="mtu must be 0 .* got %r" % (bad,)):
            simulate([JobSpec(toy(), 2, 1)], "fifo", LinkConfig(mtu=bad))


# ------------------------------------------------------------------ CLI
@pytest.mark.parametrize("args, flag", [
    (["--bandwidth", "fast"], "--bandwidth"),
    (["--bandwidth", "0gbit"], "--bandwidth"),
    (["--jobs", "0"], "--jobs"),
    (["--workers", "-3"], "--workers"),
    (["--steps", "1,x"], "--steps"),
    (["--mode", "lifo"], "--mode"),
    (["--arbiter-order", "fifo"], "--arbiter-order"),
    (["--model", "alexnet"], "--model"),
    (["--model", "/nonexistent/p.json"], "--model"),
    (["--num-groups", "0"], "--num-groups"),
    (["--max-boost", "-1"], "--max-boost"),
    (["--partition-bytes", "12XB"], "--partition-bytes"),
    (["--latency", "soon"], "--latency"),
    (["--collective-overhead", "-1ms"], "--collective-overhead"),
    (["--arbiter-rtt", "soon"], "--arbiter-rtt"),
    (["--arbiter-class-reserve", "1"], "--arbiter-class-reserve"),
    (["--mtu", "67"], "--mtu"),
    (["--mtu", "1.5k"], "--mtu"),
    (["--jitter", "1.5"], "--jitter"),
    (["--grad-order", "lifo"], "--grad-order"),
    (["--jobs", "3", "--steps", "1,2"], "--steps"),
])
def test_cli_errors_name_the_flag(args, flag, capsys):
    rc = cli.main(args + ["--no-plot"])
    err = capsys.readouterr().err
    assert rc == 2
    assert flag in err


def test_cli_runs_and_writes_tables(tmp_path, capsys):
    out = tmp_path / "o"
    rc = cli.main(["--model", "resnet50", "--jobs", "2", "--workers", "4", "--steps", "5",
                   "--bandwidth", "10gbit", "--mode", "all", "--out", str(out), "--no-plot"])
    assert rc == 0
    text = capsys.readouterr().out
    for m in MODES:
        assert f"| {m} |" in text
    data = json.loads((out / "results.json").read_text())
    assert {r["mode"] for r in data["rows"]} == set(MODES)
    assert (out / "results.md").read_text().count("| fifo |") == 2
    assert (out / "steps.csv").exists()


def test_cli_job_side_costs_reach_the_model(tmp_path):
    """--collective-overhead slows every mode, --arbiter-rtt only the arbiter's."""
    def mean_step(mode, *extra):
        out = tmp_path / ("o%d" % len(list(tmp_path.iterdir())))
        assert cli.main(["--model", "resnet50", "--jobs", "1", "--workers", "4", "--steps", "4",
                         "--mode", mode, "--out", str(out), "--no-plot", *extra]) == 0
        return json.loads((out / "results.json").read_text())["rows"][0]["mean_step_s"]
    for mode in ("fifo", "priority", "arbiter"):
        assert mean_step(mode, "--collective-overhead", "20ms") > mean_step(mode) + 0.019
    assert mean_step("arbiter", "--arbiter-rtt", "20ms") > mean_step("arbiter") + 0.019
    assert mean_step("priority", "--arbiter-rtt", "20ms") == mean_step("priority")
    # --mtu: the frames' headers on a slow link (comm-bound: the step grows with them)
    slow = ("--bandwidth", "100mbit", "--jitter", "0")
    assert mean_step("fifo", *slow, "--mtu", "1500") > 1.03 * mean_step("fifo", *slow)
    # --grad-order inline: resnet50's input-side chunks go first, so its output-side
    # gradients (the last stage, most of its bytes) leave at the end of the backward pass
    assert mean_step("priority", "--grad-order", "inline") > 1.02 * mean_step("priority")
    assert cli.main(["--model", "resnet50", "--jobs", "1", "--steps", "2", "--mode", "fifo",
                     "--grad-order", "inline", "--out", str(tmp_path / "g"), "--no-plot"]) == 0
    assert json.loads((tmp_path / "g" / "results.json").read_text())["meta"]["grad_order"] \
        == "inline"


def test_cli_dispatch_and_validate(tmp_path, capsys):
    from horovod_prio import cli as top
    rc = top.main(["sim", "--validate", "--out", str(tmp_path)])
    assert rc == 0
    v = json.loads((tmp_path / "validation.json").read_text())
    assert v["rows"] and all(r["within_15pct"] for r in v["rows"])
    assert "| 2 jobs, Horovod |" in capsys.readouterr().out
    # the harness runs TensorFlow on one thread: its gradients come input side first
    assert v["grad_order"] == "inline"
    from horovod_prio.sim.validate import validate
    back = validate(grad_order="backprop")
    assert back["grad_order"] == "backprop"
    for b, i in zip(back["rows"], v["rows"]):
        assert b["sim_s"] != i["sim_s"], (b, i)
    for b, i in zip(back["harness_sweep"], v["harness_sweep"]):
        assert b["fifo"] != i["fifo"], (b, i)


def test_cli_plot_when_matplotlib_present(tmp_path):
    import_stack_module("matplotlib")
    rc = cli.main(["--model", "resnet50", "--jobs", "2", "--steps", "4",
                   "--mode", "adaptive", "--out", str(tmp_path)])
    assert rc == 0
    assert (tmp_path / "steps.png").stat().st_size > 1000


def test_sim_imports_no_tensorflow():
    code = ("import sys, horovod_prio.sim.cli, horovod_prio.sim.validate; "
            "sys.exit('tensorflow' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=REPO)
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


# ------------------------------------------------------------------ profile_model.py (TF)
@pytest.mark.tf_stack
def test_profile_model_measures_keras_model(tmp_path):
    import tensorflow as tf
    spec = importlib.util.spec_from_file_location(
        "hp_profile_test", os.path.join(REPO, "benchmarks", "profile_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = tf.keras.Sequential([tf.keras.Input(shape=(16,)),
                                 tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    prof = mod.profile_model(model, 8, warmup=1, repeats=2)
    assert [l.params for l in prof.layers] == [16 * 32 + 32, 32 * 4 + 4]
    assert [l.tensors for l in prof.layers] == [(16 * 32, 32), (32 * 4, 4)]  # kernel, bias
    assert all(l.forward_s > 0 and l.backward_s >= 0 for l in prof.layers)
    path = tmp_path / "p.json"
    save_profile(prof, str(path))
    assert load_profile(str(path)) == prof
    r = simulate([JobSpec(load_profile(str(path)), 2, 3)], "adaptive")
    assert len(r.step_times(0)) == 3


@pytest.mark.tf_stack
def test_profile_model_measures_a_functional_model_with_a_residual_add():
    """A layer reading two earlier outputs (a residual add) is fed its own
    inputs, not the previous layer's output; the layer after the add gets the
    add's output."""
    import tensorflow as tf
    spec = importlib.util.spec_from_file_location(
        "hp_profile_test2", os.path.join(REPO, "benchmarks", "profile_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    inp = tf.keras.Input(shape=(16,))
    a = tf.keras.layers.Dense(16, name="a")(inp)
    b = tf.keras.layers.Dense(8, name="b")(a)        # 16 -> 8: the add cannot take b
    c = tf.keras.layers.Dense(16, name="c")(b)
    s = tf.keras.layers.Add(name="add")([a, c])
    out = tf.keras.layers.Dense(4, name="out")(s)
    prof = mod.profile_model(tf.keras.Model(inp, out), 8, warmup=1, repeats=2)
    assert [(l.name, l.params) for l in prof.layers] == [
        ("a", 16 * 16 + 16), ("b", 16 * 8 + 8), ("c", 8 * 16 + 16), ("add", 0), ("out", 16 * 4 + 4)]


@pytest.mark.tf_stack
def test_profile_model_measures_self_attention_called_with_query_and_value():
    """A layer the model called with several positional tensors
    (``MultiHeadAttention()(x, x)``: query and value) is timed with the same
    call (the harness's transformer)."""
    import tensorflow as tf
    spec = importlib.util.spec_from_file_location(
        "hp_profile_test3", os.path.join(REPO, "benchmarks", "profile_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    inp = tf.keras.Input(shape=(6, 8))
    x = tf.keras.layers.Dense(8, name="proj")(inp)
    a = tf.keras.layers.MultiHeadAttention(2, 4, name="attn")(x, x)
    out = tf.keras.layers.Dense(3, name="head")(tf.keras.layers.Flatten(name="flat")(a))
    prof = mod.profile_model(tf.keras.Model(inp, out), 4, warmup=1, repeats=2)
    # attention: query, key, value (8x2x4 + 2x4 each) and output (2x4x8 + 8) projections
    assert [(l.name, l.params) for l in prof.layers] == [
        ("proj", 8 * 8 + 8), ("attn", 3 * (8 * 8 + 8) + 8 * 8 + 8), ("flat", 0),
        ("head", 48 * 3 + 3)]
    assert prof.layers[1].forward_s > 0


# ------------------------------------------------------------------ validation / sweep
def test_validate_reads_harness_results(tmp_path):
    from horovod_prio.sim.validate import measured_from_harness
    run = {"status": "ok", "config": ["horovod", "horovod"], "rate": "1gbit", "batch": 32,
           "jobs": [{"model": "mlp", "steps": [{"t_start": 0.0, "t_end": 0.8, "warmup": False},
                                               {"t_start": 0.8, "t_end": 1.62},
                                               {"t_start": 9.0, "t_end": 19.0, "warmup": True}]},
                    {"model": "mlp", "steps": [{"t_start": 0.0, "t_end": 0.84}]}]}
    other = dict(run, rate="100mbit")
    failed = dict(run, status="failed")
    d = tmp_path / "quick"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"runs": [run, other, failed]}))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results.json").write_text("{broken")
    got = measured_from_harness(str(tmp_path / "*" / "results.json"))
    assert got == {("horovod", 2): [pytest.approx(0.81), pytest.approx(0.84)]}


def test_sweep_smoke():
    from horovod_prio.sim import sweep
    rows, single, join = sweep.run(steps=12)
    assert len(rows) == 18 and len(single) == 3 and len(join) == 6
    for r in rows:
        assert r["results"]["fifo"]["vs_fifo"] == 1.0
    assert "| resnet50 | 10 |" in sweep.markdown(rows, single, join)


def test_scenarios_cli_records_its_command_and_takes_the_job_side_costs(tmp_path, capsys):
    from horovod_prio.sim import scenarios

    def run(out, *extra):
        argv = ["--model", "resnet50", "--jobs", "2", "--workers", "2", "--steps", "10",
                "--bandwidth", "10gbit", "--scenarios", "identical,classes", "--out", str(out),
                *extra]
        assert scenarios.main(argv) == 0
        return json.loads((out / "scenarios.json").read_text())

    base = run(tmp_path / "a")
    cl = base["results"][1]
    assert cl["scenario"] == "classes" and cl["hvd_staggered_ratio"] < 0.95 * cl["hvd_ratio"]
    slow = run(tmp_path / "b", "--arbiter-rtt", "20ms")
    assert base["command"].startswith("python -m horovod_prio.sim.scenarios --model resnet50")
    assert base["date"] and "--arbiter-rtt 20ms" in slow["command"]
    b0, s0 = base["results"][0], slow["results"][0]
    assert s0["prio_mean_s"] > b0["prio_mean_s"] + 0.01     # prio + arbiter pays the grants
    assert s0["hvd_mean_s"] == b0["hvd_mean_s"]             # plain Horovod asks no arbiter
    # plain Horovod also staggered (job 1 half a step behind): here the link floor,
    # where the lock-step jobs lose a quarter; the arbiter is compared with both
    assert b0["hvd_staggered_mean_s"] < 0.9 * b0["hvd_mean_s"]
    assert b0["hvd_staggered_mean_s"] == pytest.approx(b0["floor_s"], rel=0.02)
    assert b0["speedup_vs_staggered"] == pytest.approx(
        b0["hvd_staggered_mean_s"] / b0["prio_mean_s"])
    assert "staggered" in (tmp_path / "a" / "scenarios.md").read_text()
    # the arbiter's credit (default its own 8 MiB): one chunk at a time leaves
    # the link idle between grants; plain Horovod asks no arbiter
    tight = run(tmp_path / "c", "--arbiter-credit", "1KiB")
    assert "--arbiter-credit 1KiB" in tight["command"]
    t0 = tight["results"][0]
    assert t0["prio_mean_s"] > 1.02 * b0["prio_mean_s"], (t0, b0)
    assert t0["link_busy"]["prio"] < b0["link_busy"]["prio"]
    assert t0["hvd_mean_s"] == b0["hvd_mean_s"]
    for flag, bad in (("--arbiter-rtt", "soon"), ("--arbiter-credit", "0"),
                      ("--arbiter-credit", "lots"), ("--bandwidth", "0"),
                      ("--scenarios", "join,foo")):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            scenarios.main([flag, bad])
        err = capsys.readouterr().err
        assert flag in err and repr(bad) in err, err


# ---------------------------------------------------------------- measured compute noise
def _noise_prof():
    return Profile("noise", (Layer("a", 1000, 0.01, 0.02), Layer("b", 2000, 0.01, 0.02)))


def _noise_run(noise, seed=0, mode="fifo", jobs=1):
    link = LinkConfig(bandwidth=1e12, topology="nic", latency=0.0)   # the link costs ~nothing
    specs = [JobSpec(_noise_prof(), 2, 12, start=0.001 * i, seed=seed, compute_noise=noise)
             for i in range(jobs)]
    return simulate(specs, mode, link)


def _durations(res):
    return [[(s.start, s.end) for s in st] for st in res.steps]


def test_measured_compute_noise_adds_one_drawn_value_to_each_steps_compute():
    """Each step's compute is the profile's (0.06 s) plus one of the measured
    deviations, drawn per step with replacement: every step time is base + d for a
    d in the sample, and both values occur."""
    base = _noise_run(())
    res = _noise_run((-0.01, 0.02))
    got = [s.seconds - b.seconds for s, b in zip(res.steps[0], base.steps[0])]
    assert all(min(abs(g + 0.01), abs(g - 0.02)) < 1e-6 for g in got), got
    assert any(abs(g + 0.01) < 1e-6 for g in got) and any(abs(g - 0.02) < 1e-6 for g in got)


def test_compute_noise_is_seeded_and_zero_spread_reproduces_the_model_exactly():
    """The same seed draws the same steps; another seed others; each job draws its
    own; a sample of zeros (no measured spread) gives bit for bit the run without
    noise, in every mode."""
    noise = (-0.004, 0.0, 0.003, 0.011)
    a, again = _noise_run(noise, seed=3, jobs=2), _noise_run(noise, seed=3, jobs=2)
    assert _durations(a) == _durations(again)
    assert _durations(_noise_run(noise, seed=4, jobs=2)) != _durations(a)
    d0 = [s.seconds for s in a.steps[0]]
    d1 = [s.seconds for s in a.steps[1]]
    assert [round(x - d0[0], 9) for x in d0] != [round(x - d1[0], 9) for x in d1]
    for mode in ("fifo", "priority", "adaptive"):
        assert _durations(_noise_run((0.0,) * 5, mode=mode, jobs=2)) == \
            _durations(_noise_run((), mode=mode, jobs=2))


@pytest.mark.parametrize("noise, msg", [
    ("0.01", "jobs[0].compute_noise must be a sequence of seconds"),
    ((0.01, float("nan")), "jobs[0].compute_noise must hold finite seconds, got nan"),
    ((True,), "jobs[0].compute_noise must hold finite seconds"),
    ((-0.06,), "jobs[0].compute_noise: -0.06 s would leave a step no compute"),
])
def test_bad_compute_noise_is_refused_by_name(noise, msg):
    with pytest.raises(ValueError) as e:
        _noise_run(noise)
    assert msg in str(e.value)
