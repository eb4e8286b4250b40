"""Parameter-server shards (horovod_prio.heter.ps): bit for bit what Keras's
optimizer does to the whole table, in one process."""
import numpy as np
import pytest

from stack_required import import_stack_module

tf = import_stack_module("tensorflow")

from horovod_prio.heter import ps  # noqa: E402

ROWS, DIM, STEPS = 23, 4, 6


def keras_optimizer(kind):
    return {"sgd": lambda: tf.keras.optimizers.SGD(0.05),
            "adagrad": lambda: tf.keras.optimizers.Adagrad(0.05),
            "adam": lambda: tf.keras.optimizers.Adam(0.01)}[kind]()


def keras_slots(opt, kind):
    if kind == "sgd":
        return {}
    if kind == "adagrad":
        return {"accumulator": opt._accumulators[0].numpy()}
    return {"m": opt._momentums[0].numpy(), "v": opt._velocities[0].numpy()}


def sparse_grads(seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        ids = rng.integers(0, ROWS, size=17).astype(np.int64)   # duplicates on purpose
        ids[:3] = ids[3]
        out.append((ids, rng.standard_normal((17, DIM)).astype(np.float32)))
    return out


@pytest.fixture
def no_arithmetic_rewrite():
    """Grappler's arithmetic optimizer off: it rewrites Adagrad's x / sqrt(y)
    into a kernel whose result depends on the element's offset (ps.py)."""
    before = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    yield
    tf.config.optimizer.set_experimental_options(
        {"arithmetic_optimization": before.get("arithmetic_optimization", True)})


@pytest.mark.parametrize("sharding", ["mod", "range"])
@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_shards_match_keras_sparse_bitwise(kind, sharding, no_arithmetic_rewrite):
    run_shards_vs_keras(kind, sharding, exact=True)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_shards_match_keras_with_grappler_within_ulps(kind):
    run_shards_vs_keras(kind, "mod", exact=False)


def run_shards_vs_keras(kind, sharding, exact):
    init = np.random.default_rng(1).standard_normal((ROWS, DIM)).astype(np.float32)
    table = tf.Variable(init)
    kopt = keras_optimizer(kind)

    @tf.function
    def keras_step(ids, values):
        kopt.apply_gradients([(tf.IndexedSlices(values, ids, tf.constant([ROWS, DIM], tf.int64)),
                               table)])

    opt = ps.Optimizer.from_keras(keras_optimizer(kind))
    shards = [ps.Shard(k, 3, {"t": init}, opt, sharding) for k in range(3)]
    for ids, values in sparse_grads(2):
        keras_step(tf.constant(ids), tf.constant(values))
        for sh in shards:
            mine = sh.shardings["t"].owner(ids) == sh.index
            sh.push({"t": (ids[mine], values[mine])})
    got = np.zeros_like(init)
    got_slots = {s: np.zeros_like(init) for s in opt.slot_names}
    for sh in shards:
        st = sh.state()["tables"]["t"]
        got[st["ids"]] = st["rows"]
        for s in opt.slot_names:
            got_slots[s][st["ids"]] = st[s]
        assert sh.state()["step"] == STEPS
    # bitwise; else a few ulps (one per step at most, see ps.py)
    same = np.testing.assert_array_equal if exact else \
        (lambda a, b: np.testing.assert_allclose(a, b, rtol=STEPS * 2.0 ** -23, atol=0))
    same(got, table.numpy())
    for s, want in keras_slots(kopt, kind).items():
        same(got_slots[s], want)
    assert not np.array_equal(got, init)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_dense_update_matches_keras_bitwise(kind):
    init = np.random.default_rng(3).standard_normal((5, 3)).astype(np.float32)
    ref, mine = tf.Variable(init), tf.Variable(init)
    kopt = keras_optimizer(kind)
    opt = ps.Optimizer.from_keras(keras_optimizer(kind))
    slots = {s: tf.Variable(opt.initial_slot(s, init.shape)) for s in opt.slot_names}
    step = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def both(g):
        kopt.apply_gradients([(g, ref)])
        opt.apply_dense(mine, slots, g, step)
        step.assign_add(1)

    rng = np.random.default_rng(4)
    for _ in range(STEPS):
        both(tf.constant(rng.standard_normal(init.shape).astype(np.float32)))
    np.testing.assert_array_equal(mine.numpy(), ref.numpy())


def test_sharding_covers_every_row_once():
    for mode in ps.SHARDINGS:
        sh = ps.Sharding(10, 3, mode)
        ids = np.concatenate([sh.global_ids(k) for k in range(3)])
        assert sorted(ids.tolist()) == list(range(10))
        for k in range(3):
            g = sh.global_ids(k)
            assert (sh.owner(g) == k).all() and (sh.local(g) == np.arange(len(g))).all()


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="sharding='hash'"):
        ps.Sharding(10, 2, "hash")
    with pytest.raises(ValueError, match="num_shards=4: more parameter-server shards than the table's 3 rows"):
        ps.Sharding(3, 4)
    with pytest.raises(ValueError, match="momentum=0.9"):
        ps.Optimizer.from_keras(tf.keras.optimizers.SGD(0.1, momentum=0.9))
    with pytest.raises(ValueError, match="RMSprop"):
        ps.Optimizer.from_keras(tf.keras.optimizers.RMSprop())
    with pytest.raises(ValueError, match="clipnorm=1.0"):
        ps.Optimizer.from_keras(tf.keras.optimizers.Adam(clipnorm=1.0))
    sh = ps.Shard(0, 2, {"t": np.zeros((6, 2))}, ps.Optimizer("sgd", 0.1))
    with pytest.raises(ValueError, match=r"table 't': ids \[1, 7\] are not rows of shard 0 of 2"):
        sh.pull("t", [0, 1, 7])
    with pytest.raises(ValueError, match=r"ids \[-1\]"):
        sh.push({"t": ([-1], np.zeros((1, 2), np.float32))})


@pytest.mark.parametrize("sharding", ["mod", "range"])
def test_a_shard_of_a_table_spec_initialises_only_its_rows(sharding):
    spec = ps.TableSpec(23, 4, tf.keras.initializers.RandomUniform(-1.0, 1.0))
    shards = [ps.Shard(k, 3, {"t": spec}, ps.Optimizer("adagrad", 0.1), sharding)
              for k in range(3)]
    sizes = [int(s.tables["t"].shape[0]) for s in shards]
    assert sizes == [len(ps.Sharding(23, 3, sharding).global_ids(k)) for k in range(3)]
    assert sum(sizes) == 23 and all(s.tables["t"].shape[1] == 4 for s in shards)
    for s in shards:
        rows = s.tables["t"].numpy()
        assert np.all(np.abs(rows) <= 1.0) and np.std(rows) > 0.1     # drawn, not zeros
        assert np.array_equal(s.slots["t"]["accumulator"].numpy(), np.full(rows.shape, 0.1,
                                                                           np.float32))
    ids = shards[1].state()["tables"]["t"]["ids"]
    assert np.array_equal(shards[1].pull("t", ids).numpy(), shards[1].tables["t"].numpy())


@pytest.mark.parametrize("sharding", ["mod", "range"])
@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_keys_of_all_tables_in_one_call_match_the_per_table_path_bitwise(kind, sharding):
    """gather_keys / apply_keys (tables of one width, ids of every table in
    one array, the order they arrive in) give the rows and the update of
    check_ids + gather_local / apply_local, bit for bit, with grappler on."""
    rng = np.random.default_rng(5)
    rows = {"a": 31, "b": 9, "c": 17}
    init = {n: rng.standard_normal((r, DIM)).astype(np.float32) for n, r in rows.items()}
    opt = ps.Optimizer.from_keras(keras_optimizer(kind))
    one, per = (ps.Shard(1, 2, init, opt, sharding) for _ in range(2))
    assert one.dim == DIM
    names = list(rows)
    for step in range(4):
        table_of = rng.integers(0, 3, 40)
        table_of[:5] = 1                                  # "c" may get none in a step
        ids = np.array([rng.integers(0, rows[names[t]]) for t in table_of], np.int64)
        mine = np.array([one.shardings[names[t]].owner(i) == 1 for t, i in zip(table_of, ids)])
        table_of, ids = table_of[mine], ids[mine]
        values = rng.standard_normal((len(ids), DIM)).astype(np.float32)
        local = one.check_keys(table_of, ids)
        got = one.gather_keys(table_of, local).numpy()
        by_table = [np.flatnonzero(table_of == t) for t in range(3)]
        want_local = [per.check_ids(n, ids[w]) for n, w in zip(names, by_table)]
        want = np.empty_like(got)
        for w, r in zip(by_table, per.gather_local(want_local)):
            want[w] = r.numpy()
        assert np.array_equal(got, want), step
        one.apply_keys(table_of, local, values)
        per.apply_local(want_local, [values[w] for w in by_table])
    a, b = one.state(), per.state()
    assert a["step"] == b["step"] == 4
    for n in names:
        for field in b["tables"][n]:
            assert np.array_equal(a["tables"][n][field], b["tables"][n][field]), (n, field)


def test_keys_of_all_tables_name_a_bad_id_and_need_one_width():
    sh = ps.Shard(0, 2, {"a": np.zeros((6, 2)), "b": np.zeros((4, 2))}, ps.Optimizer("sgd", 0.1))
    with pytest.raises(ValueError, match=r"table 'b': ids \[4\] are not rows of shard 0 of 2"):
        sh.check_keys([0, 1, 1], [2, 0, 4])
    with pytest.raises(ValueError, match=r"table 'a': ids \[3\] are not rows of shard 0 of 2"):
        sh.check_keys([0, 1], [3, 2])
    assert sh.gather_keys([], np.zeros([0], np.int64)).shape == (0, 2)
    mixed = ps.Shard(0, 1, {"a": np.zeros((6, 2)), "b": np.zeros((4, 3))}, ps.Optimizer("sgd", 0.1))
    assert mixed.dim is None
    with pytest.raises(ValueError, match=r"several row widths \[2, 3\]"):
        mixed.gather_keys([0], [1])


@pytest.mark.parametrize("kind,dims,split", [
    ("adagrad", (16, 16), True), ("adagrad", (16, 32), True), ("sgd", (3, 3), True),
    ("sgd", (3, 5), True), ("adagrad", (4, 4), False), ("adagrad", (16, 12), "a"),
    ("adam", (16, 16), True), ("adam", (3, 3), True), ("adam", (4, 3), True)])
def test_a_push_split_around_the_next_rows_keeps_the_bits(kind, dims, split):
    """Given the next step's keys, a push applies the rows the next step reads,
    the next rows are gathered, then flush() applies the rest: every gathered
    row and the final state are bit for bit those of one whole apply per step,
    with grappler on. It splits where that is exact (Optimizer.splits: SGD and
    Adam; Adagrad rows a multiple of 64 bytes; "a": only table a's rows), else
    applies whole. Tables of one width take apply_keys, of two apply_local.
    Adam moves every row each step: its first part is every row the next step
    reads (touched or not), its rest every other row (touched or not), both
    with the step's bias correction."""
    rng = np.random.default_rng(11)
    rows = {"a": 29, "b": 13}
    init = {n: rng.standard_normal((r, d)).astype(np.float32)
            for (n, r), d in zip(rows.items(), dims)}
    opt = ps.Optimizer.from_keras(keras_optimizer(kind))
    two, one = (ps.Shard(0, 1, init, opt) for _ in range(2))
    names = list(rows)

    def keys():
        table_of = rng.integers(0, 2, 30)
        return table_of, np.array([rng.integers(0, rows[names[t]]) for t in table_of], np.int64)

    def gather(shard, table_of, local, ahead):
        if shard.dim is not None:
            return [shard.gather_keys(table_of, local, ahead=ahead).numpy()]
        return [r.numpy() for r in shard.gather_local(
            [local[table_of == t] for t in range(2)], ahead=ahead)]

    def apply(shard, table_of, local, values, next_keys):
        if shard.dim is not None:
            shard.apply_keys(table_of, local, values[0], next_keys)
        else:
            shard.apply_local([local[table_of == t] for t in range(2)], values, next_keys)

    cur = keys()
    for step in range(8):
        got = gather(two, *cur, ahead=step > 0)
        want = gather(one, *cur, ahead=False)
        assert all(np.array_equal(g, w) for g, w in zip(got, want)), (kind, dims, step)
        two.flush()                                  # the rest, after the rows are sent
        nxt = keys()
        sizes = [len(cur[0])] if two.dim else [int((cur[0] == t).sum()) for t in range(2)]
        values = [rng.standard_normal((n, d)).astype(np.float32) for n, d in zip(sizes, dims)]
        apply(two, *cur, values, nxt)
        apply(one, *cur, values, None)
        cur = nxt
    a, b = two.state(), one.state()
    assert a["step"] == b["step"] == 8
    for n in names:
        for field in b["tables"][n]:
            assert np.array_equal(a["tables"][n][field], b["tables"][n][field]), (n, field)
    assert one.apply_parts == {"whole": 8}
    if split:
        assert two.apply_parts["ahead"] >= 6 and \
            two.apply_parts["rest"] == two.apply_parts["ahead"], two.apply_parts
        assert two.apply_parts["whole"] + two.apply_parts["ahead"] == 8
        assert "rest_late" not in two.apply_parts
    else:
        assert two.apply_parts == {"whole": 8}, two.apply_parts
    assert opt.splits(dims[0]) == bool(split) and opt.splits(dims[1]) == (split is True)


def test_a_gather_of_other_rows_than_announced_applies_the_rest_first():
    """The next step's inputs were not the ones announced (the trainer then
    sends the keys again): a gather that is not ``ahead`` applies the kept-back
    rest before it reads, and reads the one-part update's rows."""
    init = {"a": np.arange(24, dtype=np.float32).reshape(8, 3)}
    two, one = (ps.Shard(0, 1, init, ps.Optimizer("sgd", 0.5)) for _ in range(2))
    t, rows, g = np.zeros(3, np.int64), np.array([1, 4, 6]), np.ones((3, 3), np.float32)
    two.apply_keys(t, rows, g, next_keys=([0], [4]))
    one.apply_keys(t, rows, g)
    assert two.apply_parts == {"ahead": 1}
    got = two.gather_keys(t, rows).numpy()
    assert np.array_equal(got, one.gather_keys(t, rows).numpy())
    assert two.apply_parts == {"ahead": 1, "rest_late": 1}
    assert two.pull("a", [6]).numpy().tolist() == [[17.5, 18.5, 19.5]]


def _split_pushes(kind, dims, steps=8, disjoint=False, seed=5):
    """A shard taking ``steps`` pushes, each told the next step's keys (the
    trainer's order: gather ahead, flush the rest, apply). ``disjoint``: the
    next step reads none of a push's rows. Returns the shard and, per step
    after the first two, how many times each of its graph calls was traced."""
    rng = np.random.default_rng(seed)
    rows = {"a": 40, "b": 20}
    init = {n: rng.standard_normal((r, d)).astype(np.float32)
            for (n, r), d in zip(rows.items(), dims)}
    shard = ps.Shard(0, 1, init, ps.Optimizer.from_keras(keras_optimizer(kind)))
    names = list(rows)

    def keys(step):
        table_of = rng.integers(0, 2, 12)
        half = [(step % 2) * rows[n] // 2 for n in names] if disjoint else [0, 0]
        span = [rows[n] // 2 if disjoint else rows[n] for n in names]
        local = np.array([half[t] + rng.integers(0, span[t]) for t in table_of], np.int64)
        return table_of, local

    def graphs():
        fns = [shard._gather, *(shard._rows_fns or ())] + list(shard._apply.values()) + \
            list(shard._apply_parts_fns.values())
        return [f.experimental_get_tracing_count() for f in fns if f is not None]

    cur, traced = keys(0), []
    for step in range(steps):
        if shard.dim is not None:
            shard.gather_keys(*cur, ahead=step > 0)
        else:
            shard.gather_local([cur[1][cur[0] == t] for t in range(2)], ahead=step > 0)
        shard.flush()
        nxt = keys(step + 1)
        if shard.dim is not None:
            values = rng.standard_normal((len(cur[0]), dims[0])).astype(np.float32)
            shard.apply_keys(*cur, values, next_keys=nxt)
        else:
            shard.apply_local([cur[1][cur[0] == t] for t in range(2)],
                              [rng.standard_normal((int((cur[0] == t).sum()), d)).astype(
                                  np.float32) for t, d in enumerate(dims)], next_keys=nxt)
        if step >= 2:
            traced.append(graphs())
        cur = nxt
    return shard, traced


@pytest.mark.parametrize("kind,dims", [("adagrad", (16, 16)), ("adagrad", (16, 32)),
                                       ("sgd", (3, 3)), ("sgd", (3, 5)),
                                       ("adam", (16, 16)), ("adam", (4, 3))])
def test_split_pushes_are_traced_once_and_only_adam_passes_rows(kind, dims):
    """A split push's graph calls are traced in the first steps, never again
    (no retracing per push, none for a later whole push), and take what the
    optimizer's step needs: SGD's and Adagrad's parts are gradients, applied
    by the one-part graph (its inputs: ids and gradients, the step read from
    the shard's counter); only Adam's parts take the rows the next step reads
    and the step count."""
    shard, traced = _split_pushes(kind, dims)
    assert shard.apply_parts["ahead"] == 8 and shard.apply_parts["rest"] == 7, shard.apply_parts
    assert all(t == traced[-1] for t in traced) and set(traced[-1]) <= {0, 1}, traced
    # a push without the next keys (a fit's last) applies whole: no graph traced for it
    # then (a trace costs more CPU than many pushes)
    if shard.dim is not None:
        shard.apply_keys(np.zeros(2, np.int64), np.arange(2), np.ones((2, dims[0]), np.float32))
    else:
        shard.apply_local([np.arange(2), np.arange(1)],
                          [np.ones((2, dims[0]), np.float32), np.ones((1, dims[1]), np.float32)])
    assert shard.apply_parts["whole"] == 1 and shard.apply_parts["rest_late"] == 1
    fns = [shard._gather, *(shard._rows_fns or ())] + list(shard._apply.values()) + \
        list(shard._apply_parts_fns.values())
    assert [f.experimental_get_tracing_count() for f in fns if f is not None] == traced[-1]
    applies = list(shard._apply.values()) + list(shard._apply_parts_fns.values())
    if shard.dim is not None:
        applies.append(shard._rows_fns[1])
    inputs = sorted(len(tf.nest.flatten(f.input_signature)) for f in applies
                    if f.experimental_get_tracing_count())
    per_part = 3 if shard.dim is not None else 2 * len(dims)
    if kind == "adam":     # the parts ("ahead", "rest", which also applies a whole push):
        # + rows per table + the step
        assert inputs == [per_part + len(dims) + 1] * 2, inputs
    else:                  # one graph, the gradients only
        assert inputs == [per_part], inputs


@pytest.mark.parametrize("kind,dims", [("adagrad", (16, 16)), ("sgd", (3, 5))])
def test_a_push_the_next_step_does_not_read_is_applied_in_one_call(kind, dims, monkeypatch):
    """SGD, Adagrad: when the next step reads none of a push's rows, the
    whole push is its rest, applied at flush in one graph call -- nothing is
    applied ahead."""
    calls = []
    for name in ("_apply_keys", "_apply_local"):
        real = getattr(ps.Shard, name)

        def spy(self, part, *args, _real=real, **kw):
            calls.append(part)
            return _real(self, part, *args, **kw)
        monkeypatch.setattr(ps.Shard, name, spy)
    shard, _ = _split_pushes(kind, dims, steps=6, disjoint=True)
    assert shard.apply_parts == {"ahead": 6, "rest": 5}, shard.apply_parts
    assert calls == [None] * 5, calls


@pytest.mark.parametrize("dims", [(16, 16), (4, 3)])
def test_adam_keeps_no_copy_of_the_next_rows_between_steps(dims):
    """Adam's first part works on a copy of the rows the next step reads; the
    copy holds no rows once the part is applied."""
    shard, _ = _split_pushes("adam", dims, steps=3)
    assert shard.apply_parts["ahead"] == 3
    assert len(shard._copies) == 2
    for name, (var, slots) in shard._copies.items():
        for v in [var] + list(slots.values()):
            assert v.numpy().shape == (0, shard.tables[name].shape[1]), (name, v.numpy().shape)
