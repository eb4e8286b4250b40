"""The heterogeneous step under the priority scheduler, its monitor and the
link arbiter (real horovodrun, Gloo; roles ps=1,sparse=1,dense=2, so rank 0
is a parameter-server shard outside the dense set).

* With an arbiter: every exchange a role's first rank sends is requested at
  the arbiter and released by its grant (counted per holder, per chunk name at
  the arbiter); rank 0's boost reaches the other holders' requests; the
  weights are bit for bit those of the ungated step (HOROVOD_PRIO_ENABLED=0).
* The arbiter killed mid-run, with the job's requests queued at it: the
  holders fall back to local grants, the job finishes with the same weights.
* Beside a data-parallel job of class 0 on one arbiter, the heterogeneous job
  of class 1: no class-0 chunk is granted while a class-1 request is pending
  or granted (checked at every grant inside the arbiter), and class 1 goes
  first where both wait.
"""
import concurrent.futures
import json
import os
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tf"))
from hvdrun import check, horovodrun  # noqa: E402 (tests/tf/hvdrun.py)
from test_arbiter_jobs import SECRET, ArbiterProcess  # noqa: E402

pytestmark = pytest.mark.tf_stack
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mp", "prio_worker.py")
DP_WORKER = os.path.join(os.path.dirname(HERE), "tf", "mp", "arbiter_worker.py")
LINK = "heter0"
STEPS = 12
BATCH, ROWS_A, ROWS_B = 16, 40, 17          # prio_worker.py's batches
ROLES = {"HOROVOD_PRIO_HETER_ROLES": "ps=1,sparse=1,dense=2"}
OPT_IN_VARS = ("HOROVOD_PRIO_ARBITER", "HOROVOD_PRIO_LINK", "HOROVOD_PRIO_JOB_ID",
               "HOROVOD_PRIO_ARBITER_SECRET", "HOROVOD_PRIO_ARBITER_TIMEOUT",
               "HOROVOD_PRIO_JOB_PRIORITY", "HOROVOD_PRIO_ENABLED")
OUTAGE = "unavailable for job"


def job_env(address, job_id, job_class=0):
    return dict(ROLES, HOROVOD_PRIO_ARBITER=address, HOROVOD_PRIO_LINK=LINK,
                HOROVOD_PRIO_JOB_ID=job_id, HOROVOD_PRIO_ARBITER_SECRET=SECRET,
                HOROVOD_PRIO_ARBITER_TIMEOUT="2", HOROVOD_PRIO_JOB_PRIORITY=str(job_class))


def run_heter(out, env, extra=(), controller="gloo", np_=4):
    os.makedirs(out, exist_ok=True)
    res = horovodrun([WORKER, str(out), "--steps", str(STEPS)] + list(extra), controller, np_=np_,
                     timeout=300, env=env)
    reports = [json.load(open(os.path.join(out, "rank%d.json" % r)))
               if os.path.exists(os.path.join(out, "rank%d.json" % r)) else None
               for r in range(np_)]
    return {"res": res, "log": res.stdout, "reports": reports, "dir": str(out)}


def collective_bytes(sparse_trainers, ahead=False):
    """Per step, the bytes every sender's part of each held alltoall holds,
    counted here from prio_worker.py's batches (same seed and draws): each
    sparse trainer's slice (contiguous, the first ones one sample longer)
    dedupes its ids per table (the tables differ in width: one group each);
    keys 8 bytes each, rows and row gradients 4 x the table's width (4, 3);
    activation gradients 15 floats (3 x 4 + 3) per sample of the batch.
    ``ahead`` (``--fit``): the keys are sent in the first step only, later
    ones ride with the step before's row gradients (8 bytes each)."""
    rng = np.random.default_rng(7)
    base, extra = divmod(BATCH, sparse_trainers)
    out = []
    for _ in range(STEPS):
        ids_a = np.minimum(rng.zipf(1.5, (BATCH, 3)) - 1, ROWS_A - 1)
        ids_b = rng.integers(0, ROWS_B, (BATCH, 1))
        rng.standard_normal((BATCH, 5)), rng.random((BATCH, 1))
        keys = rows = lo = 0
        for s in range(sparse_trainers):
            hi = lo + base + (1 if s < extra else 0)
            ua, ub = len(np.unique(ids_a[lo:hi])), len(np.unique(ids_b[lo:hi]))
            keys, rows, lo = keys + 8 * (ua + ub), rows + 4 * (4 * ua + 3 * ub), hi
        out.append({"keys": keys, "rows": rows, "row_grads": rows,
                    "activation_grads": 4 * 15 * BATCH})
    want = {k: [w[k] for w in out] for k in out[0]}
    if ahead:
        want["row_grads"] = [r + k for r, k in zip(want["row_grads"], want["keys"][1:] + [0])]
        want["keys"] = want["keys"][:1]
    return want


def assert_requested_whole_collectives(grants, job_id, sparse_trainers, ahead=False):
    """Every held alltoall was asked for (and granted) with every sender's part."""
    want = collective_bytes(sparse_trainers, ahead)
    for kind in ("keys", "rows", "activation_grads", "row_grads"):
        got = [g["bytes"] for g in grants if g["job"] == job_id and g["chunk"].endswith("." + kind)]
        assert got == want[kind], (kind, got, want)


def weights(job):
    out = {}
    for r in range(4):
        with np.load(os.path.join(job["dir"], "weights_rank%d.npz" % r)) as z:
            out.update({"%d/%s" % (r, k): z[k] for k in z.files})
    return out


def assert_same_weights(job, ref):
    got, want = weights(job), weights(ref)
    assert sorted(got) == sorted(want) and len(got) >= 2 * 3 + 2 * 4
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def expected_requests(report):
    """What a holder asks per run: the exchanges of HELD, the dense chunks."""
    return {"ps": STEPS, "sparse": 2 * STEPS,
            "dense": STEPS * (1 + (report["dense_chunks"] or 0))}[report["role"]]


def assert_every_exchange_requested_once(job):
    for rank, rep in enumerate(job["reports"]):
        sched = rep["scheduler"]
        assert sched["submitted"] == sched["released"] == sched["completed"], (rank, sched)
        assert sched["queued"] == sched["requested"] == sched["inflight_chunks"] == 0, sched
        if rank == 3:            # the second dense trainer passes its gates, never asks
            assert rep["holds"] is False and rep["counters"] is None, rep
            continue
        assert rep["holds"] is True, rep
        c = rep["counters"]
        assert c["requests"] == c["grants"] == sched["submitted"] == expected_requests(rep), \
            (rank, c, sched)
        assert c["arbiter_grants"] + c["fallback_grants"] == c["grants"], c
        assert c["pending"] == 0 and c["callback_errors"] == 0, c


class GrantRecorder:
    """Sees every grant of an in-process arbiter as it is sent, with the
    link's state at that moment (the arbiter's loop thread)."""

    def __init__(self, srv):
        from horovod_prio.arbiter.core import PENDING
        self.srv, self.pending_state = srv, PENDING
        self.grants, self.violations, self.contested = [], [], 0
        real = srv.send_grants

        def send_grants(grants):
            for r in grants or ():
                self._see(r)
            real(grants)
        srv.send_grants = send_grants

    def _see(self, r):
        ln = self.srv.arbiter.links[r.job.link]
        others = [q for j in ln.jobs for q in j.reqs.values() if q is not r]
        mine = r.job.job_class
        self.grants.append({"job": r.job.job_id, "cls": mine, "chunk": r.chunk,
                            "prio": r.priority, "bytes": r.nbytes})
        higher = [(q.job.job_id, q.chunk, q.state) for q in others if q.job.job_class > mine]
        if higher:
            self.violations.append((r.job.job_id, r.chunk, higher))
        if any(q.job.job_class < mine and q.state == self.pending_state for q in others):
            self.contested += 1

    def pending_jobs(self):
        def look():
            ln = self.srv.arbiter.links.get(LINK)
            if ln is None:
                return set()
            return {j.job_id for j in ln.jobs
                    if any(q.state == self.pending_state for q in j.reqs.values())}
        return self.srv.call(look)


@pytest.fixture(scope="module")
def no_opt_in():
    with pytest.MonkeyPatch.context() as mp:
        for name in OPT_IN_VARS:
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def reference(tmp_path_factory, no_opt_in):
    """The ungated step (HOROVOD_PRIO_ENABLED=0)."""
    job = run_heter(tmp_path_factory.mktemp("ungated"), dict(ROLES, HOROVOD_PRIO_ENABLED="0"))
    check(job["res"])
    return job


def run_arbitrated(out, controller="gloo", roles=None, np_=4, extra=()):
    from horovod_prio.arbiter.server import ArbiterServer
    srv = ArbiterServer(secret=SECRET, credit_bytes=2048)
    rec = GrantRecorder(srv)
    host, port = srv.start()
    try:
        env = dict(job_env("%s:%d" % (host, port), "heter-a"), HOROVOD_PRIO_MAX_BOOST="2",
                   HOROVOD_PRIO_COUNT_THRESHOLD="1000")
        if roles:
            env["HOROVOD_PRIO_HETER_ROLES"] = roles
        job = run_heter(out, env, ["--boost", "2"] + list(extra), controller, np_)
        stats = srv.call(srv.stats)
    finally:
        srv.stop()
    return {"job": job, "grants": rec.grants, "stats": stats}


@pytest.fixture(scope="module")
def arbitrated(tmp_path_factory, no_opt_in):
    return run_arbitrated(tmp_path_factory.mktemp("arbitrated"))


def test_heter_exchanges_are_requested_at_the_arbiter_and_released_by_its_grants(arbitrated):
    check_arbitrated(arbitrated)


def test_under_open_mpi_too(tmp_path, no_opt_in, reference):
    arbitrated = run_arbitrated(tmp_path, "mpi")
    check_arbitrated(arbitrated)
    assert_same_weights(arbitrated["job"], reference)


def check_arbitrated(arbitrated):
    job = arbitrated["job"]
    check(job["res"])
    reps = job["reports"]
    assert [r["role"] for r in reps] == ["ps", "sparse", "dense", "dense"]
    assert job["log"].count("job heter-a joined link %s at arbiter" % LINK) == 3, job["log"][-3000:]
    assert_every_exchange_requested_once(job)
    for rep in reps[:3]:
        c = rep["counters"]
        assert c["arbiter_grants"] == c["grants"] and c["fallback_grants"] == 0, c
        assert rep["scheduler"]["external_grant"] is True
    # the arbiter granted each of them, under the chunk names of the exchanges
    mine = [g for g in arbitrated["grants"] if g["job"] == "heter-a"]
    by_kind = {}
    for g in mine:
        kind = g["chunk"].split(".", 1)[1]          # <identity>.<exchange> / .dense_g<k>...
        kind = "dense" if kind.startswith("dense") else kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
    chunks = reps[2]["dense_chunks"]
    assert chunks >= 2
    assert by_kind == {"keys": STEPS, "rows": STEPS, "activation_grads": STEPS,
                       "row_grads": STEPS, "dense": STEPS * chunks}, by_kind
    assert len(mine) == sum(r["counters"]["requests"] for r in reps[:3])
    link = arbitrated["stats"]["links"][LINK]
    assert link["grants_per_job"]["heter-a"] == len(mine), link
    assert link["grants"] == link["completions"] and link["outstanding_grants"] == 0, link
    # two dense trainers: the activation gradients are asked for with both parts
    assert_requested_whole_collectives(arbitrated["grants"], "heter-a", 1)


def test_with_several_ranks_per_role_a_holder_asks_for_every_senders_part(tmp_path, no_opt_in):
    """Two shards, two sparse trainers, two dense trainers (Gloo): every
    member of an alltoall sends its part at once, so each holder asks the
    arbiter for the keys, rows, row gradients (with the next step's keys:
    each step is told the next batch) or activation gradients of every
    sender, not its own part only (counted from the batches here)."""
    arbitrated = run_arbitrated(tmp_path, roles="ps=2,sparse=2,dense=2", np_=6,
                                extra=["--fit"])
    job = arbitrated["job"]
    check(job["res"])
    assert [r["role"] for r in job["reports"]] == ["ps"] * 2 + ["sparse"] * 2 + ["dense"] * 2
    assert job["log"].count("job heter-a joined link %s at arbiter" % LINK) == 3, job["log"][-3000:]
    assert_requested_whole_collectives(arbitrated["grants"], "heter-a", 2, ahead=True)


def test_rank0_shard_times_the_step_and_its_boost_reaches_every_holder(arbitrated):
    """Rank 0 is the shard: its monitor times all STEPS steps; the vector its
    policy holds (boost 2 on the last group: the step's path) is broadcast on
    the global set, and the sparse trainer's key requests (rank 1) carry it."""
    reps = arbitrated["job"]["reports"]
    g = reps[0]["dense_groups"]
    assert g == reps[2]["dense_groups"] >= 1
    assert reps[0]["monitor_steps"] == STEPS
    boosted = reps[0]["policy_priorities"]
    assert boosted == list(range(g + 1)) + [g + 1 + 2], boosted
    for rep in reps:
        assert rep["relayed"] == STEPS and rep["relay_latest"] == boosted, rep
    keys = [x["prio"] for x in arbitrated["grants"] if x["chunk"].endswith(".keys")]
    pushes = [x["prio"] for x in arbitrated["grants"] if x["chunk"].endswith(".row_grads")]
    dense = {x["prio"] for x in arbitrated["grants"] if ".dense_" in x["chunk"]}
    # the first step or two may run before the first broadcast arrived
    assert keys[-1] == g + 3 and keys.count(g + 3) >= STEPS - 2, keys
    assert set(pushes) == {g} and dense == set(range(g)), (pushes, dense)


def test_the_gate_changes_no_bit(arbitrated, reference):
    assert_same_weights(arbitrated["job"], reference)
    for rep in reference["reports"]:                          # really ungated
        assert rep["scheduler"] is None and rep["gated"] == {}, rep


@pytest.fixture(scope="module")
def killed(tmp_path_factory, no_opt_in):
    d = tmp_path_factory.mktemp("killed")
    arb = ArbiterProcess(d / "arbiter.log")
    out = d / "job"
    os.makedirs(out)
    info = {}

    def killer():
        from horovod_prio.arbiter.client import ArbiterClient
        deadline = time.monotonic() + 200
        while not os.path.exists(out / "paused") and time.monotonic() < deadline:
            time.sleep(0.05)
        info["paused"] = os.path.exists(out / "paused")
        hog = None
        try:
            info["stats"] = arb.stats()
            # a class-9 "job" takes the whole credit and keeps it: the heter
            # job's next requests queue at the arbiter, which then dies
            granted = threading.Event()
            hog = ArbiterClient(arb.address, LINK, "hog", SECRET, lambda k: granted.set(),
                                timeout=5.0, job_class=9)
            hog.request(1, 1 << 40, 1 << 20, "hog")
            open(out / "resume", "w").close()
            info["hog_granted"] = granted.wait(30)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                info["pending_at_kill"] = arb.stats()["links"][LINK]["pending"]
                if info["pending_at_kill"] >= 1:
                    break
                time.sleep(0.02)
        finally:
            arb.kill()
            open(out / "resume", "w").close()
            if hog is not None:
                hog.close()

    try:
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            kf = ex.submit(killer)
            job = run_heter(out, job_env(arb.address, "heter-k"), ["--pause-at", "5"])
            kf.result()
    finally:
        arb.kill()
    return dict(info, job=job)


def test_arbiter_killed_mid_run_the_heter_job_falls_back_and_finishes(killed, reference):
    job = killed["job"]
    check(job["res"])
    assert killed["paused"] and killed["hog_granted"], killed
    assert killed["pending_at_kill"] >= 1, killed
    per_job = killed["stats"]["links"][LINK]["grants_per_job"]
    assert per_job["heter-k"] > 0, per_job           # granted by the arbiter before
    assert_every_exchange_requested_once(job)
    for rep in job["reports"][:3]:
        c = rep["counters"]
        assert c["arbiter_grants"] > 0 and c["fallback_grants"] > 0 and c["outages"] == 1, c
    assert job["log"].count(OUTAGE) == 3, job["log"][-4000:]   # one per holder
    assert_same_weights(job, reference)


@pytest.fixture(scope="module")
def classes(tmp_path_factory, no_opt_in):
    """A class-1 heter job and a class-0 data-parallel job on one arbiter; a
    class-9 hog holds the link until both jobs have requests waiting."""
    from horovod_prio.arbiter.client import ArbiterClient
    from horovod_prio.arbiter.server import ArbiterServer
    d = tmp_path_factory.mktemp("classes")
    srv = ArbiterServer(secret=SECRET, credit_bytes=2048)
    rec = GrantRecorder(srv)
    host, port = srv.start()
    address = "%s:%d" % (host, port)
    hog = ArbiterClient(address, LINK, "hog", SECRET, lambda k: None, timeout=5.0, job_class=9)
    hog.request(1, 1 << 40, 1 << 20, "hog")
    info = {}

    def release_hog():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if {"heter-c", "dp-c"} <= rec.pending_jobs():
                info["both_waited"] = True
                break
            time.sleep(0.01)
        hog.complete(1)

    def run_dp():
        out = d / "dp"
        os.makedirs(out)
        env = {"HOROVOD_PRIO_ARBITER": address, "HOROVOD_PRIO_LINK": LINK,
               "HOROVOD_PRIO_JOB_ID": "dp-c", "HOROVOD_PRIO_ARBITER_SECRET": SECRET,
               "HOROVOD_PRIO_ARBITER_TIMEOUT": "2", "HOROVOD_PRIO_JOB_PRIORITY": "0"}
        return horovodrun([DP_WORKER, str(out), "--steps", "40"], "gloo", timeout=300, env=env)

    try:
        with concurrent.futures.ThreadPoolExecutor(3) as ex:
            hf = ex.submit(release_hog)
            dp = ex.submit(run_dp)
            heter = ex.submit(run_heter, d / "heter", job_env(address, "heter-c", 1))
            info.update(dp=dp.result(), heter=heter.result())
            hf.result()
        info["stats"] = srv.call(srv.stats)
    finally:
        hog.close()
        srv.stop()
    return dict(info, grants=rec.grants, violations=rec.violations, contested=rec.contested)


def test_class_1_heter_job_goes_before_a_class_0_data_parallel_job(classes):
    check(classes["dp"])
    check(classes["heter"]["res"])
    assert classes.get("both_waited"), "the two jobs never waited at the arbiter together"
    assert classes["stats"]["links"][LINK]["grants_per_job"]["heter-c"] > 0
    heter = [g for g in classes["grants"] if g["job"] == "heter-c"]
    dp = [g for g in classes["grants"] if g["job"] == "dp-c"]
    assert heter and dp and {g["cls"] for g in heter} == {1} and {g["cls"] for g in dp} == {0}
    # every holder of the heter job registered with class 1 (three connections)
    assert classes["heter"]["log"].count("(class 1, native client)") == 3
    # no grant while a higher class waited or held the link, at any grant
    assert classes["violations"] == [], classes["violations"][:5]
    # and where a class-0 request waited, class 1 was granted over it
    assert classes["contested"] >= 1
