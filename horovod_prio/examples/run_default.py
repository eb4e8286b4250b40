"""`make run`: a real 2-rank Gloo training job on localhost with horovod_prio.

Launches ``horovodrun -np 2 -H localhost:2 --gloo`` on itself; each rank trains
a small Keras MLP on scikit-learn's bundled digits data (nothing downloaded)
with ``horovod_prio.tensorflow.keras.DistributedOptimizer``. Rank 0 prints
per-step time, the policy's priority events and the final accuracy.

    python -m horovod_prio.examples.run_default [--np 2] [--epochs 3] [--impl prio|horovod]
"""
import argparse
import logging
import os
import shutil
import subprocess
import sys
import time


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    p.add_argument("--impl", choices=("prio", "horovod"), default="prio")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for field in ("np", "epochs", "batch_size"):
        if getattr(a, field) < 1:
            p.error("--%s must be >= 1, got %d" % (field.replace("_", "-"), getattr(a, field)))
    return a


def launch(a):
    exe = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    if not exe:
        sys.exit("horovodrun not found: run `make install` first")
    cmd = [exe, "-np", str(a.np), "-H", "localhost:%d" % a.np, "--gloo", "--network-interface", "lo",
           sys.executable, "-m", "horovod_prio.examples.run_default", "--worker",
           "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--impl", a.impl]
    print("$ " + " ".join(cmd), flush=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    return subprocess.call(cmd, env=env)


def worker(a):
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    if a.impl == "prio":
        import horovod_prio.tensorflow.keras as hvd
    else:
        import horovod.tensorflow.keras as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    order = np.random.RandomState(0).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    x_train, y_train = x[:split][rank::size], y[:split][rank::size]  # each rank its shard
    x_test, y_test = x[split:], y[split:]

    tf.keras.utils.set_random_seed(42)
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(512, activation="relu", input_shape=(64,)),
        tf.keras.layers.Dense(512, activation="relu"),
        tf.keras.layers.Dense(256, activation="relu"),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(0.001 * size))
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class StepTimes(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if rank == 0:
                print("epoch %d step %3d  %.1f ms  loss %.4f" % (
                    self.epoch, batch, 1e3 * (time.perf_counter() - self.t), logs["loss"]), flush=True)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

    model.fit(x_train, y_train, batch_size=a.batch_size, epochs=a.epochs, shuffle=True, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback(), StepTimes()])
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    if rank == 0:
        print("final test accuracy: %.4f (%s, %d ranks)" % (acc, a.impl, size), flush=True)


def main(argv=None):
    a = parse(argv)
    if a.worker:
        worker(a)
        return 0
    return launch(a)


if __name__ == "__main__":
    sys.exit(main())
