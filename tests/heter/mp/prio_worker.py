"""Worker for tests/heter/test_heter_prio.py, run under horovodrun.

    prio_worker.py OUT_DIR [--steps N] [--pause-at P] [--boost B]

Trains the tiny two-table model of heter_worker.py (Adagrad) with the roles of
HOROVOD_PRIO_HETER_ROLES and the priority settings of the HOROVOD_PRIO_*
variables, then writes OUT_DIR/rank<r>.json (role, whether the rank holds,
its scheduler's counters, its arbiter link's counters, what it gated, the
priority vector it received) and OUT_DIR/weights_rank<r>.npz (a shard's rows,
a dense trainer's weights).

--pause-at P: rank 0 stops before step P, writes OUT_DIR/paused and waits for
OUT_DIR/resume (the other ranks wait in their collectives meanwhile).
--boost B: rank 0's policy starts at boost B (as if it had seen slow steps).
--fit: each step is told the next batch (the next keys ride with the row
gradients, as in fit()).
"""
import argparse
import json
import logging
import os
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

from horovod_prio.heter import roles as roles_mod  # noqa: E402
from horovod_prio.heter.trainer import HeterTrainer  # noqa: E402
from horovod_prio.runtime import get_runtime  # noqa: E402

BATCH, ROWS_A, ROWS_B = 16, 40, 17

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--pause-at", type=int, default=-1)
ap.add_argument("--boost", type=int, default=0)
ap.add_argument("--fit", action="store_true")
args = ap.parse_args()
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def build_model():
    a = tf.keras.Input((3,), dtype="int64", name="ids_a")
    b = tf.keras.Input((1,), dtype="int64", name="ids_b")
    x = tf.keras.Input((5,), name="x")
    ea = tf.keras.layers.Embedding(ROWS_A, 4, name="emb_a")(a)
    eb = tf.keras.layers.Embedding(ROWS_B, 3, name="emb_b")(b)
    h = tf.keras.layers.Concatenate(name="cat")([tf.keras.layers.Flatten(name="fa")(ea),
                                                 tf.keras.layers.Flatten(name="fb")(eb), x])
    h = tf.keras.layers.Dense(8, activation="relu", name="hidden")(h)
    return tf.keras.Model([a, b, x], tf.keras.layers.Dense(1, name="out")(h), name="tiny_dlrm")


def batches(seed, n):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield ({"ids_a": np.minimum(rng.zipf(1.5, (BATCH, 3)) - 1, ROWS_A - 1).astype(np.int64),
                "ids_b": rng.integers(0, ROWS_B, (BATCH, 1)).astype(np.int64),
                "x": rng.standard_normal((BATCH, 5)).astype(np.float32)},
               (rng.random((BATCH, 1)) < 0.3).astype(np.float32))


roles = roles_mod.from_env()
hvd.init(process_sets=roles.process_sets())
rank = hvd.rank()
tf.keras.utils.set_random_seed(3)
trainer = HeterTrainer(build_model(), tf.keras.losses.BinaryCrossentropy(from_logits=True),
                       tf.keras.optimizers.Adagrad(0.1), roles)
ex = trainer.exchanges
runtime = get_runtime()
if args.boost and rank == 0:
    policy = ex.monitor.policy
    state = policy.state()
    state["boost"] = args.boost
    policy.load_state(state)
    ex.monitor.clock.set_priorities(ex.monitor.slot, policy.priorities)


def counters():
    return dict(runtime.arbiter.counters) if runtime.arbiter is not None else None


data = list(batches(7, args.steps))
for i, (x, y) in enumerate(data):
    if i == args.pause_at and rank == 0:
        with open(os.path.join(args.out, "paused.tmp"), "w") as f:
            json.dump({"step": i, "counters": counters()}, f)
        os.rename(os.path.join(args.out, "paused.tmp"), os.path.join(args.out, "paused"))
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(args.out, "resume")) and time.time() < deadline:
            time.sleep(0.05)
    trainer.step(x, y, next_inputs=data[i + 1][0] if args.fit and i + 1 < len(data) else None)
runtime.pump()
relay = ex.relay
trainer.close()
report = {"role": trainer.role, "holds": runtime.hold,
          "scheduler": runtime.scheduler.stats() if runtime.scheduler is not None else None,
          "counters": counters(), "gated": ex.gated, "vector": list(ex.vector),
          "relayed": relay.relayed if relay is not None else None,
          "relay_latest": list(relay.latest) if relay is not None else None,
          "dense_groups": getattr(ex, "dense_groups", None),
          "dense_chunks": len(ex.plan.chunks) if getattr(ex, "plan", None) else None,
          "monitor_steps": ex.monitor.steps if ex.monitor is not None else None,
          "policy_priorities": list(ex.monitor.policy.priorities)
          if ex.monitor is not None and ex.monitor.policy is not None else None}
weights = {}
if trainer.role == "ps":
    for t, entry in trainer.shard.state()["tables"].items():
        for k, v in entry.items():
            weights["%s/%s" % (t, k)] = np.asarray(v)
elif trainer.role == "dense":
    weights = {k: np.asarray(v) for k, v in trainer.dense_weights().items()}
np.savez(os.path.join(args.out, "weights_rank%d.npz" % rank), **weights)
with open(os.path.join(args.out, "rank%d.json" % rank), "w") as f:
    json.dump(report, f, indent=1)
hvd.shutdown()
