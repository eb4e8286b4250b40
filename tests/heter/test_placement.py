"""Placement by op type (horovod_prio.heter.placement) on known models."""
import pytest

from stack_required import import_stack_module

tf = import_stack_module("tensorflow")

from horovod_prio.heter import placement  # noqa: E402


def embedding_dense_model():
    ids = tf.keras.Input((3,), dtype="int64", name="ids")
    x = tf.keras.Input((4,), name="x")
    e = tf.keras.layers.Embedding(50, 8, name="emb")(ids)
    h = tf.keras.layers.Concatenate(name="cat")([tf.keras.layers.Flatten(name="flat")(e), x])
    h = tf.keras.layers.Dense(16, activation="relu", name="hidden")(h)
    y = tf.keras.layers.Dense(1, name="out")(h)
    return tf.keras.Model([ids, x], y, name="emb_dense")


def test_gather_lands_on_sparse_matmul_on_dense():
    plan = placement.place(embedding_dense_model())
    assert plan.kind("emb") == "sparse", plan.format()
    assert "ResourceGather" in plan._by_name["emb"].sparse_ops
    assert plan.kind("hidden") == "dense" and plan.kind("out") == "dense"
    assert plan.kind("flat") == "dense" and plan._by_name["flat"].reason == "no typed op"
    # no dense-kind layer may hold a gather, lookup or segment op
    for p in plan.layers:
        if p.kind == "dense":
            assert not p.sparse_ops, p
    assert plan.param_bytes("sparse") == 50 * 8 * 4
    assert plan.param_bytes("dense") == (3 * 8 + 4) * 16 * 4 + 16 * 4 + 16 * 4 + 4


def test_plan_prints_kinds_bytes_and_exchange():
    plan = placement.place(embedding_dense_model())
    text = plan.format(batch_size=10)
    assert "emb" in text and "sparse kind: 1 layers, 1600 parameter bytes" in text
    ex = plan.exchange_bytes(10)
    assert ex["pull_keys"] == 30 * 8                 # 10 samples x 3 ids, all distinct
    assert ex["pull_rows"] == ex["push_row_grads"] == 30 * 8 * 4
    assert ex["activations"] == ex["activation_grads"] == 10 * 3 * 8 * 4
    assert plan.exchange_bytes(100)["pull_rows"] == 50 * 8 * 4   # capped at the table
    assert plan.exchange_bytes(10, dense_trainers=2)["dense_allreduce_per_trainer"] \
        == plan.param_bytes("dense")
    with pytest.raises(ValueError, match="batch_size"):
        plan.exchange_bytes(0)


def test_backward_only_gather_is_seen():
    """A layer whose forward has no sparse op but whose gradient gathers."""

    class GatherGrad(tf.keras.layers.Layer):
        def call(self, x):
            @tf.custom_gradient
            def f(v):
                def grad(dy):
                    return tf.gather(dy, tf.range(tf.shape(dy)[0]))
                return v * 2.0, grad
            return f(x)

    x = tf.keras.Input((4,), name="x")
    h = GatherGrad(name="gg")(x)
    out = tf.keras.layers.Dense(1, name="out")(h)
    plan = placement.place(tf.keras.Model(x, out))
    assert plan.kind("gg") == "sparse", plan.format()


def test_segment_pooling_is_sparse():
    ids = tf.keras.Input((4,), dtype="int32", name="ids")

    class Pool(tf.keras.layers.Layer):
        def call(self, e):
            rows = tf.reshape(tf.range(tf.shape(e)[0]), [-1, 1]) * tf.ones([1, 4], tf.int32)
            return tf.math.unsorted_segment_sum(tf.reshape(e, [-1, 8]), tf.reshape(rows, [-1]),
                                                tf.shape(e)[0])

    e = tf.keras.layers.Embedding(20, 8, name="emb")(ids)
    p = Pool(name="pool")(e)
    out = tf.keras.layers.Dense(1, name="out")(p)
    plan = placement.place(tf.keras.Model(ids, out))
    assert plan.names("sparse") == ["emb", "pool"]
    assert [p.name for p in plan.boundary()] == ["pool"]


def test_override_wins_and_bad_overrides_are_named():
    model = embedding_dense_model()
    plan = placement.place(model, overrides={"flat": "sparse"})
    assert plan.kind("flat") == "sparse" and plan._by_name["flat"].reason.startswith("override")
    with pytest.raises(ValueError, match="'nosuch'.*its layers: ids, emb, flat"):
        placement.place(model, overrides={"nosuch": "dense"})
    with pytest.raises(ValueError, match="layer 'emb': kind 'gpu'"):
        placement.place(model, overrides={"emb": "gpu"})


def test_model_without_sparse_ops_is_an_error():
    x = tf.keras.Input((4,))
    model = tf.keras.Model(x, tf.keras.layers.Dense(2)(x), name="mlp")
    with pytest.raises(ValueError, match="model 'mlp' has no layer with a sparse op"):
        placement.place(model)
    plan = placement.place(model, require_sparse=False)
    assert plan.names("sparse") == []
    # an override makes it placeable
    assert placement.place(model, overrides={model.layers[1].name: "sparse"}).names("sparse")


def test_op_tables_are_disjoint():
    assert not placement.SPARSE_OP_TYPES & placement.DENSE_OP_TYPES


def test_placeholder_tables_keep_the_declared_shape_and_allocate_one_row():
    full = placement.place(embedding_dense_model())
    with placement.placeholder_tables():
        model = embedding_dense_model()
    emb = model.get_layer("emb")
    assert tuple(emb.embeddings.shape) == (1, 8) and placement.is_placeholder(emb)
    assert placement.table_shape(emb) == (50, 8)
    plan = placement.place(model)
    assert plan.kind("emb") == "sparse"
    assert plan.param_bytes("sparse") == full.param_bytes("sparse") == 50 * 8 * 4
    assert plan.exchange_bytes(64) == full.exchange_bytes(64)
    # the context ends: a model built after it has its whole table again
    again = embedding_dense_model().get_layer("emb")
    assert tuple(again.embeddings.shape) == (50, 8) and not placement.is_placeholder(again)


def test_pooling_joins_the_sparse_kind_and_a_dense_on_sequences_stays_dense():
    """Mean pooling of a multi-hot field has no typed op of its own (its only
    gather picks entries of a shape vector): it joins the sparse kind because
    it shrinks a sparse-kind output. A Dense applied per id (Tensordot, whose
    gathers are of shapes too) stays dense, and so does a Flatten (no smaller)."""
    ids = tf.keras.Input((4,), dtype="int64", name="ids")
    e = tf.keras.layers.Embedding(20, 8, name="emb")(ids)
    pool = tf.keras.layers.GlobalAveragePooling1D(name="pool")(e)
    proj = tf.keras.layers.Dense(8, name="proj")(e)
    h = tf.keras.layers.Concatenate(name="cat")(
        [pool, tf.keras.layers.Flatten(name="flat")(proj), tf.keras.layers.Flatten(name="fe")(e)])
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="out")(h))
    plan = placement.place(model)
    assert plan.kind("pool") == "sparse", plan.format()
    assert plan._by_name["pool"].reason == "reduces sparse-kind outputs (128 -> 32 bytes per sample)"
    assert plan.kind("proj") == "dense" and not plan._by_name["proj"].sparse_ops, plan.format()
    assert plan.kind("fe") == "dense" and plan.kind("flat") == "dense"
    assert [p.name for p in plan.boundary()] == ["emb", "pool"]
    # an override still wins
    assert placement.place(model, overrides={"pool": "dense"}).kind("pool") == "dense"
