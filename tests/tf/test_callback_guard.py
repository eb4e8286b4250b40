"""hvd.overlap's callback guard: which Keras callbacks flush pending updates
before their batch hooks, when, and the warning when that costs a flush per
step (``horovod_prio.tensorflow.keras.callback_guard``)."""
import logging
import os
import types

import numpy as np
import pytest

pytestmark = [pytest.mark.tf_stack, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def env():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import horovod_prio.tensorflow.keras as hvd
    from horovod_prio.tensorflow.keras import callback_guard
    hvd.init()
    return types.SimpleNamespace(tf=tf, hvd=hvd, guard=callback_guard, kc=tf.keras.callbacks)


@pytest.fixture(autouse=True)
def fresh_warnings(env):
    env.guard._warned.clear()


def _user_callback(env, name="StepTimer", **attrs):
    """A user's timing/logging callback with two batch hooks."""
    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(("begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("end", batch))

    def __init__(self):
        env.kc.Callback.__init__(self)
        self.calls = []

    ns = dict(on_train_batch_begin=on_train_batch_begin, on_train_batch_end=on_train_batch_end,
              __init__=__init__)
    ns.update(attrs)
    return type(name, (env.kc.Callback,), ns)()


def _no_flush(d):
    return d.flush == {} and not d.warn


@pytest.mark.parametrize("make", [
    lambda e, t: e.kc.History(),
    lambda e, t: e.kc.ProgbarLogger(),
    lambda e, t: e.kc.BaseLogger(),
    lambda e, t: e.kc.TerminateOnNaN(),
    lambda e, t: e.kc.CSVLogger(str(t / "log.csv")),
    lambda e, t: e.kc.EarlyStopping(restore_best_weights=True),
    lambda e, t: e.kc.TensorBoard(str(t / "tb"), update_freq="epoch"),
    lambda e, t: e.kc.TensorBoard(str(t / "tb"), update_freq=5, write_steps_per_second=True),
    lambda e, t: e.kc.TensorBoard(str(t / "tb"), update_freq="batch", profile_batch=(2, 3)),
    lambda e, t: e.kc.ModelCheckpoint(str(t / "ckpt"), save_freq="epoch"),
    lambda e, t: e.kc.ModelCheckpoint(str(t / "ckpt"), save_freq=3, save_weights_only=True),
    lambda e, t: e.hvd.callbacks.BestModelCheckpoint(),
    lambda e, t: e.kc.BackupAndRestore(str(t / "bk")),
    lambda e, t: e.hvd.callbacks.MetricAverageCallback(),
    lambda e, t: e.hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5),
    lambda e, t: e.hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2),
    lambda e, t: e.kc.LambdaCallback(on_epoch_end=lambda epoch, logs: None),
    lambda e, t: _user_callback(e, hvd_prio_overlap_safe=True),
    lambda e, t: type("TqdmCallback", (e.kc.Callback,), {
        "__module__": "tqdm.keras",
        "on_train_batch_end": lambda self, batch, logs=None: None})(),
], ids=["History", "ProgbarLogger", "BaseLogger", "TerminateOnNaN", "CSVLogger", "EarlyStopping",
        "TensorBoard-epoch", "TensorBoard-int", "TensorBoard-batch-profile",
        "ModelCheckpoint-epoch", "ModelCheckpoint-int", "hvd-BestModelCheckpoint",
        "BackupAndRestore-epoch", "hvd-MetricAverage", "hvd-LRSchedule", "hvd-LRWarmup",
        "Lambda-epoch-only", "user-declared-safe", "tqdm"])
def test_callbacks_that_never_flush(env, tmp_path, make):
    assert _no_flush(env.guard.decide(make(env, tmp_path)))


def test_a_user_callback_declared_safe_on_the_instance(env):
    cb = _user_callback(env)
    cb.hvd_prio_overlap_safe = True
    assert _no_flush(env.guard.decide(cb))


def test_unknown_batch_hooks_flush_every_call_and_warn_once_per_class(env, caplog):
    flushes = []
    a = _user_callback(env)
    b = type(a)()                                   # a second instance of the same class
    lam = env.kc.LambdaCallback(on_batch_end=lambda batch, logs: None)
    with caplog.at_level(logging.INFO, logger="horovod_prio"):
        undo = env.guard.guard([a, b, lam], lambda: flushes.append(1))
        for step in range(3):
            a.on_train_batch_begin(step)
            a.on_train_batch_end(step)
        assert len(flushes) == 6 and a.calls[-1] == ("end", 2)   # the original hook ran
        undo()
        undo = env.guard.guard([a], lambda: flushes.append(1))      # the next fit: no 2nd warning
        undo()
    a.on_train_batch_end(9)
    assert len(flushes) == 6                                        # unwrapped again
    warned = [r for r in caplog.records if "hvd.overlap: callback" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING, logging.WARNING]
    msg = warned[0].getMessage()
    assert "callback StepTimer overrides on_train_batch_begin, on_train_batch_end" in msg
    assert "2 flush(es) per training step" in msg and "hvd_prio_overlap_safe = True" in msg
    assert "callback LambdaCallback overrides on_batch_end" in warned[1].getMessage()


def test_broadcast_flushes_before_its_broadcast_only(env):
    cb = env.hvd.callbacks.BroadcastGlobalVariablesCallback(0)
    d = env.guard.decide(cb)
    assert list(d.flush) == ["on_batch_end"] and not d.warn
    assert d.flush["on_batch_end"](cb)
    cb.broadcast_done = True
    assert not d.flush["on_batch_end"](cb)


def test_backup_and_restore_in_batches_flushes_on_the_batches_it_backs_up(env, tmp_path):
    cb = env.kc.BackupAndRestore(str(tmp_path / "bk"), save_freq=3)
    backups = []

    def on_train_batch_end(batch, logs=None):      # Keras' counting, without a model
        cb._batches_count += 1
        if cb._batches_count >= cb.save_freq:
            cb._batches_count = 0
            backups.append(batch)

    cb.on_train_batch_end = on_train_batch_end
    flushed_before = []
    undo = env.guard.guard([cb], lambda: flushed_before.append(cb._batches_count))
    d = env.guard.decide(cb)
    assert list(d.flush) == ["on_train_batch_end"] and not d.warn
    for batch in range(7):
        cb.on_train_batch_end(batch)
    undo()
    assert backups == [2, 5] and flushed_before == [2, 2]
    assert "on_train_batch_begin" not in cb.__dict__


def _fit_counting_flushes(env, callbacks, steps=6):
    tf, hvd = env.tf, env.hvd
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8),
                                 tf.keras.layers.Dense(2)])
    model = hvd.overlap(model)
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hooks = model._hvdprio_overlap_hooks
    count = []
    real = hooks.flush
    hooks.flush = lambda: (count.append(1), real())[1]
    x = np.random.RandomState(0).rand(8 * steps, 4).astype("float32")
    y = (x[:, 0] > 0.5).astype("int64")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=callbacks)
    return len(count)


def test_fit_flushes_per_step_only_for_unknown_callbacks(env, tmp_path):
    base = _fit_counting_flushes(env, [])                      # start, epoch end, end
    ckpt = env.kc.ModelCheckpoint(str(tmp_path / "w.{batch:02d}.h5"), save_weights_only=True,
                                  save_freq=2)
    assert _fit_counting_flushes(env, [ckpt]) == base + 3      # one per save (steps 2, 4, 6)
    assert len(list(tmp_path.glob("w.*.h5"))) == 3
    tb = env.kc.TensorBoard(str(tmp_path / "tb"), update_freq=1, write_steps_per_second=True)
    assert _fit_counting_flushes(env, [tb]) == base
    assert _fit_counting_flushes(env, [_user_callback(env)]) == base + 12   # 2 hooks x 6 steps
