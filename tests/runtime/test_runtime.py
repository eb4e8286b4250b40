"""The runtime layer without TensorFlow: one owner of process state, settings
that exist once per process, optimizer identities, the monitor fed by a step
clock, the trace."""
import logging
import threading
import time

import pytest

from horovod_prio.method.config import PriorityConfig
from horovod_prio.runtime.runtime import Runtime
from horovod_prio.runtime.trace import load_trace
from horovod_prio.scheduler import UNLIMITED, Scheduler
from waiting import wait_until

pytestmark = pytest.mark.scheduler_lib


class FakeClock:
    """A step clock like the TF kernels' (horovod_prio.tensorflow.ops.StepClock)."""

    def __init__(self):
        self.vectors = []
        self.steps = {}
        self.cv = threading.Condition()

    def new_slot(self, priorities):
        self.vectors.append(list(priorities))
        self.steps[len(self.vectors) - 1] = []
        return len(self.vectors) - 1

    def set_priorities(self, slot, priorities):
        self.vectors[slot] = list(priorities)

    def finish(self, slot, begin, end):
        with self.cv:
            self.steps[slot].append((begin, end))
            self.cv.notify_all()

    def wait(self, timeout):
        with self.cv:
            self.cv.wait_for(lambda: any(self.steps.values()), timeout)

    def take_steps(self, slot):
        with self.cv:
            out, self.steps[slot] = self.steps[slot], []
            return out

    def wake(self):
        with self.cv:
            self.cv.notify_all()

    def steps_begun(self):
        return 41


def cfg(**kw):
    return PriorityConfig.from_env({}, **kw)


def runtime():
    return Runtime(scheduler_factory=Scheduler)   # a private scheduler per test


def test_first_setup_configures_the_scheduler_rank0_holds_others_do_not():
    rt = runtime()
    rt.setup(cfg(credit_bytes="1MiB"), rank=0, size=2)
    st = rt.scheduler.stats()
    assert st["hold"] is True and st["credit_bytes"] == 1 << 20
    rt.shutdown()
    rt1 = runtime()
    rt1.setup(cfg(), rank=1, size=2)
    assert rt1.scheduler.stats()["hold"] is False
    solo = runtime()
    solo.setup(cfg(), rank=0, size=1)
    assert solo.scheduler.stats()["hold"] is False


def test_a_heterogeneous_job_says_which_ranks_hold_and_a_process_cannot_be_both():
    # the first rank of a role holds whatever its rank; the default stays rank 0's
    rt = runtime()
    rt.setup(cfg(), rank=3, size=4, owner="HeterTrainer", hold=True)
    assert rt.hold is True and rt.scheduler.stats()["hold"] is True
    with pytest.raises(ValueError, match="HeterTrainer set the process up holding chunks, "
                                         "DistributedSGD needs it not holding"):
        rt.setup(cfg(), 3, 4, owner="DistributedSGD")
    rt.shutdown()
    rt0 = runtime()
    rt0.setup(cfg(), rank=0, size=4, owner="HeterTrainer", hold=False)
    assert rt0.scheduler.stats()["hold"] is False


def test_overlap_sets_the_default_credit_unless_one_was_given(caplog):
    for rank, hold in ((0, True), (1, False)):
        rt = runtime()
        rt.setup(cfg(), rank=rank, size=2)
        assert rt.scheduler.stats()["credit_bytes"] == UNLIMITED
        with caplog.at_level(logging.INFO, logger="horovod_prio"):
            rt.use_overlap_credit(cfg().overlap_credit_bytes(3 << 20))
            rt.use_overlap_credit(cfg().overlap_credit_bytes(1 << 20))  # the first one decides
        st = rt.scheduler.stats()
        assert st["credit_bytes"] == 3 << 20 and st["hold"] is hold
        assert sum("hvd.overlap: credit" in r.getMessage() for r in caplog.records) == 1
        caplog.clear()
        rt.shutdown()
    for given in (cfg(credit_bytes="8MiB"), cfg(credit_bytes="auto"), cfg(autotune=True)):
        rt = runtime()
        rt.setup(given, rank=0, size=2)
        before = rt.scheduler.stats()["credit_bytes"]
        rt.use_overlap_credit(given.overlap_credit_bytes(1 << 20))
        assert rt.scheduler.stats()["credit_bytes"] == before
        rt.shutdown()


def test_per_process_settings_conflict_with_a_clear_error():
    rt = runtime()
    rt.setup(cfg(credit_bytes="1MiB"), 0, 2, owner="DistributedAdam")
    rt.setup(cfg(credit_bytes="1MiB", num_groups=2, partition_bytes=4096), 0, 2)  # own knobs: fine
    with pytest.raises(ValueError, match=r"credit_bytes is one setting per process: "
                                         r"DistributedAdam already set it to 1048576, "
                                         r"DistributedSGD asks for 2097152 .*HOROVOD_PRIO_CREDIT_BYTES"):
        rt.setup(cfg(credit_bytes="2MiB"), 0, 2, owner="DistributedSGD")
    with pytest.raises(ValueError, match="trace_path"):
        rt.setup(cfg(credit_bytes="1MiB", trace_path="/tmp/other.json"), 0, 2)
    with pytest.raises(RuntimeError, match="elastic"):
        rt.setup(cfg(credit_bytes="1MiB"), 1, 3)


def test_identities_get_distinct_names_and_monitors_the_same_key_reuses():
    rt = runtime()
    rt.setup(cfg(), 0, 2)
    clock = FakeClock()
    a = rt.identity("DistributedSGD", ("vars", 1, 2), cfg(), 4, clock)
    b = rt.identity("DistributedSGD", ("vars", 3), cfg(), 4, clock)
    again = rt.identity("DistributedSGD", ("vars", 1, 2), cfg(), 4, clock)
    tape = rt.identity("DistributedGradientTape", ("vars", 3), cfg(), 2, clock)
    assert a[0] == "DistributedSGD" and b[0] == "DistributedSGD_1"
    assert again is a and a[1] is not b[1]
    assert tape[0] == "DistributedGradientTape"
    assert len({m.slot for _, m in (a, b, tape)}) == 3
    rt.shutdown()


def test_identity_logs_the_chunk_size_it_uses(caplog):
    """The start-up line says the chunk size in use: by default the one the
    step's gradient bytes give (an eighth of 16 MiB), or the one passed."""
    rt = runtime()
    rt.setup(cfg(), 0, 2)
    with caplog.at_level(logging.INFO, logger="horovod_prio"):
        rt.identity("Sync", ("a",), cfg(), 4, FakeClock(), step_bytes=16 << 20)
        clock = rt.clock
        rt.identity("Overlapped", ("b",), cfg(), 4, clock, partition_bytes=3 << 20)
    text = caplog.text
    assert "Sync: 4 groups" in text and "partition %d B" % (2 << 20) in text
    assert "Overlapped: 4 groups" in text and "partition %d B" % (3 << 20) in text
    rt.shutdown()


def test_rank0_monitor_raises_the_boost_from_measured_steps_and_sets_the_vector():
    rt = runtime()
    rt.setup(cfg(), 0, 2)
    clock = FakeClock()
    c = cfg(coefficient=0.05, warmup_batches=0, count_threshold=100, max_boost=3, num_groups=3)
    _, mon = rt.identity("opt", ("k",), c, 3, clock)
    assert clock.vectors[mon.slot] == [0, 1, 2]
    for begin, end in ((0.0, 0.1), (1.0, 1.1), (2.0, 2.4), (3.0, 3.4)):   # two slow steps
        clock.finish(mon.slot, begin, end)
    rt.pump()
    assert mon.steps == 4 and mon.policy.boost == 2
    assert clock.vectors[mon.slot] == [0, 1, 4]   # what the next step's gates read
    rt.shutdown()


def test_pumps_hand_steps_to_a_monitor_in_order():
    """The runtime thread and another caller (shutdown after a join that timed
    out, or a test) pump at once: the second waits for the first, so the steps
    reach the monitor in the order they finished."""
    rt = runtime()
    rt.setup(cfg(), 0, 2)
    clock = FakeClock()
    _, mon = rt.identity("opt", ("k",), cfg(warmup_batches=0), 3, clock)
    fed, inside, release = [], threading.Event(), threading.Event()
    real = mon.on_steps

    def on_steps(steps):
        if steps and not inside.is_set():
            inside.set()
            release.wait(10)         # the runtime thread holds its first steps here
        fed.extend(steps)
        real(steps)
    mon.on_steps = on_steps
    clock.finish(mon.slot, 0.0, 0.1)
    assert inside.wait(10)           # the runtime thread took step 1
    clock.finish(mon.slot, 1.0, 1.1)
    other = threading.Thread(target=rt.pump, daemon=True)
    other.start()
    other.join(0.3)                  # without one pump at a time it feeds step 2 now
    release.set()
    other.join(10)
    assert wait_until(lambda: len(fed) == 2)
    assert fed == [(0.0, 0.1), (1.0, 1.1)]
    rt.shutdown()


def test_shutdown_returns_while_the_runtime_thread_is_stuck_in_a_pump(tmp_path):
    """A runtime thread stuck handing steps over (its join times out) cannot
    hang exit: the final pump gives up instead of waiting for it."""
    rt = runtime()
    rt.setup(cfg(trace_path=str(tmp_path / "t.json")), 0, 2)
    clock = FakeClock()
    _, mon = rt.identity("opt", ("k",), cfg(), 3, clock)
    inside, release = threading.Event(), threading.Event()
    real = mon.on_steps

    def on_steps(steps):
        if steps:
            inside.set()
            release.wait(60)
        real(steps)
    mon.on_steps = on_steps
    clock.finish(mon.slot, 0.0, 0.1)
    assert inside.wait(10)
    done = threading.Thread(target=rt.shutdown, daemon=True)
    done.start()
    done.join(30)                    # 5 s join of the thread + at most 5 s for the pump
    stuck = done.is_alive()
    release.set()
    assert not stuck


def test_other_ranks_run_no_policy():
    rt = runtime()
    rt.setup(cfg(), 1, 2)
    clock = FakeClock()
    _, mon = rt.identity("opt", ("k",), cfg(coefficient=0.0, warmup_batches=0), 3, clock)
    clock.finish(mon.slot, 0.0, 1.0)
    rt.pump()
    assert mon.policy is None and clock.vectors[mon.slot] == [0, 1, 2]
    rt.shutdown()


def test_no_arbiter_is_logged_once_on_rank0(caplog):
    with caplog.at_level(logging.INFO, logger="horovod_prio"):
        rt = runtime()
        rt.setup(cfg(), 0, 2)
        rt.setup(cfg(), 0, 2)
    said = [r for r in caplog.records if "no arbiter" in r.getMessage()]
    assert len(said) == 1 and "other jobs' traffic" in said[0].getMessage()


def test_the_arbiter_link_tags_requests_with_the_step_clock_once_a_monitor_exists():
    from horovod_prio.arbiter.server import ArbiterServer
    secret = "runtime-test-secret-0123456789"
    srv = ArbiterServer("127.0.0.1", 0, secret)
    srv.start()
    try:
        rt = runtime()
        rt.setup(cfg(arbiter="127.0.0.1:%d" % srv.address[1], link="L", job_id="j",
                     arbiter_secret=secret, arbiter_timeout=2.0), 0, 2)
        assert rt.arbiter is not None and rt.arbiter.steps is None    # no step clock yet
        clock = FakeClock()
        rt.identity("opt", "k", cfg(), 3, clock)
        assert rt.arbiter.steps() == 41
        rt.shutdown()
    finally:
        srv.stop()


def test_the_thread_feeds_steps_and_the_trace_is_flushed(tmp_path):
    path = tmp_path / "t.json"
    rt = runtime()
    rt.setup(cfg(trace_path=str(path)), 0, 2)
    clock = FakeClock()
    _, mon = rt.identity("opt", ("k",), cfg(trace_path=str(path)), 2, clock)
    s = rt.scheduler
    t = s.submit("c0", 1, 10)
    assert s.take_released() == [t]
    s.complete_ticket(t)
    clock.finish(mon.slot, 5.0, 5.5)
    deadline = threading.Event()
    for _ in range(100):   # the runtime thread picks the step up
        if mon.steps:
            break
        deadline.wait(0.02)
    assert mon.steps == 1
    rt.shutdown()
    rt.shutdown()   # idempotent
    events = load_trace(str(path))
    assert any(e.get("name") == "step 0" and e["dur"] == pytest.approx(0.5e6) for e in events)
    kinds = [e["args"]["kind"] for e in events if e.get("cat") == "chunk" and e.get("ph") == "i"]
    assert kinds == ["ready", "release", "done"]
    assert any(e.get("name") == "allreduce c0" for e in events)
    with open(path) as f:
        assert f.read().rstrip().endswith("]")   # closed at shutdown
    with pytest.raises(RuntimeError, match="shut down"):
        rt.setup(cfg(), 0, 2)


def test_first_time_is_once_per_key_and_process_and_overlap_states_are_kept():
    """What the binding says once per process (a warning per callback class, one
    inter-op thread) and the hvd.overlap optimizers hvd.flush() reaches live in
    the runtime, not in module globals."""
    rt = runtime()
    assert rt.first_time(("callback", int)) and not rt.first_time(("callback", int))
    assert rt.first_time(("callback", str)) and runtime().first_time(("callback", int))
    a, b = object(), object()
    rt.add_overlap_state(a)
    rt.add_overlap_state(b)
    assert rt.overlap_states == [a, b] and runtime().overlap_states == []
