"""Barrier crossing in a custom ``tf.GradientTape`` loop (docs/overlap.md).

The next step's forward pass starts on a layer as soon as this step's update of
that layer is reduced and applied; input-side layers (needed first, ready
last) have the highest priority. The math is synchronous data-parallel SGD.

    horovodrun -np 2 -H localhost:2 --gloo python -m horovod_prio.examples.overlap_tape

What changes against a plain Horovod tape loop:

1. the optimizer is a ``DistributedOptimizer`` (not a ``DistributedGradientTape``);
2. one line, ``model = hvd.overlap(model, optimizer=opt)``;
3. the step calls ``opt.minimize(loss, vars, tape=tape)`` inside a ``tf.function``
   (or ``opt.apply_gradients(opt.compute_gradients(loss, vars, tape=tape))``:
   the pairs must be passed on unchanged; clip with the optimizer's
   ``clipnorm``/``clipvalue``/``global_clipnorm``);
4. weights read outside the step go through the model's methods
   (``get_weights``, ``save``, ``evaluate``, ``predict``, ... flush first), or
   call ``hvd.flush()`` first (e.g. before ``model(x)`` or a checkpoint).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import horovod_prio.tensorflow.keras as hvd  # noqa: E402


def main(epochs=3, batch=32):
    hvd.init()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    shard = slice(hvd.rank(), None, hvd.size())
    ds = (tf.data.Dataset.from_tensor_slices((x[shard], y[shard]))
          .shuffle(2000, seed=hvd.rank()).batch(batch, drop_remainder=True))

    tf.keras.utils.set_random_seed(0)   # the same initial weights on every rank
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(128, activation="relu", input_shape=(64,)),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05 * hvd.size(), momentum=0.9))
    model = hvd.overlap(model, optimizer=opt)           # <- barrier crossing

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        # Posts this step's gradients; each layer's update is reduced and applied in
        # the background, and the next call's forward waits per layer for it.
        opt.minimize(loss, model.trainable_variables, tape=tape)
        return loss

    for epoch in range(epochs):
        losses = [float(train_step(xb, yb)) for xb, yb in ds]
        # predict() applies the pending update first (so do get_weights, save, evaluate, ...)
        acc = float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))
        if hvd.rank() == 0:
            print("epoch %d: mean loss %.4f, accuracy %.3f" % (epoch + 1, np.mean(losses), acc),
                  flush=True)
    hvd.flush()   # nothing pending before the process ends (also done at exit)
    w = model.get_weights()
    if hvd.rank() == 0:
        print("done: %d weight tensors, first kernel norm %.4f" % (len(w), np.linalg.norm(w[0])))


if __name__ == "__main__":
    main()
