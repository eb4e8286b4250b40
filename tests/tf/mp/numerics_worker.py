"""Runs under horovodrun: trains the same model with Horovod's and with our
optimizer/tape and writes every rank's final weights, per mode, to OUT_DIR,
plus (for ours) how many chunks went through the priority path
(``<mode>_prio_rank<r>.json``: the scheduler's counters for that mode).

    horovodrun -np 2 ... python numerics_worker.py OUT_DIR MODE[,MODE...]
"""
import json
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
from horovod_prio.scheduler import Scheduler

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
    local_first_layer = kw.pop("local_first_layer", False)
    callbacks = kw.pop("callbacks", None)
    model = embedding_model(vocab) if vocab else mlp()
    if callbacks:  # every rank starts elsewhere: BroadcastGlobalVariablesCallback(0) syncs them
        model.set_weights([w + 0.01 * RANK for w in model.get_weights()])
    INIT["weights"] = model.get_weights()
    opt_cls = kw.pop("opt", tf.keras.optimizers.legacy.SGD)
    lr = kw.pop("lr", 0.05)
    opt = mod.DistributedOptimizer(opt_cls(learning_rate=lr), **kw, **extra)
    if local_first_layer:  # Horovod's local variables: reduced by nobody
        model.build((None, 20))
        for var in model.layers[0].trainable_weights:
            opt.register_local_var(var)
    model.compile(optimizer=opt, loss=LOSS)
    x, y = data(vocab)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=callbacks(mod) if callbacks else None)
    return model.get_weights()


def horovod_callbacks(mod):
    return [mod.callbacks.BroadcastGlobalVariablesCallback(0),
            mod.callbacks.MetricAverageCallback(),
            mod.callbacks.LearningRateWarmupCallback(initial_lr=0.05, warmup_epochs=1,
                                                     steps_per_epoch=STEPS, verbose=0)]


def run_tape(impl, eager=False, partial=False):
    mod = prio_tf if impl == "prio" else hvd_tf
    extra = {"priority": PRIO} if impl == "prio" else {}
    model = mlp()
    INIT["weights"] = model.get_weights()
    opt = tf.keras.optimizers.legacy.SGD(learning_rate=0.05)
    x, y = data()

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        if partial:  # the first layer stays local (Horovod scales its gradient by 1/size)
            tape = mod.PartialDistributedGradientTape(tape, local_layers=model.layers[0], **extra)
        else:
            tape = mod.DistributedGradientTape(tape, **extra)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    fn = step if eager else tf.function(step)
    for i in range(STEPS):
        fn(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    return model.get_weights()


def run_gan(impl, same_class_default_names=False):
    """Two models, two optimizers (or tapes) reduced in the same step, like a
    GAN's generator and discriminator."""
    mod = prio_tf if impl == "prio" else hvd_tf
    extra = {"priority": PRIO} if impl == "prio" else {}
    tf.keras.utils.set_random_seed(7)
    gen = tf.keras.Sequential([tf.keras.layers.Dense(24, activation="tanh", input_shape=(20,)),
                               tf.keras.layers.Dense(20)])
    disc = mlp()
    INIT["weights"] = gen.get_weights() + disc.get_weights()
    opt_g = tf.keras.optimizers.legacy.SGD(learning_rate=0.05)
    opt_d = tf.keras.optimizers.legacy.Adam(learning_rate=0.01) if not same_class_default_names \
        else tf.keras.optimizers.legacy.SGD(learning_rate=0.02)
    x, y = data()

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tg, tf.GradientTape() as td:
            fake = gen(xb, training=True)
            loss_d = LOSS(yb, disc(fake, training=True))
            loss_g = -loss_d + 0.01 * tf.reduce_sum(tf.square(fake))
        tg = mod.DistributedGradientTape(tg, **extra)
        td = mod.DistributedGradientTape(td, **extra)
        gg = tg.gradient(loss_g, gen.trainable_variables)
        gd = td.gradient(loss_d, disc.trainable_variables)
        opt_g.apply_gradients(zip(gg, gen.trainable_variables))
        opt_d.apply_gradients(zip(gd, disc.trainable_variables))

    for i in range(STEPS):
        step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    return gen.get_weights() + disc.get_weights()


def run_two_optimizers_fit(impl):
    """Two DistributedOptimizers of the same class with default names, in one
    Keras model (two sub-models trained in one step by a custom train_step)."""
    mod = prio_keras if impl == "prio" else hvd_keras
    extra = {"priority": PRIO} if impl == "prio" else {}
    a, b = mlp(), mlp()
    INIT["weights"] = a.get_weights() + b.get_weights()
    opt_a = mod.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(learning_rate=0.05), **extra)
    opt_b = mod.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(learning_rate=0.03), **extra)
    x, y = data()

    @tf.function
    def step(xb, yb):
        with tf.GradientTape(persistent=True) as tape:
            la = LOSS(yb, a(xb, training=True))
            lb = LOSS(yb, b(xb * 0.5, training=True))
        opt_a.minimize(la, a.trainable_variables, tape=tape)
        opt_b.minimize(lb, b.trainable_variables, tape=tape)

    for i in range(STEPS):
        step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    return a.get_weights() + b.get_weights()


def run_load_model(impl, tmp_dir):
    """Save a compiled model, reload it with load_model(compression=fp16), train on."""
    mod = prio_keras if impl == "prio" else hvd_keras
    extra = {"priority": PRIO} if impl == "prio" else {}
    model = mlp()
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(learning_rate=0.05), loss=LOSS)
    path = os.path.join(tmp_dir, "m_%s_rank%d.h5" % (impl, RANK))
    model.save(path)
    INIT["weights"] = model.get_weights()
    loaded = mod.load_model(path, custom_objects=None, compression=mod.Compression.fp16,
                            legacy_opts=True, **extra)
    x, y = data()
    loaded.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return loaded.get_weights()


MODES = {
    "fit": lambda impl: run_fit(impl),
    "lr_schedule": lambda impl: run_fit(impl, lr=tf.keras.optimizers.schedules.ExponentialDecay(
        0.05, decay_steps=3, decay_rate=0.5)),
    "local_vars": lambda impl: run_fit(impl, local_first_layer=True),
    "local_vars_bpps": lambda impl: run_fit(impl, local_first_layer=True,
                                            backward_passes_per_step=2),
    "callbacks": lambda impl: run_fit(impl, callbacks=horovod_callbacks),
    "partial_tape": lambda impl: run_tape(impl, partial=True),
    "groups": lambda impl: run_fit(impl, num_groups=2),
    "fit_adam": lambda impl: run_fit(impl, opt=tf.keras.optimizers.Adam),
    "tape": run_tape,
    "tape_eager": lambda impl: run_tape(impl, eager=True),
    "bpps": lambda impl: run_fit(impl, backward_passes_per_step=2),
    "fp16": lambda impl: run_fit(impl, compression=hvd_keras.Compression.fp16),
    "predivide": lambda impl: run_fit(impl, gradient_predivide_factor=2.0),
    "sum": lambda impl: run_fit(impl, op=hvd_keras.Sum),
    "sparse_as_dense": lambda impl: run_fit(impl, vocab=50, sparse_as_dense=True),
    "sparse": lambda impl: run_fit(impl, vocab=50),
    "gan": run_gan,
    "gan_same_class": lambda impl: run_gan(impl, same_class_default_names=True),
    "two_optimizers": run_two_optimizers_fit,
    "load_model": lambda impl: run_load_model(impl, sys.argv[1]),
}

if __name__ == "__main__":
    out_dir, modes = sys.argv[1], sys.argv[2].split(",")
    sched = Scheduler.process()
    for mode in modes:
        for impl in ("hvd", "prio"):
            print("rank %d: %s/%s" % (RANK, mode, impl), flush=True)
            before = sched.stats()
            weights = MODES[mode](impl)
            after = sched.stats()
            np.savez(os.path.join(out_dir, "%s_%s_rank%d.npz" % (mode, impl, RANK)), *weights)
            np.savez(os.path.join(out_dir, "%s_init_rank%d.npz" % (mode, RANK)), *INIT["weights"])
            delta = {k: after[k] - before[k] for k in ("submitted", "released", "completed",
                                                       "abandoned", "cancelled")}
            delta["inflight_bytes"] = after["inflight_bytes"]
            with open(os.path.join(out_dir, "%s_%s_rank%d.json" % (mode, impl, RANK)), "w") as f:
                json.dump(delta, f)
    print("rank %d done" % RANK, flush=True)
