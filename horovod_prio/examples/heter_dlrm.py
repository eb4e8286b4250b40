"""A tiny DLRM-style model trained by heterogeneous trainers on synthetic data.

Launches ``horovodrun -np 3 -H localhost:3 --gloo`` on itself with
``HOROVOD_PRIO_HETER_ROLES=ps=1,sparse=1,dense=1`` (``--roles`` to change):
Criteo-like synthetic batches (categorical fields with Zipf-distributed ids,
dense features, a click label that depends on both), one embedding table per
field, a bottom MLP on the dense features and a top MLP. Prints the
placement plan, the loss per few steps from the dense trainer, and where the
parameters live. Tiny by default (runs in well under a minute on a laptop).

    python -m horovod_prio.examples.heter_dlrm [--np 3] [--roles ps=1,sparse=1,dense=1]
        [--steps 30] [--batch-size 64] [--fields 4] [--rows 1000] [--dim 8]
        [--optimizer adagrad|adam|sgd] [--controller gloo|mpi] [--checkpoint DIR]
"""
import argparse
import os
import shutil
import subprocess
import sys


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=3)
    p.add_argument("--roles", default="ps=1,sparse=1,dense=1")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64, help="global batch")
    p.add_argument("--fields", type=int, default=4, help="categorical fields (one table each)")
    p.add_argument("--rows", type=int, default=1000, help="rows per table")
    p.add_argument("--dim", type=int, default=8, help="embedding dimension")
    p.add_argument("--dense-features", type=int, default=13)
    p.add_argument("--optimizer", choices=("adagrad", "adam", "sgd"), default="adagrad")
    p.add_argument("--controller", choices=("gloo", "mpi"), default="gloo")
    p.add_argument("--checkpoint", default=None, help="save the sharded state here at the end")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for field in ("np", "steps", "batch_size", "fields", "rows", "dim", "dense_features"):
        if getattr(a, field) < 1:
            p.error("--%s must be >= 1, got %d" % (field.replace("_", "-"), getattr(a, field)))
    return a


def launch(a, argv):
    exe = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    if not exe:
        sys.exit("horovodrun not found: run `make install` first")
    cmd = [exe, "-np", str(a.np), "-H", "localhost:%d" % a.np, "--" + a.controller]
    if a.controller == "gloo":
        cmd += ["--network-interface", "lo"]
    cmd += [sys.executable, "-m", "horovod_prio.examples.heter_dlrm", "--worker"] + list(argv)
    print("$ HOROVOD_PRIO_HETER_ROLES=%s %s" % (a.roles, " ".join(cmd)), flush=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               HOROVOD_PRIO_HETER_ROLES=a.roles)
    return subprocess.call(cmd, env=env)


def build_model(a):
    import tensorflow as tf
    ids = [tf.keras.Input((1,), dtype="int64", name="c%d" % i) for i in range(a.fields)]
    dense = tf.keras.Input((a.dense_features,), name="dense")
    bottom = tf.keras.layers.Dense(a.dim, activation="relu", name="bottom")(dense)
    embs = [tf.keras.layers.Flatten(name="flat%d" % i)(
        tf.keras.layers.Embedding(a.rows, a.dim, name="table%d" % i)(x)) for i, x in enumerate(ids)]
    h = tf.keras.layers.Concatenate(name="interact")([bottom] + embs)
    h = tf.keras.layers.Dense(32, activation="relu", name="top1")(h)
    out = tf.keras.layers.Dense(1, name="top2")(h)
    return tf.keras.Model(ids + [dense], out, name="tiny_dlrm")


def batches(a, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal(a.fields)
    for _ in range(a.steps):
        cats = {"c%d" % i: (np.minimum(rng.zipf(1.2, (a.batch_size, 1)), a.rows) - 1).astype(np.int64)
                for i in range(a.fields)}
        dense = rng.standard_normal((a.batch_size, a.dense_features)).astype(np.float32)
        score = dense[:, :1] + sum(w * (cats["c%d" % i] % 2) for i, w in enumerate(weights))
        labels = (score + 0.5 * rng.standard_normal(score.shape) > 0.5).astype(np.float32)
        yield dict(cats, dense=dense), labels


def worker(a):
    import tensorflow as tf
    import horovod.tensorflow as hvd
    from horovod_prio.heter import checkpoint, placement
    from horovod_prio.heter import roles as roles_mod
    from horovod_prio.heter.trainer import HeterTrainer

    roles = roles_mod.from_env()
    hvd.init(process_sets=roles.process_sets())
    tf.keras.utils.set_random_seed(1)
    with placement.placeholder_tables():   # tables live only on the parameter-server shards
        model = build_model(a)
    plan = placement.place(model)
    if hvd.rank() == 0:
        print("roles: %s" % roles, flush=True)
        print(plan.format(batch_size=a.batch_size, dense_trainers=len(roles.ranks["dense"])),
              flush=True)
    opt = {"adagrad": lambda: tf.keras.optimizers.Adagrad(0.05),
           "adam": lambda: tf.keras.optimizers.Adam(0.005),
           "sgd": lambda: tf.keras.optimizers.SGD(0.1)}[a.optimizer]()
    trainer = HeterTrainer(model, tf.keras.losses.BinaryCrossentropy(from_logits=True), opt,
                           roles, plan=plan)
    first_dense = trainer.role == "dense" and hvd.rank() == roles.ranks["dense"][0]
    results = trainer.fit(batches(a))       # a step per batch, each looking one batch ahead
    losses = results if first_dense else []
    for step, loss in enumerate(losses, 1):
        if step == 1 or step % 10 == 0 or step == a.steps:
            print("step %3d  loss %.4f (dense trainer, rank %d)" % (step, loss, hvd.rank()),
                  flush=True)
    if trainer.role == "ps":
        rows = sum(int(v.shape[0]) for v in trainer.shard.tables.values())
        print("rank %d (ps shard %d): %d table rows, step %d"
              % (hvd.rank(), trainer.shard.index, rows, int(trainer.shard.step.numpy())), flush=True)
    trainer.close()              # every rank's last step is done before anyone shuts down
    if a.checkpoint:
        path = checkpoint.save(trainer, a.checkpoint)
        if hvd.rank() == 0:
            print("checkpoint: %s" % path, flush=True)
    if first_dense and len(losses) >= 10:
        head, tail = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        print("mean loss, first 5 steps %.4f -> last 5 steps %.4f" % (head, tail), flush=True)
    hvd.shutdown()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if a.worker:
        return worker(a)
    return launch(a, argv)


if __name__ == "__main__":
    sys.exit(main())
