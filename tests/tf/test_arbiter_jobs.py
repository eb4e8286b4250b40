"""The cross-job arbiter wired into the TF binding (issue 5, job side).

Real `horovodrun -np 2` jobs (Gloo), two at a time, against a real arbiter
process (`python -m horovod_prio.cli arbiter`):

* alive: two jobs on one link both finish; the arbiter granted chunks of both;
* killed: the arbiter is SIGKILLed while both jobs are mid-run (they pause at a
  batch and wait for the test); both finish with weights identical to a run
  without any arbiter (no chunk lost, duplicated or reduced twice);
* unreachable: nothing listens on the port; the job finishes, one warning.

(The wiring without TensorFlow - tickets, local grants inside the callback,
withdrawals - is tested in tests/runtime/test_arbiter_link.py.)
"""
import concurrent.futures
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hvdrun import HERE, ROOT, check, horovodrun
from horovod_prio.arbiter.client import ArbiterClient

pytestmark = pytest.mark.tf_stack
WORKER = os.path.join(HERE, "mp", "arbiter_worker.py")
SECRET = "tf-arbiter-test-secret"
LINK = "shared0"
STEPS = 40
PAUSE_AT = 15
RUN_TIMEOUT = 120
OPT_IN_VARS = ("HOROVOD_PRIO_ARBITER", "HOROVOD_PRIO_LINK", "HOROVOD_PRIO_JOB_ID",
               "HOROVOD_PRIO_ARBITER_SECRET", "HOROVOD_PRIO_ARBITER_TIMEOUT")
OUTAGE = "unavailable for job"   # the client's one fallback warning


class ArbiterProcess:
    """`horovod-prio arbiter --bind 127.0.0.1:0` as a child process."""

    def __init__(self, log_path, credit="2048"):
        self.log = open(log_path, "w")
        env = dict(os.environ, HOROVOD_PRIO_ARBITER_SECRET=SECRET,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "horovod_prio.cli", "arbiter", "--bind", "127.0.0.1:0",
             "--credit-bytes", credit], stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=env, cwd=ROOT, start_new_session=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stdout], daemon=True).start()
        deadline = time.monotonic() + 30
        self.address = None
        while self.address is None:
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                pytest.fail("arbiter did not start within 30 s")
            m = re.search(r"listening on (\S+:\d+)", line)
            if m:
                self.address = m.group(1)

    def stats(self):
        from horovod_prio.arbiter.client import fetch_stats
        return fetch_stats(self.address, SECRET, timeout=5.0)

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()


def job_env(address, job_id):
    return {"HOROVOD_PRIO_ARBITER": address, "HOROVOD_PRIO_LINK": LINK,
            "HOROVOD_PRIO_JOB_ID": job_id, "HOROVOD_PRIO_ARBITER_SECRET": SECRET,
            "HOROVOD_PRIO_ARBITER_TIMEOUT": "0.5"}


def run_job(out_dir, env=None, extra=()):
    os.makedirs(out_dir, exist_ok=True)
    res = horovodrun([WORKER, str(out_dir), "--steps", str(STEPS)] + list(extra),
                     controller="gloo", timeout=RUN_TIMEOUT, env=env)
    rank0 = None
    if os.path.exists(os.path.join(out_dir, "rank0.json")):
        rank0 = json.load(open(os.path.join(out_dir, "rank0.json")))
    return {"res": res, "log": res.stdout, "rank0": rank0, "dir": str(out_dir)}


def weights(job):
    with np.load(os.path.join(job["dir"], "weights.npz")) as z:
        return [z["arr_%d" % i] for i in range(len(z.files))]


@pytest.fixture(scope="module")
def no_opt_in():
    """The jobs opt in only through the env each test gives them."""
    with pytest.MonkeyPatch.context() as mp:
        for name in OPT_IN_VARS:
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def alive(tmp_path_factory, no_opt_in):
    d = tmp_path_factory.mktemp("alive")
    arb = ArbiterProcess(d / "arbiter.log")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            futs = [ex.submit(run_job, d / j, dict(job_env(arb.address, j),
                                                    HOROVOD_PRIO_TRACE=str(d / j / "trace.json")))
                    for j in ("job-a", "job-b")]
            jobs = [f.result() for f in futs]
        stats = arb.stats()
    finally:
        arb.kill()
    return {"jobs": jobs, "stats": stats}


@pytest.fixture(scope="module")
def killed(tmp_path_factory, no_opt_in):
    d = tmp_path_factory.mktemp("killed")
    arb = ArbiterProcess(d / "arbiter.log")
    names = ("kill-a", "kill-b")
    info = {}

    def killer():
        # both jobs are mid-run (rank 0 paused before batch PAUSE_AT): kill, then resume them
        deadline = time.monotonic() + RUN_TIMEOUT
        while not all(os.path.exists(d / j / "paused") for j in names):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        info["paused_in_time"] = all(os.path.exists(d / j / "paused") for j in names)
        hog = None
        try:
            info["stats"] = arb.stats()
            # A third "job" takes the link's whole credit and never completes, so the
            # jobs' next requests are queued at the arbiter when it dies.
            granted = threading.Event()
            hog = ArbiterClient(arb.address, LINK, "hog", SECRET, lambda k: granted.set(), timeout=5.0)
            hog.request(1, 1 << 40, 1 << 20, "hog")
            info["hog_granted"] = granted.wait(20)
            resume()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                info["pending_at_kill"] = arb.stats()["links"][LINK]["pending"]
                if info["pending_at_kill"] >= 2:
                    break
                time.sleep(0.05)
        finally:
            arb.kill()
            resume()
            if hog is not None:
                hog.close()

    def resume():
        for j in names:
            os.makedirs(d / j, exist_ok=True)
            open(d / j / "resume", "w").close()

    try:
        with concurrent.futures.ThreadPoolExecutor(3) as ex:
            kf = ex.submit(killer)
            futs = [ex.submit(run_job, d / j, job_env(arb.address, j), ["--pause-at", str(PAUSE_AT)])
                    for j in names]
            jobs = [f.result() for f in futs]
            kf.result()
    finally:
        arb.kill()
    paused = [json.load(open(d / j / "paused")) for j in names]
    return {"jobs": jobs, "stats": info.get("stats"), "paused": paused, "names": names,
            "hog_granted": info.get("hog_granted"), "pending_at_kill": info.get("pending_at_kill"),
            "paused_in_time": info.get("paused_in_time")}


@pytest.fixture(scope="module")
def reference_and_unreachable(tmp_path_factory, no_opt_in):
    """A job without any arbiter, and one whose arbiter port nothing listens on."""
    d = tmp_path_factory.mktemp("plain")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()  # bound then closed, never listened: connections are refused
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        ref = ex.submit(run_job, d / "reference")
        unr = ex.submit(run_job, d / "unreachable", job_env(dead, "lonely"))
        return {"reference": ref.result(), "unreachable": unr.result()}


def assert_every_chunk_once(job):
    sched = job["rank0"]["scheduler"]
    assert sched["submitted"] > STEPS * 4, sched
    assert sched["submitted"] == sched["released"] == sched["completed"], sched
    assert sched["requested"] == sched["queued"] == sched["inflight_chunks"] == 0, sched
    assert sched["unknown_completions"] == 0 and sched["cancelled"] == 0, sched
    c = job["rank0"]["counters"]
    # every chunk was asked for exactly once and granted exactly once
    assert c["requests"] == c["grants"] == sched["submitted"], (c, sched)
    assert c["arbiter_grants"] + c["fallback_grants"] == c["grants"], c
    assert c["pending"] == 0 and c["callback_errors"] == 0, c


def assert_same_weights(job, ref):
    got, want = weights(job), weights(ref)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=0)


# ---------------------------------------------------------------- 1. arbiter alive
def test_two_jobs_share_the_arbiter_and_finish(alive):
    for job, name in zip(alive["jobs"], ("job-a", "job-b")):
        check(job["res"])
        assert job["log"].count("job %s joined link %s at arbiter" % (name, LINK)) == 1, job["log"][-3000:]
        assert "WARNING horovod_prio" not in job["log"], job["log"][-3000:]
        assert_every_chunk_once(job)
        c = job["rank0"]["counters"]
        assert c["arbiter_grants"] == c["requests"] and c["fallback_grants"] == 0, c
        assert job["rank0"]["scheduler"]["external_grant"] is True
    link = alive["stats"]["links"][LINK]
    per_job = link["grants_per_job"]
    assert per_job.get("job-a", 0) > 0 and per_job.get("job-b", 0) > 0, link
    for job, name in zip(alive["jobs"], ("job-a", "job-b")):
        assert per_job[name] == job["rank0"]["counters"]["requests"], link
    assert link["grants"] == link["completions"] and link["outstanding_grants"] == 0, link
    assert link["expired_leases"] == 0 and link["cancelled"] == 0, link
    assert alive["stats"]["server"]["protocol_errors"] == 0
    assert alive["stats"]["server"]["auth_failures"] == 0


def test_trace_shows_the_wait_for_the_arbiter(alive):
    from horovod_prio.runtime.trace import load_trace
    for job in alive["jobs"]:
        events = load_trace(os.path.join(job["dir"], "trace.json"))
        spans = [e for e in events if e.get("cat") == "arbiter" and e.get("ph") == "X"]
        assert len(spans) == job["rank0"]["counters"]["requests"], len(spans)
        # each span runs from its chunk's request to its release (the
        # scheduler's instants of the same ticket)
        inst = {}
        for e in events:
            if e.get("cat") == "chunk" and e.get("ph") == "i":
                inst.setdefault((e["args"]["kind"], e["args"]["name"], e["ts"]), e["args"]["ticket"])
        release = {t: ts for (kind, _, ts), t in inst.items() if kind == "release"}
        for e in spans:
            assert e["name"].startswith("arbiter "), e
            chunk = e["name"][len("arbiter "):]
            ticket = inst.get(("request", chunk, e["ts"]))
            assert ticket is not None, ("no request instant where the span starts", e)
            rel = release.get(ticket)
            assert rel is not None and abs(e["ts"] + e["dur"] - rel) < 2, (e, rel)


def test_only_rank0_asks_for_the_link(alive):
    # one job per job at the arbiter (rank 1 never registers), a class watcher per rank
    # (class_auto: 2 jobs x 2 ranks), plus our stats query
    assert set(alive["stats"]["links"][LINK]["grants_per_job"]) == {"job-a", "job-b"}
    assert alive["stats"]["server"]["connections"] == 2 + 4 + 1, alive["stats"]["server"]


# ---------------------------------------------------------------- 2. arbiter killed
def test_arbiter_killed_mid_run_jobs_finish_with_identical_weights(killed, reference_and_unreachable):
    ref = reference_and_unreachable["reference"]
    check(ref["res"])
    assert ref["rank0"]["counters"] is None  # the reference did not opt in
    assert "joined link" not in ref["log"]
    assert ref["rank0"]["scheduler"]["external_grant"] is False
    stats = killed["stats"]
    assert killed["paused_in_time"], "the jobs never paused: the arbiter was not killed mid-run"
    assert stats is not None
    assert killed["hog_granted"]
    # requests of the jobs were queued at the arbiter when it was killed
    assert killed["pending_at_kill"] >= 2, killed["pending_at_kill"]
    per_job = stats["links"][LINK]["grants_per_job"]
    for job, name, paused in zip(killed["jobs"], killed["names"], killed["paused"]):
        check(job["res"])
        # before the kill the arbiter granted this job's chunks ...
        assert paused["counters"]["arbiter_grants"] > 0, paused
        assert per_job.get(name, 0) == paused["counters"]["arbiter_grants"], (stats, paused)
        # its requests carry its training step: batches 0 .. PAUSE_AT-1 ran
        assert stats["links"][LINK]["job_steps"][name] == PAUSE_AT, stats
        # ... after it, the job granted locally, with one warning
        c = job["rank0"]["counters"]
        assert c["fallback_grants"] > 0 and c["outages"] == 1, c
        assert job["log"].count(OUTAGE) == 1, job["log"][-4000:]
        assert_every_chunk_once(job)
        assert_same_weights(job, ref)


def test_arbiter_alive_weights_match_the_reference(alive, reference_and_unreachable):
    for job in alive["jobs"]:
        assert_same_weights(job, reference_and_unreachable["reference"])


# ---------------------------------------------------------------- 3. arbiter unreachable
def test_unreachable_arbiter_job_finishes_with_one_warning(reference_and_unreachable):
    job = reference_and_unreachable["unreachable"]
    check(job["res"])
    # horovodrun interleaves the ranks' output mid-line, so count in the whole log
    log = job["log"]
    assert log.count("WARNING horovod_prio") == 1 and log.count(OUTAGE) == 1, log[-4000:]
    c = job["rank0"]["counters"]
    assert c["arbiter_grants"] == 0 and c["fallback_grants"] == c["requests"] > 0, c
    assert_every_chunk_once(job)
    assert_same_weights(job, reference_and_unreachable["reference"])
