"""Model profiles for the simulator: per-layer compute time and gradient size.

A profile is a list of layers in **forward order** (input side first), each
with the number of trainable parameters and the forward / backward compute
time of one batch on one worker. Layers with 0 parameters contribute compute
time only (no gradient, no communication task).

JSON format (``format`` = :data:`PROFILE_FORMAT`), written by
:func:`save_profile` and by :mod:`benchmarks.profile_model`::

    {"format": "horovod_prio.sim.profile/1", "name": "resnet50",
     "source": "architecture table, 10 TFLOP/s effective", "batch_size": 64,
     "dtype_bytes": 4,
     "layers": [{"name": "conv1", "params": 9472,
                 "forward_s": 0.0012, "backward_s": 0.0024}, ...]}

A layer may list ``"tensors"``: its gradients' element counts in variable
order (kernel, bias, ...), as the binding cuts them; without it the layer is
one gradient of ``params`` elements.

Built-in tables (:data:`BUILTIN`) are computed from the published
architectures (exact trainable parameter counts: ResNet-50 25,557,032,
VGG-16 138,357,544, BERT-base + 2-way classifier 109,483,778) and a FLOP count
per layer, turned into time with one assumed *effective* throughput
(:data:`DEFAULT_TFLOPS` = 10 TFLOP/s, about what a V100 sustains in fp32 on
ResNet-50: ~400 images/s). Backward = 2 x forward FLOPs.
"""
from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from ..method.plan import TensorSpec

PROFILE_FORMAT = "horovod_prio.sim.profile/1"
DEFAULT_TFLOPS = 10.0


@dataclass(frozen=True)
class Layer:
    """``tensors``: the element counts of the layer's gradients in variable
    order, as the binding sees them (e.g. kernel, bias); empty: one gradient
    of ``params`` elements."""

    name: str
    params: int
    forward_s: float
    backward_s: float
    tensors: Tuple[int, ...] = ()

    @property
    def gradients(self) -> Tuple[int, ...]:
        return self.tensors or ((self.params,) if self.params > 0 else ())


@dataclass(frozen=True)
class Profile:
    """A model profile; ``layers`` in forward (input-first) order."""

    name: str
    layers: Tuple[Layer, ...]
    batch_size: int = 0
    dtype_bytes: int = 4
    source: str = ""

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def grad_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def forward_s(self) -> float:
        return sum(layer.forward_s for layer in self.layers)

    @property
    def backward_s(self) -> float:
        return sum(layer.backward_s for layer in self.layers)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def num_tasks(self) -> int:
        return sum(1 for layer in self.layers if layer.params > 0)

    def gradients(self) -> Tuple[List[TensorSpec], List[List[int]]]:
        """``(tensors, tasks)`` as the binding builds them for the same model
        (:func:`horovod_prio.tensorflow.fusion.layer_tasks`): the gradients in
        forward variable order, one task per layer with parameters, in
        backprop order (task 0 is the output-side layer)."""
        dtype = "float%d" % (8 * self.dtype_bytes)
        tensors: List[TensorSpec] = []
        tasks: List[List[int]] = []
        for layer in self.layers:
            if layer.params > 0:
                tasks.append([len(tensors) + i for i in range(len(layer.gradients))])
                tensors += [TensorSpec(n, dtype, self.dtype_bytes) for n in layer.gradients]
        tasks.reverse()
        return tensors, tasks

    def scaled(self, factor: float) -> "Profile":
        """Same sizes, compute times multiplied by ``factor`` (> 0)."""
        if not (isinstance(factor, numbers.Real) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"compute scale must be a finite number > 0, got {factor!r}")
        return Profile(self.name, tuple(Layer(l.name, l.params, l.forward_s * factor,
                                              l.backward_s * factor, l.tensors)
                                        for l in self.layers),
                       self.batch_size, self.dtype_bytes, self.source)

    def as_dict(self) -> Dict:
        return {"format": PROFILE_FORMAT, "name": self.name, "source": self.source,
                "batch_size": self.batch_size, "dtype_bytes": self.dtype_bytes,
                "params": self.params,
                "layers": [dict({"name": l.name, "params": l.params, "forward_s": l.forward_s,
                                 "backward_s": l.backward_s},
                                **({"tensors": list(l.tensors)} if l.tensors else {}))
                           for l in self.layers]}


def profile_from_dict(d: Dict, where: str = "profile") -> Profile:
    """Validate and build a :class:`Profile`; ``ValueError`` names the bad field."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
    fmt = d.get("format", PROFILE_FORMAT)
    if fmt != PROFILE_FORMAT:
        raise ValueError(f"{where}: field 'format' must be {PROFILE_FORMAT!r}, got {fmt!r}")
    layers = d.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"{where}: field 'layers' must be a non-empty list")
    out = []
    for i, l in enumerate(layers):
        if not isinstance(l, dict):
            raise ValueError(f"{where}: layers[{i}] must be an object")
        p = l.get("params")
        if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 0:
            raise ValueError(f"{where}: layers[{i}].params must be an integer >= 0, got {p!r}")
        times = []
        for key in ("forward_s", "backward_s"):
            v = l.get(key)
            if (isinstance(v, bool) or not isinstance(v, numbers.Real)
                    or not math.isfinite(v) or v < 0):
                raise ValueError(
                    f"{where}: layers[{i}].{key} must be a finite number >= 0, got {v!r}")
            times.append(float(v))
        ts = l.get("tensors", [])
        if (not isinstance(ts, list) or any(isinstance(n, bool) or not isinstance(n, numbers.Integral)
                                            or n < 0 for n in ts)
                or (ts and sum(ts) != p)):
            raise ValueError(f"{where}: layers[{i}].tensors must be a list of integers >= 0 "
                             f"adding up to params ({p}), got {ts!r}")
        out.append(Layer(str(l.get("name", f"layer{i}")), int(p), times[0], times[1],
                         tuple(int(n) for n in ts)))
    if not any(l.params > 0 for l in out):
        raise ValueError(f"{where}: no layer has params > 0 (nothing to communicate)")
    db = d.get("dtype_bytes", 4)
    if isinstance(db, bool) or not isinstance(db, numbers.Integral) or db < 1:
        raise ValueError(f"{where}: field 'dtype_bytes' must be an integer >= 1, got {db!r}")
    bs = d.get("batch_size", 0)
    if isinstance(bs, bool) or not isinstance(bs, numbers.Integral) or bs < 0:
        raise ValueError(f"{where}: field 'batch_size' must be an integer >= 0, got {bs!r}")
    return Profile(str(d.get("name", "model")), tuple(out), int(bs), int(db),
                   str(d.get("source", "")))


def load_profile(path: str) -> Profile:
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read profile {path!r}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"profile {path!r} is not valid JSON: {e}") from None
    return profile_from_dict(d, where=path)


def save_profile(profile: Profile, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(profile.as_dict(), f, indent=1)
        f.write("\n")


# --------------------------------------------------------------- builders
def _from_flops(name: str, rows: Sequence[Tuple[str, int, float]], batch: int,
                tflops: float, source: str) -> Profile:
    """rows: (layer name, params, forward FLOPs per sample)."""
    if not (isinstance(tflops, numbers.Real) and math.isfinite(tflops) and tflops > 0):
        raise ValueError(f"tflops must be a finite number > 0, got {tflops!r}")
    rate = tflops * 1e12
    layers = tuple(Layer(n, p, f * batch / rate, 2.0 * f * batch / rate) for n, p, f in rows)
    return Profile(name, layers, batch, 4, f"{source}; {tflops:g} TFLOP/s effective, "
                                           f"batch {batch}, backward = 2 x forward FLOPs")


def resnet50(batch_size: int = 64, tflops: float = DEFAULT_TFLOPS) -> Profile:
    """ResNet-50 v1.5 (torchvision layout, 224x224): 54 tasks (conv+BN, fc)."""
    rows: List[Tuple[str, int, float]] = []

    def conv(name, k, cin, cout, hw_out):
        rows.append((name, k * k * cin * cout + 2 * cout, 2.0 * k * k * cin * cout * hw_out ** 2))

    conv("conv1", 7, 3, 64, 112)
    cin = 64
    for stage, (blocks, width, hw) in enumerate(((3, 64, 56), (4, 128, 28), (6, 256, 14),
                                                 (3, 512, 7)), start=2):
        for b in range(blocks):
            p = f"conv{stage}_{b + 1}"
            conv(p + "a", 1, cin, width, hw if (b or stage == 2) else hw * 2)
            conv(p + "b", 3, width, width, hw)
            conv(p + "c", 1, width, 4 * width, hw)
            if b == 0:
                conv(p + "_down", 1, cin, 4 * width, hw)
            cin = 4 * width
    rows.append(("fc", 2048 * 1000 + 1000, 2.0 * 2048 * 1000))
    return _from_flops("resnet50", rows, batch_size, tflops, "ResNet-50 architecture table")


def vgg16(batch_size: int = 64, tflops: float = DEFAULT_TFLOPS) -> Profile:
    """VGG-16 (224x224): 13 conv + 3 fc tasks."""
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
           512, 512, 512, "M"]
    rows: List[Tuple[str, int, float]] = []
    cin, hw, i = 3, 224, 0
    for c in cfg:
        if c == "M":
            hw //= 2
            continue
        i += 1
        rows.append((f"conv{i}", 9 * cin * c + c, 2.0 * 9 * cin * c * hw * hw))
        cin = c
    for j, (a, b) in enumerate(((25088, 4096), (4096, 4096), (4096, 1000)), start=1):
        rows.append((f"fc{j}", a * b + b, 2.0 * a * b))
    return _from_flops("vgg16", rows, batch_size, tflops, "VGG-16 architecture table")


def bert_base(batch_size: int = 32, seq_len: int = 128,
              tflops: float = DEFAULT_TFLOPS) -> Profile:
    """BERT-base (12 x 768, 30522 vocab) fine-tuning with a 2-way classifier:
    embeddings, 12 x (attention, FFN), pooler, classifier = 27 tasks.
    ``batch_size`` sequences of ``seq_len`` tokens; FLOPs counted per sequence."""
    h, ff, L = 768, 3072, seq_len
    rows: List[Tuple[str, int, float]] = []
    emb = 30522 * h + 512 * h + 2 * h + 2 * h
    rows.append(("embeddings", emb, 10.0 * h * L))  # lookup + LayerNorm: negligible
    for i in range(12):
        attn = 4 * (h * h + h) + 2 * h
        attn_flops = L * (2.0 * 4 * h * h) + 2 * (2.0 * L * L * h)  # proj + QK^T, AV
        rows.append((f"layer{i}.attention", attn, attn_flops))
        ffn = (h * ff + ff) + (ff * h + h) + 2 * h
        rows.append((f"layer{i}.ffn", ffn, L * 2.0 * 2 * h * ff))
    rows.append(("pooler", h * h + h, 2.0 * h * h))
    rows.append(("classifier", h * 2 + 2, 2.0 * h * 2))
    return _from_flops("bert-base", rows, batch_size, tflops,
                       f"BERT-base architecture table, seq {seq_len}")


def mlp(sizes: Sequence[int] = (784, 2048, 2048, 256, 10), compute_s: float = 0.0,
        name: str = "mlp") -> Profile:
    """Dense MLP; total fwd+bwd compute ``compute_s`` split by FLOPs (bwd = 2 x fwd).

    The default (784-2048-2048-256-10, 4 Dense layers) has 6,331,146 params,
    the emulated-link harness's "6.3 M-param MLP"."""
    rows = [(f"dense{i}", a * b + b, float(a * b)) for i, (a, b) in
            enumerate(zip(sizes, sizes[1:]))]
    total = sum(f for _, _, f in rows)
    layers = tuple(Layer(n, p, compute_s * f / total / 3.0, 2.0 * compute_s * f / total / 3.0)
                   for n, p, f in rows)
    return Profile(name, layers, 0, 4, f"MLP {'-'.join(map(str, sizes))}, compute "
                                       f"{compute_s:g} s/step given")


BUILTIN = {"resnet50": resnet50, "vgg16": vgg16, "bert-base": bert_base}


def get_profile(spec: str, tflops: float = DEFAULT_TFLOPS) -> Profile:
    """A built-in name (:data:`BUILTIN`) or a path to a profile JSON."""
    if spec in BUILTIN:
        return BUILTIN[spec](tflops=tflops)
    if spec.endswith(".json") or os.path.exists(spec):
        return load_profile(spec)
    raise ValueError(f"unknown model {spec!r}: choose from {', '.join(BUILTIN)} "
                     f"or give a profile .json path")
