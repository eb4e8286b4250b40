"""Failure paths leak nothing and hang nothing (real horovodrun, Gloo and MPI):

* a step fails after some of its chunks were released: every rank's held
  gates are withdrawn and its in-flight chunks abandoned with the error, the
  next steps run with the whole credit, weights stay finite and equal;
* rank 0 is killed with SIGKILL mid-run: its Chrome trace still loads (only
  the closing bracket missing) with the steps before the kill;
* Horovod elastic (KerasState, an elastic launch) and Horovod's
  groups/num_groups take Horovod's own path with one warning, never an
  exception, with Horovod's results.
"""
import json
import os
import signal
import time

import numpy as np
import pytest

from hvdrun import CONTROLLERS, HERE, check, horovodrun, start
from horovod_prio.runtime.trace import load_trace

pytestmark = pytest.mark.tf_stack
WORKER = os.path.join(HERE, "mp", "failure_worker.py")


@pytest.mark.parametrize("mode", ["failed_step", "failed_step_one_op"])
@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_failed_step_releases_its_chunks_and_training_goes_on(controller, mode, tmp_path):
    check(horovodrun([WORKER, str(tmp_path), mode], controller, timeout=300))
    weights = []
    for r in (0, 1):
        info = json.load(open(tmp_path / ("failed_rank%d.json" % r)))
        assert info["failed"] == [5], info
        after, end = info["after_failure"], info["end"]
        # nothing waits and nothing stays "in flight" once the failed step returned
        assert (after["queued"], after["requested"], after["inflight_bytes"],
                after["inflight_chunks"]) == (0, 0, 0, 0), after
        if mode == "failed_step":
            assert after["abandoned"] >= 1, after        # released, then the step failed
        # every later chunk went through; every submitted chunk is accounted for
        assert end["submitted"] == end["released"] + end["cancelled"], end
        assert end["released"] == end["completed"] + end["abandoned"], end
        assert end["completed"] > after["completed"] and end["inflight_bytes"] == 0, end
        weights.append(np.load(tmp_path / ("weights_rank%d.npz" % r)))
    for a, b in zip(weights[0].values(), weights[1].values()):
        assert np.all(np.isfinite(a)) and np.array_equal(a, b)


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_rank0_killed_mid_run_leaves_a_loadable_trace(controller, tmp_path):
    trace = tmp_path / "trace.json"
    log = open(tmp_path / "log.txt", "w")
    proc = start([WORKER, str(tmp_path), "progress"], controller,
                 env={"HOROVOD_PRIO_TRACE": str(trace)}, out=log)
    try:
        deadline = time.time() + 180
        done = -1
        while done < 40:
            assert time.time() < deadline and proc.poll() is None, open(tmp_path / "log.txt").read()
            try:
                done = int((tmp_path / "progress").read_text())
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        os.kill(int((tmp_path / "pid_rank0").read_text()), signal.SIGKILL)
        proc.wait(120)        # the job ends (non-zero) instead of hanging
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    text = trace.read_text()
    assert not text.rstrip().endswith("]")          # rank 0 never got to close it
    json.loads(text + "]")                          # strict: only the bracket is missing
    events = load_trace(str(trace))
    steps = [e for e in events if e.get("cat") == "step"]
    chunks = [e for e in events if e.get("cat") == "chunk" and e.get("ph") == "i"]
    assert len(steps) >= 30, len(steps)             # the steps before the kill are there
    assert chunks


def test_horovod_elastic_takes_horovods_path_with_its_results(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    out = check(horovodrun([WORKER, str(tmp_path), "elastic"], "gloo", timeout=300,
                           extra=["--min-np", "2", "--max-np", "2", "--host-discovery-script",
                                  str(script)]))
    assert "uses Horovod's own allreduce path: Horovod elastic (HOROVOD_ELASTIC=1)" in out, \
        out[-3000:]
    got = []
    for r in (0, 1):
        with np.load(tmp_path / ("elastic_rank%d.npz" % r)) as z:
            arrs = [z["arr_%d" % i] for i in range(len(z.files))]
        got.append((arrs[:len(arrs) // 2], arrs[len(arrs) // 2:]))
    ref = got[0][0]
    for hvd_w, prio_w in got:
        for a, b, c in zip(ref, hvd_w, prio_w):
            np.testing.assert_allclose(b, a, rtol=1e-6)   # the state synced the ranks
            np.testing.assert_array_equal(c, b)          # ours is Horovod's path, exactly


def test_groups_and_num_groups_take_horovods_path_with_a_warning(caplog):
    import tensorflow as tf
    import horovod_prio.tensorflow as hvd_tf
    import horovod_prio.tensorflow.keras as hvd
    hvd.init()
    for kwargs in ({"num_groups": 2}, {"groups": 3}):
        with caplog.at_level("WARNING", logger="horovod_prio"):
            opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.1), **kwargs)
        assert "explicit fusion groups" in opt._allreduce_grads.passthrough_reason
        assert "HOROVOD_PRIO_NUM_GROUPS" in caplog.text
    tape = hvd_tf.DistributedGradientTape(tf.GradientTape(), num_groups=2)
    assert "explicit fusion groups" in tape._allreduce_grads.passthrough_reason
    # without them: the priority path
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.1))
    assert opt._allreduce_grads.passthrough_reason is None
