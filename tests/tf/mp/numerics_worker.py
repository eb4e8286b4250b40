"""Runs under horovodrun: trains the same model with Horovod's and with our
optimizer/tape and writes every rank's final weights, per mode, to OUT_DIR.

    horovodrun -np 2 ... python numerics_worker.py OUT_DIR MODE[,MODE...]
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd_keras
import horovod_prio.tensorflow as prio_tf
import horovod_prio.tensorflow.keras as prio_keras
from horovod_prio import PriorityConfig

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
hvd_keras.init()
RANK = hvd_keras.rank()
STEPS, BATCH = 12, 16
# Small chunks and several groups so fusion, chunking and splitting all happen.
PRIO = PriorityConfig(num_groups=3, partition_bytes=1024, credit_bytes=2048)


def data(vocab=None):
    rng = np.random.RandomState(100 + RANK)
    if vocab:
        x = rng.randint(0, vocab, size=(STEPS * BATCH, 6)).astype("int32")
    else:
        x = rng.randn(STEPS * BATCH, 20).astype("float32")
    y = rng.randint(0, 4, size=(STEPS * BATCH,)).astype("int32")
    return x, y


def mlp():
    tf.keras.utils.set_random_seed(7)  # identical initial weights on every rank
    return tf.keras.Sequential([
        tf.keras.layers.Dense(48, activation="relu", input_shape=(20,)),
        tf.keras.layers.Dense(40, activation="tanh"),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(4),
    ])


def embedding_model(vocab):
    tf.keras.utils.set_random_seed(7)
    return tf.keras.Sequential([
        tf.keras.layers.Embedding(vocab, 8, input_length=6),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(4),
    ])


LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


INIT = {}


def run_fit(impl, **kw):
    mod = prio_keras if impl == "prio" else hvd_keras
    extra = {"priority": PRIO} if impl == "prio" else {}
    vocab = kw.pop("vocab", None)
    model = embedding_model(vocab) if vocab else mlp()
    INIT["weights"] = model.get_weights()
    opt_cls = kw.pop("opt", tf.keras.optimizers.legacy.SGD)
    opt = mod.DistributedOptimizer(opt_cls(learning_rate=0.05), **kw, **extra)
    model.compile(optimizer=opt, loss=LOSS)
    x, y = data(vocab)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def run_tape(impl, eager=False):
    mod = prio_tf if impl == "prio" else hvd_tf
    extra = {"priority": PRIO} if impl == "prio" else {}
    model = mlp()
    INIT["weights"] = model.get_weights()
    opt = tf.keras.optimizers.legacy.SGD(learning_rate=0.05)
    x, y = data()

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        tape = mod.DistributedGradientTape(tape, **extra)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    fn = step if eager else tf.function(step)
    for i in range(STEPS):
        fn(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    return model.get_weights()


MODES = {
    "fit": lambda impl: run_fit(impl),
    "fit_adam": lambda impl: run_fit(impl, opt=tf.keras.optimizers.Adam),
    "tape": run_tape,
    "tape_eager": lambda impl: run_tape(impl, eager=True),
    "bpps": lambda impl: run_fit(impl, backward_passes_per_step=2),
    "fp16": lambda impl: run_fit(impl, compression=hvd_keras.Compression.fp16),
    "predivide": lambda impl: run_fit(impl, gradient_predivide_factor=2.0),
    "sum": lambda impl: run_fit(impl, op=hvd_keras.Sum),
    "sparse_as_dense": lambda impl: run_fit(impl, vocab=50, sparse_as_dense=True),
    "sparse": lambda impl: run_fit(impl, vocab=50),
}

if __name__ == "__main__":
    out_dir, modes = sys.argv[1], sys.argv[2].split(",")
    for mode in modes:
        for impl in ("hvd", "prio"):
            print("rank %d: %s/%s" % (RANK, mode, impl), flush=True)
            weights = MODES[mode](impl)
            np.savez(os.path.join(out_dir, "%s_%s_rank%d.npz" % (mode, impl, RANK)), *weights)
            np.savez(os.path.join(out_dir, "%s_init_rank%d.npz" % (mode, RANK)), *INIT["weights"])
    print("rank %d done" % RANK, flush=True)
