"""Placement by op type of a tape-based training step
(horovod_prio.heter.tape_placement), single process."""
import pytest

from stack_required import import_stack_module

tf = import_stack_module("tensorflow")

from horovod_prio.heter import placement  # noqa: E402
from horovod_prio.heter.tape_placement import place_step  # noqa: E402


def embedding_mlp():
    emb = tf.keras.layers.Embedding(50, 8, name="emb")
    hidden = tf.keras.layers.Dense(16, activation="relu", name="hidden")
    out = tf.keras.layers.Dense(1, name="out")
    opt = tf.keras.optimizers.Adagrad(0.1)
    variables = []

    def train_step(ids, x, y):
        with tf.GradientTape() as tape:
            e = tf.reshape(emb(ids), [tf.shape(ids)[0], -1])
            pred = out(hidden(tf.concat([e, x], axis=1)))
            loss = tf.reduce_mean(tf.square(pred - y))
        variables[:] = emb.trainable_variables + hidden.trainable_variables + \
            out.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    args = (tf.zeros([10, 3], tf.int64), tf.zeros([10, 4]), tf.zeros([10, 1]))
    return train_step, args


def test_tape_step_places_the_table_sparse_and_the_kernels_dense():
    step, args = embedding_mlp()
    plan = place_step(tf.function(step), *args)
    assert plan.step_name == "train_step"
    assert [u.name for u in plan.units] == ["emb/embeddings", "hidden/kernel", "hidden/bias",
                                            "out/kernel", "out/bias"]
    assert plan.names("sparse") == ["emb/embeddings"], plan.format()
    table = plan._by_name["emb/embeddings"]
    assert "ResourceGather" in table.reads and "ResourceGather" in table.sparse_ops
    assert table.reason.startswith("ops ResourceGather")
    for name in ("hidden/kernel", "out/kernel"):
        assert plan.kind(name) == "dense" and plan._by_name[name].reason == "ops MatMul"
        assert "MatMul" in plan._by_name[name].grad_ops          # its own weight gradient
    assert plan._by_name["hidden/bias"].reason == "no typed op"
    # no dense-kind unit may hold a gather, lookup, segment or scatter op
    for u in plan.units:
        if u.kind == "dense":
            assert not u.sparse_ops, u
    assert plan.param_bytes("sparse") == 50 * 8 * 4
    assert plan.param_bytes("dense") == ((3 * 8 + 4) * 16 + 16 + 16 + 1) * 4


def test_tape_plan_prints_bytes_and_says_what_it_cannot_compute():
    step, args = embedding_mlp()
    plan = place_step(step, *args)
    ex = plan.exchange_bytes()
    assert ex["pull_keys"] == 30 * 8                       # 10 samples x 3 ids, all distinct
    assert ex["pull_rows"] == ex["push_row_grads"] == 30 * 8 * 4
    assert ex["activations"] is None and ex["activation_grads"] is None
    assert plan.exchange_bytes(dense_trainers=2)["dense_allreduce_per_trainer"] \
        == plan.param_bytes("dense")
    text = plan.format()
    assert "emb/embeddings" in text and "sparse kind: 1 units, 1600 parameter bytes" in text
    assert "activations                  not computed (1)" in text
    assert "(1) a tape step has no layers" in text
    assert "pull_rows" in text and "%12d bytes" % (30 * 8 * 4) in text
    with pytest.raises(ValueError, match="dense_trainers=0"):
        plan.exchange_bytes(dense_trainers=0)


def test_embedding_lookup_sparse_in_a_nested_function_and_segment_ops():
    table = tf.Variable(tf.random.normal([40, 8]), name="table")
    pooled = tf.Variable(tf.random.normal([30, 8]), name="pooled")
    bags = tf.Variable(tf.random.normal([4, 8]), name="bags")
    w = tf.Variable(tf.random.normal([8, 1]), name="w")

    @tf.function
    def lookup(t, sp):
        return tf.nn.embedding_lookup_sparse(t, sp, None, combiner="mean")

    def step(sp, ids, y):
        with tf.GradientTape() as tape:
            e = lookup(table, sp)
            e = tf.cond(tf.reduce_sum(y) > 0, lambda: e * 2.0, lambda: e)
            rows = tf.gather(pooled.read_value(), tf.reshape(ids, [-1]))
            p = tf.math.unsorted_segment_sum(rows, tf.repeat(tf.range(2), 3), 2)
            b = tf.math.segment_mean(bags, [0, 0, 1, 1])
            loss = tf.reduce_mean(tf.square(tf.matmul(e + p + b, w) - y))
        return tape.gradient(loss, [table, pooled, bags, w])

    sp = tf.sparse.from_dense(tf.constant([[1, 0, 3], [4, 5, 0]], tf.int64))
    plan = place_step(step, sp, tf.zeros([2, 3], tf.int64), tf.zeros([2, 1]))
    assert plan.names("sparse") == ["table", "pooled", "bags"] and plan.names("dense") == ["w"]
    t = plan._by_name["table"]
    assert "ResourceGather" in t.reads                      # inside the nested function
    assert "SparseSegmentMeanGrad" in t.grad_ops            # its backward, a nested function too
    assert "GatherV2" in plan._by_name["pooled"].reads      # a gather of the variable's value
    assert "GatherV2" in plan._by_name["pooled"].grad_ops   # the segment sum's gradient
    assert plan._by_name["bags"].reads == ("SegmentMean",)  # a segment op on the whole variable
    assert not plan._by_name["w"].sparse_ops
    # the ids of a SparseTensor and of a gather on a read value are not counted
    ex = plan.exchange_bytes()
    assert ex["pull_rows"] is None and ex["dense_allreduce_per_trainer"] == 0
    why = plan.not_computed()["pull_rows"]
    assert "table, pooled, bags not looked up by a ResourceGather" in why


def test_backward_only_gather_is_seen():
    """A variable whose reads hold no sparse op but whose gradient gathers."""
    scale = tf.Variable(tf.ones([4]), name="scale")
    w = tf.Variable(tf.ones([4, 1]), name="w")

    @tf.custom_gradient
    def rows(v):
        def grad(dy):
            return tf.gather(dy, tf.range(tf.shape(dy)[0]))
        return v * 1.0, grad

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(rows(x * scale), w))
        return tape.gradient(loss, [scale, w])

    plan = place_step(step, tf.ones([3, 4]))
    s = plan._by_name["scale"]
    assert s.kind == "sparse" and "GatherV2" in s.grad_ops and "GatherV2" not in s.reads, plan
    assert plan.kind("w") == "dense"


def test_a_gather_every_gradient_needs_places_no_variable_sparse():
    """A float gather in the loss (picking predictions) has its gradient
    upstream of every variable's: it belongs to no variable."""
    w1 = tf.Variable(tf.ones([4, 4]), name="w1")
    w2 = tf.Variable(tf.ones([4, 1]), name="w2")

    def step(x, pick):
        with tf.GradientTape() as tape:
            pred = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
            loss = tf.reduce_sum(tf.gather(pred, pick))
        return tape.gradient(loss, [w1, w2])

    plan = place_step(step, tf.ones([3, 4]), tf.constant([0, 2]), require_sparse=False)
    assert plan.names("dense") == ["w1", "w2"], plan
    assert all(u.reason == "ops MatMul" for u in plan.units)


def test_integer_gathers_stay_dense():
    """A mean over a dynamically shaped tensor gathers entries of its shape
    vector in the backward pass: an integer gather, not a sparse op."""
    w = tf.Variable(tf.ones([4, 2]), name="w")

    def step(x):
        with tf.GradientTape() as tape:
            kept = tf.boolean_mask(x, x[:, 0] > 0)           # rows: unknown until run
            loss = tf.reduce_mean(tf.matmul(kept, w), axis=0)
        return tape.gradient(loss, [w])

    x = tf.ones([3, 4])
    graph = tf.function(step).get_concrete_function(x).graph.as_graph_def()
    int_gathers = [n for f in graph.library.function for n in f.node_def] + list(graph.node)
    assert any(placement._gathers_a_shape(n) for n in int_gathers)  # the case is present
    plan = place_step(step, x, require_sparse=False)
    assert plan.kind("w") == "dense" and plan._by_name["w"].reason == "ops MatMul", plan


def raw_step():
    table = tf.Variable(tf.random.normal([50, 8]), name="table")
    w1 = tf.Variable(tf.random.normal([24, 16]), name="w1")
    b1 = tf.Variable(tf.zeros([16]), name="b1")
    w2 = tf.Variable(tf.random.normal([16, 1]), name="w2")

    def step(ids, y):
        with tf.GradientTape() as tape:
            e = tf.reshape(tf.nn.embedding_lookup(table, ids), [-1, 24])
            h = tf.nn.relu(tf.matmul(e, w1) + b1)
            loss = tf.reduce_mean(tf.square(tf.matmul(h, w2) - y))
        return tape.gradient(loss, [table, w1, b1, w2])

    return step, (table, w1, b1, w2), (tf.zeros([4, 3], tf.int64), tf.zeros([4, 1]))


def test_groups_and_overrides():
    step, (table, w1, b1, w2), args = raw_step()
    plan = place_step(step, *args, variables={"tables": table, "mlp": [w1, b1, w2]})
    assert plan.names("sparse") == ["tables"] and plan.names("dense") == ["mlp"], plan
    assert plan._by_name["mlp"].variables == ("w1:0", "b1:0", "w2:0")
    assert plan.param_bytes("dense") == (24 * 16 + 16 + 16) * 4
    assert "mlp                      3 variables" in plan.format()
    # a per-unit override wins over the op types, and says what the ops said
    plan = place_step(step, *args, variables={"tables": table, "mlp": [w1, b1, w2]},
                      overrides={"mlp": "sparse", "tables": "dense"})
    assert plan.kind("mlp") == "sparse" and plan.kind("tables") == "dense"
    assert plan._by_name["tables"].reason == "override (ops said sparse: ops ResourceGather)"
    # per variable: only the named ones are placed
    plan = place_step(step, *args, variables=[table, w2], overrides={"w2": "sparse"})
    assert [u.name for u in plan.units] == ["table", "w2"] and plan.names("dense") == []
    with pytest.raises(ValueError, match="variable 'w1', which step 'step' does not have "
                                         r"\(its variables: table, w2\)"):
        place_step(step, *args, variables=[table, w2], overrides={"w1": "dense"})
    with pytest.raises(ValueError, match="a variable is in more than one unit"):
        place_step(step, *args, variables={"a": [table, w1], "b": [w1]})


def test_errors_name_the_step_the_unit_and_the_kind():
    v = tf.Variable(1.0, name="v")
    frozen = tf.Variable(1.0, trainable=False, name="frozen")

    def no_variable(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x * frozen
        return tape.gradient(y, x)

    with pytest.raises(ValueError, match="step function 'no_variable' reads no trainable "
                                         "variable"):
        place_step(no_variable, tf.ones([2]))

    def broken(x):
        return tf.matmul(x, x[0])                           # rank 1: MatMul refuses

    with pytest.raises(ValueError, match="step function 'broken' failed to trace with the "
                                         "example arguments: ValueError"):
        place_step(broken, tf.ones([2, 2]))

    def forward_only(x):
        return x * v

    with pytest.raises(ValueError, match="'forward_only' computes no gradient"):
        place_step(forward_only, tf.ones([2]))

    def step(x):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(x * v)
        return tape.gradient(y, v)

    with pytest.raises(ValueError, match="holds variable 'other:0', which step function 'step' "
                                         "does not read"):
        place_step(step, tf.ones([2]), variables=[v, tf.Variable(2.0, name="other")])
    with pytest.raises(ValueError, match="unit 'g' holds 3, which is not a tf.Variable"):
        place_step(step, tf.ones([2]), variables={"g": [v, 3]})
    twin = tf.Variable(2.0, name="v")

    def twins(x):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(x * v * twin)
        return tape.gradient(y, [v, twin])

    with pytest.raises(ValueError, match="two variables of step 'twins' are named 'v'"):
        place_step(twins, tf.ones([2]), require_sparse=False)
    assert place_step(twins, tf.ones([2]), variables={"a": v, "b": twin},
                      require_sparse=False).names("dense") == ["a", "b"]
    with pytest.raises(ValueError, match="step function 'step' has no unit with a sparse op"):
        place_step(step, tf.ones([2]))
    with pytest.raises(ValueError, match="variable 'nosuch', which step 'step' does not have "
                                         r"\(its variables: v\)"):
        place_step(step, tf.ones([2]), overrides={"nosuch": "sparse"})
    with pytest.raises(ValueError, match="override for variable 'v': kind 'gpu' is not one of "
                                         "sparse, dense"):
        place_step(step, tf.ones([2]), overrides={"v": "gpu"})


def test_heter_trainer_refuses_a_tape_plan():
    from horovod_prio.heter.trainer import HeterTrainer
    step, args = embedding_mlp()
    plan = place_step(step, *args)
    with pytest.raises(TypeError, match="placement of tape step 'train_step'.*HeterTrainer runs "
                                        "Keras models only; build the model as Keras layers"):
        HeterTrainer(None, None, None, None, plan=plan)
