"""Runs under horovodrun: Keras fit with the credit tuner on (HOROVOD_PRIO_AUTOTUNE=1
and an automatic credit); every rank writes its scheduler counters, and rank 0
also, after every batch, the credit its scheduler has beside the tuner's
latest choice (read after handing the finished steps over, with no pump
running, so every choice made so far must be in force)."""
import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import horovod_prio.tensorflow.keras as hvd
from horovod_prio import PriorityConfig
from horovod_prio.runtime import get_runtime
from horovod_prio.scheduler import Scheduler

OUT = sys.argv[1]
logging.basicConfig(level=logging.INFO, format="%(message)s")
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
rank = hvd.rank()
tf.keras.utils.set_random_seed(3)
model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(32,))]
                            + [tf.keras.layers.Dense(64, activation="relu") for _ in range(4)]
                            + [tf.keras.layers.Dense(8)])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.01),
                               priority=PriorityConfig(autotune=True, partition_bytes=4096))
model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
n = 8 * 80
x = np.random.RandomState(rank).randn(n, 32).astype("float32")
y = np.random.RandomState(rank).randint(0, 8, size=n)
in_force = []                  # (scheduler's credit, tuner's latest choice) per batch


class CreditInForce(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        rt = get_runtime()
        rt.pump()
        state = rt.autotune_state()
        if state is not None:
            in_force.append((state["credit_bytes"], state["choice"]))


model.fit(x, y, batch_size=8, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), CreditInForce()])
with open(os.path.join(OUT, "rank%d.json" % rank), "w") as f:
    json.dump(dict(Scheduler.process().stats(), in_force=in_force), f)
print("rank %d done" % rank, flush=True)
