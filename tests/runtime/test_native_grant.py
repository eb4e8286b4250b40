"""The grant path against arbiter *processes*: a scheduler in external-grant
mode joined by ArbiterLink, with the native client (config.arbiter_client =
"native": the C++ client sends the requests and its I/O thread releases the
chunks) and, for comparison, the Python client.

* a real arbiter (``horovod-prio arbiter``): a grant releases the chunk; a
  withdrawn chunk is cancelled at the arbiter at once;
* the arbiter killed (SIGKILL) while a chunk waits: granted locally, one
  warning, no hang; restarted on the same port: the client reconnects and the
  next chunk is the arbiter's grant again;
* a lying arbiter (a process speaking the protocol): a GRANT for a ticket the
  job never requested releases nothing and is logged; a GRANT with a bad MAC
  drops the connection with a clear warning and the chunk is granted locally.

Behaviour only: every wait is a generous upper bound.
"""
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from horovod_prio.arbiter.client import ArbiterClient, fetch_stats
from horovod_prio.method.config import PriorityConfig
from horovod_prio.runtime.arbiter_link import ArbiterLink
from horovod_prio.scheduler import Scheduler
from waiting import wait_until

pytestmark = [pytest.mark.scheduler_lib, pytest.mark.timeout(60)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "native-grant-test-secret-0123456789"
LOGGER = "horovod_prio.arbiter"


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_PRIO_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["HOROVOD_PRIO_ARBITER_SECRET"] = SECRET
    return env


def _start(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=_env(), cwd=ROOT)
    line = p.stdout.readline()
    m = re.search(r"listening on ([\d.]+):(\d+)", line)
    if not m:
        p.kill()
        raise AssertionError("server did not start: %r" % line)
    return p, (m.group(1), int(m.group(2)))


def start_arbiter(bind="127.0.0.1:0"):
    return _start([sys.executable, "-m", "horovod_prio.cli", "arbiter", "--bind", bind,
                   "--credit-bytes", "100", "--lease-seconds", "30"])


# A protocol-2 arbiter that lies: REGISTERED, PONG, QUEUED like a real one, then
# per mode: "unknown" grants a token the job never asked for; "forged" grants
# the real token in a frame whose MAC is wrong.
LIAR = textwrap.dedent("""
    import socket, sys
    from horovod_prio.arbiter import protocol as P
    mode, secret = sys.argv[1], sys.argv[2]
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(4)
    print("liar listening on 127.0.0.1:%d" % ls.getsockname()[1], flush=True)
    s, _ = ls.accept()
    rd = P.FrameReader()
    backlog = []
    def body():
        while not backlog:
            data = s.recv(65536)
            if not data:
                sys.exit(0)
            backlog.extend(rd.feed(data))
        return backlog.pop(0)
    hs = P.ServerHandshake(P.load_secret(secret))
    s.sendall(hs.on_hello(body()))
    reply, sess = hs.on_proof(body())
    s.sendall(reply)
    while True:
        p = sess.open(body())
        if p[0] == P.T_REGISTER:
            s.sendall(sess.seal(P.enc_registered(30.0)))
        elif p[0] == P.T_PING:
            s.sendall(sess.seal(P.enc_token(P.T_PONG, P.dec_token(p))))
        elif p[0] == P.T_REQUEST:
            token = P.dec_request(p)[0]
            s.sendall(sess.seal(P.enc_token(P.T_QUEUED, token)))
            if mode == "unknown":
                s.sendall(sess.seal(P.enc_token(P.T_GRANT, token + 424242)))
            else:
                frame = bytearray(sess.seal(P.enc_token(P.T_GRANT, token)))
                frame[-1] ^= 0x01
                s.sendall(bytes(frame))
""")


def start_liar(mode):
    return _start([sys.executable, "-c", LIAR, mode, SECRET])


def stop(p):
    if p.poll() is None:
        p.kill()
    p.wait(10)


@pytest.fixture(params=["native", "python"])
def kind(request):
    return request.param


def native_link(addr, kind="native", **kw):
    s = Scheduler()
    s.configure(1 << 20, True)
    cfg = PriorityConfig.from_env({}, arbiter="%s:%d" % addr, link="L", job_id="job-n",
                                  arbiter_secret=SECRET, arbiter_timeout=2.0,
                                  arbiter_client=kind, **kw)
    al = ArbiterLink.attach(s, cfg)
    assert al.native == (kind == "native")
    assert wait_until(lambda: al.client.connected), "the native client did not register"
    return s, al


def link_stats(addr):
    return fetch_stats(addr, SECRET)["links"].get("L", {})


def released(s, ticket):
    return wait_until(lambda: ticket in s.take_released())


def test_grant_releases_the_chunk_and_a_withdrawn_chunk_is_cancelled_at_once(kind):
    p, addr = start_arbiter()
    hog = None
    s, al = native_link(addr, kind)
    try:
        t1 = s.submit("a", 1, 10)
        assert released(s, t1)                          # the arbiter's grant released it
        assert s.complete_ticket(t1)
        hog_got = []
        hog = ArbiterClient(addr, "L", "hog", SECRET, hog_got.append, timeout=2.0)
        hog.request(1, 1000, 100, "hog")                # the hog takes the whole link
        assert wait_until(lambda: hog_got == [1])
        t2 = s.submit("b", 1, 50)
        assert wait_until(lambda: link_stats(addr).get("pending") == 1)
        assert s.cancel(t2) == "requested"              # the step failed: withdrawn
        assert wait_until(lambda: link_stats(addr).get("pending") == 0, timeout=5.0)
        assert link_stats(addr)["cancelled"] == 1
        t3 = s.submit("b", 1, 50)
        assert wait_until(lambda: link_stats(addr).get("pending") == 1)
        hog.complete(1)
        assert released(s, t3)
        assert s.stats()["unknown_grants"] == 0          # nothing granted t2 late
        c = al.counters
        assert c["arbiter_grants"] == 2 and c["fallback_grants"] == 0 and c["cancels"] == 1
    finally:
        al.close()
        if hog is not None:
            hog.close()
        stop(p)


def test_arbiter_killed_then_restarted(kind, caplog):
    p, addr = start_arbiter()
    p2 = None
    s, al = native_link(addr, kind)
    try:
        t1 = s.submit("a", 1, 100)                      # the link's whole credit
        assert released(s, t1)
        t2 = s.submit("b", 1, 50)
        assert wait_until(lambda: link_stats(addr).get("pending") == 1)   # waits at the arbiter
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            p.send_signal(signal.SIGKILL)
            p.wait(10)
            assert released(s, t2)                      # the waiting chunk: granted locally
            assert not al.client.connected
            t4 = s.submit("d", 1, 10)
            assert released(s, t4)                      # while it is down: locally at once
            for t in (t1, t2, t4):
                assert s.complete_ticket(t)
            p2, addr2 = start_arbiter("%s:%d" % addr)
            assert addr2 == addr
            assert wait_until(lambda: al.client.connected), "no reconnect"
            t3 = s.submit("c", 1, 10)
            assert released(s, t3)
        c = al.counters
        assert c["arbiter_grants"] == 2 and c["fallback_grants"] == 2 and c["reconnects"] == 1
        warnings = [r.getMessage() for r in caplog.records
                    if r.name == LOGGER and r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "unavailable for job job-n" in warnings[0], warnings
        assert link_stats(addr)["grants_per_job"] == {"job-n": 1}
    finally:
        al.close()
        stop(p)
        if p2 is not None:
            stop(p2)


def test_grant_for_a_ticket_never_requested_releases_nothing_and_is_logged(kind, caplog):
    p, addr = start_liar("unknown")
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            s, al = native_link(addr, kind)
            try:
                t = s.submit("a", 1, 10)
                assert wait_until(lambda: al.counters["ignored_grants"] == 1)
                assert s.take_released() == []          # the lie released nothing
                st = s.stats()
                assert st["requested"] == 1 and st["unknown_grants"] == 0
                assert al.client.connected              # a late grant is no protocol error
            finally:
                al.close()                              # external grant off releases it
            assert s.take_released() == [t]
        msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert any("granted token %d, which this job never requested" % (t + 424242) in m
                   for m in msgs), msgs
    finally:
        stop(p)


def test_grant_with_a_bad_mac_is_rejected_and_the_chunk_granted_locally(kind, caplog):
    p, addr = start_liar("forged")
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            s, al = native_link(addr, kind)
            try:
                t = s.submit("a", 1, 10)
                assert released(s, t)                   # the local fallback grant
                c = al.counters
                assert c["fallback_grants"] == 1 and c["arbiter_grants"] == 0
                assert not al.client.connected
            finally:
                al.close()
        msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert any("unavailable for job job-n" in m and "bad frame MAC" in m for m in msgs), msgs
    finally:
        stop(p)


def test_native_counters_are_json_and_match_the_python_clients_names():
    """The link's counters (the runtime's summary reads them) have every name
    the Python client reports, for either client."""
    from horovod_prio.scheduler.arbiter_client import NativeArbiterClient
    py = ArbiterClient(("127.0.0.1", 1), "L", "j", SECRET, lambda k: None, timeout=0.05)
    nat = NativeArbiterClient(("127.0.0.1", 1), "L", "j", SECRET, lambda k: None, timeout=0.05)
    try:
        assert set(py.counters) <= set(nat.counters)
        json.dumps(nat.counters)
    finally:
        py.close()
        nat.close()


@pytest.mark.parametrize("klen", [1, 32, 63, 64, 65, 100, 300])
def test_native_hmac_matches_the_standard_library(klen):
    """The client's own HMAC-SHA256 (sha256.h) against Python's, for keys
    shorter, as long as and longer than a block (longer ones are hashed first)
    and messages across the padding boundaries."""
    import hashlib
    import hmac
    from horovod_prio.scheduler.arbiter_client import hmac_sha256
    key = hashlib.sha512(b"k%d" % klen).digest() * (klen // 64 + 1)
    key = key[:klen]
    for mlen in (0, 1, 9 + 27, 55, 56, 63, 64, 65, 119, 120, 1000):
        msg = bytes((i * 7 + mlen) & 0xFF for i in range(mlen))
        assert hmac_sha256(key, msg) == hmac.digest(key, msg, "sha256"), (klen, mlen)
