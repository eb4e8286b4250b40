"""Checkpoints of a heterogeneous job: the sharded tables with their optimizer
slots, the dense weights with the dense optimizer's variables.

Layout (a directory every rank can reach)::

    DIR/step-00000020/shard-0-of-2.npz   one per parameter-server shard:
                                         per table its global ids, rows, slots
    DIR/step-00000020/dense.npz          the first dense trainer's weights and
                                         optimizer variables
    DIR/step-00000020/heter.json         the manifest, written last
    DIR/latest                           the newest complete step directory

Every file is written to a temporary name and renamed into place; the
manifest is written only after every rank's files are in place (a
collective barrier), and ``latest`` after the manifest. A directory without
a manifest is never read: a job killed while saving leaves the previous
checkpoint as ``latest``. Restore reads every shard file and keeps the rows
each new shard owns under its own sharding, so the number of shards (and the
sharding mode) may differ from the saving job's.
"""
import json
import os

import numpy as np

from horovod_prio.heter import ps as ps_mod

MANIFEST = "heter.json"


def _atomic_write(path, write):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def step_dir(directory, step):
    return os.path.join(directory, "step-%08d" % step)


def shard_file(index, count):
    return "shard-%d-of-%d.npz" % (index, count)


def save_shard(shard, path):
    """One shard's tables, slots and step into ``path/shard-k-of-P.npz``."""
    state = shard.state()
    arrays = {"step": np.int64(state["step"])}
    for table, entry in state["tables"].items():
        for key, value in entry.items():
            arrays["%s/%s" % (table, key)] = value
    os.makedirs(path, exist_ok=True)
    _atomic_write(os.path.join(path, shard_file(shard.index, shard.num_shards)),
                  lambda f: np.savez(f, **arrays))


def write_manifest(directory, step, manifest):
    """The manifest of a complete step directory, then ``latest``."""
    path = step_dir(directory, step)
    data = json.dumps(dict(manifest, step=step), indent=1, sort_keys=True).encode()
    _atomic_write(os.path.join(path, MANIFEST), lambda f: f.write(data))
    _atomic_write(os.path.join(directory, "latest"),
                  lambda f: f.write(os.path.basename(path).encode()))


def latest(directory):
    """The newest complete step directory under ``directory``; ValueError if none."""
    try:
        name = open(os.path.join(directory, "latest")).read().strip()
    except FileNotFoundError:
        raise ValueError("checkpoint directory %r holds no complete checkpoint (no 'latest')"
                         % directory) from None
    path = os.path.join(directory, name)
    if not os.path.exists(os.path.join(path, MANIFEST)):
        raise ValueError("checkpoint %r has no manifest %s: it is incomplete" % (path, MANIFEST))
    return path


def read_manifest(path):
    if not os.path.exists(os.path.join(path, MANIFEST)):
        raise ValueError("checkpoint %r has no manifest %s: it is incomplete" % (path, MANIFEST))
    with open(os.path.join(path, MANIFEST)) as f:
        return json.load(f)


def load_shard(shard, path):
    """Fill ``shard`` (any index/count/sharding) from the complete checkpoint
    at ``path``: the rows it owns, their slots, the step. A push's rest the
    shard kept back (``Shard.flush``) is applied first, so that it lands on
    the state it belongs to and not on the restored one."""
    shard.flush()
    manifest = read_manifest(path)
    for name, var in shard.tables.items():
        want = manifest["tables"].get(name)
        if want is None:
            raise ValueError("checkpoint %r has no table %r (it has %s)"
                             % (path, name, ", ".join(sorted(manifest["tables"]))))
        if [want["rows"], want["dim"]] != [shard.shardings[name].rows, int(var.shape[1])]:
            raise ValueError("table %r: checkpoint %r holds %d x %d rows, the model %d x %d"
                             % (name, path, want["rows"], want["dim"],
                                shard.shardings[name].rows, int(var.shape[1])))
    if manifest["slots"] != list(shard.optimizer.slot_names):
        raise ValueError("checkpoint %r holds optimizer slots %s, this optimizer (%s) needs %s"
                         % (path, manifest["slots"], shard.optimizer.kind,
                            list(shard.optimizer.slot_names)))
    fields = ["rows"] + list(shard.optimizer.slot_names)
    new = {name: {f: np.empty(var.shape, var.dtype.as_numpy_dtype) for f in fields}
           for name, var in shard.tables.items()}
    filled = {name: np.zeros(var.shape[0], bool) for name, var in shard.tables.items()}
    steps = set()
    for k in range(manifest["shards"]):
        with np.load(os.path.join(path, shard_file(k, manifest["shards"]))) as z:
            steps.add(int(z["step"]))
            for name in shard.tables:
                ids = z["%s/ids" % name]
                sh = shard.shardings[name]
                mine = sh.owner(ids) == shard.index
                local = sh.local(ids[mine])
                for f in fields:
                    new[name][f][local] = z["%s/%s" % (name, f)][mine]
                filled[name][local] = True
    for name, ok in filled.items():
        if not ok.all():
            raise ValueError("checkpoint %r misses %d rows of table %r for shard %d"
                             % (path, int((~ok).sum()), name, shard.index))
    if len(steps) != 1:
        raise ValueError("checkpoint %r: shard files from different steps %s" % (path, sorted(steps)))
    for name, var in shard.tables.items():
        var.assign(new[name]["rows"])
        for s, slot in shard.slots[name].items():
            slot.assign(new[name][s])
    shard.step.assign(steps.pop())


def save(trainer, directory):
    """Collective over every rank of ``trainer``'s job: write its step's
    checkpoint under ``directory`` (see the module doc); returns its path."""
    hvd, step = trainer.hvd, trainer.steps
    path = step_dir(directory, step)
    os.makedirs(path, exist_ok=True)
    if trainer.role == "ps":
        save_shard(trainer.shard, path)
    if trainer.role == "dense" and trainer.rank == trainer.dense_ranks[0]:
        opt = trainer.optimizer
        arrays = {"w%d" % i: v.numpy() for i, v in enumerate(trainer.dense_vars)}
        arrays.update({"o%d" % i: v.numpy() for i, v in enumerate(opt.variables)})
        _atomic_write(os.path.join(path, "dense.npz"), lambda f: np.savez(f, **arrays))
    hvd.allreduce(np.zeros(1, np.float32), name="heter.checkpoint.%d" % step)    # barrier
    if trainer.rank == 0:
        write_manifest(directory, step, {
            "shards": len(trainer.ps_ranks),
            "slots": list(ps_mod.Optimizer.from_keras(trainer.optimizer).slot_names),
            "tables": {t["name"]: {"rows": t["rows"], "dim": t["dim"]} for t in trainer.tables}})
    hvd.allreduce(np.zeros(1, np.float32), name="heter.checkpoint_done.%d" % step)
    return path


def restore(trainer, directory):
    """Every rank: load the newest complete checkpoint under ``directory``
    into ``trainer`` (any shard count); returns its step. Every rank first
    forgets the next batch its last step was told
    (``HeterTrainer.drop_look_ahead``: the keys sent ahead, a shard's kept-back
    rest applied to the state it belongs to), so the next step takes the path
    of a fresh trainer's first step on every rank: it sends its keys."""
    path = latest(directory)
    manifest = read_manifest(path)
    trainer.drop_look_ahead()
    if trainer.role == "ps":
        load_shard(trainer.shard, path)
    if trainer.role == "dense":
        opt = trainer.optimizer
        opt.build(trainer.dense_vars)
        with np.load(os.path.join(path, "dense.npz")) as z:
            ws = [z["w%d" % i] for i in range(len(trainer.dense_vars))]
            os_ = [z["o%d" % i] for i in range(len([k for k in z.files if k.startswith("o")]))]
        if len(os_) != len(opt.variables):
            raise ValueError("checkpoint %r holds %d dense optimizer variables, this optimizer "
                             "has %d" % (path, len(os_), len(opt.variables)))
        for v, w in zip(trainer.dense_vars, ws):
            v.assign(w)
        for v, w in zip(opt.variables, os_):
            v.assign(w)
    trainer.steps = manifest["step"]
    return manifest["step"]
