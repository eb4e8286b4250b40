"""A Horovod TF2 Keras example script, in the shape of Horovod's own
tensorflow2_keras_mnist.py, on scikit-learn's bundled digits data.

It is written for plain Horovod. To schedule its gradients by priority change
only the import line to ``import horovod_prio.tensorflow.keras as hvd``.

    horovodrun -np 2 -H localhost:2 --gloo python keras_digits.py [CHECKPOINT_DIR]
"""
import os
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
from sklearn.datasets import load_digits

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

digits = load_digits()
images = (digits.images / 16.0).astype(np.float32)[..., np.newaxis]
labels = digits.target.astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((images, labels))
dataset = dataset.repeat().shuffle(2000, seed=hvd.rank()).batch(64)

digits_model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(16, [3, 3], activation='relu', input_shape=(8, 8, 1)),
    tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation='relu'),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation='softmax')
])
loss = tf.losses.SparseCategoricalCrossentropy()

# Horovod: adjust learning rate based on number of workers.
scaled_lr = 0.002 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(
    opt, backward_passes_per_step=1, average_aggregated_gradients=True)

# Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
# uses hvd.DistributedOptimizer() to compute gradients.
digits_model.compile(loss=loss,
                     optimizer=opt,
                     metrics=['accuracy'],
                     experimental_run_tf_function=False)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first three epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
checkpoint_dir = sys.argv[1] if len(sys.argv) > 1 else '.'
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(
        os.path.join(checkpoint_dir, 'checkpoint-{epoch}.h5')))

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0

# Train the model.
# Horovod: adjust number of steps based on number of GPUs.
digits_model.fit(dataset, steps_per_epoch=60 // hvd.size(), callbacks=callbacks, epochs=4,
                 verbose=verbose)
