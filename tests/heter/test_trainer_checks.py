"""What the heterogeneous trainer refuses at construction and per batch, in
one process (a stand-in for Horovod's size/rank: no collective runs before
these checks)."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from stack_required import import_stack_module

tf = import_stack_module("tensorflow")

from horovod_prio.heter import roles as roles_mod  # noqa: E402
from horovod_prio.heter.trainer import HeterTrainer  # noqa: E402

pytestmark = pytest.mark.tf_stack      # roles' process sets come from horovod.common


# the stand-in world must not set up the process's runtime (a real job's state), nor
# glibc malloc (process-wide: test_heter_ranks_tune_glibc_malloc_before_they_allocate)
NO_RUNTIME = {"enabled": False, "malloc_tuning": False}


class FakeHvd:
    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def model(rows=10):
    ids = tf.keras.Input((2,), dtype="int64", name="ids")
    x = tf.keras.Input((3,), name="x")
    e = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(rows, 4, name="emb")(ids))
    out = tf.keras.layers.Dense(1, name="out")(tf.keras.layers.Concatenate()([e, x]))
    return tf.keras.Model([ids, x], out)


def trainer(m, roles="ps=1,sparse=1,dense=1", size=3, rank=1):
    return HeterTrainer(m, tf.keras.losses.MeanSquaredError(), tf.keras.optimizers.SGD(0.1),
                        roles_mod.parse(roles, size),
                        hvd=FakeHvd(size, rank), priority=NO_RUNTIME)


def test_roles_for_another_job_size_are_named():
    r = roles_mod.parse("ps=1,sparse=1,dense=2", 4)
    with pytest.raises(ValueError, match="HOROVOD_PRIO_HETER_ROLES: roles for 4 ranks, the job has 3"):
        HeterTrainer(model(), tf.keras.losses.MeanSquaredError(), tf.keras.optimizers.SGD(0.1),
                     r, hvd=FakeHvd(3, 0))


def test_more_shards_than_rows_is_named():
    with pytest.raises(ValueError, match="3 parameter-server shards but table 'emb' has only 2 rows"):
        trainer(model(rows=2), "ps=3,sparse=1,dense=1", size=5)


class Pool(tf.keras.layers.Layer):
    """Sums a sample's 4 embeddings (its ops make it sparse-kind)."""

    def call(self, e):
        return tf.math.unsorted_segment_sum(tf.transpose(e, [1, 0, 2]),
                                            tf.zeros([4], tf.int32), 1)[0]


class WeightedPool(Pool):
    def build(self, shape):
        self.scale = self.add_weight(name="scale", shape=(), initializer="ones")

    def call(self, e):
        return super().call(e) * self.scale


def test_pooling_after_the_tables_runs_on_the_sparse_trainer():
    ids = tf.keras.Input((4,), dtype="int32", name="ids")
    e = tf.keras.layers.Embedding(20, 8, name="emb")(ids)
    out = tf.keras.layers.Dense(1, name="out")(Pool(name="pool")(e))
    t = trainer(tf.keras.Model(ids, out))
    assert t.side_layers == ["pool"]
    assert [c["name"] for c in t.cut] == ["pool"] and t.features == 8     # not 4 x 8


def test_sparse_side_layer_with_weights_is_named():
    ids = tf.keras.Input((4,), dtype="int32", name="ids")
    e = tf.keras.layers.Embedding(20, 8, name="emb")(ids)
    out = tf.keras.layers.Dense(1)(WeightedPool(name="wpool")(e))
    with pytest.raises(ValueError, match="sparse-kind layer 'wpool' .a WeightedPool. has "
                                         "trainable weights"):
        trainer(tf.keras.Model(ids, out))


def test_sparse_side_layer_reading_a_dense_output_is_named():
    ids = tf.keras.Input((4,), dtype="int32", name="ids")
    e = tf.keras.layers.Embedding(20, 8, name="emb")(ids)
    d = tf.keras.layers.Dense(8, name="proj")(e)
    out = tf.keras.layers.Dense(1)(Pool(name="pool")(d))
    with pytest.raises(ValueError, match="sparse-kind layer 'pool' .a Pool. reads 'proj', which "
                                         "is not of the sparse kind"):
        trainer(tf.keras.Model(ids, out))


def test_bad_batches_are_named_before_any_collective():
    t = trainer(model())
    x = {"ids": np.array([[0, 1], [2, 3]]), "x": np.zeros((2, 3), np.float32)}
    y = np.zeros((2, 1), np.float32)
    t.check_batch(x, y)
    with pytest.raises(ValueError, match=r"input 'ids': ids \[-1, 10\] out of table 'emb''s rows 0-9"):
        t.check_batch(dict(x, ids=np.array([[0, 10], [-1, 3]])), y)
    with pytest.raises(ValueError, match=r"input 'ids': shape \(2, 3\), expected \(2,\) \+ \(2,\)"):
        t.check_batch(dict(x, ids=np.zeros((2, 3), np.int64)), y)
    with pytest.raises(ValueError, match="batch has no input 'x'"):
        t.check_batch({"ids": x["ids"]}, y)
    with pytest.raises(ValueError, match="global batch of 1 samples is smaller than"):
        trainer(model(), "ps=1,sparse=2,dense=1", size=4).check_batch(
            {"ids": x["ids"][:1], "x": x["x"][:1]}, y[:1])


def test_bad_next_inputs_are_named_before_any_collective():
    """step(next_inputs=...) checks the next batch's ids with the batch's
    (FakeHvd has no collectives: reaching one would raise AttributeError)."""
    t = trainer(model())
    x = {"ids": np.array([[0, 1], [2, 3]]), "x": np.zeros((2, 3), np.float32)}
    y = np.zeros((2, 1), np.float32)
    with pytest.raises(ValueError, match=r"next_inputs: input 'ids': ids \[10\] out of table "
                                         r"'emb''s rows 0-9"):
        t.step(x, y, next_inputs={"ids": np.array([[0, 10]])})
    with pytest.raises(ValueError, match=r"next_inputs has no input 'ids' \(table 'emb'\)"):
        t.step(x, y, next_inputs={"x": x["x"]})
    with pytest.raises(ValueError, match="next_inputs of 1 samples is smaller than"):
        trainer(model(), "ps=1,sparse=2,dense=1", size=4).step(
            x, y, next_inputs={"ids": x["ids"][:1]})
    assert t.steps == 0 and t._ahead is None
    with pytest.raises(ValueError, match=r"steps=-1: give a number of steps >= 0 or None"):
        t.fit([(x, y)], steps=-1)
    assert t.fit([(x, y)], steps=0) == []


def test_next_keys_ride_with_the_row_gradients_bit_for_bit():
    """The float32 message of row gradients + next keys (two shards) comes
    apart on a shard into the same gradients and int64 keys, also keys whose
    words read as NaN floats."""
    from horovod_prio.heter.trainer import _split_keys, _with_keys
    rows = np.arange(10, dtype=np.float32) + 0.5             # 6 floats to shard 0, 4 to shard 1
    keys = np.array([3, 0x7FC00001_7FC00001, 5, 2 ** 40 + 7, 11], np.int64)  # 2 to 0, 3 to 1
    msg, splits = _with_keys(rows, [6, 4], keys, [2, 3])
    assert msg.dtype == np.float32 and splits == [6 + 4, 4 + 6]
    # shard 1 receives its part (another sender sent it nothing)
    got_rows, (got_keys, per) = _split_keys(msg[10:], [0, 10], [0, 4])
    assert np.array_equal(got_rows, rows[6:]) and np.array_equal(got_keys, keys[2:])
    assert per.tolist() == [0, 3]
    got_rows, (got_keys, per) = _split_keys(msg[:10], [10], [6])
    assert np.array_equal(got_rows, rows[:6]) and got_keys.tolist() == keys[:2].tolist()
    with pytest.raises(RuntimeError, match="9 floats from a sparse trainer that was sent 6"):
        _split_keys(msg[:9], [9], [6])


TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MALLOC_SCRIPT = textwrap.dedent("""
    import json, logging, os, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sys.path.insert(0, %r)
    from malloc_probe import probe
    import tensorflow as tf
    from horovod_prio.heter import roles as roles_mod
    from horovod_prio.heter.trainer import HeterTrainer

    class FakeHvd:
        def size(self):
            return 3

        def rank(self):
            return int(sys.argv[1])

    ids = tf.keras.Input((2,), dtype="int64", name="ids")
    x = tf.keras.Input((3,), name="x")
    e = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(10, 4, name="emb")(ids))
    out = tf.keras.layers.Dense(1, name="out")(tf.keras.layers.Concatenate()([e, x]))
    t = HeterTrainer(tf.keras.Model([ids, x], out), tf.keras.losses.MeanSquaredError(),
                     tf.keras.optimizers.SGD(0.1), roles_mod.parse("ps=1,sparse=1,dense=1", 3),
                     hvd=FakeHvd(), priority=dict(json.loads(sys.argv[2]), enabled=False))
    print(json.dumps(dict(probe(), role=t.role)))
""" % TESTS)


def built_trainer_probe(rank, priority):
    """A fresh process builds a trainer of ``rank`` (stand-in Horovod), then
    mallocs, touches and frees 100 MB (tests/malloc_probe.py)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES",
                                                        "HOROVOD_PRIO_MALLOC_TUNING")}
    env.update(PYTHONPATH=os.path.dirname(TESTS), TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run([sys.executable, "-c", MALLOC_SCRIPT, str(rank), json.dumps(priority)],
                       capture_output=True, text=True, timeout=180, env=env, cwd="/")
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_heter_ranks_tune_glibc_malloc_before_they_allocate():
    """Every role's trainer set-up makes glibc keep a freed 100 MB block in
    the heap for reuse (defaults: its own mapping, unmapped at the free);
    ``malloc_tuning=False`` leaves glibc's defaults."""
    for rank, role in ((0, "ps"), (1, "sparse")):
        got, err = built_trainer_probe(rank, {})
        assert got["role"] == role
        assert got["in_heap"] and got["kept"] > 90 << 20, got
        assert err.count("glibc malloc keeps freed blocks for reuse (a heterogeneous "
                         "trainer's rank)") == 1, err
    got, err = built_trainer_probe(0, {"malloc_tuning": False})
    assert not got["in_heap"] and got["kept"] < 10 << 20, got
    assert "glibc malloc" not in err
