"""Runs under horovodrun: Keras fit with hvd.callbacks.PrioritySummaryCallback;
rank 0 reads back the TensorBoard scalars it wrote and saves what it found.

    horovodrun -np 2 ... python summary_worker.py OUT_DIR
"""
import collections
import glob
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import horovod_prio.tensorflow.keras as hvd
from horovod_prio import PriorityConfig

OUT = sys.argv[1]
tf.config.threading.set_inter_op_parallelism_threads(2)
hvd.init()
RANK = hvd.rank()
tf.keras.utils.set_random_seed(7)
model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(20,)),
                             tf.keras.layers.Dense(4)])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.05),
                               priority=PriorityConfig(num_groups=2, partition_bytes=1024))
model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(True))
rng = np.random.RandomState(RANK)
x, y = rng.randn(96, 20).astype("float32"), rng.randint(0, 4, size=96)
cb = hvd.callbacks.PrioritySummaryCallback(log_dir=os.path.join(OUT, "tb"))
model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
if RANK == 0:
    tags = collections.Counter()
    steps = collections.defaultdict(list)
    for path in glob.glob(os.path.join(OUT, "tb", "horovod_prio", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags[value.tag] += 1
                steps[value.tag].append(event.step)
    with open(os.path.join(OUT, "summary.json"), "w") as f:
        json.dump({"tags": tags, "steps": steps, "summary": cb.summary}, f)
else:
    assert cb.summary is None          # only rank 0 times steps and summarises
print("rank %d done" % RANK, flush=True)
