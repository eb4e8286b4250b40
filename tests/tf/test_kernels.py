"""HvdPrioGate / HvdPrioDone / HvdPrioStep* inside TensorFlow graphs (one
process, no Horovod): release order, credit, pass-through, external grants by
ticket, failed steps withdraw and abandon their chunks, the step clock."""
import random
import threading
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.tf_stack, pytest.mark.timeout(120)]

from stack_required import import_stack_module  # noqa: E402

tf = import_stack_module("tensorflow")

import hvdrun  # noqa: E402
from horovod_prio.scheduler import Scheduler  # noqa: E402
from horovod_prio.tensorflow import ops  # noqa: E402

SCHED = Scheduler.process()


@pytest.fixture(autouse=True)
def fresh_scheduler():
    SCHED.reset()
    yield
    SCHED.set_external_grant(False)
    SCHED.set_grant_callbacks()
    SCHED.reset()


def run_with_timeout(fn, timeout=60.0):
    """hvdrun.run_with_timeout, with the scheduler's stats in the failure message."""
    return hvdrun.run_with_timeout(fn, timeout, SCHED.stats)


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, "timed out waiting for %s: %r" % (what, SCHED.stats())
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
            g = ops.gate(xs[i], prios[i], name)
            r = tf.identity(g)  # where hvd.allreduce goes
            outs.append(ops.done(r, name))
        return outs
    return step


@tf.function
def hold_blocker(x):
    # its Done runs in another call (free_blocker): not abandoned when this call ends
    return ops.gate(x, 1 << 20, "blocker", abandon_on_cancel=False)


@tf.function
def free_blocker(x):
    return ops.done(x, "blocker")


def test_kernels_use_the_process_scheduler():
    SCHED.configure(credit_bytes=123, hold=False)
    s = SCHED.stats()
    assert s["credit_bytes"] == 123 and s["hold"] is False
    out = ops.gate(tf.constant([1.0, 2.0]), 3, "eager")  # eager, pass-through
    out = ops.done(out, "eager")
    np.testing.assert_array_equal(out.numpy(), [1.0, 2.0])
    s = SCHED.stats()  # counted by the kernels, read through the scheduler's C API
    assert (s["submitted"], s["released"], s["completed"]) == (1, 1, 1)
    assert s["inflight_bytes"] == 0 and s["unknown_completions"] == 0


def test_a_gate_asks_for_nbytes_instead_of_its_tensors_bytes():
    """``nbytes``: the chunk's size at the scheduler (and so at the arbiter),
    for a collective whose other members send parts of their own."""
    SCHED.configure(credit_bytes=1 << 20, hold=True)
    x = tf.constant([1.0, 2.0])                                  # 8 bytes
    out = ops.gate(x, 3, "whole", nbytes=1000)
    assert SCHED.stats()["inflight_bytes"] == 1000
    ops.done(out, "whole")
    out = ops.gate(x, 3, "part")
    assert SCHED.stats()["inflight_bytes"] == 8
    np.testing.assert_array_equal(ops.done(out, "part").numpy(), [1.0, 2.0])
    assert SCHED.stats()["inflight_bytes"] == 0
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"gate\('bad'\): nbytes=.*give an int >= 0"):
            ops.gate(x, 3, "bad", nbytes=bad)


def test_gradient_passes_through():
    SCHED.configure(credit_bytes=0, hold=True)
    x = tf.Variable([1.0, -2.0, 3.0])

    @tf.function
    def grad():
        with tf.GradientTape() as tape:
            y = ops.done(ops.gate(x * x, 2, "sq"), "sq")
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
    SCHED.configure(credit_bytes=credit, hold=True)
    SCHED.set_tracing(True)
    step = make_step(n)
    prio_t = tf.constant(prios, tf.int32)
    step.get_concrete_function(xs, prio_t)  # trace outside the timed part

    # Deterministic queueing: a blocker chunk sits in flight (bigger than the
    # credit), so every chunk of the step is held until it is freed.
    big = tf.zeros([credit + 1], tf.uint8)
    t_lo = time.time() * 1e6
    run_with_timeout(lambda: hold_blocker(big), 30)
    assert SCHED.stats()["inflight_bytes"] == credit + 1

    box = {}
    t = threading.Thread(target=lambda: box.setdefault("outs", step(xs, prio_t)), daemon=True)
    t.start()
    wait_for(lambda: SCHED.stats()["queued"] == n, what="all chunks held")
    assert SCHED.stats()["released"] == 1  # only the blocker
    run_with_timeout(lambda: free_blocker(big), 30)
    t.join(60)
    assert not t.is_alive(), "step did not finish: %r" % SCHED.stats()

    for x, y in zip(xs, box["outs"]):
        assert y.dtype == x.dtype
        np.testing.assert_array_equal(y.numpy(), x.numpy())

    events = SCHED.drain_events()
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
    s = SCHED.stats()
    assert s["submitted"] == s["released"] == s["completed"] == n + 1
    assert s["queued"] == 0 and s["inflight_bytes"] == 0
    assert s["max_inflight_bytes"] <= max(credit, max(sizes), credit + 1)
    t_hi = time.time() * 1e6
    assert all(t_lo <= e["t_us"] <= t_hi for e in events)  # the system clock, in this test's span


def test_many_iterations_random_priorities_tiny_credit():
    n, iters = 20, 200
    xs = make_inputs(n, seed=2)
    SCHED.configure(credit_bytes=16, hold=True)
    SCHED.set_tracing(True)
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
    s = SCHED.stats()
    assert s["submitted"] == s["released"] == s["completed"] == n * iters, s
    assert s["queued"] == 0 and s["inflight_bytes"] == 0 and s["unknown_completions"] == 0
    assert s["dropped_events"] == 0
    events = SCHED.drain_events()
    assert len(events) == 3 * n * iters
    check_trace(events, 16)


def test_pass_through_when_not_holding():
    n = 6
    xs = make_inputs(n, seed=4)
    SCHED.configure(credit_bytes=0, hold=False)
    SCHED.set_tracing(True)
    step = make_step(n)
    outs = run_with_timeout(lambda: step(xs, tf.constant(list(range(n)), tf.int32)), 30)
    for x, y in zip(xs, outs):
        np.testing.assert_array_equal(y.numpy(), x.numpy())
    events = SCHED.drain_events()
    # every release directly follows its own ready event
    assert len(events) == 3 * n                     # ready, release, complete per chunk
    assert sum(e["kind"] == "release" for e in events) == n
    for a, b in zip(events, events[1:]):
        if b["kind"] == "release":
            assert a["kind"] == "ready" and a["name"] == b["name"]
    s = SCHED.stats()
    assert s["submitted"] == s["released"] == s["completed"] == n


def test_external_grant_through_tf():
    n = 4
    xs = make_inputs(n, seed=5)
    requests, completes = [], []
    lock = threading.Lock()

    def on_request(ticket, name, prio, nbytes):
        with lock:
            requests.append(ticket)

    def on_complete(ticket):
        with lock:
            completes.append(ticket)

    SCHED.configure(credit_bytes=0, hold=True)  # one at a time
    SCHED.set_grant_callbacks(request=on_request, complete=on_complete)
    SCHED.set_external_grant(True)
    step = make_step(n)
    prio_t = tf.constant([1, 2, 3, 4], tf.int32)
    step.get_concrete_function(xs, prio_t)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("outs", step(xs, prio_t)), daemon=True)
    t.start()
    granted = 0
    deadline = time.time() + 30
    while granted < n:
        assert time.time() < deadline, (requests, SCHED.stats())
        with lock:
            pending = requests[granted:]
        for ticket in pending:
            assert SCHED.grant(ticket)
            granted += 1
        time.sleep(0.002)
    t.join(30)
    assert not t.is_alive(), SCHED.stats()
    for x, y in zip(xs, box["outs"]):
        np.testing.assert_array_equal(y.numpy(), x.numpy())
    assert not SCHED.grant(requests[0])  # nothing pending any more
    s = SCHED.stats()
    assert s["released"] == s["completed"] == n and s["requested"] == 0
    assert s["unknown_grants"] == 1
    with lock:
        assert sorted(completes) == sorted(requests) and len(requests) == n


def test_aborted_step_withdraws_held_chunk():
    """A step that fails while a chunk is held must fail, not hang."""
    SCHED.configure(credit_bytes=0, hold=True)
    SCHED.set_tracing(True)
    big = tf.zeros([8], tf.uint8)
    run_with_timeout(lambda: hold_blocker(big), 30)  # keeps "held" waiting

    def fail_once_held(y):
        wait_for(lambda: SCHED.stats()["queued"] == 1, what="chunk held")
        raise RuntimeError("boom while held")

    @tf.function
    def step(x, y):
        out = ops.done(tf.identity(ops.gate(x, 1, "held")), "held")
        f = tf.py_function(fail_once_held, [y], tf.float32)
        return out, f

    x = tf.constant([1.0, 2.0])
    with pytest.raises(tf.errors.OpError, match="boom while held"):
        run_with_timeout(lambda: step(x, x), 60)
    s = SCHED.stats()
    assert s["cancelled"] == 1 and s["queued"] == 0, s
    assert [e["kind"] for e in SCHED.drain_events() if e["name"] == "held"] == ["ready", "cancel"]
    run_with_timeout(lambda: free_blocker(big), 30)
    assert SCHED.stats()["inflight_bytes"] == 0


def test_step_failing_after_a_release_abandons_the_chunk():
    """The chunk was released, then its "allreduce" failed: the step's
    cancellation abandons it, so the next step has the full credit again."""
    SCHED.configure(credit_bytes=0, hold=True)  # one chunk at a time: a leak would hang
    SCHED.set_tracing(True)

    def failing_allreduce(x):
        raise RuntimeError("collective failed")

    @tf.function
    def step(x, fail):
        g = ops.gate(x, 1, "c")
        r = tf.cond(fail, lambda: tf.py_function(failing_allreduce, [g], tf.float32),
                    lambda: tf.identity(g))
        return ops.done(r, "c")

    x = tf.constant([1.0, 2.0])
    with pytest.raises(tf.errors.OpError, match="collective failed"):
        run_with_timeout(lambda: step(x, tf.constant(True)), 30)
    s = SCHED.stats()
    assert s["abandoned"] == 1 and s["inflight_bytes"] == 0 and s["inflight_chunks"] == 0, s
    for _ in range(3):  # later steps run with the whole credit
        np.testing.assert_array_equal(run_with_timeout(lambda: step(x, tf.constant(False)),
                                                       30).numpy(), [1.0, 2.0])
    s = SCHED.stats()
    assert s["completed"] == 3 and s["inflight_bytes"] == 0, s
    kinds = [e["kind"] for e in SCHED.drain_events()]
    assert kinds[:3] == ["ready", "release", "abandon"]


def test_step_clock_records_steps_and_serves_the_priority_vector():
    clock = ops.StepClock.get()
    slot = clock.new_slot([0, 1, 2])

    @tf.function
    def step(x):
        p = ops.step_begin(slot, 3)
        y = ops.done(ops.gate(x, p[2], "s"), "s")
        ops.step_end(slot, [y])
        return p

    SCHED.configure(credit_bytes=0, hold=False)
    x = tf.constant([1.0])
    begun = clock.steps_begun()
    assert step(x).numpy().tolist() == [0, 1, 2]
    assert clock.steps_begun() == begun + 1        # the arbiter link's step tag
    clock.set_priorities(slot, [5, 6, 9])
    assert step(x).numpy().tolist() == [5, 6, 9]   # the next step reads the new vector
    assert clock.steps_begun() == begun + 2
    import ctypes                                  # what the native arbiter client reads
    native = ctypes.cast(ctypes.c_void_p(clock.steps_begun_address), ctypes.CFUNCTYPE(ctypes.c_int64))
    assert native() == begun + 2
    assert clock.wait(5.0)
    steps = clock.take_steps(slot)
    assert len(steps) == 2 and all(b <= e for b, e in steps)
    assert steps[0][1] <= steps[1][0]
    assert clock.take_steps(slot) == []
    with pytest.raises(ValueError, match="slot"):
        clock.set_priorities(slot, [1, 2])


def test_bad_inputs_have_clear_errors():
    with pytest.raises(ValueError, match="credit_bytes"):
        SCHED.configure(credit_bytes=-1, hold=True)
    with pytest.raises(ValueError, match="credit_bytes"):
        SCHED.configure(credit_bytes=1.5, hold=True)
    with pytest.raises(ValueError, match="hold"):
        SCHED.configure(credit_bytes=1, hold="yes")
    with pytest.raises(ValueError, match="name"):
        ops.gate(tf.constant(1.0), 1, "")
    with pytest.raises(ValueError, match="name"):
        ops.done(tf.constant(1.0), None)
    with pytest.raises(ValueError, match="priority"):
        ops.gate(tf.constant(1.0), 2**40, "x")

    @tf.function
    def bad_priority(x):
        return ops.gate(x, tf.constant([1, 2]), "vec")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        bad_priority(tf.constant(1.0))
    assert SCHED.stats()["submitted"] == 0
    with pytest.raises(ValueError, match="slot"):
        ops.StepClock.get().set_priorities(10 ** 6, [1])


def test_load_error_mentions_build(monkeypatch, tmp_path):
    monkeypatch.setattr(ops, "_HERE", str(tmp_path))
    with pytest.raises(ops.KernelLibraryError, match="pip install --no-build-isolation"):
        ops.kernel_library_path()
