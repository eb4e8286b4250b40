"""The shaped-link harness's workload models, in one place for the harness
(``benchmarks/workload.py``) and the profiler
(``benchmarks.profile_model``), so the profile the simulator is
validated with is measured on exactly the benchmarked model.

``harness_model(keras, name)`` takes the ``keras`` module (no TensorFlow
import here):

* ``mlp``: 784-2048-2048-256-10, 6,331,146 parameters (25.3 MB of fp32 gradients);
* ``cnn``: a small CNN on 28x28x1, ~262 k parameters, compute-heavy per byte;
* ``mobilenetv2``: ``keras.applications.MobileNetV2(weights=None)`` on 32x32x3
  images, 10 classes: a real architecture (155 layers, 2,236,682 trainable
  parameters, BatchNorm; nothing downloaded).
"""

HARNESS_MODELS = ("mlp", "cnn", "mobilenetv2", "transformer")
INPUT_SHAPES = {"mlp": (784,), "cnn": (28, 28, 1), "mobilenetv2": (32, 32, 3),
                "transformer": (64, 48)}


def _encoder(keras, layers=4, width=256, heads=4, ffn=1024):
    """A Transformer encoder (ViT-style: 64 patches of 48 values projected to
    ``width``, ``layers`` post-norm blocks of multi-head self-attention and a
    ReLU feed-forward, mean-pooled, 10 classes); 3.2 M parameters."""
    x = inp = keras.Input(shape=INPUT_SHAPES["transformer"])
    x = keras.layers.Dense(width, name="patch_proj")(x)
    for i in range(layers):
        a = keras.layers.MultiHeadAttention(heads, width // heads, name=f"attn{i}")(x, x)
        x = keras.layers.LayerNormalization(name=f"norm{i}a")(x + a)
        f = keras.layers.Dense(ffn, activation="relu", name=f"ffn{i}a")(x)
        f = keras.layers.Dense(width, name=f"ffn{i}b")(f)
        x = keras.layers.LayerNormalization(name=f"norm{i}b")(x + f)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inp, keras.layers.Dense(10, name="head")(x), name="transformer")


def harness_model(keras, name: str):
    if name == "mlp":
        return keras.Sequential([
            keras.Input(shape=(784,)),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10),
        ], name="mlp")
    if name == "cnn":
        return keras.Sequential([
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ], name="cnn")
    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(input_shape=INPUT_SHAPES[name], weights=None,
                                              classes=10, classifier_activation=None)
    if name == "transformer":
        return _encoder(keras)
    raise ValueError(f"unknown harness model {name!r} (choose {', '.join(HARNESS_MODELS)})")
