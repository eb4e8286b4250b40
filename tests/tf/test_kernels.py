"""HvdPrioGate / HvdPrioDone inside TensorFlow graphs (one process, no Horovod).

Needs TensorFlow and the built op library (``pip install --no-build-isolation
--no-deps -e .``); skipped with the reason otherwise.
"""
import os
import random
import threading
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed in this interpreter")

from horovod_prio import cc  # noqa: E402

try:
    cc.load()
except cc.SchedulerOpError as e:  # pragma: no cover - depends on the build
    pytest.skip("scheduler op library not usable: %s" % e, allow_module_level=True)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def fresh_scheduler():
    cc.reset()
    yield
    cc.reset()


def run_with_timeout(fn, timeout=60.0):
    """Run fn() in a daemon thread; fail (instead of hanging) if it does not finish."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "graph did not finish within %.0f s: %r" % (timeout, cc.stats())
    if "error" in box:
        raise box["error"]
    return box.get("value")


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, "timed out waiting for %s: %r" % (what, cc.stats())
        time.sleep(0.005)


def check_trace(events, credit):
    """Replay the trace and check every release obeyed the rule; return release names."""
    waiting = {}  # name -> list of (priority, seq)
    seq = 0
    inflight = 0
    released = []
    for e in events:
        if e["kind"] == "ready":
            waiting.setdefault(e["name"], []).append((e["priority"], seq))
            seq += 1
        elif e["kind"] == "release":
            cands = [(p, s, n) for n, lst in waiting.items() for (p, s) in lst]
            best_p = max(p for p, _, _ in cands)
            first_seq = min(s for p, s, _ in cands if p == best_p)
            # highest priority first, ties by readiness
            assert e["priority"] == best_p, (e, cands)
            assert e["waiting_max_priority"] == best_p, (e, cands)
            lst = waiting[e["name"]]
            mine = [s for p, s in lst if p == e["priority"]]
            assert min(mine) == first_seq, (e, cands)
            lst.remove((e["priority"], min(mine)))
            if not lst:
                del waiting[e["name"]]
            inflight += e["bytes"]
            assert e["inflight_bytes"] == inflight, e
            # credit respected unless the chunk goes alone
            assert inflight <= credit or inflight == e["bytes"], (e, credit)
            released.append(e["name"])
        elif e["kind"] == "done":
            inflight -= e["bytes"]
            assert e["inflight_bytes"] == inflight, e
        assert e["queued"] == sum(len(v) for v in waiting.values()), e
    assert not waiting
    return released


DTYPES = [tf.float16, tf.float32, tf.float64, tf.int32, tf.int64, tf.bool, tf.complex64]


def make_inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    xs = []
    for i in range(n):
        dt = DTYPES[i % len(DTYPES)]
        shape = (int(rng.integers(5, 40)), 3)
        if dt.is_bool:
            v = rng.integers(0, 2, shape).astype(bool)
        else:
            v = (rng.standard_normal(shape) * 100).astype(dt.as_numpy_dtype)
        xs.append(tf.constant(v, dtype=dt))
    return xs


def make_step(n):
    """Gate -> (stand-in for hvd.allreduce) -> Done for n independent chunks."""
    @tf.function
    def step(xs, prios):
        outs = []
        for i in range(n):
            name = "chunk%d" % i
            g = cc.gate(xs[i], prios[i], name)
            r = tf.identity(g)  # where hvd.allreduce goes
            outs.append(cc.done(r, name))
        return outs
    return step


@tf.function
def hold_blocker(x):
    return cc.gate(x, 1 << 20, "blocker")


@tf.function
def free_blocker(x):
    return cc.done(x, "blocker")


def test_same_library_for_ops_and_ctypes():
    cc.configure(credit_bytes=123, hold=False)
    s = cc.stats()
    assert s["credit_bytes"] == 123 and s["hold"] is False
    out = cc.gate(tf.constant([1.0, 2.0]), 3, "eager")  # eager, pass-through
    out = cc.done(out, "eager")
    np.testing.assert_array_equal(out.numpy(), [1.0, 2.0])
    s = cc.stats()  # counted by the kernels, read through ctypes
    assert (s["submitted"], s["released"], s["completed"]) == (1, 1, 1)
    assert s["inflight_bytes"] == 0 and s["unknown_completions"] == 0


def test_gradient_passes_through():
    cc.configure(credit_bytes=0, hold=True)
    x = tf.Variable([1.0, -2.0, 3.0])

    @tf.function
    def grad():
        with tf.GradientTape() as tape:
            y = cc.done(cc.gate(x * x, 2, "sq"), "sq")
            loss = tf.reduce_sum(y)
        return tape.gradient(loss, x)
    g = run_with_timeout(grad, 30)
    np.testing.assert_allclose(g.numpy(), [2.0, -4.0, 6.0])


def test_held_chunks_released_by_priority_within_credit():
    n = 7
    xs = make_inputs(n, seed=1)
    prios = [3, 9, 1, 9, 5, 0, 5]
    sizes = [int(np.prod(x.shape)) * x.dtype.size for x in xs]
    credit = max(sizes) + min(sizes)  # at most ~2 chunks in flight
    cc.configure(credit_bytes=credit, hold=True)
    cc.set_tracing(True)
    step = make_step(n)
    prio_t = tf.constant(prios, tf.int32)
    step.get_concrete_function(xs, prio_t)  # trace outside the timed part

    # Deterministic queueing: a blocker chunk sits in flight (bigger than the
    # credit), so every chunk of the step is held until it is freed.
    big = tf.zeros([credit + 1], tf.uint8)
    run_with_timeout(lambda: hold_blocker(big), 30)
    assert cc.stats()["inflight_bytes"] == credit + 1

    box = {}
    t = threading.Thread(target=lambda: box.setdefault("outs", step(xs, prio_t)), daemon=True)
    t.start()
    wait_for(lambda: cc.stats()["queued"] == n, what="all chunks held")
    assert cc.stats()["released"] == 1  # only the blocker
    run_with_timeout(lambda: free_blocker(big), 30)
    t.join(60)
    assert not t.is_alive(), "step did not finish: %r" % cc.stats()

    for x, y in zip(xs, box["outs"]):
        assert y.dtype == x.dtype
        np.testing.assert_array_equal(y.numpy(), x.numpy())

    events = cc.drain_events()
    released = check_trace(events, credit)
    assert released[0] == "blocker"
    order = [int(r[len("chunk"):]) for r in released[1:]]
    # all n were waiting together, so the order is exactly priority order
    # (ties: readiness order, which the trace gives)
    ready = [int(e["name"][len("chunk"):]) for e in events
             if e["kind"] == "ready" and e["name"] != "blocker"]
    expect = sorted(ready, key=lambda i: (-prios[i], ready.index(i)))
    assert order == expect
    assert [prios[i] for i in order] == sorted(prios, reverse=True)
    # at least one release happened with >= 2 chunks waiting
    assert any(e["kind"] == "release" and e["queued"] >= 1 for e in events)
    s = cc.stats()
    assert s["submitted"] == s["released"] == s["completed"] == n + 1
    assert s["queued"] == 0 and s["inflight_bytes"] == 0
    assert s["max_inflight_bytes"] <= max(credit, max(sizes), credit + 1)
    now_us = time.time() * 1e6
    assert all(abs(e["t_us"] - now_us) < 300e6 for e in events)  # system clock


def test_many_iterations_random_priorities_tiny_credit():
    n, iters = 20, 200
    xs = make_inputs(n, seed=2)
    cc.configure(credit_bytes=16, hold=True)
    cc.set_tracing(True)
    step = make_step(n)
    rng = random.Random(3)
    prio_sets = [tf.constant([rng.randrange(-5, 6) for _ in range(n)], tf.int32)
                 for _ in range(iters)]
    step.get_concrete_function(xs, prio_sets[0])

    def loop():
        for p in prio_sets:
            outs = step(xs, p)
        return outs

    outs = run_with_timeout(loop, 60)
    for x, y in zip(xs, outs):
        np.testing.assert_array_equal(y.numpy(), x.numpy())
    s = cc.stats()
    assert s["submitted"] == s["released"] == s["completed"] == n * iters, s
    assert s["queued"] == 0 and s["inflight_bytes"] == 0 and s["unknown_completions"] == 0
    assert s["dropped_events"] == 0
    events = cc.drain_events()
    assert len(events) == 3 * n * iters
    check_trace(events, 16)


def test_pass_through_when_not_holding():
    n = 6
    xs = make_inputs(n, seed=4)
    cc.configure(credit_bytes=0, hold=False)
    cc.set_tracing(True)
    step = make_step(n)
    outs = run_with_timeout(lambda: step(xs, tf.constant(list(range(n)), tf.int32)), 30)
    for x, y in zip(xs, outs):
        np.testing.assert_array_equal(y.numpy(), x.numpy())
    events = cc.drain_events()
    # every release directly follows its own ready event
    for a, b in zip(events, events[1:]):
        if b["kind"] == "release":
            assert a["kind"] == "ready" and a["name"] == b["name"]
    s = cc.stats()
    assert s["submitted"] == s["released"] == s["completed"] == n


def test_external_grant_through_tf():
    n = 4
    xs = make_inputs(n, seed=5)
    requests, completes = [], []
    lock = threading.Lock()

    def on_request(name, prio, nbytes):
        with lock:
            requests.append(name)

    def on_complete(name):
        with lock:
            completes.append(name)

    cc.configure(credit_bytes=0, hold=True)  # one at a time
    cc.set_grant_callbacks(on_request, on_complete)
    cc.set_external_grant(True)
    step = make_step(n)
    prio_t = tf.constant([1, 2, 3, 4], tf.int32)
    step.get_concrete_function(xs, prio_t)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("outs", step(xs, prio_t)), daemon=True)
    t.start()
    granted = 0
    deadline = time.time() + 30
    while granted < n:
        assert time.time() < deadline, (requests, cc.stats())
        with lock:
            pending = requests[granted:]
        for name in pending:
            assert cc.grant(name)
            granted += 1
        time.sleep(0.002)
    t.join(30)
    assert not t.is_alive(), cc.stats()
    for x, y in zip(xs, box["outs"]):
        np.testing.assert_array_equal(y.numpy(), x.numpy())
    assert not cc.grant("chunk0")  # nothing pending any more
    s = cc.stats()
    assert s["released"] == s["completed"] == n and s["requested"] == 0
    assert s["unknown_grants"] == 1
    with lock:
        assert sorted(completes) == sorted(requests) and len(requests) == n
    cc.set_external_grant(False)
    cc.set_grant_callbacks(None, None)


def test_aborted_step_withdraws_held_chunk():
    """A step that fails while a chunk is held must fail, not hang."""
    cc.configure(credit_bytes=0, hold=True)
    cc.set_tracing(True)
    big = tf.zeros([8], tf.uint8)
    run_with_timeout(lambda: hold_blocker(big), 30)  # keeps "held" waiting

    def fail_once_held(y):
        wait_for(lambda: cc.stats()["queued"] == 1, what="chunk held")
        raise RuntimeError("boom while held")

    @tf.function
    def step(x, y):
        out = cc.done(tf.identity(cc.gate(x, 1, "held")), "held")
        f = tf.py_function(fail_once_held, [y], tf.float32)
        return out, f

    x = tf.constant([1.0, 2.0])
    with pytest.raises(tf.errors.OpError):
        run_with_timeout(lambda: step(x, x), 60)
    s = cc.stats()
    assert s["cancelled"] == 1 and s["queued"] == 0, s
    assert [e["kind"] for e in cc.drain_events() if e["name"] == "held"] == ["ready", "cancel"]
    run_with_timeout(lambda: free_blocker(big), 30)
    assert cc.stats()["inflight_bytes"] == 0
    # A released chunk whose Done never ran can be forgotten explicitly.
    run_with_timeout(lambda: hold_blocker(big), 30)
    assert cc.abandon_inflight() == 1
    s = cc.stats()
    assert s["inflight_bytes"] == 0 and s["abandoned"] == 1


def test_bad_inputs_have_clear_errors():
    with pytest.raises(ValueError, match="credit_bytes"):
        cc.configure(credit_bytes=-1, hold=True)
    with pytest.raises(ValueError, match="credit_bytes"):
        cc.configure(credit_bytes=1.5, hold=True)
    with pytest.raises(ValueError, match="hold"):
        cc.configure(credit_bytes=1, hold="yes")
    with pytest.raises(ValueError, match="name"):
        cc.gate(tf.constant(1.0), 1, "")
    with pytest.raises(ValueError, match="name"):
        cc.done(tf.constant(1.0), None)
    with pytest.raises(ValueError, match="priority"):
        cc.gate(tf.constant(1.0), 2**40, "x")

    @tf.function
    def bad_priority(x):
        return cc.gate(x, tf.constant([1, 2]), "vec")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        bad_priority(tf.constant(1.0))
    assert cc.stats()["submitted"] == 0


def test_load_error_mentions_build(monkeypatch, tmp_path):
    monkeypatch.setattr(cc, "_HERE", str(tmp_path))
    with pytest.raises(cc.SchedulerOpError, match="pip install --no-build-isolation"):
        cc.library_path()
