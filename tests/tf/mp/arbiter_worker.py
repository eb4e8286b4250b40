"""Runs under horovodrun: a tiny Keras fit with many small chunks, for the
cross-job arbiter tests. The arbiter is configured through the environment
(HOROVOD_PRIO_ARBITER / _LINK / _JOB_ID / _ARBITER_SECRET), or not at all.

Rank 0 writes OUT_DIR/weights.npz (final weights) and OUT_DIR/rank0.json
(arbiter client counters, scheduler stats). With ``--pause-at N`` rank 0
stops before batch N, writes OUT_DIR/paused (with the client counters so far)
and waits (at most 60 s) for OUT_DIR/resume before carrying on: the test kills
the arbiter in between.
"""
import argparse
import json
import logging
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import horovod_prio.tensorflow.keras as hvd
from horovod_prio import PriorityConfig
from horovod_prio.runtime import get_runtime
from horovod_prio.scheduler import Scheduler

p = argparse.ArgumentParser()
p.add_argument("out_dir")
p.add_argument("--steps", type=int, default=40)
p.add_argument("--seed", type=int, default=5)
p.add_argument("--pause-at", type=int, default=-1)
args = p.parse_args()
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
rank = hvd.rank()

tf.keras.utils.set_random_seed(args.seed)  # identical initial weights on every rank and run
model = tf.keras.Sequential([tf.keras.layers.Dense(24, activation="relu", input_shape=(16,))]
                            + [tf.keras.layers.Dense(24, activation="relu") for _ in range(3)]
                            + [tf.keras.layers.Dense(4)])
# 1 KiB chunks, 4 KiB local credit: several requests per job reach the arbiter at once.
config = PriorityConfig(num_groups=3, partition_bytes=1024, credit_bytes=4096,
                        warmup_batches=2, count_threshold=4)
opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.05), priority=config)
model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def link_counters():
    al = get_runtime().arbiter
    return None if al is None else al.counters


class Pause(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if rank != 0 or batch != args.pause_at:
            return
        with open(os.path.join(args.out_dir, "paused.tmp"), "w") as f:
            json.dump({"batch": batch, "counters": link_counters()}, f)
        os.replace(os.path.join(args.out_dir, "paused.tmp"), os.path.join(args.out_dir, "paused"))
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(args.out_dir, "resume")):
            if time.monotonic() > deadline:
                print("rank 0: no resume file within 60 s, carrying on", flush=True)
                break
            time.sleep(0.05)


rs = np.random.RandomState(100 * args.seed + rank)
x = rs.randn(args.steps * 8, 16).astype("float32")
y = rs.randint(0, 4, size=args.steps * 8)
hist = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                 callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Pause()])
if rank == 0:
    np.savez(os.path.join(args.out_dir, "weights.npz"), *model.get_weights())
    with open(os.path.join(args.out_dir, "rank0.json"), "w") as f:
        json.dump({"counters": link_counters(), "scheduler": Scheduler.process().stats(),
                   "loss": float(hist.history["loss"][-1])}, f)
print("rank %d finished" % rank, flush=True)
