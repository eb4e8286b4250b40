"""Runs under horovodrun: failure paths of the priority path.

    failure_worker.py OUT_DIR failed_step   # step FAIL_AT fails on every rank after
                                            # chunks were released (gate -> hvd.allreduce
                                            # -> done path); training goes on
    failure_worker.py OUT_DIR failed_step_one_op  # the same step fails on every rank
                                            # before its HvdPrioAllreduce ops run
    failure_worker.py OUT_DIR progress      # Keras fit that reports each step (the test
                                            # kills rank 0 with SIGKILL mid-run)
    failure_worker.py OUT_DIR elastic       # Keras fit under hvd.elastic.run with KerasState,
                                            # Horovod's optimizer and ours (elastic launch)
"""
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import horovod_prio.tensorflow as hvd
import horovod_prio.tensorflow.keras as hvd_keras
from horovod_prio import PriorityConfig
from horovod_prio.scheduler import Scheduler
from horovod_prio.tensorflow import fusion, ops

OUT, MODE = sys.argv[1], sys.argv[2]
STEPS, FAIL_AT, BATCH = 12, 5, 16
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
RANK = hvd.rank()
# 1 KiB chunks, 2 KiB credit: at the failure some chunks are in flight on
# rank 0 and others still held by their gates.
PRIO = PriorityConfig(num_groups=3, partition_bytes=1024, credit_bytes=2048)


def mlp():
    tf.keras.utils.set_random_seed(7)
    return tf.keras.Sequential([tf.keras.layers.Dense(48, activation="relu", input_shape=(20,)),
                                tf.keras.layers.Dense(40, activation="tanh"),
                                tf.keras.layers.Dense(4)])


def failed_step():
    # The chunk's collective fails after its gate released it: an error raised
    # where our fusion hands each chunk to Horovod. Step FAIL_AT's loss is
    # scaled by NaN, so every gradient (every chunk) is NaN on every rank and
    # every chunk fails its check: nothing of that step reaches Horovod on any
    # rank (a collective submitted by one rank only would stall Horovod itself).
    def checked(real):
        def call(x, *args, **kwargs):
            # (independent: tf.function would chain this stateful op in program
            # order across chunks, against the scheduler's order)
            x = ops.independent(tf.debugging.check_numerics(x, "injected failure"))
            return real(x, *args, **kwargs)
        return call

    if MODE == "failed_step":
        # the three-op path (kept for GPU tensors): fail between gate and Horovod
        fusion.PriorityAllreduce._one_op = lambda self: False
        fusion._hvd.allreduce = checked(fusion._hvd.allreduce)
    else:
        # one HvdPrioAllreduce per chunk: fail just before it
        fusion.ops.allreduce = checked(fusion.ops.allreduce)
    model = mlp()
    opt = tf.keras.optimizers.legacy.SGD(learning_rate=0.05)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.RandomState(100 + RANK)
    x = rng.randn(STEPS * BATCH, 20).astype("float32")
    y = rng.randint(0, 4, size=(STEPS * BATCH,)).astype("int32")
    scale = np.ones(STEPS, "float32")
    scale[FAIL_AT] = np.nan

    @tf.function
    def step(xb, yb, s):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True)) * s
        tape = hvd.DistributedGradientTape(tape, priority=PRIO)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    failed = []
    sched = Scheduler.process()
    for i in range(STEPS):
        try:
            step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH], scale[i])
        except tf.errors.InvalidArgumentError as e:
            assert "injected failure" in str(e), e
            failed.append(i)
            after_failure = sched.stats()
    np.savez(os.path.join(OUT, "weights_rank%d.npz" % RANK), *model.get_weights())
    with open(os.path.join(OUT, "failed_rank%d.json" % RANK), "w") as f:
        json.dump({"failed": failed, "after_failure": after_failure, "end": sched.stats()}, f)


def progress():
    model = mlp()
    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.01), priority=PRIO)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(True))
    with open(os.path.join(OUT, "pid_rank%d" % RANK), "w") as f:
        f.write(str(os.getpid()))

    class Report(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if RANK == 0:
                with open(os.path.join(OUT, "progress.tmp"), "w") as f:
                    f.write(str(batch))
                os.replace(os.path.join(OUT, "progress.tmp"), os.path.join(OUT, "progress"))
            time.sleep(0.02)

    n = 100000
    x = np.random.RandomState(RANK).randn(n, 20).astype("float32")
    y = np.random.RandomState(RANK).randint(0, 4, size=n)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[Report()])


def elastic():
    """Horovod's elastic Keras recipe, once with Horovod's optimizer and once with ours:
    the same weights, and ours says it takes Horovod's own path."""
    import horovod.tensorflow.keras as plain_keras
    x = np.random.RandomState(RANK).randn(8 * 16, 20).astype("float32")
    y = np.random.RandomState(RANK).randint(0, 4, size=8 * 16)
    out = {}
    for impl, mod in (("hvd", plain_keras), ("prio", hvd_keras)):
        model = mlp()
        model.set_weights([w + 0.01 * RANK for w in model.get_weights()])  # synced by the state
        extra = {"priority": PRIO} if impl == "prio" else {}
        opt = mod.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.05), **extra)
        model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(True))
        state = mod.elastic.KerasState(model, batch=0, epoch=0)

        @mod.elastic.run
        def train(state):
            state.model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                            callbacks=[mod.elastic.CommitStateCallback(state, batches_per_commit=4),
                                       mod.elastic.UpdateBatchStateCallback(state),
                                       mod.elastic.UpdateEpochStateCallback(state)])

        train(state)
        out[impl] = model.get_weights()
    np.savez(os.path.join(OUT, "elastic_rank%d.npz" % RANK), *(out["hvd"] + out["prio"]))


{"failed_step": failed_step, "failed_step_one_op": failed_step, "progress": progress,
 "elastic": elastic}[MODE]()
print("rank %d done" % RANK, flush=True)
