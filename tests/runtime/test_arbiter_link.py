"""Rank 0's scheduler wired to a real arbiter (in-process server on loopback),
no TensorFlow: requests by ticket, a refused request granted locally inside the
scheduler's callback, a withdrawn chunk freed at the arbiter at once (not
after the lease) and never released by a late grant, detach at exit."""
import logging
import time

import pytest

from horovod_prio.arbiter.server import ArbiterServer
from horovod_prio.method.config import PriorityConfig
from horovod_prio.runtime.arbiter_link import ArbiterLink
from horovod_prio.scheduler import Scheduler

pytestmark = pytest.mark.scheduler_lib
SECRET = "runtime-arbiter-link-test-secret"


@pytest.fixture(params=["native", "python"])
def kind(request):
    """Every test runs with both clients (config.arbiter_client)."""
    return request.param


@pytest.fixture
def server():
    srv = ArbiterServer("127.0.0.1", 0, SECRET, credit_bytes=100, lease_seconds=30.0)
    srv.start()
    yield srv
    srv.stop()


def config(srv, kind, **kw):
    return PriorityConfig.from_env({}, arbiter="127.0.0.1:%d" % srv.address[1], link="L",
                                   arbiter_client=kind,
                                   job_id=kw.pop("job_id", "job-a"), arbiter_secret=SECRET,
                                   arbiter_timeout=2.0, **kw)


def wait_for(pred, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.005)


def link_stats(srv):
    return srv.call(srv.stats)["links"]["L"]


def test_not_opted_in_attaches_nothing():
    s = Scheduler()
    assert ArbiterLink.attach(s, PriorityConfig.from_env({})) is None
    assert not s.stats()["external_grant"]


def test_chunks_go_through_the_arbiter_by_ticket(server, kind):
    s = Scheduler()
    s.configure(1 << 20, True)
    al = ArbiterLink.attach(s, config(server, kind))
    try:
        assert s.stats()["external_grant"]
        tickets = [s.submit("c%d" % i, i, 10) for i in range(3)]
        released = []
        wait_for(lambda: released.extend(s.take_released()) or len(released) == 3, "grants")
        assert sorted(released) == tickets
        for t in tickets:
            s.complete_ticket(t)
        wait_for(lambda: link_stats(server)["completions"] == 3, "completions at the arbiter")
        assert link_stats(server)["grants_per_job"] == {"job-a": 3}
    finally:
        al.close()
    assert not s.stats()["external_grant"]
    al.close()   # idempotent


@pytest.mark.parametrize("tagged", [True, False])
def test_requests_carry_the_step_so_a_step_is_one_burst(server, kind, tagged):
    """With a step source (the runtime sets the step clock's count of steps
    begun), chunks of one step that reach the arbiter apart (the job idle in
    between) stay one burst; without it every return from idle is a new one."""
    s = Scheduler()
    s.configure(1 << 20, True)
    al = ArbiterLink.attach(s, config(server, kind))
    step = [1]
    if tagged:
        al.set_steps(lambda: step[0])
    try:
        for st in (1, 1, 2):                   # two chunks of step 1 with a gap, one of step 2
            step[0] = st
            t = s.submit("c", 1, 10)
            wait_for(lambda: t in s.take_released(), "grant")
            s.complete_ticket(t)
            wait_for(lambda: link_stats(server)["outstanding_grants"] == 0, "completion")
        assert link_stats(server)["bursts"] == (2 if tagged else 3)
    finally:
        al.close()


def test_refused_request_is_granted_locally_inside_the_callback(server, kind, caplog):
    s = Scheduler()
    s.configure(1 << 20, True)
    al = ArbiterLink.attach(s, config(server, kind))
    try:
        with caplog.at_level(logging.WARNING, logger="horovod_prio"):
            t = s.submit("c" * 300, 1, 10)     # label > 256 bytes: the client refuses it
        assert s.take_released() == [t]        # granted locally, no deadlock
        assert al.counters["link_local_grants"] == 1
        assert [r for r in caplog.records if "granted locally" in r.getMessage()]
    finally:
        al.close()


def test_withdrawn_request_is_freed_at_the_arbiter_at_once(server, kind):
    """Another job holds the link; our request waits at the arbiter. Our step
    fails: the scheduler withdraws the chunk, the arbiter drops the request at
    once (long before the 30 s lease), and the late grant it could have sent
    never releases the next step's chunk of the same name."""
    from horovod_prio.arbiter.client import ArbiterClient
    hog_granted = []
    hog = ArbiterClient(server.address, "L", "hog", SECRET, hog_granted.append, timeout=2.0)
    s = Scheduler()
    s.configure(1 << 20, True)
    al = ArbiterLink.attach(s, config(server, kind))
    try:
        hog.request(1, 1000, 100, "hog")
        wait_for(lambda: hog_granted == [1], "the hog's grant")
        old = s.submit("g", 1, 50)
        wait_for(lambda: link_stats(server)["pending"] == 1, "our request queued")
        assert s.cancel(old) == "requested"
        wait_for(lambda: link_stats(server)["pending"] == 0, "the withdrawal at the arbiter", 2.0)
        assert link_stats(server)["cancelled"] == 1
        new = s.submit("g", 1, 50)             # the next step's chunk, same name
        wait_for(lambda: link_stats(server)["pending"] == 1, "the new request queued")
        assert s.take_released() == []
        hog.complete(1)                        # the link frees: only the new request is granted
        wait_for(lambda: s.stats()["released"] == 1, "the new grant")
        assert s.take_released() == [new]
        assert s.stats()["unknown_grants"] == 0
    finally:
        al.close()
        hog.close()


def test_native_client_requests_and_releases_without_the_python_callbacks(server, monkeypatch):
    """arbiter_client=native: the scheduler's hooks are the C++ client's own; the
    Python callbacks of the link are never called, yet chunks are requested at
    the arbiter (by ticket, with the step tag), granted there and released."""
    def boom(*a):
        raise AssertionError("a Python callback ran on the native grant path")
    for name in ("on_request", "on_complete", "on_cancel", "on_grant"):
        monkeypatch.setattr(ArbiterLink, name, boom)
    s = Scheduler()
    s.configure(1 << 20, True)
    al = ArbiterLink.attach(s, config(server, "native"))
    try:
        assert al.native and s.stats()["external_grant"]
        t = s.submit("c", 1, 10)
        wait_for(lambda: t in s.take_released(), "the grant")
        assert s.complete_ticket(t)
        wait_for(lambda: link_stats(server)["completions"] == 1, "the completion at the arbiter")
        c = al.counters
        assert c["arbiter_grants"] == 1 and c["fallback_grants"] == 0
        assert c["callback_errors"] == 0
    finally:
        al.close()
    assert not s.stats()["external_grant"]
