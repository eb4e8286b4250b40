"""Runs under horovodrun: a Keras fit with the default PriorityConfig on a
model whose step reduces ~9 MB of gradients (one 1100x2048 kernel), so the
default chunk size (an eighth of that) differs from the largest allowed
(4 MiB). With HOROVOD_PRIO_TRACE set, rank 0's chunk events show the chunks
it really cut. Writes OUT_DIR/rank<r>.json with the gradient bytes per step.
Usage: chunk_size_worker.py OUT_DIR [overlap]  (overlap: the model goes
through hvd.overlap).
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import horovod_prio.tensorflow.keras as hvd

hvd.init()
rank = hvd.rank()
model = tf.keras.Sequential([tf.keras.Input(shape=(1100,)), tf.keras.layers.Dense(2048),
                             tf.keras.layers.Dense(2)])
if sys.argv[2:] == ["overlap"]:
    model = hvd.overlap(model)
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.01)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.RandomState(rank).randn(8, 1100).astype("float32")
y = np.random.RandomState(rank).randint(0, 2, size=8)
model.fit(x, y, batch_size=4, epochs=1, verbose=0)
with open(os.path.join(sys.argv[1], "rank%d.json" % rank), "w") as f:
    json.dump({"step_bytes": sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)},
              f)
