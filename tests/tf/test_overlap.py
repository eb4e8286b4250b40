"""Barrier crossing (``hvd.overlap``): the next step's forward starts on layers
already reduced and updated, with the math of synchronous data-parallel SGD.

* numerics under real ``horovodrun -np 2`` (Gloo and MPI): plain Horovod vs
  horovod_prio + ``hvd.overlap`` give the same weights (rtol 1e-5) and the
  same predict/evaluate/validation results, checkpoints (ModelCheckpoint after
  batch 5, a rank-0-only ``model.save``), weights read directly by a callback
  at epoch end, per-batch learning rates, for SGD+momentum, Adam, RMSprop,
  legacy Adam, backward_passes_per_step=2, fp16 compression,
  gradient_predivide_factor=2, learning-rate schedules, a callback writing a
  weight after every batch, a callback raising inside fit, a step graph
  failing inside fit, a custom tape loop (with and without a model);
* the trace shows the next step's forward waiting per layer while the
  previous step's allreduces are in flight, the input-side layer updated
  first and every release the highest priority waiting;
* the channel itself (one process): a step that fails part-way fails the
  channel loudly and nothing hangs, a step that posted no gradient is dropped,
  a per-layer wait really orders the next read after the update;
* misuse raises clear errors (unsupported optimizers, eager steps,
  steps_per_execution, a tape, modified gradients, writes in the step, sparse
  gradients with global_clipnorm or backward_passes_per_step); sparse gradients
  otherwise keep Horovod's numbers (rows allgathered and applied in the call); ``overlap=False`` makes ``hvd.overlap`` a no-op, ``True`` requires it.
"""
import collections
import json
import os
import threading
import time

import numpy as np
import pytest

from hvdrun import CONTROLLERS, HERE, check, horovodrun, run_with_timeout
from horovod_prio.runtime import get_runtime
from horovod_prio.runtime.trace import load_trace

WORKER = os.path.join(HERE, "mp", "overlap_worker.py")
FIT_MODES = ["sgd_momentum", "adam", "rmsprop", "legacy_adam", "schedule", "legacy_schedule",
             "bpps", "fp16", "predivide", "weight_callback", "sparse_adam", "sparse_legacy_sgd"]
SPARSE_MODES = ("sparse_adam", "sparse_legacy_sgd")
OTHER_MODES = ["raise", "nan_step", "tape", "tape_opt_only"]
PER_RANK = ("val_loss", "eval", "pred")   # computed on each rank's own validation data
FIT_KEYS = ("eval", "pred", "ckpt0", "saved0", "epoch0_0", "epoch1_0", "end0")


def _load(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


# ----------------------------------------------------------------------------- numerics
@pytest.fixture(scope="module", params=CONTROLLERS)
def numerics(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("overlap_" + request.param)
    check(horovodrun([WORKER, str(out), ",".join(FIT_MODES + OTHER_MODES)],
                     controller=request.param, timeout=900))
    return out


@pytest.mark.tf_stack
@pytest.mark.parametrize("mode", FIT_MODES + OTHER_MODES)
def test_same_results_as_horovod(numerics, mode):
    hvd = [_load(numerics / ("%s_hvd_rank%d.npz" % (mode, r))) for r in (0, 1)]
    ref = hvd[0]
    expected = FIT_KEYS if mode in FIT_MODES else ("direct0",) if mode in ("raise", "nan_step") \
        else ()
    assert all(k in ref for k in expected), (mode, sorted(ref))
    assert ("val_loss" in ref) == (mode in FIT_MODES and mode != "rmsprop"), mode
    assert ("lr" in ref) == (mode in FIT_MODES and "schedule" not in mode
                             and mode != "weight_callback"), mode
    weights = sorted(k for k in ref if k.startswith("w"))
    assert weights
    for r in (0, 1):
        got = _load(numerics / ("%s_prio_rank%d.npz" % (mode, r)))
        assert sorted(got) == sorted(ref), mode
        for k in ref:
            want = hvd[r][k] if k in PER_RANK else ref[k]
            atol = 1e-6 if k in PER_RANK else 1e-7
            np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=atol,
                                       err_msg="%s: prio rank %d %s vs Horovod" % (mode, r, k))
    # the comparison is not vacuous: training moved the weights
    assert any(not np.allclose(ref[k], ref["init" + k[1:]]) for k in weights), mode
    # our run went through the overlap pipeline (and the priority scheduler); Horovod's did not
    for r in (0, 1):
        ours = json.load(open(numerics / ("%s_prio_rank%d.json" % (mode, r))))
        theirs = json.load(open(numerics / ("%s_hvd_rank%d.json" % (mode, r))))
        assert ours["submitted"] >= 12 and ours["submitted"] == ours["released"] \
            == ours["completed"], (mode, r, ours)
        assert ours["inflight_bytes"] == 0 and ours["abandoned"] == 0, (mode, r, ours)
        assert theirs["submitted"] == 0 and not theirs["overlap"], (mode, r, theirs)
        if mode in SPARSE_MODES:   # the table's rows were applied in the call, never posted
            assert ours["sparse"] and all("embedding" in n for n in ours["sparse"]), ours
            assert ours["posted"] and not any("embedding" in n for n in ours["posted"]), ours
        (stats,) = ours["overlap"].values()
        assert stats["started"] >= 6 and stats["finished"] == stats["started"], (mode, r, stats)
        layers = 2 if mode in SPARSE_MODES else 4   # the layers that wait (dense ones)
        assert stats["live"] == 0 and stats["waits"] >= layers * stats["finished"], \
            (mode, r, stats)
        assert stats["layers_applied"] == layers * stats["finished"], (mode, r, stats)
        # steps without gradients are dropped: the failed one, bpps' accumulating calls
        assert stats["dropped"] == {"nan_step": 1, "bpps": 12}.get(mode, 0), (mode, r, stats)


# ----------------------------------------------------------------------------- the trace
def _chunk_events(events, kind=None):
    return [e["args"] for e in events if e.get("cat") == "chunk" and e.get("ph") == "i"
            and (kind is None or e["args"]["kind"] == kind)]


@pytest.mark.tf_stack
@pytest.mark.parametrize("controller", CONTROLLERS)
def test_trace_next_forward_overlaps_previous_allreduces(controller, tmp_path):
    """A 7-layer model, 8 KiB chunks, one chunk of credit and Horovod cycling every
    5 ms (so an allreduce lasts longer than the gap between two training calls).
    Counts are required for half of the 24 steps (typically all of them): the
    ordering of a step can depend on the box's load, never its correctness."""
    trace = tmp_path / "trace.json"
    check(horovodrun([WORKER, str(tmp_path), "trace"], controller, timeout=600,
                     env={"HOROVOD_PRIO_TRACE": str(trace), "HOROVOD_CYCLE_TIME": "5"}))
    events = load_trace(str(trace))
    ov = [e for e in events if e.get("cat") == "overlap"]
    finished = [e for e in ov if e["args"]["kind"] == "finish"]
    assert len(finished) == 24, len(finished)                 # every step was applied
    waits = [e for e in ov if e["args"]["kind"] == "wait"]
    assert {e["args"]["task"] for e in waits} == set(range(7))
    allreduce = [e for e in events if e.get("cat") == "chunk" and e.get("ph") == "X"
                 and e["name"].startswith("allreduce ")]
    # 1. the next step's forward asked for a layer whose update was still pending while
    #    the previous step's chunks were in their allreduce
    overlapped = {w["args"]["ticket"] for w in waits if w["args"]["blocked"]
                  and any(a["ts"] < w["ts"] < a["ts"] + a["dur"] for a in allreduce)}
    assert len(overlapped) >= 12, sorted(overlapped)
    # 2. the input-side layer (the last task in backprop order) was updated first, or
    #    second behind the layer of the one chunk that found the link empty (the first
    #    chunk submitted always goes at once, whatever its priority)
    order = collections.defaultdict(list)
    for e in ov:
        if e["args"]["kind"] == "apply":
            order[e["args"]["ticket"]].append(e["args"]["task"])
    first = [tasks[:2] for tasks in order.values()]
    assert sum(6 in f for f in first) >= 12, order
    # 3. every release took the highest priority waiting (replayed independently), and the
    #    input-side group (highest priority) overtook others many times
    waiting, overtakes = {}, 0
    for a in _chunk_events(events):
        if a["kind"] == "ready":
            waiting[a["ticket"]] = a["priority"]
        elif a["kind"] == "release":
            best = max(waiting.values())
            assert a["priority"] == best, (a, sorted(waiting.values()))
            overtakes += a["priority"] == 3 and min(waiting.values()) < 3
            del waiting[a["ticket"]]
    assert overtakes >= 12, overtakes
    # rank 1 ran the same graph: its forward waited per layer too
    assert any(e.get("cat") == "overlap" and e["args"]["kind"] == "wait"
               for e in load_trace(str(tmp_path / "trace.rank1.json")))


# ----------------------------------------------------------------------------- in-process
@pytest.fixture(scope="module")
def tf_env():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import horovod_prio.tensorflow.keras as hvd
    from horovod_prio.tensorflow import overlapped
    hvd.init()
    return tf, hvd, overlapped


class _Bg:
    """A hand-made background loop on a test channel: take the step's slots, hold
    the update until the next training call is seen waiting for it (the
    channel's ``waits_blocked`` count grows), then add the last chunk's sum to
    ``v``, mark the layer applied, finish. Holding it makes the ordering checks
    deterministic: a read that did not wait would see the old ``v`` whatever
    the machine's load. Once the test sets ``flush_now`` (before flushing: no
    call will wait for the last update) updates are applied at once."""

    def __init__(self, tf, overlapped, channel, v, nslots, hold=60.0):
        ops, _ = overlapped._load()
        from horovod_prio.tensorflow.ops import independent

        @tf.function
        def take():
            ticket = independent(ops.hvd_prio_overlap_take_begin(channel=channel.id))
            vals = [independent(ops.hvd_prio_overlap_take(ticket, T=tf.float32, shape=[2],
                                                         channel=channel.id, slot=i))
                    for i in range(nslots)]
            return ticket, vals[-1]

        @tf.function
        def apply(ticket, last):
            upd = v.assign_add(tf.reduce_sum(last))
            with tf.control_dependencies([upd]):
                done = independent(ops.hvd_prio_overlap_layer_done(ticket, channel=channel.id,
                                                                   task=0))
            with tf.control_dependencies([done]):
                independent(ops.hvd_prio_overlap_finish(ticket, channel=channel.id))

        self.errors = []
        self.flush_now = threading.Event()

        def held_until_a_call_waits(seen):
            deadline = time.monotonic() + hold
            while not self.flush_now.is_set():
                n = channel.stats()["waits_blocked"]
                if n > seen:
                    return n
                if time.monotonic() > deadline:
                    raise RuntimeError("no training call waited for this update")
                time.sleep(0.005)
            return seen

        def loop():
            seen = 0
            while True:
                try:
                    ticket, last = take()
                    seen = held_until_a_call_waits(seen)
                    apply(ticket, last)
                except Exception as e:  # noqa: B902 - recorded for the test
                    self.errors.append(e)
                    return
        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()


def _train_fn(tf, overlapped, channel, v, seen):
    """A training call: wait for layer 0, read v (recorded), post a value (slot 0)
    and two chunks (slots 1, 2), the second only after check_numerics(x): a NaN
    makes the call fail part-way; a NaN ``scale`` fails it before any post."""
    ops, _ = overlapped._load()
    from horovod_prio.tensorflow.ops import independent

    @tf.function
    def train(x, scale):
        wait = independent(ops.hvd_prio_overlap_wait(channel=channel.id, task=0))
        with tf.control_dependencies([wait]):
            read = v.read_value()
            ticket = independent(ops.hvd_prio_overlap_begin(channel=channel.id))
        seen.assign(read)
        x = x + 0.0 * read     # what is posted depends on the read, as gradients do
        with tf.control_dependencies([ticket]):     # fail after the step began
            x = x * tf.debugging.check_numerics(scale, "pre")
        posted = [independent(ops.hvd_prio_overlap_post(ticket, x, channel=channel.id, slot=i))
                  for i in (0, 1)]
        with tf.control_dependencies(posted):
            checked = tf.debugging.check_numerics(x, "injected")
        independent(ops.hvd_prio_overlap_post(ticket, checked, channel=channel.id, slot=2))
    return train


@pytest.mark.tf_stack
@pytest.mark.timeout(180)
def test_channel_orders_reads_after_updates_and_fails_loudly_part_way(tf_env):
    tf, hvd, overlapped = tf_env
    ch = overlapped.Channel("test_part_way", ntasks=1, nslots=3, nmeta=1)
    v, seen = tf.Variable(0.0), tf.Variable(-1.0)
    bg = _Bg(tf, overlapped, ch, v, 3)
    train = _train_fn(tf, overlapped, ch, v, seen)
    ones = tf.ones([2])
    for k in range(5):
        # the read of step k waits for step k-1's update (v grows by 2 per step)
        run_with_timeout(lambda: train(ones, 1.0))
        assert seen.numpy() == 2.0 * k
    bg.flush_now.set()
    assert ch.flush(30) and v.numpy() == 10.0
    # a call that fails before it posts a chunk: dropped
    with pytest.raises(tf.errors.InvalidArgumentError, match="pre"):
        run_with_timeout(lambda: train(ones, np.nan))
    assert ch.flush(30) and ch.state() == "open" and ch.stats()["dropped"] == 1
    run_with_timeout(lambda: train(ones, 1.0))
    assert ch.flush(30) and v.numpy() == 12.0
    # a call that fails after posting part of its slots fails the channel, loudly
    bad = tf.constant([1.0, np.nan])
    with pytest.raises(tf.errors.InvalidArgumentError, match="injected"):
        run_with_timeout(lambda: train(bad, 1.0))
    with pytest.raises(overlapped.OverlapError, match="posting only 2 of 3"):
        run_with_timeout(lambda: ch.flush(30))
    assert ch.state() == "failed"
    bg.thread.join(30)                       # the background call ended, it did not hang
    assert not bg.thread.is_alive() and bg.errors
    with pytest.raises(tf.errors.AbortedError, match="posting only 2 of 3"):
        run_with_timeout(lambda: train(ones, 1.0))   # the next step refuses
    ch.close()


@pytest.mark.tf_stack
@pytest.mark.timeout(180)
def test_begin_first_a_wait_skips_its_own_step(tf_env):
    """The product's order: Begin runs first in a call (so chunks are posted during
    the backward pass) and the call's waits come after it. A wait must then skip
    its own, unsealed step (waiting for it would deadlock: the step's update needs
    the posts that come after the read) and still wait for every earlier step."""
    tf, hvd, overlapped = tf_env
    ops, _ = overlapped._load()
    from horovod_prio.tensorflow.ops import independent
    ch = overlapped.Channel("test_begin_first", ntasks=1, nslots=2, nmeta=1)
    v, seen = tf.Variable(0.0), tf.Variable(-1.0)
    bg = _Bg(tf, overlapped, ch, v, 2)

    @tf.function
    def train(x):
        ticket = independent(ops.hvd_prio_overlap_begin(channel=ch.id))
        # a chunk posted before a read, as the backward pass posts one layer's chunk
        # and then reads another layer's weights
        chunk = independent(ops.hvd_prio_overlap_post(ticket, x, channel=ch.id, slot=1))
        with tf.control_dependencies([chunk]):
            wait = independent(ops.hvd_prio_overlap_wait(channel=ch.id, task=0))
        with tf.control_dependencies([wait]):
            read = v.read_value()
        seen.assign(read)
        independent(ops.hvd_prio_overlap_post(ticket, x + 0.0 * read, channel=ch.id, slot=0))

    for k in range(4):
        # the read of step k waits for step k-1's update, and not for step k's own
        run_with_timeout(lambda: train(tf.ones([2])), timeout=30)
        assert seen.numpy() == 2.0 * k
    bg.flush_now.set()
    assert ch.flush(30) and v.numpy() == 8.0 and not bg.errors
    ch.close()


@pytest.mark.tf_stack
@pytest.mark.timeout(180)
def test_a_step_cannot_finish_before_all_its_values_are_taken(tf_env):
    tf, hvd, overlapped = tf_env
    ops, _ = overlapped._load()
    from horovod_prio.tensorflow.ops import independent
    ch = overlapped.Channel("test_finish", ntasks=1, nslots=2, nmeta=1)

    @tf.function
    def post(x):
        ticket = independent(ops.hvd_prio_overlap_begin(channel=ch.id))
        for slot in (0, 1):
            independent(ops.hvd_prio_overlap_post(ticket, x, channel=ch.id, slot=slot))

    @tf.function
    def finish_early():
        ticket = independent(ops.hvd_prio_overlap_take_begin(channel=ch.id))
        x = independent(ops.hvd_prio_overlap_take(ticket, T=tf.float32, shape=[2],
                                                  channel=ch.id, slot=1))
        with tf.control_dependencies([x]):
            independent(ops.hvd_prio_overlap_finish(ticket, channel=ch.id))

    post(tf.ones([2]))
    with pytest.raises(tf.errors.FailedPreconditionError, match="before all its values"):
        run_with_timeout(finish_early)
    ch.close()


@pytest.mark.tf_stack
@pytest.mark.timeout(180)
def test_kernel_misuse_raises_clear_errors(tf_env):
    """Each channel kernel names what is wrong (a ticket that is not a scalar, an
    unknown channel, slot or task, a step that is not live) instead of aborting
    the process or touching another step, and the channel stays usable."""
    tf, hvd, overlapped = tf_env
    ops, _ = overlapped._load()
    ch = overlapped.Channel("test_misuse", ntasks=1, nslots=2, nmeta=1)
    two, one, x = tf.constant([1, 2], tf.int64), tf.constant(1, tf.int64), tf.ones([2])
    bad, gone = tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError
    cases = [
        (lambda: ops.hvd_prio_overlap_post(two, x, channel=ch.id, slot=0), bad,
         r"HvdPrioOverlapPost: ticket must be a scalar, got shape \[2\]"),
        (lambda: ops.hvd_prio_overlap_take(two, T=tf.float32, shape=[2], channel=ch.id, slot=1),
         bad, r"HvdPrioOverlapTake: ticket must be a scalar, got shape \[2\]"),
        (lambda: ops.hvd_prio_overlap_layer_done(two, channel=ch.id, task=0), bad,
         r"HvdPrioOverlapLayerDone: ticket must be a scalar, got shape \[2\]"),
        (lambda: ops.hvd_prio_overlap_finish(two, channel=ch.id), bad,
         r"HvdPrioOverlapFinish: ticket must be a scalar, got shape \[2\]"),
        (lambda: ops.hvd_prio_overlap_begin(channel=ch.id + 1000), bad,
         "no channel %d" % (ch.id + 1000)),
        (lambda: ops.hvd_prio_overlap_post(one, x, channel=ch.id, slot=5), bad,
         r"test_misuse: no slot 5 \(the channel has 2\)"),
        (lambda: ops.hvd_prio_overlap_wait(channel=ch.id, task=1), bad,
         r"test_misuse: no task 1 \(the channel has 1\)"),
        (lambda: ops.hvd_prio_overlap_layer_done(one, channel=ch.id, task=3), bad,
         r"test_misuse: no task 3 \(the channel has 1\)"),
        (lambda: ops.hvd_prio_overlap_layer_done(one, channel=ch.id, task=0), gone,
         "test_misuse: step 1 is not live"),
        (lambda: ops.hvd_prio_overlap_finish(one, channel=ch.id), gone,
         "test_misuse: step 1 is not live"),
        (lambda: ops.hvd_prio_overlap_post(one, x, channel=ch.id, slot=0), gone,
         "test_misuse: post to step 1 after its call ended"),
    ]
    for op, error, message in cases:
        with pytest.raises(error, match=message):
            run_with_timeout(op, timeout=30)
    assert ch.state() == "open"
    stats = ch.stats()
    assert stats["posts"] == stats["layers_applied"] == stats["finished"] == 0, stats
    assert stats["pending_requests"] == 0, stats
    ch.close()


@pytest.mark.tf_stack
@pytest.mark.timeout(180)
def test_pending_wait_ends_with_its_failing_call(tf_env):
    """A wait whose update never comes does not outlive its call when another op fails."""
    tf, hvd, overlapped = tf_env
    ops, _ = overlapped._load()
    from horovod_prio.tensorflow.ops import independent
    ch = overlapped.Channel("test_cancel", ntasks=1, nslots=1)

    @tf.function
    def post(x):
        independent(ops.hvd_prio_overlap_post(
            independent(ops.hvd_prio_overlap_begin(channel=ch.id)), x, channel=ch.id, slot=0))

    @tf.function
    def step(x):
        wait = independent(ops.hvd_prio_overlap_wait(channel=ch.id, task=0))
        with tf.control_dependencies([wait]):
            y = tf.identity(x)
        return y + tf.debugging.check_numerics(x * np.nan, "boom")

    post(tf.ones([2]))            # posted, never applied (no background here)
    # a wait that outlived its call would hang it: run_with_timeout fails the test then
    with pytest.raises(tf.errors.InvalidArgumentError, match="boom"):
        run_with_timeout(lambda: step(tf.ones([2])), timeout=60)
    assert ch.stats()["pending_requests"] == 0
    ch.close()


# ----------------------------------------------------------------------------- misuse
def _mlp(tf, vocab=None):
    tf.keras.utils.set_random_seed(1)
    if vocab:
        return tf.keras.Sequential([tf.keras.layers.Embedding(vocab, 4, input_length=3),
                                    tf.keras.layers.Flatten(), tf.keras.layers.Dense(2)])
    return tf.keras.Sequential([tf.keras.layers.Dense(8, input_shape=(4,)),
                                tf.keras.layers.Dense(2)])


def _xy(vocab=None, n=32):
    rng = np.random.RandomState(0)
    x = rng.randint(0, vocab, size=(n, 3)) if vocab else rng.randn(n, 4).astype("float32")
    return x, rng.randint(0, 2, size=(n,))


@pytest.mark.tf_stack
@pytest.mark.timeout(300)
def test_unsupported_setups_raise_clear_errors(tf_env):
    tf, hvd, overlapped = tf_env
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _xy()

    def compile_with(opt, **kw):
        m = hvd.overlap(_mlp(tf))
        m.compile(optimizer=opt, loss=loss, **kw)
        return m

    with pytest.raises(TypeError, match="not a horovod_prio DistributedOptimizer"):
        compile_with(tf.keras.optimizers.SGD(0.1))
    with pytest.raises(TypeError, match="Nadam.*cannot be applied layer by layer"):
        compile_with(hvd.DistributedOptimizer(tf.keras.optimizers.Nadam()))
    with pytest.raises(ValueError, match="use_ema"):
        compile_with(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, use_ema=True)))
    with pytest.raises(ValueError, match="steps_per_execution=2"):
        compile_with(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)),
                     steps_per_execution=2)
    with pytest.raises(RuntimeError, match="inside a tf.function"):
        compile_with(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), run_eagerly=True)
    m = compile_with(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)))
    m.run_eagerly = True
    with pytest.raises(RuntimeError, match="inside a tf.function"):
        m.fit(x, y, batch_size=8, verbose=0)
    # sparse gradients are applied in the training call: a global norm cannot span both
    xe, ye = _xy(vocab=10)
    me = hvd.overlap(_mlp(tf, vocab=10))
    me.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(
        0.1, global_clipnorm=1.0)), loss=loss)
    with pytest.raises(ValueError, match="global_clipnorm"):
        me.fit(xe, ye, batch_size=8, verbose=0)
    me = hvd.overlap(_mlp(tf, vocab=10))
    me.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                                  backward_passes_per_step=2), loss=loss)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        me.fit(xe, ye, batch_size=8, verbose=0)

    # custom loops
    import horovod_prio.tensorflow as hvd_tf
    model = _mlp(tf)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    hvd.overlap(model, optimizer=opt)
    xb, yb = tf.constant(x[:8]), tf.constant(y[:8])

    with pytest.raises(RuntimeError, match="inside a tf.function"):
        with tf.GradientTape() as tape:
            lv = loss(yb, model(xb))
        opt.minimize(lv, model.trainable_variables, tape=tape)

    @tf.function
    def modified(xb, yb):
        with tf.GradientTape() as tape:
            lv = loss(yb, model(xb))
        gv = opt.compute_gradients(lv, model.trainable_variables, tape=tape)
        opt.apply_gradients([(g * 2.0, v) for g, v in gv])

    with pytest.raises(ValueError, match="not the one this optimizer reduced"):
        modified(xb, yb)

    @tf.function
    def writes(xb, yb):
        model.layers[0].kernel.assign(model.layers[0].kernel * 0.5)
        with tf.GradientTape() as tape:
            lv = loss(yb, model(xb))
        opt.minimize(lv, model.trainable_variables, tape=tape)

    with pytest.raises(ValueError, match="writes the trainable variable"):
        writes(xb, yb)

    tape_model = _mlp(tf)

    @tf.function
    def with_tape(xb, yb):
        with tf.GradientTape() as tape:
            lv = loss(yb, tape_model(xb))
        tape = hvd_tf.DistributedGradientTape(tape, priority={"overlap": True})
        return tape.gradient(lv, tape_model.trainable_variables)

    with pytest.raises(ValueError, match="was not passed to hvd.overlap"):
        with_tape(xb, yb)
    hvd.flush()


@pytest.mark.tf_stack
@pytest.mark.timeout(300)
def test_overlap_on_horovods_own_path_is_a_logged_no_op(tf_env, clean_env, caplog):
    """An optimizer that keeps Horovod's own path (here: Horovod's fusion groups)
    trains synchronously under hvd.overlap, with a warning, never an exception;
    with overlap required (HOROVOD_PRIO_OVERLAP=1) it is a clear error."""
    tf, hvd, overlapped = tf_env
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _xy()
    before = set(overlapped.stats())
    clean_env.delenv("HOROVOD_PRIO_OVERLAP", raising=False)
    runs = []
    for wrap in (True, False):
        m = _mlp(tf)
        if wrap:
            m = hvd.overlap(m)
        with caplog.at_level("WARNING", logger="horovod_prio"):
            m.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                                         num_groups=2,
                                                         name="Groups%s" % wrap), loss=loss)
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        runs.append(m.get_weights())
    assert set(overlapped.stats()) == before           # no overlap state was made
    assert "hvd.overlap does nothing" in caplog.text and "explicit fusion groups" in caplog.text
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    clean_env.setenv("HOROVOD_PRIO_OVERLAP", "1")
    with pytest.raises(ValueError, match="requires barrier crossing"):
        hvd.overlap(_mlp(tf)).compile(optimizer=hvd.DistributedOptimizer(
            tf.keras.optimizers.SGD(0.1), num_groups=2, name="GroupsRequired"), loss=loss)


@pytest.mark.tf_stack
@pytest.mark.timeout(300)
def test_overlap_switch(tf_env, clean_env):
    """HOROVOD_PRIO_OVERLAP=0 (or HOROVOD_PRIO_ENABLED=0): hvd.overlap is a no-op
    (synchronous, same weights as without it); =1 without hvd.overlap: a clear error."""
    tf, hvd, overlapped = tf_env
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _xy()
    before = set(overlapped.stats())
    runs = []
    for env, wrap in (("0", True), ("disabled", True), (None, False), (None, True)):
        clean_env.delenv("HOROVOD_PRIO_OVERLAP", raising=False)
        clean_env.delenv("HOROVOD_PRIO_ENABLED", raising=False)
        if env == "disabled":
            clean_env.setenv("HOROVOD_PRIO_ENABLED", "0")
        elif env is not None:
            clean_env.setenv("HOROVOD_PRIO_OVERLAP", env)
        m = _mlp(tf)
        if wrap:
            m = hvd.overlap(m)
        m.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                                     name="Switch%s%s" % (env, wrap)), loss=loss)
        m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        runs.append(m.get_weights())
        created = set(overlapped.stats()) - before
        assert bool(created) == (env is None and wrap), (env, wrap, created)
    for off, disabled, sync, ovl in zip(*runs):
        np.testing.assert_allclose(off, sync, rtol=1e-6)
        np.testing.assert_allclose(disabled, sync, rtol=1e-6)
        np.testing.assert_allclose(ovl, sync, rtol=1e-5, atol=1e-7)
    clean_env.delenv("HOROVOD_PRIO_ENABLED", raising=False)
    clean_env.setenv("HOROVOD_PRIO_OVERLAP", "1")
    m = _mlp(tf)
    m.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), loss=loss)
    with pytest.raises(ValueError, match="was not passed to hvd.overlap"):
        m.fit(x, y, batch_size=8, verbose=0)


@pytest.mark.tf_stack
def test_overlap_chunk_and_credit_defaults(tf_env, clean_env):
    """Under hvd.overlap, unless given: chunks of an eighth of the step's
    gradient bytes within [1 MiB, 4 MiB] (here 1.18 MiB / 8 -> 1 MiB) and a
    credit of one chunk for the process; a given partition wins."""
    tf, hvd, overlapped = tf_env
    from horovod_prio.scheduler import UNLIMITED, Scheduler
    rt, sched = get_runtime(), Scheduler.process()
    # the runtime is the process's: forget what earlier tests decided, so the
    # credit checked below is the one this test's first optimizer sets
    clean_env.setattr(rt, "overlap_credit", None)
    sched.configure(UNLIMITED, rt.hold)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.RandomState(0)
    x, y = rng.randn(16, 600).astype("float32"), rng.randint(0, 2, size=(16,))
    sizes = {}
    for env in (None, "4MiB"):
        clean_env.delenv("HOROVOD_PRIO_PARTITION_BYTES", raising=False)
        clean_env.delenv("HOROVOD_PRIO_CREDIT_BYTES", raising=False)
        if env:
            clean_env.setenv("HOROVOD_PRIO_PARTITION_BYTES", env)
        tf.keras.utils.set_random_seed(1)
        m = hvd.overlap(tf.keras.Sequential([tf.keras.layers.Dense(512, input_shape=(600,)),
                                             tf.keras.layers.Dense(2)]))
        name = "Defaults%s" % env
        m.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), name=name),
                  loss=loss)
        m.fit(x, y, batch_size=8, epochs=1, verbose=0)
        (st,) = [st for st in get_runtime().overlap_states if st.base.name == name]
        (pipe,) = st.pipelines.values()
        sizes[env] = sorted(c.nbytes for c in pipe.plan.chunks)
    # the 600x512 kernel (1.17 MiB) alone exceeds 1 MiB: cut in two by default
    kernel = (600 * 512 + 512) * 4
    assert sizes[None] == [2 * 513 * 4, kernel - (1 << 20), 1 << 20], sizes
    assert sizes["4MiB"] == [2 * 513 * 4, kernel], sizes
    # one chunk of the first overlapped optimizer (1 MiB), kept by the second
    assert rt.overlap_credit == 1 << 20
    assert sched.stats()["credit_bytes"] == 1 << 20


def test_config_field(clean_env):
    from horovod_prio import PriorityConfig
    assert PriorityConfig().overlap is None
    assert PriorityConfig.from_env({"HOROVOD_PRIO_OVERLAP": "0"}).overlap is False
    assert PriorityConfig.from_env({"HOROVOD_PRIO_OVERLAP": "on"}).overlap is True
    assert PriorityConfig(overlap=True).overlap is True
    with pytest.raises(ValueError, match="HOROVOD_PRIO_OVERLAP"):
        PriorityConfig.from_env({"HOROVOD_PRIO_OVERLAP": "maybe"})


# ----------------------------------------------------------------------------- example, benchmark
@pytest.mark.tf_stack
def test_tape_loop_example_runs(tmp_path):
    out = check(horovodrun(["-m", "horovod_prio.examples.overlap_tape"], "gloo", timeout=300))
    assert out.count("epoch 3: mean loss") == 1 and "done:" in out, out[-3000:]
    acc = float(out.split("epoch 3: mean loss")[1].split("accuracy")[1].split()[0])
    assert acc > 0.8, out[-2000:]                   # it really trained


def test_benchmark_workload_flag(capsys):
    from benchmarks import workload
    assert workload.parse_args(["--impl", "prio", "--out", "x", "--overlap"]).overlap
    assert not workload.parse_args(["--impl", "prio", "--out", "x"]).overlap
    with pytest.raises(SystemExit) as ei:
        workload.parse_args(["--impl", "horovod", "--out", "x", "--overlap"])
    assert ei.value.code == 2 and "--overlap" in capsys.readouterr().err


@pytest.mark.tf_stack
def test_benchmark_workload_runs_with_overlap(tmp_path):
    steps, meta = tmp_path / "steps.jsonl", tmp_path / "meta.json"
    check(horovodrun(["-m", "benchmarks.workload", "--impl", "prio", "--overlap", "--batch", "8",
                      "--steps", "3", "--warmup", "1", "--out", str(steps),
                      "--meta-out", str(meta)], "gloo", timeout=300))
    assert len(steps.read_text().splitlines()) == 4
    assert json.load(open(meta))["overlap"] is True


@pytest.mark.tf_stack
def test_one_inter_op_thread_is_warned_once(tf_env, monkeypatch, caplog):
    """hvd.overlap with one inter-op thread cannot overlap (the background update
    waits for the training call's thread): a warning says so, once."""
    tf, hvd, overlapped = tf_env
    monkeypatch.setattr(get_runtime(), "_said", set())          # say-once memory
    monkeypatch.setattr(tf.config.threading, "get_inter_op_parallelism_threads", lambda: 1)
    with caplog.at_level("WARNING", logger="horovod_prio"):
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), name="OneThread")
        hvd.overlap(opt)
        hvd.overlap(opt)
    hits = [r for r in caplog.records if "inter-op thread" in r.getMessage()]
    assert len(hits) == 1, [r.getMessage() for r in caplog.records]
