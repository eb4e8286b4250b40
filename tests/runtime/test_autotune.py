"""The credit tuner (pure) and its wiring in the runtime (no TensorFlow)."""
import time
import random

import pytest

from horovod_prio.method.config import PriorityConfig
from horovod_prio.runtime.autotune import CreditTuner, credit_candidates
from horovod_prio.runtime.runtime import Runtime
from horovod_prio.scheduler import UNLIMITED, Scheduler


def run(tuner, cost, steps, noise=0.01, seed=0):
    rng = random.Random(seed)
    credit = tuner.start_value()
    seen = []
    for _ in range(steps):
        seen.append(credit)
        new = tuner.on_step(cost(credit) * (1 + rng.uniform(-noise, noise)))
        if new is not None:
            credit = new
    return credit, seen


def test_converges_to_the_fastest_setting_of_a_synthetic_cost():
    cands = credit_candidates(64 << 20, UNLIMITED)
    assert cands == [UNLIMITED, 32 << 20, 16 << 20, 8 << 20]
    cost = {UNLIMITED: 0.50, 32 << 20: 0.44, 16 << 20: 0.40, 8 << 20: 0.47}.get
    t = CreditTuner(cands, steps_per_trial=6, discard=1)
    credit, seen = run(t, cost, 200)
    assert credit == t.best == 16 << 20 and not t.exploring
    assert seen[-150:] == [16 << 20] * 150          # it stays put on a steady cost
    assert [c for _, c, why in t.choices if why.startswith("keep")] == [16 << 20]


def test_re_explores_when_the_step_time_drifts():
    t = CreditTuner([UNLIMITED, 1 << 20], steps_per_trial=4, discard=1, drift=0.2, window=10)
    phase = {"cost": {UNLIMITED: 0.3, 1 << 20: 0.5}}
    credit, _ = run(t, lambda c: phase["cost"][c], 40)
    assert credit == UNLIMITED
    phase["cost"] = {UNLIMITED: 0.9, 1 << 20: 0.6}     # another job arrived
    credit2 = credit
    for _ in range(60):
        new = t.on_step(phase["cost"][credit2])
        credit2 = new if new is not None else credit2
    assert credit2 == 1 << 20
    assert any("drifted" in why for _, _, why in t.choices)


def test_bad_tuner_arguments():
    with pytest.raises(ValueError, match="candidates"):
        CreditTuner([])
    with pytest.raises(ValueError, match="steps_per_trial"):
        CreditTuner([1], steps_per_trial=2, discard=2)


class Clock:
    def __init__(self):
        self.steps, self.vec = {}, {}

    def new_slot(self, p):
        self.steps[len(self.steps)] = []
        return len(self.steps) - 1

    def set_priorities(self, slot, p):
        self.vec[slot] = p

    def wait(self, timeout):
        # like the real clock, block (a no-op wait spins the runtime thread and
        # starves every later test of the CPU)
        time.sleep(timeout)

    def take_steps(self, slot):
        out, self.steps[slot] = self.steps[slot], []
        return out

    def wake(self):
        pass


def cfg(**kw):
    return PriorityConfig.from_env({}, **kw)


def test_runtime_tunes_rank0s_credit_and_explicit_values_win():
    rt = Runtime(scheduler_factory=Scheduler)
    rt.setup(cfg(autotune=True), 0, 2)
    clock = Clock()
    _, mon = rt.identity("opt", ("k",), cfg(autotune=True), 2, clock, step_bytes=32 << 20)
    assert rt.tuner is not None and rt.scheduler.stats()["credit_bytes"] == UNLIMITED
    for i in range(8):                 # one trial's steps
        clock.steps[mon.slot].append((float(i), i + 0.5))
    assert rt.autotune_state() == {"step": 0, "choice": UNLIMITED, "why": "try (start)",
                                   "credit_bytes": UNLIMITED}
    rt.pump()
    assert rt.scheduler.stats()["credit_bytes"] == 16 << 20    # the next candidate, applied
    st = rt.autotune_state()
    assert st["choice"] == st["credit_bytes"] == 16 << 20 and st["step"] == 8, st
    rt.scheduler.configure(1 << 20, True)       # the credit in force is the scheduler's own
    assert rt.autotune_state()["credit_bytes"] == 1 << 20
    rt.shutdown()
    # an explicit credit is never tuned
    rt2 = Runtime(scheduler_factory=Scheduler)
    rt2.setup(cfg(autotune=True, credit_bytes="4MiB"), 0, 2)
    rt2.identity("opt", ("k",), cfg(autotune=True, credit_bytes="4MiB"), 2, Clock(), 1 << 30)
    assert rt2.tuner is None and rt2.scheduler.stats()["credit_bytes"] == 4 << 20
    assert rt2.autotune_state() is None
    rt2.shutdown()
    # other ranks never hold, never tune: nothing for them to agree on
    rt3 = Runtime(scheduler_factory=Scheduler)
    rt3.setup(cfg(autotune=True), 1, 2)
    rt3.identity("opt", ("k",), cfg(autotune=True), 2, Clock(), 1 << 30)
    assert rt3.tuner is None and rt3.scheduler.stats()["hold"] is False
    rt3.shutdown()
    # without autotune the automatic credit is "no limit"
    rt4 = Runtime(scheduler_factory=Scheduler)
    rt4.setup(cfg(), 0, 2)
    assert rt4.scheduler.stats()["credit_bytes"] == UNLIMITED and rt4.tuner is None
    rt4.shutdown()
