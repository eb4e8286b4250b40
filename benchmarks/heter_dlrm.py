"""DLRM on synthetic Criteo-like data: plain Horovod data parallelism vs the
heterogeneous trainers (``horovod_prio.heter``), on the testbed's hosts.

    sudo .venv/bin/python -m benchmarks.heter_dlrm --rates 300mbit,1gbit,unshaped --repeats 3
    sudo .venv/bin/python -m benchmarks.heter_dlrm --quick          # small tables, few steps
    .venv/bin/python -m benchmarks.heter_dlrm --report-only --out DIR

The model: 26 categorical fields (one table each, rows in the proportions of
the Criteo Kaggle cardinalities, scaled to ``--table-gb`` in total, at least
``--min-rows``), ``--hot`` Zipf-distributed ids per field and sample (mean
pooled), 13 dense features through a bottom MLP to the embedding dimension, a
dot interaction of the 27 vectors, a top MLP to one logit; Adagrad (or
``--optimizer``).

Hosts (``benchmarks.testbed``: network namespaces, one tbf-shaped uplink
between two racks, a cgroup per host kind): ``a1``, ``a2`` on rack A of kind
``--kind-memory`` (default ``large-memory``), ``b1`` on rack B of kind
``--kind-cores`` (default ``more-cores``, its memory raised to
``--uncapped-memory`` so that plain Horovod can hold the tables there).

* plain Horovod: one rank per host (``-H a1:1,a2:1,b1:1``), each with the
  whole model (tables replicated, initialised from the same seed), a tape
  step with ``hvd.DistributedGradientTape`` (embedding gradients are
  ``IndexedSlices``: Horovod allgathers them, its default), each rank its
  slice of the global batch;
* heter: parameter-server shards on ``a1`` and ``a2``, the sparse trainer on
  ``a1``, the dense trainer on ``b1`` (``-H a1:2,a2:1,b1:1``, roles
  ``ps=0+2,sparse=[1],dense=[3]``); the model is built with placeholder tables,
  so the tables exist only as the shards' rows.

The same global batches (a pool of ``--pool`` batches drawn once, cycled),
``--warmup`` steps then ``--steps`` timed ones, repeats interleaved (plain,
heter, heter, plain, ...). Per run: s/step and samples/s (the window from the
last rank's end of warm-up to the last rank's end of the last step), peak RSS
per rank (``VmHWM``) and per host (the cgroup's peak usage), bytes per step
over the uplink and over the whole fabric (veth counters, interpolated at the
window's ends) beside the payload bound computed from the ids of the batches
actually drawn (:func:`heter_bound`, :func:`plain_bound`). Then the memory-cap
scenario: ``b1``'s memory capped (``--cap-memory``; ``auto`` = halfway
between what ``b1`` used under heter and under plain Horovod); plain Horovod
OOMs there (recorded as status ``oom``, a result) and heter trains.

Writes OUT/results.json.gz (summaries only), OUT/results.md, OUT/throughput.png.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from horovod_prio.method import units

from . import results_io

FIELDS, DENSE_FEATURES = 26, 13
#: Criteo Kaggle (display advertising challenge) cardinalities of C1..C26: the
#: tables' relative sizes
CRITEO_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
               3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
               142572)
UNSHAPED = "unshaped"
#: "unshaped" is a tbf far above what a veth pair carries on this box
UNSHAPED_RATE = "100gbit"
SYSTEMS = ("plain", "heter")
#: ``--optimizer``: the Keras optimizer both systems train with (the
#: parameter-server shards apply the same rule to the tables)
OPTIMIZERS = {"adagrad": ("Adagrad", 0.05), "adam": ("Adam", 0.001), "sgd": ("SGD", 0.05)}
#: --malloc-tuning -> HOROVOD_PRIO_MALLOC_TUNING in both systems' ranks (None: unset)
MALLOC_TUNING = {"default": None, "off": "0", "all": "1"}
HOSTS = {"a1": "A", "a2": "A", "b1": "B"}
PLAIN_H = "a1:1,a2:1,b1:1"
#: MLPerf DLRMv2's multi-hot sizes of the 26 fields (its synthetic multi-hot
#: Criteo): ``--hot mlperf``
MLPERF_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


def heter_layout(sparse_trainers: int) -> dict:
    """Ranks, hosts and roles of the heter job: a parameter-server shard on
    each large-memory host (a1, a2) with ``sparse_trainers`` sparse trainers
    beside them (1: on a1; 2: one on each), the dense trainer on the
    more-cores host b1. Sparse trainer s sits beside shard s."""
    if sparse_trainers == 1:
        return {"H": "a1:2,a2:1,b1:1", "roles": "ps=0+2,sparse=[1],dense=[3]", "np": 4,
                "where": sorted([("ps", "a1"), ("sparse", "a1"), ("ps", "a2"), ("dense", "b1")])}
    if sparse_trainers == 2:
        # the sparse trainers take local rank 0 of their host: Horovod 0.28.1's Gloo
        # process-set set-up names a set's cross-host context by the local rank within
        # the set, so with ps=0+2,sparse=1+3 ranks 1 and 4 both join "cross0" of
        # sparse_dense as its rank 0 (of sizes 2 and 1) and hvd.init hangs
        return {"H": "a1:2,a2:2,b1:1", "roles": "sparse=0+2,ps=1+3,dense=[4]", "np": 5,
                "where": sorted([("ps", "a1"), ("sparse", "a1"), ("ps", "a2"), ("sparse", "a2"),
                                 ("dense", "b1")])}
    raise ValueError(f"--sparse-trainers: 1 or 2, got {sparse_trainers}")


def parse_hot(text: str):
    """``--hot``: ids per field and sample, one number for every field or
    ``mlperf`` (:data:`MLPERF_HOT`) -> a list of 26."""
    if str(text).strip().lower() == "mlperf":
        return list(MLPERF_HOT)
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hot: expected a positive integer or 'mlperf', "
                                         f"got {text!r}")
    if v < 1:
        raise argparse.ArgumentTypeError(f"--hot: expected a positive integer or 'mlperf', got {v}")
    return [v] * FIELDS


def host_threads(kinds: dict) -> dict:
    """TensorFlow threads per rank on each host: its CPU limit rounded up
    (1 without one), the same for both systems."""
    import math
    return {h: max(1, math.ceil(lim.cpu)) if lim.cpu else 1 for h, (_, lim) in kinds.items()}
ID_BYTES, FLOAT_BYTES = 8, 4


# ---------------------------------------------------------------- configuration (pure)
def table_rows(table_gb: float, dim: int, min_rows: int) -> list[int]:
    """Rows of the 26 tables: Criteo's proportions scaled so the tables hold
    ``table_gb`` GB (10^9 bytes) of float32 rows, each at least ``min_rows``."""
    scale = table_gb * 1e9 / (sum(CRITEO_ROWS) * dim * FLOAT_BYTES)
    return [max(int(min_rows), int(round(c * scale))) for c in CRITEO_ROWS]


def _pos_int(name):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected a positive integer, got {text!r}")
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name}: expected a positive integer, got {v}")
        return v
    return parse


def _pos_float(name):
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected a positive number, got {text!r}")
        if not v > 0:
            raise argparse.ArgumentTypeError(f"{name}: expected a positive number, got {v:g}")
        return v
    return parse


def parse_rates(text: str) -> list[str]:
    """``300mbit,1gbit,unshaped`` -> the list; a rate tc cannot read is an error naming it."""
    out = []
    for r in (p.strip() for p in str(text).split(",")):
        if not r:
            raise argparse.ArgumentTypeError(f"--rates: empty rate in {text!r}")
        if r != UNSHAPED:
            try:
                units.check("--rates", units.parse_rate_bits_per_s, r)
            except ValueError as e:
                raise argparse.ArgumentTypeError(f"{e} (or {UNSHAPED!r})")
        if r in out:
            raise argparse.ArgumentTypeError(f"--rates: {r!r} given twice")
        out.append(r)
    return out


def parse_systems(text: str) -> list[str]:
    """``--systems plain,heter`` -> the list in the harness's order; an
    unknown or repeated name is an error naming it."""
    names = [x.strip() for x in str(text).split(",")]
    for x in names:
        if x not in SYSTEMS:
            raise argparse.ArgumentTypeError(f"--systems: unknown system {x!r}, give "
                                             f"{' and/or '.join(SYSTEMS)}")
        if names.count(x) > 1:
            raise argparse.ArgumentTypeError(f"--systems: {x!r} given twice")
    return [x for x in SYSTEMS if x in names]


def run_order(systems: list[str], rep: int) -> list[str]:
    """The systems of repeat ``rep``: alternating order (A B, B A, ...)."""
    return list(systems) if rep % 2 == 0 else list(systems)[::-1]


def keras_optimizer(cfg: dict):
    """The optimizer both systems train with (``cfg["optimizer"]``, Adagrad
    in configs recorded before the flag)."""
    import tensorflow as tf
    name, lr = OPTIMIZERS[cfg.get("optimizer", "adagrad")]
    return getattr(tf.keras.optimizers, name)(lr)


def _cap(text: str):
    if text == "auto":
        return text
    try:
        return units.check("--cap-memory", units.parse_bytes, text, 4 << 20)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} (or 'auto')")


def _kind(flag):
    def parse(text):
        from .cgroups import parse_kind
        try:
            parse_kind(text, flag)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e))
        return text
    return parse


QUICK = dict(table_gb=0.1, steps=6, warmup=2, repeats=1, batch=512, pool=4,
             rates=["1gbit"])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.heter_dlrm",
                                description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=parse_rates, default=["300mbit", "1gbit", UNSHAPED],
                   help="uplink rates, comma-separated (tc units, or 'unshaped')")
    p.add_argument("--repeats", type=_pos_int("--repeats"), default=3)
    p.add_argument("--steps", type=_pos_int("--steps"), default=10, help="timed steps per run")
    p.add_argument("--warmup", type=_pos_int("--warmup"), default=3)
    p.add_argument("--batch", type=_pos_int("--batch"), default=2048, help="global batch")
    p.add_argument("--pool", type=_pos_int("--pool"), default=8,
                   help="distinct global batches drawn, cycled")
    p.add_argument("--table-gb", type=_pos_float("--table-gb"), default=1.0,
                   help="total size of the 26 tables, GB of float32 rows")
    p.add_argument("--min-rows", type=_pos_int("--min-rows"), default=4)
    p.add_argument("--dim", type=_pos_int("--dim"), default=16)
    p.add_argument("--hot", type=parse_hot, default=parse_hot("mlperf"),
                   help="ids per field and sample: a number, or 'mlperf' (MLPerf DLRMv2's "
                        "multi-hot sizes, 1 to 100 per field)")
    p.add_argument("--sparse-trainers", type=int, choices=(1, 2), default=2,
                   help="heter: sparse trainers, beside the shards on a1 (1) or a1 and a2 (2)")
    p.add_argument("--zipf", type=_pos_float("--zipf"), default=1.05,
                   help="Zipf exponent of the ids (> 1)")
    p.add_argument("--bottom", default="256,64", help="bottom MLP widths (then --dim)")
    p.add_argument("--top", default="256,128", help="top MLP widths (then 1)")
    p.add_argument("--kind-memory", type=_kind("--kind-memory"), default="large-memory",
                   help="host kind of a1, a2 (parameter-server shards, sparse trainer)")
    p.add_argument("--kind-cores", type=_kind("--kind-cores"), default="more-cores",
                   help="host kind of b1 (dense trainer)")
    p.add_argument("--uncapped-memory", type=_cap, default=8 << 30,
                   help="b1's memory in the throughput runs (plain Horovod must fit)")
    p.add_argument("--cap-memory", type=_cap, default="auto",
                   help="b1's memory in the memory-cap scenario (bytes, or 'auto')")
    p.add_argument("--cap-rate", default=UNSHAPED, help="uplink rate of the cap scenario")
    p.add_argument("--no-cap", action="store_true", help="skip the memory-cap scenario")
    p.add_argument("--systems", type=parse_systems, default=list(SYSTEMS),
                   help="which systems to run, comma-separated (plain, heter); with one, "
                        "no heter/plain ratio")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adagrad",
                   help="the optimizer both systems train with (learning rates: "
                        + ", ".join(f"{k} {v[1]:g}" for k, v in OPTIMIZERS.items()) + ")")
    p.add_argument("--transport", choices=("gloo", "mpi"), default="gloo")
    p.add_argument("--malloc-tuning", choices=MALLOC_TUNING, default="default",
                   help="glibc malloc tuning (PriorityConfig.malloc_tuning): default = the "
                        "product's (heter ranks tuned, plain Horovod not), off = no rank "
                        "(HOROVOD_PRIO_MALLOC_TUNING=0), all = plain Horovod's ranks too "
                        "(HOROVOD_PRIO_MALLOC_TUNING=1, as a data-parallel horovod_prio rank "
                        "takes it)")
    p.add_argument("--run-timeout", type=_pos_float("--run-timeout"), default=900.0,
                   help="seconds before a run is stopped and recorded as failed")
    p.add_argument("--sample-interval", type=_pos_float("--sample-interval"), default=0.1)
    p.add_argument("--keep-raw", action="store_true",
                   help="keep the launchers' logs and the ranks' records (a temporary folder)")
    p.add_argument("--quick", action="store_true",
                   help="small tables (0.1 GB), 6 steps, one repeat at 1gbit (a smoke run)")
    p.add_argument("--out", default=None,
                   help="result folder (default results/bench/heter-dlrm-<what>-<date>)")
    p.add_argument("--report-only", action="store_true",
                   help="re-render results.md and the plot from OUT/results.json.gz")
    p.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    return p


def parse_args(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    if a.quick:
        explicit = {x.split("=")[0].lstrip("-").replace("-", "_") for x in (argv or sys.argv[1:])
                    if x.startswith("--")}
        for k, v in QUICK.items():
            if k not in explicit:
                setattr(a, k, v)
    if a.zipf <= 1:
        p.error(f"--zipf: expected an exponent > 1, got {a.zipf:g}")
    for flag in ("bottom", "top"):
        try:
            widths = [int(w) for w in getattr(a, flag).split(",") if w.strip()]
        except ValueError:
            p.error(f"--{flag}: expected comma-separated layer widths, got {getattr(a, flag)!r}")
        if not widths or min(widths) < 1:
            p.error(f"--{flag}: expected positive layer widths, got {getattr(a, flag)!r}")
        setattr(a, flag + "_widths", widths)
    if a.cap_rate != UNSHAPED:
        try:
            units.check("--cap-rate", units.parse_rate_bits_per_s, a.cap_rate)
        except ValueError as e:
            p.error(str(e))
    if a.batch < 3:
        p.error(f"--batch: the global batch is split over 3 ranks, got {a.batch}")
    if a.report_only and not a.out:
        p.error("--report-only needs --out DIR")
    return a


def model_config(a) -> dict:
    """What a worker needs (JSON on its command line)."""
    return {"rows": table_rows(a.table_gb, a.dim, a.min_rows), "dim": a.dim, "hot": a.hot,
            "zipf": a.zipf, "batch": a.batch, "pool": a.pool, "warmup": a.warmup,
            "steps": a.steps, "bottom": a.bottom_widths, "top": a.top_widths, "seed": 1,
            "sparse_trainers": a.sparse_trainers, "optimizer": a.optimizer,
            "threads": host_threads(host_kinds(a, a.uncapped_memory))}


# ---------------------------------------------------------------- data (pure numpy)
def draw_batches(cfg: dict) -> list[tuple[dict, np.ndarray]]:
    """The pool of global batches (identical on every rank and in the harness):
    ``({"c0".."c25": int64 (B, hot[i]), "dense": float32 (B, 13)}, labels (B, 1))``."""
    rng = np.random.default_rng(cfg["seed"])
    rows, b, hot = cfg["rows"], cfg["batch"], cfg["hot"]
    out = []
    for _ in range(cfg["pool"]):
        cats = {f"c{i}": ((rng.zipf(cfg["zipf"], (b, h)) - 1) % r).astype(np.int64)
                for i, (r, h) in enumerate(zip(rows, hot))}
        dense = rng.standard_normal((b, DENSE_FEATURES)).astype(np.float32)
        score = dense[:, :1] + 0.5 * sum((cats[f"c{i}"][:, :1] % 3 == 0) for i in range(4))
        labels = (score + 0.5 * rng.standard_normal(score.shape) > 0.8).astype(np.float32)
        out.append((dict(cats, dense=dense), labels))
    return out


# ---------------------------------------------------------------- bounds (pure)
def heter_bound(batch: dict, rows: list[int], dim: int, shards: int = 2,
                sparse_trainers: int = 2, pooled: bool = True) -> dict:
    """Payload bytes one heter step must move between hosts for this global
    batch: ``sparse_trainers`` sparse trainers (trainer s beside shard s, each
    a contiguous slice of the batch), ``shards`` shards with mod sharding,
    one dense trainer on the other rack. Each trainer's unique ids per table
    owned by a shard on another host travel as keys (8 B) to it, their rows
    back and their gradients to it (``dim`` float32 each); the activations
    (per sample one pooled vector per field if ``pooled``, else every
    looked-up row) go to the dense trainer and their gradients come back,
    across the uplink. Headers and the collectives' own framing come on top."""
    from horovod_prio.heter.trainer import split_batch
    n = len(next(iter(batch.values())))
    unique_remote = 0
    for i, r in enumerate(rows):
        ids = np.asarray(batch[f"c{i}"])
        if ids.size and (ids.min() < 0 or ids.max() >= r):
            raise ValueError(f"input 'c{i}': ids outside table rows 0-{r - 1}")
        for s, (lo, hi) in enumerate(split_batch(n, sparse_trainers)):
            uniq = np.unique(ids[lo:hi].reshape(-1))
            unique_remote += int(((uniq % shards) != s).sum())
    lookups = sum(int(np.asarray(batch[f"c{i}"]).size) for i in range(len(rows)))
    acts = (n * len(rows) if pooled else lookups) * dim * FLOAT_BYTES
    keys = unique_remote * ID_BYTES
    row_bytes = unique_remote * dim * FLOAT_BYTES
    return {"samples": n, "unique_remote_rows": unique_remote, "keys": keys, "rows": row_bytes,
            "row_grads": row_bytes, "activations": acts, "activation_grads": acts,
            "uplink": 2 * acts, "fabric": keys + 2 * row_bytes + 2 * acts}


def plain_bound(batch: dict, rows: list[int], dim: int, dense_params: int,
                ranks: int = 3) -> dict:
    """Payload bytes of one plain Horovod step over ``ranks`` ranks: the dense
    gradients' ring allreduce (2(R-1) x their bytes in all) and the
    embeddings' IndexedSlices allgather (every rank receives every other
    rank's ids, 8 B, and row gradients, ``dim`` float32, of every lookup in
    its slice: (R-1) x the whole batch's)."""
    lookups = sum(int(np.asarray(batch[f"c{i}"]).size) for i in range(len(rows)))
    dense = dense_params * FLOAT_BYTES
    allreduce = 2 * (ranks - 1) * dense
    allgather = (ranks - 1) * lookups * (ID_BYTES + dim * FLOAT_BYTES)
    return {"dense_allreduce": allreduce, "sparse_allgather": allgather,
            "fabric": allreduce + allgather}


# ---------------------------------------------------------------- the worker (TF, under horovodrun)
def build_model(cfg: dict):
    import tensorflow as tf
    dim, hot = cfg["dim"], cfg["hot"]
    ids = [tf.keras.Input((h,), dtype="int64", name=f"c{i}") for i, h in enumerate(hot)]
    dense = tf.keras.Input((DENSE_FEATURES,), name="dense")
    h = dense
    for j, w in enumerate(cfg["bottom"] + [dim]):
        h = tf.keras.layers.Dense(w, activation="relu", name=f"bottom{j}")(h)
    vecs = [tf.keras.layers.Reshape((1, dim), name="bottom_vec")(h)]
    for i, (x, r) in enumerate(zip(ids, cfg["rows"])):
        e = tf.keras.layers.Embedding(r, dim, name=f"table{i}")(x)
        e = tf.keras.layers.GlobalAveragePooling1D(name=f"pool{i}")(e)
        vecs.append(tf.keras.layers.Reshape((1, dim), name=f"vec{i}")(e))
    stack = tf.keras.layers.Concatenate(axis=1, name="stack")(vecs)          # (B, 27, dim)
    inter = tf.keras.layers.Dot(axes=2, name="interact")([stack, stack])     # (B, 27, 27)
    h = tf.keras.layers.Concatenate(name="top_in")(
        [tf.keras.layers.Flatten(name="inter_flat")(inter), h])
    for j, w in enumerate(cfg["top"]):
        h = tf.keras.layers.Dense(w, activation="relu", name=f"top{j}")(h)
    out = tf.keras.layers.Dense(1, name="logit")(h)
    return tf.keras.Model(ids + [dense], out, name="dlrm")


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_seconds() -> float:
    """This process's CPU time so far, every thread, user + system."""
    t = os.times()
    return t.user + t.system


def worker(system: str, cfg: dict, out_dir: str) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import socket
    import tensorflow as tf
    import horovod.tensorflow as hvd
    threads = cfg.get("threads", {}).get(socket.gethostname(), 1)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    pool = draw_batches(cfg)
    n = cfg["warmup"] + cfg["steps"]
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    rec = {"system": system, "host": socket.gethostname(), "threads": threads}
    from horovod_prio.runtime import malloc
    ends, cpu0 = [], None
    if system == "heter":
        from horovod_prio.heter import placement, roles as roles_mod
        from horovod_prio.heter.trainer import HeterTrainer
        roles = roles_mod.from_env()
        hvd.init(process_sets=roles.process_sets())
        tf.keras.utils.set_random_seed(cfg["seed"])
        with placement.placeholder_tables():
            model = build_model(cfg)
        plan = placement.place(model, overrides={f"pool{i}": cfg["pool_on"]
                                                 for i in range(len(cfg["rows"]))}
                               if cfg.get("pool_on") else None)
        pool0 = next(p for p in plan.layers if p.name == "pool0")
        rec["placement_of_pool0"] = [pool0.kind, pool0.reason]
        trainer = HeterTrainer(model, loss_fn, keras_optimizer(cfg), roles, plan=plan)
        rec["role"] = trainer.role
        rec["rss_after_init"] = _vm_hwm()
        # seconds per timed step in each exchange (waiting for peers included); the rest
        # of the step is this rank's own work
        waits, real = {}, trainer._alltoall

        def timed(tensor, splits, set_name, what, *nbytes):
            t = time.perf_counter()
            try:
                return real(tensor, splits, set_name, what, *nbytes)
            finally:
                if trainer.steps > cfg["warmup"]:
                    waits[what] = waits.get(what, 0.0) + time.perf_counter() - t
        trainer._alltoall = timed
        for s in range(n):           # looking one batch ahead, as trainer.fit() does
            cpu0 = _cpu_seconds() if s == cfg["warmup"] else cpu0
            x, y = pool[s % len(pool)]
            trainer.step(x, y, next_inputs=pool[(s + 1) % len(pool)][0] if s + 1 < n else None)
            ends.append(time.time())
        rec["cpu_s_per_step"] = (_cpu_seconds() - cpu0) / cfg["steps"]
        rec["exchange_s_per_step"] = {k: v / cfg["steps"] for k, v in waits.items()}
        if trainer.role == "ps":     # how the shard applied the pushes (whole / in two parts)
            rec["apply_parts"] = dict(trainer.shard.apply_parts)
        trainer.close()
    else:
        hvd.init()
        # what a data-parallel horovod_prio rank's set-up does: tuned only with
        # HOROVOD_PRIO_MALLOC_TUNING=1 (--malloc-tuning all)
        import logging
        from horovod_prio.heter import roles as _  # noqa: F401 (declares HOROVOD_PRIO_HETER_ROLES)
        from horovod_prio.method.config import PriorityConfig
        malloc.apply(PriorityConfig(), False, logging.getLogger("horovod_prio"))
        tf.keras.utils.set_random_seed(cfg["seed"])      # identical tables on every rank
        model = build_model(cfg)
        opt = keras_optimizer(cfg)
        from horovod_prio.heter.trainer import split_batch     # the heter trainers' slicing
        lo, hi = split_batch(cfg["batch"], hvd.size())[hvd.rank()]
        rec["role"] = "replica"
        rec["rss_after_init"] = _vm_hwm()

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        local = [({k: tf.constant(v[lo:hi]) for k, v in x.items()}, tf.constant(y[lo:hi]))
                 for x, y in pool]
        for s in range(n):
            cpu0 = _cpu_seconds() if s == cfg["warmup"] else cpu0
            x, y = local[s % len(local)]
            step(x, y).numpy()
            ends.append(time.time())
        rec["cpu_s_per_step"] = (_cpu_seconds() - cpu0) / cfg["steps"]
        hvd.allreduce(np.zeros(1, np.float32), name="plain.close")
    rec.update(rank=hvd.rank(), size=hvd.size(), step_ends=ends, vm_hwm=_vm_hwm(),
               malloc_tuned=bool(malloc.decided()))
    with open(os.path.join(out_dir, f"{system}_rank{hvd.rank()}.json"), "w") as f:
        json.dump(rec, f)
    hvd.shutdown()
    return 0


# ---------------------------------------------------------------- summaries (pure)
def interpolate(samples: list[dict], t: float, key) -> float:
    """Counter ``key(sample)`` at time ``t``, linear between the samples around it."""
    ts = [s["t"] for s in samples]
    if not samples or t <= ts[0]:
        return float(key(samples[0])) if samples else 0.0
    if t >= ts[-1]:
        return float(key(samples[-1]))
    j = next(i for i, x in enumerate(ts) if x >= t)
    a, b = samples[j - 1], samples[j]
    f = (t - a["t"]) / (b["t"] - a["t"]) if b["t"] > a["t"] else 1.0
    return key(a) + f * (key(b) - key(a))


def summarize_run(ranks: list[dict], samples: list[dict], steps: int, warmup: int,
                  batch: int) -> dict:
    """One run's numbers from the workers' records and the link samples."""
    t0 = max(r["step_ends"][warmup - 1] for r in ranks)
    t1 = max(r["step_ends"][-1] for r in ranks)
    s_step = (t1 - t0) / steps
    out = {"s_per_step": s_step, "samples_per_s": batch / s_step if s_step > 0 else None,
           "window": [t0, t1]}
    if samples:
        up = lambda s: s["AB"] + s["BA"]                          # noqa: E731
        fab = lambda s: sum(v[0] for h, v in s["hosts"].items() if h in HOSTS)  # noqa: E731
        out["uplink_bytes_per_step"] = (interpolate(samples, t1, up)
                                        - interpolate(samples, t0, up)) / steps
        out["fabric_bytes_per_step"] = (interpolate(samples, t1, fab)
                                        - interpolate(samples, t0, fab)) / steps
    rss = {}
    for r in ranks:
        rss.setdefault(r["role"], []).append(r["vm_hwm"])
    out["peak_rss_by_role"] = {k: max(v) for k, v in rss.items()}
    out["ranks"] = [{k: r[k] for k in ("rank", "role", "host", "vm_hwm", "rss_after_init",
                                        "cpu_s_per_step", "apply_parts", "malloc_tuned") if k in r}
                    for r in ranks]
    waits = {}
    for r in ranks:
        for what, v in (r.get("exchange_s_per_step") or {}).items():
            waits.setdefault(r["role"], {}).setdefault(what, []).append(v)
    if waits:       # per role: mean seconds per step in each exchange (waiting included)
        out["exchange_s_per_step_by_role"] = {
            role: {what: statistics.mean(v) for what, v in d.items()} for role, d in waits.items()}
    pool_ops = [r["placement_of_pool0"] for r in ranks if "placement_of_pool0" in r]
    if pool_ops:
        out["placement_of_pool0"] = pool_ops[0]
    return out


def cpu_floor(ranks: list[dict], hosts: dict) -> dict | None:
    """The step time the hosts' CPU quotas allow: per host, the CPU seconds
    its ranks spent per timed step (every thread, user + system) over the
    cores its cgroup grants (``hosts``: name -> {"limits": {"cpu": cores}});
    the floor is the largest, on the busiest host. A host with no CPU
    limit counts the machine's cores. None without the ranks' CPU times."""
    per = {}
    for r in ranks:
        if r.get("cpu_s_per_step") is None:
            return None
        per[r["host"]] = per.get(r["host"], 0.0) + r["cpu_s_per_step"]
    if not per:
        return None
    cores = {}
    for h in per:
        lim = (hosts.get(h) or {}).get("limits") or {}
        cores[h] = lim.get("cpu") or os.cpu_count()
    by_host = {h: per[h] / cores[h] for h in per}
    busiest = max(by_host, key=by_host.get)
    return {"s_per_step": by_host[busiest], "host": busiest,
            "cpu_s_per_step_by_host": per, "cores": cores}


def median_ratio(pairs: list[tuple[float, float]]) -> dict | None:
    """heter/plain throughput per repeat -> median, min, max."""
    rs = [h / p for p, h in pairs if p and h]
    if not rs:
        return None
    return {"median": statistics.median(rs), "min": min(rs), "max": max(rs), "n": len(rs)}


def summarize(results: dict) -> dict:
    """Per rate: each system's medians and the heter/plain ratio of the same repeat."""
    table = {}
    for rate in results["meta"]["rates"]:
        runs = [r for r in results["runs"] if r["rate"] == rate and r["scenario"] == "throughput"]
        row = {"rate": rate}
        for sysname in SYSTEMS:
            ok = [r for r in runs if r["system"] == sysname and r["status"] == "ok"]
            row[sysname] = {
                "runs_ok": len(ok), "runs": len([r for r in runs if r["system"] == sysname]),
                "statuses": sorted({r["status"] for r in runs if r["system"] == sysname}),
            }
            for k in ("samples_per_s", "s_per_step", "uplink_bytes_per_step",
                      "fabric_bytes_per_step"):
                vals = [r[k] for r in ok if r.get(k) is not None]
                row[sysname][k] = statistics.median(vals) if vals else None
            floors = [r["cpu_floor"] for r in ok if r.get("cpu_floor")]
            row[sysname]["cpu_floor_s_per_step"] = \
                statistics.median(f["s_per_step"] for f in floors) if floors else None
            row[sysname]["cpu_floor_hosts"] = sorted({f["host"] for f in floors})
            roles = {}
            for r in ok:
                for role, v in r.get("peak_rss_by_role", {}).items():
                    roles[role] = max(roles.get(role, 0), v)
            row[sysname]["peak_rss_by_role"] = roles
        pairs = []
        for rep in sorted({r["repeat"] for r in runs}):
            by = {r["system"]: r for r in runs if r["repeat"] == rep and r["status"] == "ok"}
            if set(by) == set(SYSTEMS):
                pairs.append((by["plain"]["samples_per_s"], by["heter"]["samples_per_s"]))
        row["ratio"] = median_ratio(pairs)
        table[rate] = row
    return table


def _fmt(v, spec="{:.1f}"):
    return "–" if v is None else spec.format(v)


def _mb(v):
    return "–" if v is None else f"{v / 1e6:.2f} MB"


def _gib(v):
    return "–" if not v else f"{v / (1 << 30):.2f} GiB"


def _hot_text(hot) -> str:
    if isinstance(hot, int):
        return str(hot)
    if list(hot) == list(MLPERF_HOT):
        return f"MLPerf DLRMv2 multi-hot ({sum(hot)} per sample)"
    return str(hot[0]) if len(set(hot)) == 1 else "+".join(map(str, hot))


def testbed_mtu() -> int:
    from .testbed import MTU
    return MTU


def wire_bounds(meta: dict) -> tuple[dict, int]:
    """The recorded payload bounds the table shows, and the testbed's MTU.
    The heter uplink's bound is in bytes on the wire, frames of that MTU
    (``benchmarks.bounds.wire_bytes``): the uplink's tbf counts every frame's
    headers. The fabric bounds stay payload: the veth counters see the
    kernel's offloaded super-packets, one header per up to 64 KB, so a bound
    with a header per MTU would exceed what they count (measured: 19.85 MB
    against a 20.55 MB wire bound, 19.66 MB of payload)."""
    from .bounds import wire_bytes
    mtu = int(meta.get("mtu", testbed_mtu()))
    b = meta["bounds"]
    return {"heter": {"uplink": wire_bytes(b["heter"]["uplink"], mtu),
                      "fabric": b["heter"]["fabric"]},
            "plain": {"fabric": b["plain"]["fabric"]}}, mtu


def _tuned_ranks(results: dict) -> str:
    """Which ranks' malloc was tuned, from the ok runs' records."""
    seen = {}
    for r in results["runs"]:
        for k in r.get("ranks") or []:
            if "malloc_tuned" in k:
                seen.setdefault(f"{r['system']} {k['role']}", set()).add(k["malloc_tuned"])
    if not seen:
        return "not recorded"
    on = sorted(n for n, v in seen.items() if v == {True})
    mixed = sorted(n for n, v in seen.items() if len(v) > 1)
    text = "tuned: " + (", ".join(on) or "none")
    return text + ("; in some runs only: " + ", ".join(mixed) if mixed else "")


def render_md(results: dict) -> str:
    from .bounds import floor_label
    meta, summ = results["meta"], results.get("summary") or summarize(results)
    b, mtu = wire_bounds(meta)
    opt_name, opt_lr = OPTIMIZERS[meta["config"].get("optimizer", "adagrad")]
    systems = list(meta.get("systems", SYSTEMS))
    only = "" if systems == list(SYSTEMS) else "; systems run: " + ", ".join(systems)
    lines = [f"# Heterogeneous trainers vs plain Horovod: DLRM ({meta['what']})", "",
             f"Command: `{meta['command']}`", "",
             f"Date {meta['date']}, git {meta['git']}, machine: {meta['machine']}, "
             f"{meta['ncpu']} cores; 1-min load {meta['loadavg_before']:.2f} before, "
             f"{_fmt(meta.get('loadavg_after'), '{:.2f}')} after.", "",
             f"Model: 26 tables, {meta['table_bytes'] / 1e9:.3f} GB of float32 rows in all "
             f"(largest {max(meta['config']['rows'])} rows), dim {meta['config']['dim']}, "
             f"{_hot_text(meta['config']['hot'])} ids per field (Zipf {meta['config']['zipf']}, "
             f"mean-pooled), "
             f"{meta['dense_params']} dense parameters; global batch {meta['config']['batch']}, "
             f"{meta['config']['warmup']} warm-up + {meta['config']['steps']} timed steps, "
             f"{meta['repeats']} interleaved repeats; {opt_name} (learning rate {opt_lr:g})"
             f"{only}. glibc malloc tuning (`--malloc-tuning`): "
             f"{meta.get('malloc_tuning', 'default')} ({_tuned_ranks(results)}).", "",
             "| link rate | plain Horovod samples/s | heter samples/s | heter/plain (median, min–max) "
             "| plain bytes/step uplink, fabric (bound fabric, payload) "
             "| heter bytes/step uplink, fabric "
             f"(bound uplink, {floor_label(mtu)}; fabric, payload) | peak RSS plain replica "
             "| peak RSS heter ps / sparse / dense "
             "| runs ok plain, heter |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rate, row in summ.items():
        p, h, r = row["plain"], row["heter"], row["ratio"]
        ratio = "–" if not r else f"{r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})"
        hr = h["peak_rss_by_role"]
        lines.append(
            f"| {rate} | {_fmt(p['samples_per_s'])} | {_fmt(h['samples_per_s'])} | {ratio} "
            f"| {_mb(p['uplink_bytes_per_step'])}, {_mb(p['fabric_bytes_per_step'])} "
            f"({_mb(b['plain']['fabric'])}) "
            f"| {_mb(h['uplink_bytes_per_step'])}, {_mb(h['fabric_bytes_per_step'])} "
            f"({_mb(b['heter']['uplink'])}, {_mb(b['heter']['fabric'])}) "
            f"| {_gib(p['peak_rss_by_role'].get('replica'))} "
            f"| {_gib(hr.get('ps'))} / {_gib(hr.get('sparse'))} / {_gib(hr.get('dense'))} "
            f"| {p['runs_ok']}/{p['runs']}, {h['runs_ok']}/{h['runs']} |")
    floors = [(rate, row) for rate, row in summ.items()
              if row["heter"].get("cpu_floor_s_per_step") is not None]
    if floors:
        lines += ["", "Step time against the CPU floor (the busiest host's CPU seconds per step "
                      "over its cores; medians over repeats). Where a system's step is near its "
                      "floor, its hosts' CPU, not the link, sets its pace; heter/plain cannot "
                      "exceed plain's step over heter's floor.", "",
                  "| link rate | plain s/step | plain CPU floor (host) | heter s/step "
                  "| heter CPU floor (host) | heter/plain at heter's floor |",
                  "|---|---|---|---|---|---|"]
        for rate, row in floors:
            p, h = row["plain"], row["heter"]
            best = (p["s_per_step"] / h["cpu_floor_s_per_step"]
                    if p["s_per_step"] and h["cpu_floor_s_per_step"] else None)
            lines.append(
                f"| {rate} | {_fmt(p['s_per_step'], '{:.3f}')} "
                f"| {_fmt(p.get('cpu_floor_s_per_step'), '{:.3f}')} "
                f"({', '.join(p.get('cpu_floor_hosts') or []) or '–'}) "
                f"| {_fmt(h['s_per_step'], '{:.3f}')} "
                f"| {_fmt(h['cpu_floor_s_per_step'], '{:.3f}')} "
                f"({', '.join(h['cpu_floor_hosts'])}) | {_fmt(best, '{:.2f}×')} |")
    cap = [r for r in results["runs"] if r["scenario"] == "cap"]
    if cap:
        lines += ["", f"Memory cap: b1 (the dense trainer's host) limited to "
                      f"{_gib(meta.get('cap_memory'))}, uplink {meta['cap_rate']}.", "",
                  "| system | status | samples/s | b1 peak usage | OOM kills on b1 | error |",
                  "|---|---|---|---|---|---|"]
        for r in cap:
            lines.append(f"| {r['system']} | {r['status']} | {_fmt(r.get('samples_per_s'))} "
                         f"| {_gib(r.get('host_peak', {}).get('b1'))} "
                         f"| {r.get('oom_kills', {}).get('b1', '–')} "
                         f"| {(r.get('error') or '')[:120]} |")
    lines += ["", "Definitions: samples/s = global batch / s per step over the timed window "
              "(the last rank's end of warm-up to the last rank's end of the last step); "
              "bytes/step = the uplink's two tbf counters (uplink) and every host's veth "
              "counter of what it sent (fabric), interpolated at the window's ends; the bounds "
              "are the payload bytes computed from the ids of the batches drawn "
              "(benchmarks/heter_dlrm.py: heter_bound, plain_bound; mean over the pool); the "
              "uplink's as bytes on the wire: TCP/IPv4 frames over Ethernet, MTU + 14 bytes per "
              "MTU − 52 of payload (benchmarks.bounds; a message's last partial frame not "
              "rounded up); the fabric's as payload (the veth counters see offloaded "
              "super-packets, one header per up to 64 KB); "
              "peak RSS = the largest VmHWM of a rank of that role; ratio = median over repeats "
              "of heter/plain samples/s within the same repeat.",
              "", "![throughput](throughput.png)", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    summ = results.get("summary") or summarize(results)
    rates = list(summ)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for sysname, label in (("plain", "plain Horovod"), ("heter", "horovod_prio.heter")):
        ys = [summ[r][sysname]["samples_per_s"] for r in rates]
        ax.plot(range(len(rates)), [y if y is not None else float("nan") for y in ys],
                marker="o", label=label)
    ax.set_xticks(range(len(rates)))
    ax.set_xticklabels(rates)
    ax.set_xlabel("uplink rate")
    ax.set_ylabel("samples/s (median)")
    ax.set_title("DLRM, %.2f GB of tables" % (results["meta"]["table_bytes"] / 1e9))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_outputs(results: dict, out: Path) -> None:
    results["summary"] = summarize(results)
    out.mkdir(parents=True, exist_ok=True)
    results_io.save(out, results, raw=False)
    (out / "results.md").write_text(render_md(results))
    if plot(results, out / "throughput.png"):
        results_io.shrink_png(out / "throughput.png")     # the tree keeps palette PNGs


# ---------------------------------------------------------------- the runs (root, testbed)
def run_status(returncode: int | None, oom_kills: dict, timed_out: bool) -> str:
    """ok / oom (a host's OOM killer killed a rank: a result) / timeout / failed."""
    if any(oom_kills.values()):
        return "oom"
    if timed_out:
        return "timeout"
    return "ok" if returncode == 0 else "failed"


def oom_total(cgroups: dict) -> int:
    n = 0
    for cg in cgroups.values():
        try:
            n += cg.oom_kills()
        except (OSError, ValueError):
            pass
    return n


def wait_or_oom(proc, cgroups: dict, timeout: float, grace: float = 5.0) -> bool:
    """Wait for ``proc``; a host's OOM kill ends the wait ``grace`` s later (the
    launcher would otherwise wait for its collectives' timeouts). False if
    ``timeout`` passed first."""
    deadline, oom_at = time.monotonic() + timeout, None
    while proc.poll() is None:
        now = time.monotonic()
        if now > deadline:
            return False
        if oom_at is None and oom_total(cgroups):
            oom_at = now
        if oom_at is not None and now - oom_at > grace:
            return True
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    return True


def host_kinds(a, b1_memory: int) -> dict:
    from .cgroups import parse_kind
    mk, ml = parse_kind(a.kind_memory, "--kind-memory")
    ck, cl = parse_kind(a.kind_cores, "--kind-cores")
    from dataclasses import replace
    return {"a1": (mk, ml), "a2": (mk, ml), "b1": (ck, replace(cl, memory=int(b1_memory)))}


def launch_command(system: str, cfg: dict, workdir: Path, transport: str) -> list[str]:
    from .harness import horovodrun_path
    layout = heter_layout(cfg["sparse_trainers"])
    hosts = layout["H"] if system == "heter" else PLAIN_H
    n = layout["np"] if system == "heter" else 3
    cmd = [horovodrun_path(), f"--{transport}", "-np", str(n), "-H", hosts,
           "--network-interface", "eth0", "--start-timeout", "120"]
    if transport == "gloo":
        cmd += ["--gloo-timeout-seconds", "300"]
    return cmd + [sys.executable, "-m", "benchmarks.heter_dlrm", "--worker", system,
                  "--config", json.dumps(cfg, separators=(",", ":")), "--out", str(workdir)]


def execute_run(system: str, rate: str, scenario: str, repeat: int, a, cfg: dict,
                workroot: Path, b1_memory: int) -> dict:
    from .testbed import LinkSampler, Testbed, plan_topology
    from .netns import HarnessError, stop_process_groups
    from .harness import REPO
    label = f"{scenario}-{rate}-{system}-r{repeat}"
    workdir = workroot / label
    workdir.mkdir(parents=True, exist_ok=True)
    rec = {"system": system, "rate": rate, "scenario": scenario, "repeat": repeat,
           "status": "failed", "error": None, "loadavg_before": os.getloadavg()[0]}
    topo = plan_topology(["a1", "a2"], ["b1"], rate=UNSHAPED_RATE if rate == UNSHAPED else rate,
                         kinds=host_kinds(a, b1_memory), extra_hosts=("head",))
    rec["hosts"] = {h.name: {"kind": h.kind, "limits": h.limits.describe() if h.limits else None}
                    for h in topo.hosts}
    tb, sampler, proc, timed_out = Testbed(topo), None, None, False
    log = workdir / "launcher.log"
    try:
        tb.create()
        base = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
                    PYTHONUNBUFFERED="1",
                    HOROVOD_PRIO_HETER_ROLES=heter_layout(cfg["sparse_trainers"])["roles"])
        base.pop("HOROVOD_PRIO_MALLOC_TUNING", None)
        if MALLOC_TUNING[a.malloc_tuning] is not None:
            base["HOROVOD_PRIO_MALLOC_TUNING"] = MALLOC_TUNING[a.malloc_tuning]
        env = tb.launch_env(base)
        sampler = LinkSampler(tb, a.sample_interval).start()
        with open(log, "w") as f:
            proc = tb.popen("head", launch_command(system, cfg, workdir, a.transport),
                            stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
            timed_out = not wait_or_oom(proc, tb.cgroups, a.run_timeout)
            if proc.poll() is None:
                stop_process_groups([proc])
    except HarnessError as e:
        rec["error"] = str(e)
    finally:
        samples = sampler.stop() if sampler is not None else []
        rec["oom_kills"], rec["host_peak"] = {}, {}
        for name, cg in tb.cgroups.items():
            try:
                rec["oom_kills"][name] = cg.oom_kills()
            except (OSError, ValueError):
                pass
            for f in ("memory.max_usage_in_bytes", "memory.peak"):
                try:
                    rec["host_peak"][name] = int(cg.read(f))
                    break
                except (OSError, ValueError):
                    continue
        rec["loadavg_after"] = os.getloadavg()[0]
        try:
            tb.kill_processes()
        finally:
            tb.cleanup()
    rec["returncode"] = proc.returncode if proc is not None else None
    rec["status"] = run_status(rec["returncode"], rec["oom_kills"], timed_out)
    ranks = []
    for p in sorted(workdir.glob(f"{system}_rank*.json")):
        ranks.append(json.loads(p.read_text()))
    layout = heter_layout(cfg["sparse_trainers"])
    expected = layout["np"] if system == "heter" else 3
    if rec["status"] == "ok" and len(ranks) != expected:
        rec["status"] = "failed"
        rec["error"] = f"{len(ranks)} of {expected} ranks reported"
    if rec["status"] == "ok" and system == "heter":
        where = sorted((r["role"], r["host"]) for r in ranks)
        if where != layout["where"]:
            rec["status"] = "failed"
            rec["error"] = f"roles landed on hosts {where}, expected {layout['where']}"
    if rec["status"] == "ok":
        rec.update(summarize_run(ranks, samples, cfg["steps"], cfg["warmup"], cfg["batch"]))
        rec["cpu_floor"] = cpu_floor(ranks, rec["hosts"])
    elif rec["error"] is None:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        lines = [ln for ln in tail.splitlines() if "Error" in ln or "Killed" in ln
                 or "exit" in ln.lower()]
        rec["error"] = (lines[-1] if lines else tail[-300:]).strip()
    return rec


def default_out(a) -> Path:
    from .harness import REPO
    what = "quick" if a.quick else "-".join(a.rates)
    return REPO / "results" / "bench" / f"heter-dlrm-{what}-{_dt.date.today().isoformat()}"


def machine() -> str:
    import platform
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{platform.node()}, {model}, {mem / (1 << 30):.0f} GiB RAM, {platform.release()}"


def dense_param_count(cfg: dict) -> int:
    dim, n = cfg["dim"], 0
    prev = DENSE_FEATURES
    for w in cfg["bottom"] + [dim]:
        n += prev * w + w
        prev = w
    prev = (len(cfg["rows"]) + 1) ** 2 + dim
    for w in cfg["top"] + [1]:
        n += prev * w + w
        prev = w
    return n


def mean_bounds(cfg: dict, dense_params: int) -> dict:
    pool = draw_batches(cfg)
    hb = [heter_bound(x, cfg["rows"], cfg["dim"], sparse_trainers=cfg["sparse_trainers"])
          for x, _ in pool]
    pb = [plain_bound(x, cfg["rows"], cfg["dim"], dense_params) for x, _ in pool]
    return {"heter": {k: statistics.mean(d[k] for d in hb) for k in hb[0]},
            "plain": {k: statistics.mean(d[k] for d in pb) for k in pb[0]}}


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker(a.worker, json.loads(a.config), a.out)
    out = Path(a.out) if a.out else default_out(a)
    if a.report_only:
        results = results_io.load(out)
        write_outputs(results, out)
        print(out / "results.md")
        return 0
    from .netns import install_signal_handlers, require_root
    from .harness import git_rev
    require_root()
    install_signal_handlers()
    cfg = model_config(a)
    dense_params = dense_param_count(cfg)
    meta = {"what": "quick" if a.quick else ",".join(a.rates),
            "command": " ".join(shlex.quote(x) for x in [sys.executable, "-m",
                                                           "benchmarks.heter_dlrm"]
                                + list(sys.argv[1:] if argv is None else argv)),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "git": git_rev(), "machine": machine(), "ncpu": os.cpu_count(),
            "loadavg_before": os.getloadavg()[0], "loadavg": list(os.getloadavg()),
            "rates": a.rates, "repeats": a.repeats, "config": cfg,
            "table_bytes": sum(cfg["rows"]) * cfg["dim"] * FLOAT_BYTES,
            "dense_params": dense_params, "bounds": mean_bounds(cfg, dense_params),
            "kinds": {"a1,a2": a.kind_memory, "b1": a.kind_cores},
            "uncapped_memory": a.uncapped_memory,
            "heter_roles": heter_layout(a.sparse_trainers)["roles"],
            "hosts": {"plain": PLAIN_H, "heter": heter_layout(a.sparse_trainers)["H"]},
            "transport": a.transport, "systems": a.systems, "malloc_tuning": a.malloc_tuning,
            "unshaped_rate": UNSHAPED_RATE, "cap_rate": a.cap_rate, "mtu": testbed_mtu()}
    results = {"meta": meta, "runs": []}
    # the launchers' logs and the ranks' records stay out of the result folder
    workroot = Path(tempfile.mkdtemp(prefix="heter-dlrm-"))
    print(f"raw logs in {workroot} ({'kept' if a.keep_raw else 'removed at the end'})",
          flush=True)
    print(f"tables {meta['table_bytes'] / 1e9:.3f} GB, dense params {dense_params}; "
          f"bound per step: heter uplink {meta['bounds']['heter']['uplink'] / 1e6:.2f} MB, "
          f"fabric {meta['bounds']['heter']['fabric'] / 1e6:.2f} MB; plain fabric "
          f"{meta['bounds']['plain']['fabric'] / 1e6:.2f} MB", flush=True)
    try:
        for rep in range(a.repeats):
            order = run_order(a.systems, rep)
            for rate in a.rates:
                for sysname in order:
                    rec = execute_run(sysname, rate, "throughput", rep, a, cfg, workroot,
                                      a.uncapped_memory)
                    results["runs"].append(rec)
                    print(f"[{rate} {sysname} r{rep}] {rec['status']} "
                          f"{_fmt(rec.get('samples_per_s'))} samples/s "
                          f"{rec.get('error') or ''}", flush=True)
        if not a.no_cap:
            cap = a.cap_memory
            if cap == "auto":
                cap = auto_cap(results["runs"])
            meta["cap_memory"] = cap
            if cap is None:
                meta["cap_note"] = ("no cap: auto needs an ok throughput run of each system "
                                    "with b1's peak usage")
            else:
                for sysname in a.systems:
                    rec = execute_run(sysname, a.cap_rate, "cap", 0, a, cfg, workroot, cap)
                    results["runs"].append(rec)
                    print(f"[cap {_gib(cap)} {sysname}] {rec['status']} "
                          f"{_fmt(rec.get('samples_per_s'))} samples/s", flush=True)
    finally:
        meta["loadavg_after"] = os.getloadavg()[0]
        write_outputs(results, out)
        print(out / "results.md", flush=True)
        if not a.keep_raw:
            shutil.rmtree(workroot, ignore_errors=True)
    if out.resolve().is_relative_to((Path(__file__).resolve().parent.parent / "results")):
        from . import results_index
        results_index.main([])
    return 0


def auto_cap(runs: list[dict]) -> int | None:
    """Halfway between b1's peak usage under heter (the dense trainer) and
    under plain Horovod (a replica with every table), from the throughput runs."""
    peaks = {}
    for r in runs:
        if r["scenario"] == "throughput" and r["status"] == "ok" and "b1" in r.get("host_peak", {}):
            peaks.setdefault(r["system"], []).append(r["host_peak"]["b1"])
    if set(peaks) != set(SYSTEMS):
        return None
    heter, plain = max(peaks["heter"]), min(peaks["plain"])
    if plain <= heter:
        return None
    return int((heter + plain) // 2)


if __name__ == "__main__":
    sys.exit(main())
