"""class_auto end to end: a real ``horovodrun -np 2`` job (Gloo and Open
MPI) names a real arbiter process and sets no class and no nice. While
another job of a higher class is registered on its link, *every* rank runs
at nice 19 (threads and autogroup); when that job leaves, and again when the
arbiter is killed with the flag set, every rank returns to its own values
and the job finishes (its chunks then granted locally). With
HOROVOD_PRIO_CLASS_AUTO=0 nothing changes.
"""
import json
import os
import time

import pytest

from hvdrun import CONTROLLERS, HERE, check, start
from test_arbiter_jobs import LINK, SECRET, ArbiterProcess
from horovod_prio.arbiter.client import ArbiterClient

pytestmark = pytest.mark.tf_stack
WORKER = os.path.join(HERE, "mp", "class_auto_worker.py")
TIMEOUT = 150


def ranks_state(d):
    out = []
    for r in (0, 1):
        try:
            with open(os.path.join(d, "rank%d.json" % r)) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            out.append(None)
    return out


def wait_state(d, pred, what, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = ranks_state(d)
        if all(x is not None and pred(x) for x in s):
            return s
        time.sleep(0.05)
    pytest.fail("ranks never %s: %r" % (what, ranks_state(d)))


def run(tmp_path, controller, env_extra=None):
    d = str(tmp_path)
    arb = ArbiterProcess(tmp_path / "arbiter.log")
    env = {"HOROVOD_PRIO_ARBITER": arb.address, "HOROVOD_PRIO_LINK": LINK,
           "HOROVOD_PRIO_ARBITER_SECRET": SECRET, "HOROVOD_PRIO_JOB_ID": "low",
           "HOROVOD_PRIO_ARBITER_TIMEOUT": "0.5"}
    for k in ("HOROVOD_PRIO_CPU_NICE", "HOROVOD_PRIO_JOB_PRIORITY", "HOROVOD_PRIO_CLASS_AUTO"):
        env[k] = ""                                     # empty = unset
    env.update(env_extra or {})
    log = open(tmp_path / "job.log", "w")
    proc = start([WORKER, d], controller=controller, env=env, out=log)
    seen = {}
    high = None
    try:
        seen["start"] = wait_state(d, lambda x: True, "paused", timeout=TIMEOUT)
        high = ArbiterClient(arb.address, LINK, "high", SECRET, lambda k: None, job_class=1)
        if env_extra:                                   # class_auto off: wait, then look
            time.sleep(2)
            seen["beside"] = ranks_state(d)
            return seen, proc, log, tmp_path
        seen["beside"] = wait_state(d, lambda x: x == {"threads": [19], "autogroup": 19},
                                    "niced beside the class-1 job")
        high.close()
        seen["left"] = wait_state(d, lambda x: 19 not in x["threads"], "back after it left")
        high = ArbiterClient(arb.address, LINK, "high", SECRET, lambda k: None, job_class=1)
        wait_state(d, lambda x: x["threads"] == [19], "niced again")
        arb.kill()                                      # the arbiter dies with the flag set
        seen["dead"] = wait_state(d, lambda x: 19 not in x["threads"], "back after the kill")
        return seen, proc, log, tmp_path
    finally:
        open(os.path.join(d, "resume"), "w").close()
        try:
            proc.wait(TIMEOUT)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            if high is not None:
                high.close()
            arb.kill()
            log.close()


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_every_rank_is_niced_while_a_higher_class_is_on_the_link(tmp_path, controller):
    seen, proc, _, d = run(tmp_path, controller)
    out = (d / "job.log").read_text()
    assert proc.returncode == 0, out[-6000:]
    assert os.path.exists(d / "done")
    for r in (0, 1):
        start_state = seen["start"][r]
        assert 19 not in start_state["threads"], seen
        assert seen["left"][r] == start_state, seen
        assert seen["dead"][r] == start_state, seen
    assert out.count("a higher job class is on this job's link") >= 4, out[-4000:]


@pytest.mark.parametrize("controller", CONTROLLERS[:1])
def test_class_auto_off_leaves_every_rank_alone(tmp_path, controller):
    seen, proc, _, d = run(tmp_path, controller, {"HOROVOD_PRIO_CLASS_AUTO": "0"})
    out = (d / "job.log").read_text()
    assert proc.returncode == 0, out[-6000:]
    assert seen["beside"] == seen["start"], seen
    assert "a higher job class" not in out
