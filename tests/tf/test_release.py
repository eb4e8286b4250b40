"""A chunk released from outside TensorFlow's executor (an arbiter grant, the
completion of another chunk) reaches Horovod and completes even while every
TensorFlow inter-op thread is busy (real horovodrun, Gloo and MPI).

The control case (gate -> hvd.allreduce -> done, the three-op path) shows the
setup really starves the executor: there the chunk cannot complete until the
busy call ends."""
import json

import pytest

pytestmark = [pytest.mark.tf_stack, pytest.mark.timeout(300)]

pytest.importorskip("tensorflow")

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


def test_three_op_path_waits_for_the_executor(tmp_path):
    r0, r1 = run("three_ops", "gloo", tmp_path)
    assert not r0["completed_while_busy"], r0["stats"]
    assert r0["y"] == r1["y"] == [3.0] * 4
