"""Roles of a heterogeneous job (horovod_prio.heter.roles): parsing, checks,
process sets (registered for real under horovodrun in test_trainer.py)."""
import pytest

from horovod_prio.heter import roles


def test_counts_fill_in_the_order_written():
    r = roles.parse("ps=1,sparse=1,dense=2", 4)
    assert r.ranks == {"ps": (0,), "sparse": (1,), "dense": (2, 3)}
    assert [r.role(i) for i in range(4)] == ["ps", "sparse", "dense", "dense"]
    r = roles.parse("dense=1, sparse=1, ps=2", 4)
    assert r.ranks == {"dense": (0,), "sparse": (1,), "ps": (2, 3)}
    assert str(r) == "ps=2+3, sparse=1, dense=0"


def test_rank_lists_and_mixed():
    r = roles.parse("dense=0+3,sparse=[2],ps=1", 4)
    assert r.ranks == {"dense": (0, 3), "sparse": (2,), "ps": (1,)}
    r = roles.parse("sparse=1,ps=[3],dense=3", 5)      # lists first, counts fill 0,1,2,4
    assert r.ranks == {"ps": (3,), "sparse": (0,), "dense": (1, 2, 4)}
    r = roles.parse("ps=[3],sparse=1,dense=3", 5)
    assert r.ranks == {"ps": (3,), "sparse": (0,), "dense": (1, 2, 4)}


def test_process_set_ranks():
    r = roles.parse("ps=1,sparse=1,dense=2", 4)
    assert r.set_ranks() == {"sparse_ps": (0, 1), "sparse_dense": (1, 2, 3), "dense": (2, 3)}


@pytest.mark.tf_stack          # horovod.common builds the ProcessSets
def test_process_sets_are_built_from_the_roles():
    r = roles.parse("ps=1,sparse=1,dense=1", 3)
    sets = r.process_sets()
    assert sorted(tuple(s.ranks) for s in sets) == [(0, 1), (1, 2), (2,)]
    assert r.process_set("dense").ranks == [2]
    assert r.process_sets() == sets                                   # created once


@pytest.mark.parametrize("text,size,msg", [
    ("ps=1,sparse=1,dense=2", 3, "the roles cover 4 ranks, the job has 3"),
    ("ps=1,sparse=1,dense=1", 4, "the roles cover 3 ranks, the job has 4"),
    ("ps=0,sparse=1,dense=2", 3, "ps=0; every role needs at least one rank"),
    ("ps=1,dense=2", 3, "role 'sparse' is missing"),
    ("ps=1,sparse=1,dense=1,ps=1", 3, "role 'ps' is given twice"),
    ("ps=1,sparse=1,gpu=1", 3, "'gpu=1' is not role=count"),
    ("ps=1,sparse=x,dense=1", 3, "sparse='x' is neither a count nor a rank list"),
    ("ps=[5],sparse=1,dense=1", 3, "ps lists rank 5, the job has ranks 0-2"),
    ("ps=[0],sparse=[0],dense=1", 3, "rank 0 is both ps and sparse"),
    ("ps=1,sparse=1,dense=1", 2, "needs at least 3 ranks"),
])
def test_bad_roles_name_the_field(text, size, msg):
    with pytest.raises(ValueError, match="HOROVOD_PRIO_HETER_ROLES"):
        roles.parse(text, size)
    with pytest.raises(ValueError) as e:
        roles.parse(text, size)
    assert msg in str(e.value)


def test_from_env_reads_size_from_the_launcher():
    env = {"HOROVOD_PRIO_HETER_ROLES": "ps=1,sparse=1,dense=1", "OMPI_COMM_WORLD_SIZE": "3"}
    assert roles.from_env(env).ranks["dense"] == (2,)
    env["HOROVOD_SIZE"] = "3"
    assert roles.from_env(env).size == 3
    with pytest.raises(ValueError, match="HOROVOD_PRIO_HETER_ROLES is not set"):
        roles.from_env({})
    with pytest.raises(ValueError, match="job size is unknown"):
        roles.from_env({"HOROVOD_PRIO_HETER_ROLES": "ps=1,sparse=1,dense=1"})
    with pytest.raises(ValueError, match="HOROVOD_SIZE='x' is not an integer"):
        roles.from_env({"HOROVOD_PRIO_HETER_ROLES": "ps=1", "HOROVOD_SIZE": "x"})
