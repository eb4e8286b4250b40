"""Measure a per-layer profile of a tf.keras model for ``horovod-prio sim``.

Times the forward and the backward pass of every layer of a Keras model on
this machine (CPU), one batch, and writes the simulator's profile JSON
(:mod:`horovod_prio.sim.profiles`)::

    python -m benchmarks.profile_model --model mlp --batch 32 \\
        --threads 1 --out results/sim/profile_mlp_b32.json
    horovod-prio sim --model results/sim/profile_mlp_b32.json ...

Method: one forward pass of the whole model on a random batch records every
layer's input(s) (a functional model's layers may read several earlier
outputs: residual adds, concatenations - e.g. ``--model mobilenetv2``); a
model without a functional graph is treated as a chain (each layer's input is
the previous layer's output). For each layer a ``tf.function`` computing its
output, and one computing the gradients of ``sum(output * r)`` (fixed random
``r``) w.r.t. its input(s) and its trainable weights, are each timed
(best of ``repeats`` after ``warmup`` calls: the minimum is the least
disturbed by other processes); backward = gradient call - forward call
(floored at 0). TensorFlow is imported only when a function
here is called.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional


def _tf():
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: WPS433 (lazy on purpose)
    return tf


def builtin_model(name: str):
    """The harness's workloads (benchmarks/models.py): ``mlp`` (784-2048-
    2048-256-10, 6,331,146 params), ``cnn`` (small CNN on 28x28x1),
    ``mobilenetv2`` (Keras' MobileNetV2, ``weights=None``, 32x32x3, 10 classes)
    and ``transformer`` (a 4-block Transformer encoder on 64 patches of 48
    values, 3,174,154 params)."""
    from benchmarks.models import HARNESS_MODELS, harness_model
    if name not in HARNESS_MODELS:
        raise ValueError(f"--model: unknown built-in model {name!r} (choose "
                         f"{', '.join(HARNESS_MODELS)} or a saved Keras model path)")
    return harness_model(_tf().keras, name)


def _best_time(fn, args, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn(*args)
        # force completion
        if isinstance(out, (list, tuple)):
            for o in out:
                if o is not None:
                    o.numpy()
        else:
            out.numpy()
        times.append(time.perf_counter() - t)
    # the minimum: least disturbed by other processes on the machine
    return min(times)


def _positional_inputs(layer) -> int:
    """How many positional tensors the model passed ``layer`` (2 for
    ``MultiHeadAttention()(query, value)``; 1 for a layer given one tensor or
    one list, e.g. ``Add()([a, b])``)."""
    nodes = getattr(layer, "_inbound_nodes", None) or []
    args = getattr(nodes[0], "call_args", None) if len(nodes) == 1 else None
    return len(args) if isinstance(args, (tuple, list)) and args else 1


def _layer_fns(tf, layer, x):
    """tf.functions: forward of ``layer``, and gradients of ``sum(out * r)``
    w.r.t. its input(s) and trainable weights. A layer the model called with
    several positional tensors gets them the same way."""
    spread = _positional_inputs(layer) > 1 and isinstance(x, (list, tuple))

    def call(inp):
        return layer(*inp, training=True) if spread else layer(inp, training=True)
    fwd = tf.function(call)
    r = tf.random.normal(tf.shape(fwd(x)))
    weights = list(layer.trainable_variables)

    def grad(inp):
        with tf.GradientTape() as tape:
            tape.watch(inp)
            loss = tf.reduce_sum(call(inp) * r)
        return tape.gradient(loss, tf.nest.flatten(inp) + weights)
    return fwd, tf.function(grad)


def _layer_inputs(tf, model, layers, x):
    """Each layer's input value(s) on batch ``x`` from one forward pass of a
    functional model, or ``None`` when the model has no functional graph (or
    a layer is called more than once: its input is ambiguous)."""
    try:
        if any(len(getattr(layer, "_inbound_nodes", ())) != 1 for layer in layers):
            return None
        # a layer called with several positional tensors (attention's query and value,
        # the same tensor twice for self-attention): each of them, in order
        symbolic = [list(layer._inbound_nodes[0].call_args) if _positional_inputs(layer) > 1
                    else layer.input for layer in layers]
        extractor = tf.keras.Model(model.inputs, tf.nest.flatten(symbolic))
    except (AttributeError, ValueError, TypeError):
        return None
    values = extractor(x, training=True)
    if not isinstance(values, (list, tuple)):
        values = [values]
    return tf.nest.pack_sequence_as(symbolic, list(values))


def profile_model(model, batch_size: int, *, warmup: int = 3, repeats: int = 10,
                  name: Optional[str] = None, seed: int = 0, threads: Optional[int] = None):
    """Return a :class:`horovod_prio.sim.profiles.Profile` of ``model``.

    ``model`` is a built tf.keras model: functional (any graph of layers,
    each called once) or a chain of layers.
    ``threads`` sets TF intra/inter-op threads (must be called before TF
    runs anything in this process for it to take effect).
    """
    from horovod_prio.sim.profiles import Layer, Profile
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    for label, v in (("warmup", warmup), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if label == "warmup" else 1):
            raise ValueError(f"{label} must be an integer >= {0 if label == 'warmup' else 1}, "
                             f"got {v!r}")
    tf = _tf()
    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:
            pass  # TF already initialised; keep its settings
    tf.random.set_seed(seed)
    shape = model.inputs[0].shape if getattr(model, "inputs", None) else model.input_shape
    x = tf.random.normal([batch_size] + [int(d) for d in list(shape)[1:]])
    layers = []
    todo = [layer for layer in model.layers
            if not isinstance(layer, tf.keras.layers.InputLayer)]
    inputs = _layer_inputs(tf, model, todo, x)
    for k, layer in enumerate(todo):
        if inputs is not None:
            x = inputs[k]
        fwd, grad = _layer_fns(tf, layer, x)
        y = fwd(x)
        wts = list(layer.trainable_variables)
        t_f = _best_time(fwd, (x,), warmup, repeats)
        t_g = _best_time(grad, (x,), warmup, repeats)
        sizes = tuple(int(tf.size(w)) for w in wts)
        layers.append(Layer(layer.name, sum(sizes), t_f, max(t_g - t_f, 0.0), sizes))
        x = y
    import platform
    src = (f"measured with benchmarks.profile_model on {platform.machine()} CPU, "
           f"TF {tf.__version__}, threads {threads or 'default'}, best of {repeats}")
    return Profile(name or model.name, tuple(layers), batch_size, 4, src)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_model",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp",
                   help="mlp | cnn | mobilenetv2 | transformer | path of a saved Keras model")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.batch < 1:
        p.error(f"argument --batch: must be >= 1, got {a.batch}")
    if a.threads < 1:
        p.error(f"argument --threads: must be >= 1, got {a.threads}")
    tf = _tf()
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    from benchmarks.models import HARNESS_MODELS
    if a.model in HARNESS_MODELS:
        model = builtin_model(a.model)
    else:
        model = tf.keras.models.load_model(a.model, compile=False)
    prof = profile_model(model, a.batch, warmup=a.warmup, repeats=a.repeats,
                         threads=a.threads)
    from horovod_prio.sim.profiles import save_profile
    save_profile(prof, a.out)
    print(f"{prof.name}: {len(prof.layers)} layers, {prof.params:,} params, forward "
          f"{prof.forward_s * 1e3:.2f} ms, backward {prof.backward_s * 1e3:.2f} ms "
          f"(batch {a.batch}) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
