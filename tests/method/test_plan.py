"""horovod_prio.method.plan: the chunk plan the binding and the simulator share."""
import pytest
from hypothesis import given, settings, strategies as st

from horovod_prio.method.plan import ALIGN_BYTES, TensorSpec, make_plan
from horovod_prio.method.sequence import partition_groups


def test_chunks_cover_their_group_in_backprop_order_and_cut_every_partition():
    specs = [TensorSpec(100), TensorSpec(10), TensorSpec(300), TensorSpec(20)]
    tasks = [[3, 2], [1, 0]]                 # backprop order: task 0 = output side
    plan = make_plan(specs, tasks, [[0], [1]], partition_bytes=4 * 128, prefix="opt")
    names = [c.name for c in plan.chunks]
    assert names == ["opt_g0_float32_c0", "opt_g0_float32_c1", "opt_g0_float32_c2",
                     "opt_g1_float32_c0"]
    c0 = plan.chunks[0]
    # the cut at element 128 falls 108 elements into tensor 2: it moves back to
    # element 96 of it, a 64-byte boundary (ALIGN_BYTES), so slicing it is a view
    assert [(s.tensor, s.offset, s.length, s.chunk_offset) for s in c0.segments] == \
        [(3, 0, 20, 0), (2, 0, 96, 20)]
    assert c0.nbytes == 4 * 116 and c0.last_tensor == 2
    # the second group's chunk is made of its two tensors, backprop order
    assert [(s.tensor, s.length) for s in plan.chunks[3].segments] == [(1, 10), (0, 100)]
    pieces = plan.pieces()
    assert [(c, s.offset, s.length) for c, s in pieces[2]] == [(0, 0, 96), (1, 96, 128),
                                                              (2, 224, 76)]


def test_without_split_tensors_a_gradient_is_never_cut_and_big_ones_go_alone():
    """Where no chunk can be held back (PriorityConfig.splits_tensors) a
    gradient is never cut (its pieces would leave together), one of at least
    half a chunk is a chunk of its own (a fused chunk waits for its last
    gradient), and smaller ones are fused up to the partition (they share the
    cost of a chunk)."""
    specs = [TensorSpec(100), TensorSpec(10), TensorSpec(300), TensorSpec(20), TensorSpec(0),
             TensorSpec(30), TensorSpec(40), TensorSpec(63)]
    tasks = [[5, 4, 3, 2], [1, 0], [6, 7]]
    plan = make_plan(specs, tasks, [[0], [1], [2]], partition_bytes=4 * 128, prefix="opt",
                     split_tensors=False)
    assert [[(s.tensor, s.offset, s.length) for s in c.segments] for c in plan.chunks] == [
        [(5, 0, 30), (3, 0, 20)], [(2, 0, 300)], [(1, 0, 10)], [(0, 0, 100)],
        [(6, 0, 40), (7, 0, 63)]]
    assert [c.name for c in plan.chunks] == ["opt_g0_float32_c0", "opt_g0_float32_c1",
                                             "opt_g1_float32_c0", "opt_g1_float32_c1",
                                             "opt_g2_float32_c0"]


def test_dtypes_are_fused_separately():
    specs = [TensorSpec(8, "float32", 4), TensorSpec(8, "float16", 2), TensorSpec(8, "float32", 4)]
    plan = make_plan(specs, [[0, 1, 2]], [[0]], partition_bytes=1 << 20, prefix="p")
    assert [(c.dtype, c.nelems) for c in plan.chunks] == [("float32", 16), ("float16", 8)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(partition_bytes=0), "partition_bytes"),
    (dict(tasks=[[0], [0]]), "tasks"),
    (dict(tasks=[[5]]), "tasks"),
    (dict(groups=[[0], [0]]), "groups"),
])
def test_bad_plans_name_the_argument(kwargs, match):
    args = dict(tensors=[TensorSpec(4), TensorSpec(4)], tasks=[[1], [0]], groups=[[0], [1]],
                partition_bytes=8)
    args.update(kwargs)
    if "tasks" in kwargs and "groups" not in kwargs:
        args["groups"] = [list(range(len(args["tasks"])))]
    with pytest.raises(ValueError, match=match):
        make_plan(**args)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 500), min_size=1, max_size=12),
       n_groups=st.integers(1, 5), part=st.integers(1, 700), split=st.booleans())
def test_every_element_is_sent_exactly_once_within_the_partition_size(sizes, n_groups, part,
                                                                     split):
    specs = [TensorSpec(n) for n in sizes]
    tasks = [[i] for i in reversed(range(len(sizes)))]
    groups = partition_groups(len(tasks), min(n_groups, len(tasks)))
    plan = make_plan(specs, tasks, groups, part, split_tensors=split)
    covered = {i: [] for i in range(len(sizes))}
    for c in plan.chunks:
        whole_one = len(c.segments) == 1 and c.segments[0].length == sizes[c.segments[0].tensor]
        if not split and len(c.segments) > 1:       # fused: small tensors, within a chunk
            assert c.nbytes <= part and all(8 * s.length < part for s in c.segments), c
        elif not split:
            assert whole_one, c
        else:
            assert c.nbytes <= max(part, 4), c
        assert c.nelems > 0
        pos = 0
        for s in c.segments:
            assert s.chunk_offset == pos and s.length > 0
            pos += s.length
            covered[s.tensor].append((s.offset, s.length))
            if not split:
                assert (s.offset, s.length) == (0, sizes[s.tensor])      # never cut
            elif s.offset and part >= 4 * 16:
                assert (s.offset * 4) % ALIGN_BYTES == 0, s      # a cut inside: a view
    for t, n in enumerate(sizes):
        spans = sorted(covered[t])
        assert sum(length for _, length in spans) == n
        at = 0
        for off, length in spans:
            assert off == at
            at += length
    # each chunk holds tensors of one group only
    group_of = plan.group_of_tensor()
    assert all(group_of[s.tensor] == c.group for c in plan.chunks for s in c.segments)


def test_step_plan_takes_chunk_size_credit_and_cuts_from_the_config():
    """step_plan: the one place that turns a config into a step's plan (the
    binding's and the simulator's): chunk size partition_bytes_for, credit
    credit_bytes or, under hvd.overlap, overlap_credit_bytes, gradients cut
    only where a chunk can be held back."""
    from horovod_prio.method.config import PriorityConfig
    from horovod_prio.method.plan import step_plan
    specs = [TensorSpec(3 << 18), TensorSpec(1 << 18), TensorSpec(12 << 18)]   # 16 MiB
    tasks = [[2], [1], [0]]
    d = step_plan(specs, tasks, PriorityConfig.from_env({}))
    assert (d.step_bytes, d.partition_bytes, d.credit_bytes, d.split_tensors) == \
        (16 << 20, 2 << 20, None, False)
    assert d.groups == tuple(tuple(g) for g in PriorityConfig.from_env({}).make_groups(3))
    assert d.plan("x") == make_plan(specs, tasks, d.groups, 2 << 20, prefix="x",
                                    split_tensors=False)
    o = step_plan(specs, tasks, PriorityConfig.from_env({}), overlap=True)
    assert (o.credit_bytes, o.split_tensors) == (2 << 20, True)      # one chunk
    given = PriorityConfig.from_env({}, credit_bytes="8MiB")
    assert step_plan(specs, tasks, given, overlap=True).credit_bytes == 8 << 20
    assert step_plan(specs, tasks, given).split_tensors
    assert step_plan(specs, tasks, PriorityConfig.from_env({}), arbiter=True).split_tensors
    arb = PriorityConfig.from_env({}, arbiter="h:1", link="l", arbiter_secret="s")
    assert step_plan(specs, tasks, arb).split_tensors
    assert not step_plan(specs, tasks, arb, arbiter=False).split_tensors
