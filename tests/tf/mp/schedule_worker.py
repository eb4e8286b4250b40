"""Runs under horovodrun: a Keras fit with many small chunks, a tiny credit,
rank-skewed random delays between steps, chosen slow steps on rank 0 (the
test hook that makes the monitor raise the boost: the delay is inside the
step's graph, because the monitor measures the step itself, not the gaps
between steps) and an optional crash.

With HOROVOD_PRIO_TRACE set, every rank writes its chunk events (rank 0 to
that path, rank r to <stem>.rank<r>.json); the test compares them.
"""
import argparse
import json
import logging
import os
import random
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import horovod_prio.tensorflow.keras as hvd
from horovod_prio import PriorityConfig

p = argparse.ArgumentParser()
p.add_argument("out_dir")
p.add_argument("--steps", type=int, default=120)
p.add_argument("--slow", default="", help="comma-separated batch indices slowed on rank 0")
p.add_argument("--slow-seconds", type=float, default=0.5)
p.add_argument("--jitter", type=float, default=0.02, help="max random delay per step, per rank")
p.add_argument("--kill-rank", type=int, default=-1)
p.add_argument("--kill-step", type=int, default=-1)
args = p.parse_args()
logging.basicConfig(level=logging.INFO, format="%(message)s")

tf.config.threading.set_inter_op_parallelism_threads(4)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
rank = hvd.rank()
rng = random.Random(1000 + rank)
slow = {int(s) for s in args.slow.split(",") if s}

# Seconds the next step sleeps inside its graph (set on rank 0 for the slow
# steps; every rank has the op, so the graphs stay identical).
delay = tf.Variable(0.0, trainable=False)


def _sleep(seconds):
    time.sleep(float(seconds))
    return np.float32(0.0)


class InGraphDelay(tf.keras.layers.Layer):
    def call(self, x):
        z = tf.ensure_shape(tf.numpy_function(_sleep, [delay], tf.float32), [])
        return x + tf.stop_gradient(z)


tf.keras.utils.set_random_seed(3)
model = tf.keras.Sequential([tf.keras.Input(shape=(32,)), InGraphDelay(),
                             tf.keras.layers.Dense(64, activation="relu")]
                            + [tf.keras.layers.Dense(64, activation="relu") for _ in range(6)]
                            + [tf.keras.layers.Dense(8)])
config = PriorityConfig(num_groups=4, partition_bytes=1024, credit_bytes=1024,
                        coefficient=0.2, count_threshold=4, max_boost=3, warmup_batches=3,
                        adjust_groups=1, step=2)
opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.01), priority=config)
model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
steps_done = []


class Hooks(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == args.kill_step and rank == args.kill_rank:
            print("rank %d: simulated crash at step %d" % (rank, batch), flush=True)
            os._exit(17)
        time.sleep(rng.uniform(0, args.jitter))  # skews readiness between ranks
        delay.assign(args.slow_seconds if rank == 0 and batch in slow else 0.0)

    def on_train_batch_end(self, batch, logs=None):
        steps_done.append(batch)


x = np.random.RandomState(rank).randn(args.steps * 8, 32).astype("float32")
y = np.random.RandomState(rank).randint(0, 8, size=args.steps * 8)
model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Hooks()])
with open(os.path.join(args.out_dir, "rank%d.json" % rank), "w") as f:
    json.dump({"rank": rank, "steps": len(steps_done)}, f)
print("rank %d finished %d steps" % (rank, len(steps_done)), flush=True)
