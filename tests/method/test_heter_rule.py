"""The heterogeneous step's priority and holder rule (horovod_prio.method.heter)."""
import pytest

from horovod_prio.method import heter as rule


@pytest.mark.parametrize("groups", [0, 1, 4])
def test_what_the_next_step_needs_first_ranks_highest(groups):
    p = rule.priorities(rule.base_vector(groups), groups)
    dense = [p["dense:%d" % g] for g in range(groups)]
    # the dense allreduce: the data-parallel order, input side (last group) highest
    assert dense == sorted(dense) and len(set(dense)) == groups
    # the push outranks every dense group: the next step's pull waits for it
    assert all(p["row_grads"] > d for d in dense)
    # the step's own path outranks both
    for e in ("keys", "rows", "activations", "activation_grads"):
        assert p[e] > p["row_grads"]
    assert set(p) == {"dense:%d" % g for g in range(groups)} | set(rule.EXCHANGES)


def test_the_boost_raises_the_last_groups_of_the_vector():
    vector = [0, 1, 2, 3 + 2]              # two dense groups, push, path boosted by 2
    p = rule.priorities(vector, 2)
    assert p["keys"] == p["rows"] == p["activation_grads"] == 5
    assert (p["row_grads"], p["dense:0"], p["dense:1"]) == (2, 0, 1)


def test_first_rank_of_each_role_holds():
    assert rule.holders({"ps": [4, 1], "sparse": [2, 5], "dense": [3, 0]}) == \
        {"ps": 1, "sparse": 2, "dense": 0}
    held = {e for es in rule.HELD.values() for e in es}
    # every exchange but the activations is held by the role that sends it
    assert held == set(rule.EXCHANGES) - {"activations"} | {"dense"}


def test_a_holder_asks_for_every_senders_part_with_an_arbiter_and_several_senders():
    ranks = {"ps": [0, 3], "sparse": [1], "dense": [2, 4]}
    assert [rule.whole_collective(r, ranks, True) for r in ("ps", "sparse", "dense")] == \
        [True, False, True]
    assert not any(rule.whole_collective(r, ranks, False) for r in ("ps", "sparse", "dense"))
    with pytest.raises(ValueError, match="role 'server': give one of dense, ps, sparse"):
        rule.whole_collective("server", ranks, True)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="priority vector: 3 entries for 2 dense groups"):
        rule.priorities([0, 1, 2], 2)
    with pytest.raises(ValueError, match="dense_groups must be an int >= 0"):
        rule.num_groups(-1)
    with pytest.raises(ValueError, match="role 'ps' has no rank"):
        rule.holders({"ps": [], "sparse": [0], "dense": [1]})
