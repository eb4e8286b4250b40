"""Runs under horovodrun: a tiny Keras fit whose job names an arbiter (from
the environment) and sets no class (class 0) and no nice, for the class_auto
tests. Every rank stops before batch ``--pause-at`` and, until OUT_DIR/resume
exists (at most 90 s), writes OUT_DIR/rank<r>.json every 50 ms: the nice
values of its threads and its session's autogroup, so the test sees each
rank's CPU priority change while it registers and drops a higher-class job
and kills the arbiter. Then the fit finishes; rank 0 writes OUT_DIR/done.
"""
import argparse
import json
import logging
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import horovod_prio.tensorflow.keras as hvd
from horovod_prio import PriorityConfig

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from proc_nice import autogroup_nice, thread_nices  # noqa: E402  (tests/proc_nice.py)

p = argparse.ArgumentParser()
p.add_argument("out_dir")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--pause-at", type=int, default=5)
args = p.parse_args()
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
rank = hvd.rank()
tf.keras.utils.set_random_seed(5)
model = tf.keras.Sequential([tf.keras.layers.Dense(24, activation="relu", input_shape=(16,)),
                             tf.keras.layers.Dense(4)])
config = PriorityConfig(num_groups=2, partition_bytes=1024, credit_bytes=4096)
opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.05), priority=config)
model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def nices():
    return {"threads": sorted(set(thread_nices().values())), "autogroup": autogroup_nice()}


class Pause(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch != args.pause_at:
            return
        path = os.path.join(args.out_dir, "rank%d.json" % rank)
        deadline = time.monotonic() + 90
        while not os.path.exists(os.path.join(args.out_dir, "resume")):
            if time.monotonic() > deadline:
                print("rank %d: no resume file within 90 s, carrying on" % rank, flush=True)
                break
            with open(path + ".tmp", "w") as f:
                json.dump(nices(), f)
            os.replace(path + ".tmp", path)
            time.sleep(0.05)


rs = np.random.RandomState(rank)
x = rs.randn(args.steps * 8, 16).astype("float32")
y = rs.randint(0, 4, size=args.steps * 8)
model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Pause()])
if rank == 0:
    open(os.path.join(args.out_dir, "done"), "w").close()
print("rank %d finished" % rank, flush=True)
