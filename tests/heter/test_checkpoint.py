"""Checkpoints of the sharded tables (horovod_prio.heter.checkpoint): restore
onto another shard count, nothing read from a half-written checkpoint. The
trainer-level save/restore round trip runs under horovodrun in
test_trainer.py."""
import os

import numpy as np
import pytest

from stack_required import import_stack_module

tf = import_stack_module("tensorflow")

from horovod_prio.heter import checkpoint, ps  # noqa: E402

TABLES = {"a": (29, 4), "b": (7, 3)}


def trained_shards(count, sharding, kind="adam", steps=4):
    rng = np.random.default_rng(0)
    init = {t: rng.standard_normal(shape).astype(np.float32) for t, shape in TABLES.items()}
    opt = ps.Optimizer(kind, 0.05)
    shards = [ps.Shard(k, count, init, opt, sharding) for k in range(count)]
    for _ in range(steps):
        grads = {t: (rng.integers(0, r, 9), rng.standard_normal((9, d)).astype(np.float32))
                 for t, (r, d) in TABLES.items()}
        for sh in shards:
            sh.push({t: (ids[sh.shardings[t].owner(ids) == sh.index],
                         v[sh.shardings[t].owner(ids) == sh.index]) for t, (ids, v) in grads.items()})
    return shards, init, opt


def whole(shards, field):
    out = {}
    for t, (r, d) in TABLES.items():
        full = np.full((r, d), np.nan, np.float32)
        for sh in shards:
            e = sh.state()["tables"][t]
            full[e["ids"]] = e[field]
        out[t] = full
    return out


def save_all(shards, directory, step):
    path = checkpoint.step_dir(directory, step)
    for sh in shards:
        checkpoint.save_shard(sh, path)
    checkpoint.write_manifest(directory, step, {
        "shards": len(shards), "slots": list(shards[0].optimizer.slot_names),
        "tables": {t: {"rows": r, "dim": d} for t, (r, d) in TABLES.items()}})
    return path


@pytest.mark.parametrize("before,after", [(3, 2), (2, 3)])
def test_restore_onto_another_shard_count(tmp_path, before, after):
    shards, init, opt = trained_shards(before, "mod")
    save_all(shards, str(tmp_path), 4)
    target = [ps.Shard(k, after, init, opt, "range") for k in range(after)]   # other mode too
    path = checkpoint.latest(str(tmp_path))
    for sh in target:
        checkpoint.load_shard(sh, path)
        assert int(sh.step.numpy()) == 4
    for field in ("rows", "m", "v"):
        want, got = whole(shards, field), whole(target, field)
        for t in TABLES:
            np.testing.assert_array_equal(got[t], want[t])
    assert not np.array_equal(whole(target, "rows")["a"], init["a"])
    # and the restored shards go on training exactly as the saved ones would
    grads = {"a": (np.array([1, 5, 5, 28]), np.ones((4, 4), np.float32))}
    for group in (shards, target):
        for sh in group:
            sh.push({t: (ids[sh.shardings[t].owner(ids) == sh.index],
                         v[sh.shardings[t].owner(ids) == sh.index]) for t, (ids, v) in grads.items()})
    np.testing.assert_array_equal(whole(target, "rows")["a"], whole(shards, "rows")["a"])


def test_half_written_checkpoint_is_never_read(tmp_path):
    shards, init, opt = trained_shards(2, "mod", steps=2)
    save_all(shards, str(tmp_path), 2)
    # a later save dies after one shard file, before the manifest
    more, _, _ = trained_shards(2, "mod", steps=3)
    checkpoint.save_shard(more[0], checkpoint.step_dir(str(tmp_path), 3))
    assert checkpoint.latest(str(tmp_path)).endswith("step-00000002")
    with pytest.raises(ValueError, match="step-00000003.*has no manifest heter.json: it is incomplete"):
        checkpoint.read_manifest(checkpoint.step_dir(str(tmp_path), 3))
    # no temporary file is left next to the finished ones
    assert not [f for f in os.listdir(checkpoint.step_dir(str(tmp_path), 2)) if ".tmp-" in f]
    with pytest.raises(ValueError, match="no complete checkpoint"):
        checkpoint.latest(str(tmp_path / "empty"))


def test_restore_checks_tables_and_slots(tmp_path):
    shards, init, opt = trained_shards(2, "mod", kind="adam", steps=1)
    path = save_all(shards, str(tmp_path), 1)
    sgd = [ps.Shard(0, 2, init, ps.Optimizer("sgd", 0.1))]
    with pytest.raises(ValueError, match=r"optimizer slots \['m', 'v'\], this optimizer \(sgd\)"):
        checkpoint.load_shard(sgd[0], path)
    other = dict(init, a=np.zeros((30, 4), np.float32))
    with pytest.raises(ValueError, match="table 'a': checkpoint .* holds 29 x 4 rows, the model 30 x 4"):
        checkpoint.load_shard(ps.Shard(0, 2, other, opt), path)
    with pytest.raises(ValueError, match="has no table 'c'"):
        checkpoint.load_shard(ps.Shard(0, 2, dict(init, c=np.zeros((3, 2))), opt), path)


def test_restore_over_a_split_push_keeps_the_checkpoint(tmp_path):
    """A shard holding the rest of a split push (SGD splits at any width)
    restores the checkpoint's bits: the rest goes to the state before it."""
    shards, init, opt = trained_shards(1, "mod", kind="sgd")
    path = save_all(shards, str(tmp_path), 4)
    want = shards[0].state()
    other = ps.Shard(0, 1, init, opt)
    other.apply_local([np.array([0, 5, 9]), np.array([1, 2])],
                      [np.ones((3, 4), np.float32), np.ones((2, 3), np.float32)],
                      next_keys=([0], [5]))
    assert other.apply_parts == {"ahead": 1}
    checkpoint.load_shard(other, path)
    got = other.state()
    assert got["step"] == want["step"] == 4
    for t in TABLES:
        assert np.array_equal(got["tables"][t]["rows"], want["tables"][t]["rows"]), t


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_checkpoint_taken_over_a_split_push_restores_its_bits(tmp_path, kind):
    """Pushes applied in two parts (the rows the next step reads, then the
    rest at flush), saved while the last push's rest is pending: the
    checkpoint holds the bits of one-part pushes (saving applies the rest,
    with its own step's bias correction for Adam). A shard holding a rest of
    its own restores those bits, and both go on training (in two parts, the
    reference in one) to the same bits."""
    rng = np.random.default_rng(7)
    init = {t: rng.standard_normal(shape).astype(np.float32) for t, shape in TABLES.items()}
    opt = ps.Optimizer(kind, 0.05)
    two, one, other = (ps.Shard(0, 1, init, opt) for _ in range(3))

    def keys():
        return [rng.integers(0, r, 6) for r, _ in TABLES.values()]

    def push(shard, cur, values, nxt):
        shard.flush()                                # after the next rows went out
        shard.apply_local(cur, values, next_keys=None if nxt is None else (
            np.repeat(np.arange(len(nxt)), [len(n) for n in nxt]), np.concatenate(nxt)))

    cur = keys()
    for step in range(4):
        nxt = keys()
        values = [rng.standard_normal((len(i), d)).astype(np.float32)
                  for i, (_, d) in zip(cur, TABLES.values())]
        push(two, cur, values, nxt)
        push(one, cur, values, None)
        cur = nxt
    assert two.apply_parts == {"ahead": 4, "rest": 3} and two._rest is not None
    push(other, keys(), [np.ones((6, d), np.float32) for _, d in TABLES.values()], keys())
    assert other._rest is not None
    path = save_all([two], str(tmp_path), 4)
    checkpoint.load_shard(other, path)
    for shard in (two, other):
        got, want = shard.state(), one.state()
        assert got["step"] == want["step"] == 4
        for t in TABLES:
            for field in want["tables"][t]:
                assert np.array_equal(got["tables"][t][field], want["tables"][t][field]), \
                    (t, field)
    for step in range(3):
        nxt = keys()
        values = [rng.standard_normal((len(i), d)).astype(np.float32)
                  for i, (_, d) in zip(cur, TABLES.values())]
        push(other, cur, values, nxt)
        push(one, cur, values, None)
        cur = nxt
    got, want = other.state(), one.state()
    for t in TABLES:
        for field in want["tables"][t]:
            assert np.array_equal(got["tables"][t][field], want["tables"][t][field]), (t, field)
