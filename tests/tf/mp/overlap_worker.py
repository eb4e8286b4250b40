"""Runs under horovodrun: the same training with plain Horovod and with
horovod_prio + ``hvd.overlap`` (barrier crossing), per mode; writes what each
rank observed to OUT_DIR for tests/tf/test_overlap.py to compare.

    horovodrun -np 2 ... python overlap_worker.py OUT_DIR MODE[,MODE...]

Per mode and implementation (``hvd``/``prio``) and rank r, ``<mode>_<impl>_rank<r>.npz``
holds named arrays:

* ``w<i>``: weights after the run (``model.get_weights()``);
* ``init<i>``: weights before training (the comparison must not be vacuous);
* Keras modes also: ``pred`` (predict), ``eval`` (evaluate loss), ``val_loss``
  (fit's per-epoch validation loss; not in ``rmsprop``, which validates
  nothing so that only the epoch-end flush precedes the callbacks),
  ``epoch<e>_<i>`` (weights read *directly* from the variables inside the
  first callback's on_epoch_end: the epoch-end flush happened before
  callbacks), ``end<i>`` (read directly right after fit returned),
  ``ckpt<i>`` (the weights ModelCheckpoint saved after batch 5), ``saved<i>``
  (the model saved by rank 0 only), ``lr`` (learning rate seen by each batch);
* ``raise`` mode (a callback raises at batch 6) and ``nan_step`` mode (the
  step graph of batch 5 fails before anything is posted): ``direct<i>``
  (variables read directly right after the exception left fit), then ``w<i>``
  after a second fit.

``trace`` mode (horovod_prio only, run with HOROVOD_PRIO_TRACE): a deeper
model, 8 KiB chunks and a one-chunk credit, so the trace shows the next step's
forward waiting per layer while the previous step's chunks are still in
their allreduce, released by priority.

``<mode>_<impl>_rank<r>.json``: the scheduler's counters (delta over the run) and
the counters of the overlap channels the run created.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd_keras
import horovod_prio.tensorflow.keras as prio_keras
from horovod_prio import PriorityConfig
from horovod_prio.scheduler import Scheduler
from horovod_prio.tensorflow import overlapped

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd_keras.init()
RANK = hvd_keras.rank()
OUT = sys.argv[1]
STEPS, BATCH, EPOCHS = 12, 16, 2
# Small chunks and several groups so fusion, chunking and splitting all happen.
PRIO = PriorityConfig(num_groups=3, partition_bytes=1024, credit_bytes=2048)
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
TF_216 = tuple(int(v) for v in tf.__version__.split(".")[:2]) >= (2, 16)


def data(n, seed):
    rng = np.random.RandomState(seed + RANK)
    return rng.randn(n, 20).astype("float32"), rng.randint(0, 4, size=(n,)).astype("int32")


X, Y = data(STEPS * BATCH, 100)
XV, YV = data(48, 500)


def mlp():
    tf.keras.utils.set_random_seed(7)  # identical initial weights on every rank
    return tf.keras.Sequential([
        tf.keras.layers.Dense(48, activation="relu", input_shape=(20,)),
        tf.keras.layers.Dense(40, activation="tanh",
                              kernel_constraint=tf.keras.constraints.MaxNorm(1.5)),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(4),
    ])


VOCAB = 50
XE = np.random.RandomState(300 + RANK).randint(0, VOCAB, size=(STEPS * BATCH, 6)).astype("int32")
XEV = np.random.RandomState(600 + RANK).randint(0, VOCAB, size=(48, 6)).astype("int32")


def embedding_model():
    """An Embedding without sparse_as_dense: its gradient is a tf.IndexedSlices of the
    rows the batch touched (ids repeat within a batch: Keras sums duplicate rows)."""
    tf.keras.utils.set_random_seed(7)
    return tf.keras.Sequential([
        tf.keras.layers.Embedding(VOCAB, 8, input_length=6),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(4),
    ])


class BatchLR(tf.keras.callbacks.Callback):
    """Changes the learning rate before every batch (the step must use its own value)."""
    hvd_prio_overlap_safe = True   # touches no weights (only the learning rate)

    def __init__(self, base):
        super().__init__()
        self.base, self.seen = base, []

    def on_train_batch_begin(self, batch, logs=None):
        lr = self.base * (1.0 + 0.25 * (batch % 4))
        tf.keras.backend.set_value(self.model.optimizer.lr, lr)
        self.seen.append(float(tf.keras.backend.get_value(self.model.optimizer.lr)))


class EpochReader(tf.keras.callbacks.Callback):
    """Reads the variables directly (not through a model method) at epoch end."""
    hvd_prio_overlap_safe = True

    def __init__(self):
        super().__init__()
        self.epochs = {}

    def on_epoch_end(self, epoch, logs=None):
        self.epochs[epoch] = [v.numpy() for v in self.model.weights]


class NanAtStep5(tf.keras.Sequential):
    """The step graph of batch 5 fails (check_numerics on the loss) before any gradient."""
    scale = None

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x, y, self(x, training=True))
            loss = tf.debugging.check_numerics(loss * self.scale, "injected NaN")
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return {"loss": loss}


class ScaleNan(tf.keras.callbacks.Callback):
    hvd_prio_overlap_safe = True

    def on_train_batch_begin(self, batch, logs=None):
        self.model.scale.assign(np.nan if batch == 5 else 1.0)


class Raise(tf.keras.callbacks.Callback):
    hvd_prio_overlap_safe = True

    def on_train_batch_end(self, batch, logs=None):
        if batch == 6:
            raise RuntimeError("injected at batch 6")


class ShrinkKernel(tf.keras.callbacks.Callback):
    """A callback that writes a weight after every batch (not declared safe: the
    pending update must be applied before it runs)."""

    def on_train_batch_end(self, batch, logs=None):
        k = self.model.layers[0].kernel
        k.assign(k * 0.99)


def epoch_schedule(epoch, lr):
    return lr * (0.5 if epoch == 1 else 1.0)


def run_fit(impl, name, make_opt, raise_mode=False, nan_mode=False, validate=True,
            lr_callbacks=True, extra_callbacks=(), model_fn=None, **kw):
    mod = prio_keras if impl == "prio" else hvd_keras
    extra = {"priority": PRIO} if impl == "prio" else {}
    model_fn = model_fn or mlp
    x, xv = (XE, XEV) if model_fn is embedding_model else (X, XV)
    model = model_fn()
    if nan_mode:
        model = NanAtStep5(model.layers)
        model.scale = tf.Variable(1.0, trainable=False)
    out = {"init%d" % i: w for i, w in enumerate(model.get_weights())}
    if impl == "prio":
        model = prio_keras.overlap(model)          # the one added line
    model.compile(optimizer=mod.DistributedOptimizer(make_opt(), **kw, **extra), loss=LOSS)
    if raise_mode or nan_mode:
        try:
            model.fit(x, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                      callbacks=[ScaleNan() if nan_mode else Raise()])
            raise AssertionError("fit did not raise")
        except (RuntimeError, tf.errors.InvalidArgumentError) as e:
            assert ("injected NaN" if nan_mode else "injected at batch 6") in str(e), e
        for i, v in enumerate(model.weights):      # no model method: the flush already ran
            out["direct%d" % i] = v.numpy()
        if nan_mode:
            model.scale.assign(1.0)
        model.fit(x, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        out.update({"w%d" % i: w for i, w in enumerate(model.get_weights())})
        return out
    ckpt = os.path.join(OUT, "%s_%s_rank%d_ckpt.h5" % (name, impl, RANK))
    reader = EpochReader()
    callbacks = [reader, tf.keras.callbacks.ModelCheckpoint(ckpt, save_weights_only=True,
                                                            save_freq=5),
                 mod.callbacks.BroadcastGlobalVariablesCallback(0)]
    callbacks += list(extra_callbacks)
    if lr_callbacks:   # (a LearningRateSchedule cannot be set by callbacks)
        batch_lr = BatchLR(0.5 * make_opt().get_config()["learning_rate"])
        callbacks[1:1] = [batch_lr, tf.keras.callbacks.LearningRateScheduler(epoch_schedule)]
    hist = model.fit(x, Y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                     validation_data=(xv, YV) if validate else None, callbacks=callbacks)
    for i, v in enumerate(model.weights):          # no model method: fit flushed at its end
        out["end%d" % i] = v.numpy()
    if validate:   # (validation evaluates, which flushes, before the epoch-end callbacks)
        out["val_loss"] = np.array(hist.history["val_loss"])
    if lr_callbacks:
        out["lr"] = np.array(batch_lr.seen)
    for e, ws in reader.epochs.items():
        out.update({"epoch%d_%d" % (e, i): w for i, w in enumerate(ws)})
    probe = model_fn()
    probe.load_weights(ckpt)
    out.update({"ckpt%d" % i: w for i, w in enumerate(probe.get_weights())})
    out["eval"] = np.array(model.evaluate(xv, YV, verbose=0))
    out["pred"] = model.predict(xv, verbose=0)
    saved = os.path.join(OUT, "%s_%s_saved.h5" % (name, impl))
    if RANK == 0:                                   # a save on one rank only must not hang
        model.save(saved)
    hvd_keras.allreduce(np.zeros(1), name="barrier_%s_%s" % (name, impl))
    probe.load_weights(saved)
    out.update({"saved%d" % i: w for i, w in enumerate(probe.get_weights())})
    out.update({"w%d" % i: w for i, w in enumerate(model.get_weights())})
    state = model.optimizer.__dict__.get("_hvdprio_overlap")
    if state is not None:   # what crossed the barrier, and what was applied in the call
        POSTED[name] = {"posted": sorted(v.name for p in state.pipelines.values()
                                         for v in p.variables),
                        "sparse": sorted(r.deref().name for r in state.sparse_vars)}
    return out


POSTED = {}


def run_tape(impl, name, opt_only=False):
    mod = prio_keras if impl == "prio" else hvd_keras
    extra = {"priority": PRIO} if impl == "prio" else {}
    model = mlp()
    out = {"init%d" % i: w for i, w in enumerate(model.get_weights())}
    opt = mod.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9), **extra)
    if impl == "prio":
        if opt_only:
            prio_keras.overlap(opt)
        else:
            model = prio_keras.overlap(model, optimizer=opt)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        opt.minimize(loss, model.trainable_variables, tape=tape)
        return loss

    for i in range(STEPS):
        step(X[i * BATCH:(i + 1) * BATCH], Y[i * BATCH:(i + 1) * BATCH])
    if impl == "prio" and opt_only:
        prio_keras.flush(opt)
    out.update({"w%d" % i: w for i, w in enumerate(model.get_weights())})
    return out


def run_trace(impl, name):
    config = PriorityConfig(num_groups=4, partition_bytes=8192, credit_bytes=8192)
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(20,))]
                                + [tf.keras.layers.Dense(64, activation="relu") for _ in range(5)]
                                + [tf.keras.layers.Dense(4)])
    out = {"init%d" % i: w for i, w in enumerate(model.get_weights())}
    model = prio_keras.overlap(model)
    model.compile(optimizer=prio_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.01, momentum=0.9), priority=config), loss=LOSS)
    xs, ys = data(24 * 8, 900)
    model.fit(xs, ys, batch_size=8, epochs=1, shuffle=False, verbose=0)
    out.update({"w%d" % i: w for i, w in enumerate(model.get_weights())})
    return out


LEGACY = tf.keras.optimizers.legacy
MODES = {
    "sgd_momentum": lambda impl, n: run_fit(impl, n, lambda: LEGACY.SGD(0.05, momentum=0.9)),
    "adam": lambda impl, n: run_fit(impl, n, lambda: tf.keras.optimizers.Adam(0.01)),
    "rmsprop": lambda impl, n: run_fit(impl, n, lambda: tf.keras.optimizers.RMSprop(0.005),
                                       validate=False),
    "legacy_adam": lambda impl, n: run_fit(impl, n, lambda: LEGACY.Adam(0.01)),
    "bpps": lambda impl, n: run_fit(impl, n, lambda: tf.keras.optimizers.Adam(0.01),
                                    backward_passes_per_step=2),
    "fp16": lambda impl, n: run_fit(impl, n, lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9),
                                    compression=hvd_keras.Compression.fp16),
    "predivide": lambda impl, n: run_fit(impl, n, lambda: tf.keras.optimizers.Adam(0.01),
                                         gradient_predivide_factor=2.0),
    # learning-rate schedules: evaluated at each step's own `iterations`
    "schedule": lambda impl, n: run_fit(
        impl, n, lambda: tf.keras.optimizers.Adam(
            tf.keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=3, decay_rate=0.6)),
        lr_callbacks=False),
    "legacy_schedule": lambda impl, n: run_fit(
        impl, n, lambda: LEGACY.SGD(tf.keras.optimizers.schedules.PiecewiseConstantDecay(
            [5, 15], [0.1, 0.03, 0.01]), momentum=0.9, decay=0.01), lr_callbacks=False),
    "weight_callback": lambda impl, n: run_fit(impl, n, lambda: LEGACY.SGD(0.05, momentum=0.9),
                                               lr_callbacks=False,
                                               extra_callbacks=[ShrinkKernel()]),
    # sparse gradients (an Embedding without sparse_as_dense): rows allgathered, applied
    # in the training call; the dense layers still cross the barrier
    "sparse_adam": lambda impl, n: run_fit(impl, n, lambda: tf.keras.optimizers.Adam(0.01),
                                           model_fn=embedding_model),
    "sparse_legacy_sgd": lambda impl, n: run_fit(impl, n,
                                                 lambda: LEGACY.SGD(0.05, momentum=0.9),
                                                 model_fn=embedding_model),
    "raise": lambda impl, n: run_fit(impl, n, lambda: LEGACY.SGD(0.05, momentum=0.9),
                                     raise_mode=True),
    "nan_step": lambda impl, n: run_fit(impl, n, lambda: tf.keras.optimizers.Adam(0.01),
                                        nan_mode=True),
    "tape": lambda impl, n: run_tape(impl, n),
    "tape_opt_only": lambda impl, n: run_tape(impl, n, opt_only=True),
    "trace": run_trace,
}
PRIO_ONLY = {"trace"}

if __name__ == "__main__":
    sched = Scheduler.process()
    for mode in sys.argv[2].split(","):
        for impl in ("prio",) if mode in PRIO_ONLY else ("hvd", "prio"):
            print("rank %d: %s/%s" % (RANK, mode, impl), flush=True)
            before, channels = sched.stats(), set(overlapped.stats())
            arrays = MODES[mode](impl, mode)
            after = sched.stats()
            np.savez(os.path.join(OUT, "%s_%s_rank%d.npz" % (mode, impl, RANK)), **arrays)
            info = {k: after[k] - before[k] for k in ("submitted", "released", "completed",
                                                      "abandoned", "cancelled")}
            info["inflight_bytes"] = after["inflight_bytes"]
            info["overlap"] = {k: v for k, v in overlapped.stats().items() if k not in channels}
            if impl == "prio":
                info.update(POSTED.pop(mode, {}))
            with open(os.path.join(OUT, "%s_%s_rank%d.json" % (mode, impl, RANK)), "w") as f:
                json.dump(info, f)
    print("rank %d done" % RANK, flush=True)
