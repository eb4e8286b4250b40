"""The runtime side of barrier crossing (no TensorFlow): the per-channel worker
thread, its ownership by the runtime, and the trace events of a channel."""
import logging
import threading
import time

import pytest

from horovod_prio.runtime import Runtime
from horovod_prio.runtime.overlap import OverlapWorker, trace_events
from waiting import wait_until


class FakeChannel:
    """A channel whose steps are queued by the test; step_fn takes one."""

    def __init__(self):
        self.name = "fake"
        self.steps = []
        self.cv = threading.Condition()
        self._state, self._error = "open", ""
        self.applied = 0
        self.closed_by = None

    def state(self):
        return self._state

    def error(self):
        return self._error

    def fail(self, message):
        with self.cv:
            if self._state == "open":
                self._state, self._error = "failed", message
            self.cv.notify_all()

    def close(self):
        with self.cv:
            if self._state == "open":
                self._state = "closed"
            self.cv.notify_all()

    def flush(self, timeout):
        with self.cv:
            return self.cv.wait_for(lambda: not self.steps or self._state != "open", timeout) \
                and not self.steps

    def post(self, step):
        with self.cv:
            self.steps.append(step)
            self.cv.notify_all()

    def step_fn(self):
        with self.cv:
            self.cv.wait_for(lambda: self.steps or self._state != "open")
            if self._state != "open":
                raise RuntimeError("channel %s" % self._state)
            step = self.steps[0]
        if step == "boom":
            raise ValueError("allreduce failed\nsecond line")
        with self.cv:
            self.steps.pop(0)
            self.applied += 1
            self.cv.notify_all()


def test_worker_runs_steps_in_order_and_stops_on_close():
    ch = FakeChannel()
    w = OverlapWorker("fake", ch, ch.step_fn)
    w.start()
    for i in range(5):
        ch.post(i)
    assert ch.flush(10) and ch.applied == 5
    w.stop(flush_timeout=5)
    assert ch.state() == "closed" and not w.alive and w.error is None


def test_a_failed_update_fails_the_channel_with_its_message():
    ch = FakeChannel()
    w = OverlapWorker("fake", ch, ch.step_fn)
    w.start()
    ch.post(1)
    ch.post("boom")
    assert wait_until(lambda: not w.alive)
    assert ch.state() == "failed" and ch.applied == 1
    assert ch.error() == ("the background update of step 2 failed: ValueError: allreduce failed")
    assert w.error == ch.error()
    w.stop(flush_timeout=1)          # never raises, even on a failed channel


@pytest.mark.timeout(30)
def test_stop_gives_up_after_the_flush_timeout(caplog):
    """A step that can never be applied: stop() waits flush_timeout for it (no
    longer), says the pending update was dropped, and still closes the channel."""
    ch = FakeChannel()
    ch.post(1)                       # never applied: no worker running
    asked = []
    real_flush = ch.flush
    ch.flush = lambda timeout: asked.append(timeout) or real_flush(timeout)
    w = OverlapWorker("fake", ch, ch.step_fn)
    with caplog.at_level(logging.WARNING, logger="horovod_prio"):
        w.stop(flush_timeout=0.3)
    assert asked == [0.3] and ch.state() == "closed" and ch.applied == 0
    warns = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warns) == 1 and "overlap fake: updates still pending after 0.3 s" in warns[0] \
        and "dropped" in warns[0]


def test_runtime_stops_its_workers_at_shutdown():
    rt = Runtime()
    ch = FakeChannel()
    w = OverlapWorker("fake", ch, ch.step_fn)
    rt.add_overlap_worker(w)
    assert w.alive
    ch.post(1)
    rt.shutdown()
    assert ch.applied == 1 and ch.state() == "closed" and not w.alive
    with pytest.raises(RuntimeError, match="shut down"):
        rt.add_overlap_worker(OverlapWorker("late", FakeChannel(), lambda: None))


def test_trace_events():
    raw = [{"kind": "wait", "channel": "c", "ticket": 3, "t_us": 150, "task": 2, "begin_us": 100,
            "dur_us": 50, "blocked": True},
           {"kind": "apply", "channel": "c", "ticket": 2, "t_us": 140, "task": 2},
           {"kind": "finish", "channel": "c", "ticket": 2, "t_us": 160, "begin_us": 60},
           {"kind": "post", "channel": "c", "ticket": 3, "t_us": 170, "slot": 4}]
    ev = trace_events(raw)
    assert [(e["name"], e["ph"], e["tid"], e["ts"], e.get("dur")) for e in ev] == [
        ("wait layer 2", "X", "overlap wait", 100, 50),
        ("applied layer 2", "i", "overlap apply", 140, None),
        ("update step 2", "X", "overlap steps", 60, 100),
        ("post c", "i", "overlap", 170, None)]
    assert ev[0]["args"]["blocked"] is True and all(e["cat"] == "overlap" for e in ev)
