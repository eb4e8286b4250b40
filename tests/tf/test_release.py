"""A chunk released from outside TensorFlow's executor (an arbiter grant, the
completion of another chunk) reaches Horovod and completes even while every
TensorFlow inter-op thread is busy (real horovodrun, Gloo and MPI).

The control case (gate -> hvd.allreduce -> done, the three-op path) shows the
setup really starves the executor: there the chunk cannot complete until the
busy call ends."""
import json

import pytest

pytestmark = [pytest.mark.tf_stack, pytest.mark.timeout(300)]

from stack_required import import_stack_module  # noqa: E402

import_stack_module("tensorflow")

from hvdrun import CONTROLLERS, HERE, check, horovodrun  # noqa: E402


def run(mode, controller, tmp_path):
    check(horovodrun([f"{HERE}/mp/release_worker.py", mode, str(tmp_path)], controller,
                     timeout=240))
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_granted_chunk_completes_while_the_executor_is_busy(controller, tmp_path):
    r0, r1 = run("one_op", controller, tmp_path)
    assert r0["completed_while_busy"], r0["stats"]
    assert r1["completed_while_busy"], r1["stats"]
    assert r0["y"] == r1["y"] == [3.0] * 4          # 1 + 2: Horovod's sum
    assert r0["stats"]["completed"] == 1 and r0["stats"]["unknown_completions"] == 0


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_chunk_op_runs_inline_not_behind_the_backward_chain(controller, tmp_path):
    """With one inter-op thread, an op queued on TensorFlow's pool waits for the
    whole inline chain (the backward pass); HvdPrioAllreduce is cheap to start,
    so the executor runs it inline during the chain and the chunk completes
    while a py_function after the chain still holds the only thread."""
    r0, r1 = run("inline", controller, tmp_path)
    for r in (r0, r1):
        assert r["completed_during_chain"][-1], r
    assert r0["y"] == r1["y"] == [3.0] * 4


def test_horovod_allreduce_op_waits_behind_the_chain(tmp_path):
    # the control: the same graph with Horovod's own op starves until the chain ends
    r0, r1 = run("inline_three_ops", "gloo", tmp_path)
    assert not any(r0["completed_during_chain"]), r0
    assert r0["y"] == r1["y"] == [3.0] * 4


def test_one_graph_may_hold_a_chunk_twice(tmp_path):
    # Horovod's tensor name is the node's, uniquified by TensorFlow, as with hvd.allreduce
    r0, r1 = run("twice", "gloo", tmp_path)
    assert r0["a"] == r1["a"] == [3.0] * 4 and r0["b"] == r1["b"] == [6.0] * 4
    assert r0["stats"]["completed"] == 2 and r0["stats"]["unknown_completions"] == 0


def test_three_op_path_waits_for_the_executor(tmp_path):
    r0, r1 = run("three_ops", "gloo", tmp_path)
    assert not r0["completed_while_busy"], r0["stats"]
    assert r0["y"] == r1["y"] == [3.0] * 4


def test_bad_inputs_name_the_chunk():
    import tensorflow as tf
    from horovod_prio.tensorflow import ops
    x = tf.ones([4])
    with pytest.raises(ValueError, match="allreduce: name"):
        ops.allreduce(x, 1, "", 1)
    with pytest.raises(ValueError, match=r"allreduce\(c0\): priority must fit in int32"):
        ops.allreduce(x, 2**40, "c0", 1)
    with pytest.raises(ValueError, match=r'rank 0 .*chunk_name="c0"|chunk_name="c0".*rank 0'):
        tf.function(lambda t: ops.allreduce(t, tf.constant([1, 2]), "c0", 1))(x)
    # a priority of unknown shape reaches the kernel
    f = tf.function(lambda t, p: ops.allreduce(t, p, "c0", 1),
                    input_signature=[tf.TensorSpec([4]), tf.TensorSpec(None, tf.int32)])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"HvdPrioAllreduce\(c0\): priority must be a scalar"):
        f(x, tf.constant([1, 2]))

