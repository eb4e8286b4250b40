"""The training script every benchmark job runs (one process per Horovod rank).

    horovodrun --gloo --network-interface lo -np 2 -H localhost:2 \\
        python -m benchmarks.workload --impl horovod --model mlp --batch 32 \\
        --steps 30 --warmup 3 --out steps.jsonl

``--impl horovod`` imports ``horovod.tensorflow.keras as hvd``; ``--impl prio``
imports ``horovod_prio.tensorflow.keras as hvd``. That import (plus the
optional ``priority=`` kwarg of ``DistributedOptimizer`` when ``--priority`` is
given, and ``model = hvd.overlap(model)`` with ``--overlap``, barrier crossing,
docs/overlap.md) is the only difference between the two; everything else --
model, seeded synthetic data, optimizer, threads, pinning -- is identical.

Rank 0 writes one JSON line per step to ``--out``:
``{"step": i, "t_start": wall s, "t_end": wall s, "cpu_start": s, "cpu_end": s,
"warmup": bool}`` (``cpu_*``: the process's CPU time, all threads, at the same
instants; a step's CPU cost is the difference between two steps' ``cpu_start``),
and every other rank r writes the same records without wall times to
``<--out>.rank<r>``, so the report can add up a step's CPU over the job
(warmup steps are written but flagged, and excluded from statistics), plus
``--meta-out`` (a JSON object describing the run) and ``--events-out`` (JSON
lines of records logged on the ``horovod_prio`` logger, e.g. boost raise/decay).

With ``--ready-file``/``--go-file`` every job stops after its warmup steps,
rank 0 touches the ready file, and all ranks wait for the go file, so the
measured steps of concurrent jobs start together.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

T_PROCESS_START = time.time()

from horovod_prio.method import units  # noqa: E402 (pure Python, no TF)
from benchmarks.models import HARNESS_MODELS, INPUT_SHAPES  # noqa: E402 (no TF import)


_positive_int = units.arg(units.parse_int, 1)


def _priority(s: str):
    """JSON object of PriorityConfig fields, e.g. '{"num_groups": 8, "max_boost": 2}'."""
    try:
        v = json.loads(s)
    except ValueError:
        v = None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object of PriorityConfig fields, e.g. '{{\"num_groups\": 8}}', got {s!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.workload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["horovod", "prio"], required=True)
    p.add_argument("--model", choices=HARNESS_MODELS, default="mlp")
    p.add_argument("--batch", type=_positive_int, default=32, help="per-rank batch size")
    p.add_argument("--steps", type=_positive_int, default=20, help="measured steps")
    p.add_argument("--warmup", type=_positive_int, default=3,
                   help="steps before measuring (>= 1: the first step traces the graph)")
    p.add_argument("--threads", type=_positive_int, default=1,
                   help="TF intra-op and inter-op threads")
    p.add_argument("--inter-threads", type=_positive_int, default=None,
                   help="TF inter-op threads (default: --threads); hvd.overlap runs its "
                        "background update beside the training call and needs >= 2")
    p.add_argument("--pin-rank", action="store_true",
                   help="pin rank r to core r %% ncpu (default: inherit the affinity)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nice", type=units.arg(units.parse_int, -20, 19), default=None,
                   help="the whole process (and its session's autogroup) at this nice value, "
                        "set before TensorFlow starts: what HOROVOD_PRIO_CPU_NICE does, for "
                        "plain Horovod")
    p.add_argument("--priority", type=_priority, default=None,
                   help="JSON object of PriorityConfig fields, passed as "
                        "DistributedOptimizer(priority={...}) (only --impl prio; "
                        "default: the binding reads HOROVOD_PRIO_* env)")
    p.add_argument("--overlap", action="store_true",
                   help="model = hvd.overlap(model) before compile: the next step's forward "
                        "starts on layers already reduced (only --impl prio)")
    p.add_argument("--out", required=True, help="rank 0: step times, JSON lines")
    p.add_argument("--meta-out", help="rank 0: run description, JSON")
    p.add_argument("--events-out", help="rank 0: horovod_prio logger records, JSON lines")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING"], help="level for the horovod_prio logger")
    p.add_argument("--ready-file", help="rank 0 touches it after the warmup steps")
    p.add_argument("--go-file", help="all ranks wait for it after the warmup steps")
    p.add_argument("--go-timeout", type=float, default=600.0)
    p.add_argument("--fail-at-step", type=int, default=None,
                   help="(tests) rank 1 exits with status 3 at this step")
    return p


def parse_args(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    if a.priority is not None and a.impl != "prio":
        p.error("argument --priority: only valid with --impl prio "
                "(plain Horovod's DistributedOptimizer has no priority)")
    if a.overlap and a.impl != "prio":
        p.error("argument --overlap: only valid with --impl prio (hvd.overlap is horovod_prio's)")
    return a


def build_model(tf, name: str):
    from benchmarks.models import harness_model
    return harness_model(tf.keras, name)


def synthetic_data(np, model: str, batch: int, seed: int):
    rng = np.random.default_rng(seed)
    n = batch * 8
    shape = (n,) + INPUT_SHAPES[model]
    x = rng.standard_normal(shape, dtype=np.float32)
    y = rng.integers(0, 10, size=(n,), dtype=np.int64)
    return x, y


class _JsonLinesHandler(logging.Handler):
    def __init__(self, path):
        super().__init__()
        self._f = open(path, "a", buffering=1)

    def emit(self, record):
        try:
            self._f.write(json.dumps({"t": record.created, "level": record.levelname,
                                      "logger": record.name, "msg": record.getMessage()}) + "\n")
        except Exception:
            pass


def _wait_for(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.stderr.write(f"[workload] go file {path} did not appear within {timeout}s\n")
            sys.exit(4)
        time.sleep(0.005)


def main(argv=None) -> int:
    a = parse_args(argv)
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    if a.pin_rank:
        ncpu = os.cpu_count() or 1
        os.sched_setaffinity(0, {rank % ncpu})
    if a.nice is not None:      # one thread yet (the later ones inherit it), and the autogroup
        from horovod_prio.runtime.cpu import set_process_nice   # stdlib only
        set_process_nice(a.nice, logging.getLogger("horovod_prio"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))

    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.inter_threads or a.threads)

    if a.impl == "horovod":
        import horovod.tensorflow.keras as hvd
    else:
        try:
            import horovod_prio.tensorflow.keras as hvd
        except ImportError as e:
            sys.stderr.write(f"[workload] --impl prio: cannot import "
                             f"horovod_prio.tensorflow.keras: {e}\n")
            return 2

    hvd.init()
    rank = hvd.rank()
    if rank == 0 and a.events_out:
        lg = logging.getLogger("horovod_prio")
        lg.setLevel(getattr(logging, a.log_level))
        lg.addHandler(_JsonLinesHandler(a.events_out))

    tf.random.set_seed(a.seed)
    model = build_model(tf, a.model)
    x, y = synthetic_data(np, a.model, a.batch, a.seed + rank)
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).repeat()
          .batch(a.batch, drop_remainder=True).prefetch(2))

    if a.overlap:
        model = hvd.overlap(model)   # the one added line
    kw = {} if a.priority is None else {"priority": a.priority}
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.01), **kw)
    model.compile(optimizer=opt,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    out = open(a.out if rank == 0 else f"{a.out}.rank{rank}", "w", buffering=1)
    meta = {
        "impl": a.impl, "model": a.model, "params": int(model.count_params()),
        "grad_bytes": int(model.count_params()) * 4, "batch": a.batch,
        "steps": a.steps, "warmup": a.warmup, "threads": a.threads,
        "inter_threads": a.inter_threads or a.threads,
        "priority": a.priority, "overlap": a.overlap, "size": hvd.size(), "pid": os.getpid(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "rendezvous": "%s:%s" % (os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"),
                                 os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")),
        "iface": os.environ.get("HOROVOD_GLOO_IFACE"),
        "tensorflow": tf.__version__,
        "t_process_start": T_PROCESS_START,
        "env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_PRIO_")},
    }

    class StepTimer(tf.keras.callbacks.Callback):
        hvd_prio_overlap_safe = True   # reads no weights: no flush before its hooks (hvd.overlap)

        def __init__(self):
            super().__init__()
            self.t0 = 0.0
            self.c0 = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            if batch == a.warmup:
                if rank == 0 and a.ready_file:
                    open(a.ready_file, "w").close()
                if a.go_file:
                    _wait_for(a.go_file, a.go_timeout)
                meta["t_go"] = time.time()
            if a.fail_at_step is not None and batch == a.fail_at_step and rank == 1:
                sys.stderr.write(f"[workload] --fail-at-step {batch}: rank 1 exits\n")
                sys.stderr.flush()
                os._exit(3)
            self.t0 = time.time()
            self.c0 = time.process_time()

        def on_train_batch_end(self, batch, logs=None):
            t, c = time.time(), time.process_time()
            rec = {"step": batch, "cpu_start": self.c0, "cpu_end": c, "warmup": batch < a.warmup}
            if rank == 0:
                rec.update(t_start=self.t0, t_end=t)
            out.write(json.dumps(rec) + "\n")

        def on_train_end(self, logs=None):
            # Here, not after fit returns: leaving fit destroys the input
            # iterator, which has been seen to block for more than 30 s at
            # MobileNetV2 b2048 (waiting for tf.data's prefetch thread), with
            # plain Horovod as with horovod_prio, and the harness kills a job
            # that lingers that long after its last step.
            out.close()
            if rank == 0 and a.meta_out:
                meta["t_done"] = time.time()
                with open(a.meta_out, "w") as f:
                    json.dump(meta, f, indent=1)

    model.fit(ds, steps_per_epoch=a.warmup + a.steps, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), StepTimer()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
