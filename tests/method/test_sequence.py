"""Unit tests for horovod_prio.method.sequence (pure Python)."""
import pathlib
import subprocess
import sys

import pytest

from horovod_prio.method.sequence import (SCENES, base_priorities, partition_groups, task_priorities,
                                   task_sequence)


def sizes(groups):
    return [len(g) for g in groups]


# ---------------------------------------------------------------- task_sequence
def test_task_sequence_reverses_forward_order():
    assert task_sequence(["in", "hidden", "out"]) == ["out", "hidden", "in"]


def test_task_sequence_accepts_iterables_and_does_not_mutate():
    layers = ["a", "b"]
    assert task_sequence(iter(layers)) == ["b", "a"]
    out = task_sequence(layers)
    assert layers == ["a", "b"] and out is not layers
    assert task_sequence([]) == []


def test_task_sequence_keeps_objects():
    objs = [object(), object(), object()]
    seq = task_sequence(objs)
    assert seq[0] is objs[-1] and seq[-1] is objs[0]


# ------------------------------------------------------------- partition_groups
@pytest.mark.parametrize("m,n,expected", [
    (10, 4, [3, 3, 2, 2]),     # 2.5 > 2 -> near-equal, larger first
    (9, 4, [3, 2, 2, 2]),      # 2.25 > 2
    (12, 4, [3, 3, 3, 3]),
    (7, 1, [7]),
    (5, 2, [3, 2]),            # 2.5 > 2
])
def test_ratio_above_threshold_near_equal(m, n, expected):
    for scene in SCENES:  # the scene does not matter above the ratio
        assert sizes(partition_groups(m, n, 2.0, scene)) == expected


@pytest.mark.parametrize("m,n,expected", [
    (8, 4, [2, 2, 2, 2]),      # 2.0 == threshold -> scene rule
    (7, 4, [4, 1, 1, 1]),      # 7//4 + 7%4 = 1 + 3
    (6, 4, [3, 1, 1, 1]),
    (4, 4, [1, 1, 1, 1]),
    (5, 3, [3, 1, 1]),         # 1 + 2
    (2, 1, [2]),               # 2.0 == threshold
])
def test_scene_first(m, n, expected):
    assert sizes(partition_groups(m, n, 2.0, "first")) == expected


@pytest.mark.parametrize("m,n,expected", [
    (8, 4, [5, 1, 1, 1]),
    (7, 4, [4, 1, 1, 1]),
    (4, 4, [1, 1, 1, 1]),
    (6, 3, [4, 1, 1]),
    (2, 1, [2]),
])
def test_scene_tail(m, n, expected):
    assert sizes(partition_groups(m, n, 2.0, "tail")) == expected


def test_tail_last_groups_hold_the_last_tasks():
    groups = partition_groups(8, 4, 2.0, "tail")
    assert groups == [[0, 1, 2, 3, 4], [5], [6], [7]]


def test_groups_are_contiguous_task_indices():
    assert partition_groups(10, 4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert partition_groups(7, 4, scene="first") == [[0, 1, 2, 3], [4], [5], [6]]


def test_default_arguments():
    assert partition_groups(8, 4) == partition_groups(8, 4, 2.0, "first")


def test_ratio_threshold_changes_rule():
    # 8/4 = 2: with threshold 1.5 the near-equal rule applies
    assert sizes(partition_groups(8, 4, 1.5, "tail")) == [2, 2, 2, 2]
    assert sizes(partition_groups(8, 4, 2.0, "tail")) == [5, 1, 1, 1]
    assert sizes(partition_groups(100, 4, 1000, "tail")) == [97, 1, 1, 1]
    assert sizes(partition_groups(9, 4, 2, "first")) == [3, 2, 2, 2]  # int threshold ok


@pytest.mark.parametrize("kwargs,name", [
    (dict(num_tasks=0, num_groups=1), "num_tasks"),
    (dict(num_tasks=-3, num_groups=1), "num_tasks"),
    (dict(num_tasks=2.0, num_groups=1), "num_tasks"),
    (dict(num_tasks="4", num_groups=1), "num_tasks"),
    (dict(num_tasks=True, num_groups=1), "num_tasks"),
    (dict(num_tasks=4, num_groups=0), "num_groups"),
    (dict(num_tasks=4, num_groups=1.0), "num_groups"),
    (dict(num_tasks=4, num_groups=None), "num_groups"),
    (dict(num_tasks=4, num_groups=5), "num_groups"),
    (dict(num_tasks=4, num_groups=2, scene="middle"), "scene"),
    (dict(num_tasks=40, num_groups=2, scene="First"), "scene"),  # checked even above ratio
    (dict(num_tasks=4, num_groups=2, ratio_threshold=0), "ratio_threshold"),
    (dict(num_tasks=4, num_groups=2, ratio_threshold=-1.0), "ratio_threshold"),
    (dict(num_tasks=4, num_groups=2, ratio_threshold=float("nan")), "ratio_threshold"),
    (dict(num_tasks=4, num_groups=2, ratio_threshold="2"), "ratio_threshold"),
])
def test_partition_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        partition_groups(**kwargs)


# -------------------------------------------------------------- base_priorities
def test_base_priorities_are_0_to_n_minus_1():
    assert base_priorities(1) == [0]
    assert base_priorities(4) == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [0, -1, 2.0, "3", None, True])
def test_base_priorities_errors(bad):
    with pytest.raises(ValueError, match="num_groups"):
        base_priorities(bad)


# -------------------------------------------------------------- task_priorities
def test_task_priorities_expands_groups():
    groups = partition_groups(7, 4, 2.0, "first")  # [4,1,1,1]
    assert task_priorities(groups, (0, 1, 2, 9)) == [0, 0, 0, 0, 1, 2, 9]


def test_task_priorities_errors():
    with pytest.raises(ValueError, match="priorities"):
        task_priorities([[0], [1]], [0])
    with pytest.raises(ValueError, match="groups"):
        task_priorities([[0], [0]], [0, 1])


# ------------------------------------------------------------------- no TF
def test_layers_below_the_binding_do_not_import_tensorflow():
    code = ("import sys; import horovod_prio, horovod_prio.method.sequence, "
            "horovod_prio.method.policy, horovod_prio.method.config, horovod_prio.method.plan, "
            "horovod_prio.method.units, horovod_prio.scheduler, horovod_prio.runtime, "
            "horovod_prio.runtime.arbiter_link, horovod_prio.arbiter, horovod_prio.sim, "
            "horovod_prio.sim.cli; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'horovod', 'keras')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   cwd=pathlib.Path(__file__).resolve().parents[2])
