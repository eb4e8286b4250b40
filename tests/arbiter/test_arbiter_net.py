"""Arbiter service + client over real loopback TCP (127.0.0.1, ephemeral ports).

Behaviour only, never timing: waits are generous upper bounds.
"""
import collections
import json
import logging
import random
import socket
import struct
import threading
import time

import pytest

from horovod_prio.arbiter import protocol as P
from horovod_prio.arbiter.client import ArbiterClient, fetch_stats
from horovod_prio.arbiter.server import ArbiterServer
from waiting import wait_until

pytestmark = pytest.mark.timeout(30)

SECRET = b"test-secret-\x00\xff-16-bytes-or-more"
LOGGER = "horovod_prio.arbiter"


# ------------------------------------------------------------------ helpers
_KEYS, _NAMES = {}, {}
_key_lock = threading.Lock()


def key(name):
    """The request key (an int, as the job side's tickets) a test names ``name``;
    Grants records the names back, so the tests read as before."""
    with _key_lock:
        k = _KEYS.get(name)
        if k is None:
            k = _KEYS[name] = 1000 + len(_KEYS)
            _NAMES[k] = name
        return k


class Grants:
    """Records on_grant calls (as test names); thread-safe; waits on conditions."""

    def __init__(self):
        self.calls = []
        self.cv = threading.Condition()

    def __call__(self, k):
        with self.cv:
            self.calls.append(_NAMES.get(k, k))
            self.cv.notify_all()

    def wait(self, pred, timeout=5.0):
        end = time.monotonic() + timeout
        with self.cv:
            while not pred(self.calls):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(left)
            return True

    def wait_for(self, chunk, timeout=5.0):
        return self.wait(lambda calls: chunk in calls, timeout)

    def count(self):
        with self.cv:
            return collections.Counter(self.calls)


class Reader(P.FrameReader):
    """FrameReader plus a backlog of bodies already split off (for recv_body)."""

    def __init__(self):
        super().__init__()
        self.backlog = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def server_factory():
    made = []

    def make(port=0, **kw):
        kw.setdefault("credit_bytes", 100)
        srv = ArbiterServer("127.0.0.1", port, SECRET, **kw)
        srv.start()
        made.append(srv)
        return srv
    yield make
    for s in made:
        s.stop()


def native_client_class():
    """The native client (libhvdprio_scheduler.so), imported only when a test runs it."""
    from horovod_prio.scheduler.arbiter_client import NativeArbiterClient
    return NativeArbiterClient


# Every test that talks to a client through its interface runs against both
# implementations: the Python ArbiterClient and the native one.
CLIENT_KINDS = ["python", pytest.param("native", marks=pytest.mark.scheduler_lib)]


@pytest.fixture(params=CLIENT_KINDS)
def client_class(request):
    return ArbiterClient if request.param == "python" else native_client_class()


def _factory(cls):
    made = []

    def make(addr, job, link="L", on_grant=None, secret=SECRET, timeout=1.0, wait_connected=True, **kw):
        g = on_grant if on_grant is not None else Grants()
        c = cls(addr, link, job, secret, g, timeout=timeout, **kw)
        made.append(c)
        if wait_connected:
            assert wait_until(lambda: c.connected), "client %s did not connect" % job
        return c, g
    return make, made


@pytest.fixture
def client_factory(client_class):
    make, made = _factory(client_class)
    yield make
    for c in made:
        c.close()


@pytest.fixture
def python_client_factory():
    """For the tests that reach into the Python client's internals."""
    make, made = _factory(ArbiterClient)
    yield make
    for c in made:
        c.close()


def link_stats(srv, link="L"):
    return srv.call(lambda: srv.stats()["links"].get(link, {}))


def server_counters(srv):
    return srv.call(lambda: dict(srv.counters))


def raw_connect(addr, secret=SECRET):
    """Authenticated raw socket (for forging / fuzzing after the handshake)."""
    s = socket.create_connection(addr, timeout=5)
    rd = Reader()
    hs = P.ClientHandshake(secret)
    s.sendall(hs.hello())
    s.sendall(hs.on_challenge(recv_body(s, rd)))
    hs.on_verdict(recv_body(s, rd))
    return s, rd, hs.session


def recv_body(s, rd, timeout=5.0):
    """Next frame body; frames that arrived together are kept in `rd.backlog`."""
    if rd.backlog:
        return rd.backlog.pop(0)
    s.settimeout(timeout)
    while True:
        data = s.recv(65536)
        if not data:
            raise ConnectionError("closed")
        rd.backlog += rd.feed(data)
        if rd.backlog:
            return rd.backlog.pop(0)


def is_closed_by_peer(s, timeout=5.0):
    s.settimeout(timeout)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


# ------------------------------------------------------------------ policy over the wire
def test_grant_order_across_jobs(server_factory, client_factory):
    srv = server_factory(credit_bytes=100)
    a, ga = client_factory(srv.address, "A")
    b, gb = client_factory(srv.address, "B")
    c, gc = client_factory(srv.address, "C")
    order = []
    lock = threading.Lock()
    a.request(key("hold"), 0, 100)
    assert ga.wait_for("hold")
    for cl, g, chunk, prio in ((b, gb, "b-low", 1), (c, gc, "c-high", 9), (a, ga, "a-mid", 5)):
        cl.request(key(chunk), prio, 100)
    assert wait_until(lambda: link_stats(srv)["pending"] == 3)
    for cl, g in ((a, ga), (b, gb), (c, gc)):
        g.order, g.lock = order, lock
    a.complete(key("hold"))
    for chunk, (cl, g) in (("c-high", (c, gc)), ("a-mid", (a, ga)), ("b-low", (b, gb))):
        assert g.wait_for(chunk)
        # nothing else was granted while this one holds the link
        assert link_stats(srv)["outstanding_grants"] == 1
        cl.complete(key(chunk))
    st = link_stats(srv)
    assert st["grants"] == 4 and st["waits"] == 3 and st["connected_jobs"] == 3
    assert st["grants_per_job"] == {"A": 2, "B": 1, "C": 1}
    for cl in (a, b, c):
        assert cl.counters["fallback_grants"] == 0


@pytest.mark.parametrize("order, first, second", [("chunk", "b0", "a3"), ("burst", "a3", "b0")])
def test_credit_and_ties(server_factory, client_factory, order, first, second):
    """Equal priorities: "chunk" order serves them in arrival order (b0 before
    a3); "burst" order lets A finish its burst first (a3, then b0)."""
    srv = server_factory(credit_bytes=300, order=order)
    a, ga = client_factory(srv.address, "A")
    b, gb = client_factory(srv.address, "B")
    grants = {"A": ga, "B": gb}
    for i in range(3):
        a.request(key("a%d" % i), 5, 100)
    assert ga.wait(lambda calls: len(calls) == 3)
    b.request(key("b0"), 5, 100)
    assert wait_until(lambda: link_stats(srv)["pending"] == 1)
    a.request(key("a3"), 5, 100)
    assert wait_until(lambda: link_stats(srv)["pending"] == 2)
    assert link_stats(srv)["grants_per_job"] == {"A": 3}    # both queued: the credit is used
    assert gb.calls == [] and len(ga.calls) == 3
    a.complete(key("a0"))
    assert grants[first[0].upper()].wait_for(first)
    st = link_stats(srv)                                   # the arbiter granted one, holds one
    assert st["pending"] == 1 and st["grants_per_job"] == {"A": 4 if first == "a3" else 3,
                                                           **({"B": 1} if first == "b0" else {})}
    assert second not in grants[second[0].upper()].calls
    a.complete(key("a1"))
    assert grants[second[0].upper()].wait_for(second)


@pytest.mark.parametrize("a_step, first", [(1, "a2"), (2, "b2")])
def test_step_tag_keeps_a_burst_across_a_gap_over_the_wire(server_factory, client_factory,
                                                            a_step, first):
    """A's chunks say their training step: A drains (B is served in the gap),
    then A's next chunk of the same step resumes A's burst ahead of B's; a
    chunk of A's next step queues behind B's burst."""
    srv = server_factory(credit_bytes=100)          # burst order (the default)
    a, ga = client_factory(srv.address, "A")
    b, gb = client_factory(srv.address, "B")
    a.request(key("a1"), 5, 100, step=1)
    assert ga.wait_for("a1")
    b.request(key("b1"), 5, 100, step=40)
    assert wait_until(lambda: link_stats(srv)["pending"] == 1)
    a.complete(key("a1"))                           # A's gap: B gets the link
    assert gb.wait_for("b1")
    a.request(key("a2"), 5, 100, step=a_step)
    b.request(key("b2"), 5, 100, step=40)
    assert wait_until(lambda: link_stats(srv)["pending"] == 2)
    b.complete(key("b1"))
    grants = {"a2": ga, "b2": gb}
    assert grants[first].wait_for(first)
    other = "b2" if first == "a2" else "a2"
    st = link_stats(srv)                                   # the arbiter holds the other one
    assert st["pending"] == 1 and st["grants_per_job"] == {"A": 1 + (first == "a2"),
                                                           "B": 1 + (first == "b2")}
    assert other not in grants[other].calls
    assert link_stats(srv)["bursts"] == (2 if a_step == 1 else 3)


def test_request_frame_step_field_is_optional_and_checked():
    body = P.enc_request(7, -3, 100, "c")
    assert P.dec_request(body) == (7, -3, 100, "c", 0)             # untagged (no field)
    assert P.dec_request(P.enc_request(7, -3, 100, "c", 0)) == (7, -3, 100, "c", 0)
    tagged = P.enc_request(7, -3, 100, "c", 12345)
    assert len(tagged) == len(body) + 8
    assert P.dec_request(tagged) == (7, -3, 100, "c", 12345)
    for bad in (body + b"\x00", tagged + b"\x00", tagged[:-1]):
        with pytest.raises(P.ProtocolError, match="trailing bytes in REQUEST"):
            P.dec_request(bad)


def test_starvation_bound_over_the_wire(server_factory, client_factory):
    srv = server_factory(credit_bytes=1, starvation_bound=2)
    hi, ghi = client_factory(srv.address, "hi")
    lo, glo = client_factory(srv.address, "lo")
    hi.request(key("h0"), 10, 1)
    assert ghi.wait_for("h0")
    lo.request(key("low"), 0, 1)
    assert wait_until(lambda: link_stats(srv)["pending"] == 1)     # arrives before h1
    hi.request(key("h1"), 10, 1)
    assert wait_until(lambda: link_stats(srv)["pending"] == 2)
    hi.complete(key("h0"))
    assert ghi.wait_for("h1")                       # low passed over once
    hi.request(key("h2"), 10, 1)
    assert wait_until(lambda: link_stats(srv)["pending"] == 2)
    hi.complete(key("h1"))
    assert ghi.wait_for("h2")                       # passed over twice
    hi.request(key("h3"), 10, 1)
    assert wait_until(lambda: link_stats(srv)["pending"] == 2)
    hi.complete(key("h2"))
    assert glo.wait_for("low")                      # bound reached: granted regardless
    assert "h3" not in ghi.calls
    assert link_stats(srv)["starvation_grants"] == 1


def test_lease_expiry_frees_link(server_factory, client_factory):
    """A job that holds a grant without completing or renewing it (here a raw
    connection, as a stopped process whose socket stays open) loses it after
    the lease."""
    srv = server_factory(credit_bytes=100, lease_seconds=0.3)
    s, rd, sess = raw_connect(srv.address)
    s.sendall(sess.seal(P.enc_register("A", "L")) + sess.seal(P.enc_request(1, 9, 100, "held")))
    assert sess.open(recv_body(s, rd))[0] == P.T_REGISTERED
    assert sess.open(recv_body(s, rd)) == P.enc_token(P.T_GRANT, 1)
    b, gb = client_factory(srv.address, "B")
    b.request(key("b"), 1, 100)
    assert gb.wait_for("b", timeout=5)              # after A's lease expired
    st = link_stats(srv)
    assert st["expired_leases"] == 1
    s.sendall(sess.seal(P.enc_token(P.T_COMPLETE, 1)))       # late: ignored by the arbiter
    assert wait_until(lambda: server_counters(srv)["late_completions"] == 1)
    assert link_stats(srv)["outstanding_bytes"] == 100   # only b's grant
    assert b.counters["fallback_grants"] == 0
    s.close()


def test_grant_held_past_the_lease_is_renewed(server_factory, client_factory):
    """A slow allreduce: the client holds its grant for many leases; it renews
    it, so the arbiter never hands the credit to another job meanwhile."""
    srv = server_factory(credit_bytes=100, lease_seconds=1.0)
    a, ga = client_factory(srv.address, "A")
    b, gb = client_factory(srv.address, "B")
    a.request(key("slow"), 9, 100)
    assert ga.wait_for("slow")
    b.request(key("b"), 1, 100)
    assert not gb.wait_for("b", timeout=3.2)        # > 3 leases: still A's
    st = link_stats(srv)
    assert st["expired_leases"] == 0 and st["renewals"] >= 2 and st["outstanding_grants"] == 1
    assert a.counters["renewals"] >= 2
    a.complete(key("slow"))
    assert gb.wait_for("b")
    assert b.counters["fallback_grants"] == 0 and a.counters["fallback_grants"] == 0


def test_disconnect_frees_grants_and_pending(server_factory, client_factory):
    srv = server_factory(credit_bytes=100)
    a, ga = client_factory(srv.address, "A")
    b, gb = client_factory(srv.address, "B")
    a.request(key("a0"), 9, 100)
    assert ga.wait_for("a0")
    a.request(key("a1"), 9, 100)
    b.request(key("b0"), 1, 100)
    assert wait_until(lambda: link_stats(srv)["pending"] == 2)
    a.close()                                        # the job "crashes"
    assert gb.wait_for("b0")
    assert ga.calls.count("a1") == 1                 # close() granted a1 locally, once
    st = link_stats(srv)
    assert st["connected_jobs"] == 1 and st["dropped"] == 2


def test_waiting_behind_other_jobs_is_not_a_fallback(server_factory, client_factory):
    """A queued request may wait far longer than `timeout` while the arbiter is alive."""
    srv = server_factory(credit_bytes=100)
    a, ga = client_factory(srv.address, "A", timeout=0.25)
    b, gb = client_factory(srv.address, "B", timeout=0.25)
    a.request(key("big"), 9, 100)
    assert ga.wait_for("big")
    b.request(key("b"), 1, 100)
    time.sleep(1.0)                                  # 4 x timeout
    assert gb.calls == [] and b.connected
    a.complete(key("big"))
    assert gb.wait_for("b")
    assert b.counters["fallback_grants"] == 0 and b.counters["arbiter_grants"] == 1
    assert b.counters["wait_seconds_max"] >= 0.9


def test_max_wait_cancels_and_grants_locally_once(server_factory, client_factory, caplog):
    srv = server_factory(credit_bytes=100)
    a, ga = client_factory(srv.address, "A")
    b, gb = client_factory(srv.address, "B", max_wait=0.3)
    a.request(key("hold"), 9, 100)
    assert ga.wait_for("hold")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        b.request(key("b"), 1, 100)
        assert gb.wait_for("b")
    assert b.counters["max_wait_cancels"] == 1 and b.counters["fallback_grants"] == 1
    assert wait_until(lambda: link_stats(srv)["cancelled"] == 1)
    a.complete(key("hold"))
    assert wait_until(lambda: link_stats(srv)["completions"] == 1)
    st = link_stats(srv)                     # the cancelled request is gone, not granted late
    assert st["pending"] == 0 and st["grants_per_job"] == {"A": 1}
    assert gb.calls == ["b"] and b.connected
    assert sum("waited more than" in r.getMessage() for r in caplog.records) == 1


def test_max_wait_counts_only_while_none_of_the_jobs_own_grants_is_outstanding(
        server_factory, client_factory, caplog):
    """B's granted chunk holds part of the credit (in a real job: until B's
    late rank joins its allreduce); B's next request waits behind it and A's
    chunk. That wait is on B itself, not the arbiter: no local grant however
    long; max_wait counts from B's last own completion."""
    srv = server_factory(credit_bytes=150)
    a, ga = client_factory(srv.address, "A")
    b, gb = client_factory(srv.address, "B", max_wait=1.0)
    b.request(key("own"), 1, 50)
    assert gb.wait_for("own")
    a.request(key("hold"), 9, 100)
    assert ga.wait_for("hold")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        b.request(key("b"), 1, 100)                  # 150 in flight: queued
        assert wait_until(lambda: link_stats(srv)["pending"] == 1)
        time.sleep(1.5)                              # > max_wait
        assert gb.calls == ["own"] and b.counters["max_wait_cancels"] == 0
        t0 = time.monotonic()
        b.complete(key("own"))                       # 100 in flight: "b" still does not fit
        assert gb.wait_for("b")
        waited = time.monotonic() - t0
    assert waited >= 1.0, waited                     # counted from the completion
    assert b.counters["max_wait_cancels"] == 1 and b.counters["fallback_grants"] == 1
    assert sum("waited more than" in r.getMessage() for r in caplog.records) == 1


def test_stats_request(server_factory, client_factory):
    srv = server_factory(credit_bytes=100)
    a, ga = client_factory(srv.address, "A", link="eth0")
    a.request(key("x"), 1, 10)
    assert ga.wait_for("x")
    st = fetch_stats(srv.address, SECRET)
    assert st["links"]["eth0"]["grants"] == 1
    assert st["links"]["eth0"]["connected_jobs"] == 1
    for name in ("waits", "wait_seconds_total", "expired_leases", "outstanding_bytes"):
        assert name in st["links"]["eth0"]
    assert st["server"]["auth_failures"] == 0
    # the service's default reserve; the cap is the credit's eighth (100 - int(87.5))
    assert st["server"]["class_reserve"] == 0.875 and st["links"]["eth0"]["lower_class_cap_bytes"] == 13
    with pytest.raises(P.AuthError, match="wrong secret"):
        fetch_stats(srv.address, b"wrong", timeout=2)
    assert fetch_stats(srv.address, SECRET)["server"]["auth_failures"] == 1


# ------------------------------------------------------------------ authentication
def test_wrong_secret_rejected_and_client_falls_back(server_factory, client_factory, caplog):
    srv = server_factory()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c, g = client_factory(srv.address, "evil", secret=b"wrong", timeout=0.2, wait_connected=False,
                              backoff_initial=0.05, backoff_max=0.1)
        c.request(key("x"), 99, 1)
        assert g.wait_for("x")
        time.sleep(0.4)                              # several failed reconnects
    assert not c.connected
    assert c.counters["fallback_grants"] == 1
    assert link_stats(srv) == {}                     # never registered
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER
                and "unavailable" in r.getMessage()]
    assert len(warnings) == 1
    assert "authentication" in warnings[0].getMessage()


def test_server_reveals_nothing_derived_from_the_secret_before_the_client_proves(server_factory):
    """No offline guessing oracle: before the client proves, the arbiter sends
    only MAGIC + its nonce; a wrong proof gets a bare "rejected" and a close."""
    import hmac
    srv = server_factory()
    s = socket.create_connection(srv.address, timeout=5)
    rd = Reader()
    cn = P.new_nonce()
    s.sendall(P.frame(P.MAGIC + cn))
    body = recv_body(s, rd)
    assert body[:4] == P.MAGIC and len(body) == 4 + P.NONCE_LEN
    sn = body[4:]
    s.sendall(P.frame(hmac.digest(b"a guess", b"cli" + P.MAGIC + cn + sn, "sha256")))
    s.settimeout(5)
    rest = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            rest += data
    except ConnectionResetError:
        pass
    assert rest == P.frame(b"\x01")                 # rejected; nothing else
    assert server_counters(srv)["auth_failures"] == 1
    assert srv.call(lambda: len(srv.conns)) == 0
    s.close()


def test_forged_and_replayed_frames_rejected(server_factory, client_factory):
    srv = server_factory(credit_bytes=100)
    victim, gv = client_factory(srv.address, "victim")
    # an authenticated attacker connection whose frames are then forged
    s, rd, sess = raw_connect(srv.address)
    reg = sess.seal(P.enc_register("attacker", "L"))
    s.sendall(reg)
    assert sess.open(recv_body(s, rd))[0] == P.T_REGISTERED
    req = sess.seal(P.enc_request(1, 100, 100, "x"))
    s.sendall(req)
    assert sess.open(recv_body(s, rd)) == P.enc_token(P.T_GRANT, 1)
    victim.request(key("v"), 1, 100)
    assert wait_until(lambda: link_stats(srv)["pending"] == 1)
    # a forged COMPLETE (wrong MAC) must not free the link; it kills the connection
    body = P.enc_token(P.T_COMPLETE, 1)
    s.sendall(P.frame(body + b"\0" * P.MAC_LEN))
    assert is_closed_by_peer(s)
    assert server_counters(srv)["protocol_errors"] == 1
    # the connection is gone, so its grant was released by the disconnect: victim proceeds
    assert gv.wait_for("v")

    # replay: re-sending a captured frame on a new session fails its MAC
    s2, rd2, sess2 = raw_connect(srv.address)
    s2.sendall(reg)                                 # frame sealed for the other session
    assert is_closed_by_peer(s2)
    # replay within the same session (sequence number) also fails
    s3, rd3, sess3 = raw_connect(srv.address)
    ping = sess3.seal(P.enc_token(P.T_PING, 7))
    s3.sendall(ping)
    assert sess3.open(recv_body(s3, rd3)) == P.enc_token(P.T_PONG, 7)
    s3.sendall(ping)
    assert is_closed_by_peer(s3)
    assert server_counters(srv)["protocol_errors"] == 3
    # the victim's client is unaffected and still served by the arbiter
    assert victim.complete(key("v"))
    victim.request(key("v2"), 1, 100)
    assert gv.wait_for("v2")
    assert victim.counters["fallback_grants"] == 0
    for x in (s, s2, s3):
        x.close()


def test_handshake_timeout_closes_idle_connection(server_factory):
    srv = server_factory(handshake_timeout=0.2)
    s = socket.create_connection(srv.address, timeout=5)
    assert is_closed_by_peer(s, timeout=5)
    assert server_counters(srv)["auth_failures"] == 1
    s.close()


# ------------------------------------------------------------------ malformed input
def test_malformed_input_fuzz_server_survives(server_factory, client_factory):
    srv = server_factory(credit_bytes=1 << 30, handshake_timeout=0.5)
    good, gg = client_factory(srv.address, "good")
    rng = random.Random(1234)
    n_done = 0

    def check_good(i):
        good.request(key("g%d" % i), 1, 10)
        assert gg.wait_for("g%d" % i), "legit client not served after fuzz case %d" % i
        good.complete(key("g%d" % i))

    # 1) unauthenticated garbage: random bytes, bad lengths, oversized frames
    pre = [b"", b"\0\0\0\0", struct.pack(">I", P.MAX_FRAME + 1) + b"x" * 10,
           struct.pack(">I", 0xFFFFFFFF), P.frame(b"HPA1"), P.frame(b"XXXX" + b"\0" * 32),
           P.frame(P.MAGIC + b"\0" * 33)]
    pre += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))) for _ in range(40)]
    for i, blob in enumerate(pre):
        s = socket.create_connection(srv.address, timeout=5)
        try:
            s.sendall(blob)
        except OSError:
            pass
        s.close()
        n_done += 1
        if i % 10 == 0:
            check_good(n_done)

    # 2) authenticated (valid MAC) but malformed payloads: the decoder's fuzz
    templates = [P.enc_register("j", "L"), P.enc_request(1, 5, 10, "c"), P.enc_token(P.T_COMPLETE, 1),
                 P.enc_token(P.T_PING, 1), P.enc_empty(P.T_STATS), P.enc_token(P.T_CANCEL, 2)]
    cases = [b"\x02", b"\x01\xff\xff", b"\x01\x00\x00\x00\x00", b"\x7f", b"\x02" + b"\0" * 30,
             P.enc_register("j", "L") + b"extra", P.enc_request(1, 5, 10, "c")]  # REQUEST w/o REGISTER
    for _ in range(60):
        t = bytearray(rng.choice(templates))
        op = rng.randrange(3)
        if op == 0 and len(t) > 1:
            del t[rng.randrange(1, len(t)):]
        elif op == 1:
            t += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 20)))
        else:
            for _ in range(rng.randint(1, 4)):
                t[rng.randrange(len(t))] = rng.getrandbits(8)
        cases.append(bytes(t))
    for i, payload in enumerate(cases):
        s, rd, sess = raw_connect(srv.address)
        try:
            if rng.random() < 0.5:
                s.sendall(sess.seal(P.enc_register("fuzz%d" % i, "L")))
            s.sendall(sess.seal(payload))
            s.sendall(sess.seal(P.enc_token(P.T_PING, 42)))
        except OSError:
            pass
        s.close()
        n_done += 1
        if i % 10 == 0:
            check_good(n_done)
    check_good(n_done + 1)
    c = server_counters(srv)
    assert c["protocol_errors"] + c["auth_failures"] >= 20
    assert wait_until(lambda: srv.call(lambda: len(srv.conns)) == 1)    # only `good` left
    assert good.counters["fallback_grants"] == 0
    st = link_stats(srv)
    assert st["pending"] == 0 and st["outstanding_grants"] == 0


def test_duplicate_token_and_second_register_are_protocol_errors(server_factory):
    srv = server_factory()
    for payloads in ([P.enc_register("j", "L"), P.enc_register("j", "L")],
                     [P.enc_register("j", "L"), P.enc_request(1, 0, 1000, "a"),
                      P.enc_request(1, 0, 1000, "a")]):
        s, rd, sess = raw_connect(srv.address)
        s.sendall(b"".join(sess.seal(p) for p in payloads))
        assert is_closed_by_peer(s)
        s.close()
    assert server_counters(srv)["protocol_errors"] == 2
    st = link_stats(srv)
    assert st["connected_jobs"] == 0 and st["outstanding_bytes"] == 0


def test_answers_to_frames_that_came_together_all_arrive_in_order(server_factory):
    """Frames that arrive together are answered together: every answer still
    arrives, in order (each MAC in sequence); answers held back go out before a
    STATS reply and before the ERROR of a bad frame behind them."""
    srv = server_factory(credit_bytes=100)
    s, rd, sess = raw_connect(srv.address)
    s.sendall(b"".join(sess.seal(p) for p in [
        P.enc_register("j", "L"),
        P.enc_request(1, 5, 60, "a"),           # granted
        P.enc_request(2, 9, 60, "b"),           # does not fit: queued
        P.enc_request(3, 1, 30, "c"),           # behind b: queued
        P.enc_empty(P.T_STATS),
        P.enc_token(P.T_PING, 77),
        P.enc_token(P.T_COMPLETE, 1)]))         # b and c granted
    got = [sess.open(recv_body(s, rd)) for _ in range(8)]
    assert got[:4] == [P.enc_registered(srv.arbiter.lease_seconds), P.enc_token(P.T_GRANT, 1),
                       P.enc_token(P.T_QUEUED, 2), P.enc_token(P.T_QUEUED, 3)]
    assert got[4][0] == P.T_STATS_REPLY
    more, text = P.dec_stats_part(got[4])
    assert not more and json.loads(text)["links"]["L"]["pending"] == 2
    assert got[5:] == [P.enc_token(P.T_PONG, 77), P.enc_token(P.T_GRANT, 2),
                       P.enc_token(P.T_GRANT, 3)]
    # a grant, then a forged frame: the grant arrives, then the ERROR, then the close
    s.sendall(sess.seal(P.enc_request(4, 0, 10, "d")) + P.frame(b"\x03" + b"\0" * 40))
    assert sess.open(recv_body(s, rd)) == P.enc_token(P.T_GRANT, 4)
    err = sess.open(recv_body(s, rd))
    assert err[0] == P.T_ERROR and b"MAC" in err
    assert is_closed_by_peer(s)
    s.close()


def test_a_job_that_reads_late_still_gets_every_answer_in_order(server_factory):
    """A job that stops reading while its frames keep coming: what the socket
    does not take waits in the arbiter's write buffer and is sent as the job
    reads again; every answer arrives, in order."""
    srv = server_factory()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)     # a small window fills fast
    s.connect(srv.address)
    s.settimeout(5)
    rd = Reader()
    hs = P.ClientHandshake(SECRET)
    s.sendall(hs.hello())
    s.sendall(hs.on_challenge(recv_body(s, rd)) + hs.session.seal(P.enc_register("j", "L")))
    hs.on_verdict(recv_body(s, rd))
    sess = hs.session
    assert sess.open(recv_body(s, rd))[0] == P.T_REGISTERED
    # and a small send buffer on the arbiter's side of it (no autotuning)
    srv.call(lambda: [c.t.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                      for c in srv.conns])
    n = 10000                                   # 450 KB of PONGs: < the 1 MiB write buffer
    for i in range(0, n, 1000):
        s.sendall(b"".join(sess.seal(P.enc_token(P.T_PING, k)) for k in range(i, i + 1000)))
    assert wait_until(lambda: srv.call(lambda: max(c.t.buffered for c in srv.conns)) > 0), \
        "the arbiter never had to queue: the test did not fill the socket"
    for k in range(n):
        assert sess.open(recv_body(s, rd)) == P.enc_token(P.T_PONG, k)
    assert srv.call(lambda: max(c.t.buffered for c in srv.conns)) == 0
    s.close()


def test_several_grants_to_one_job_at_once_all_arrive_in_order(server_factory):
    """One COMPLETE frees the credit for several requests of another job (and a
    disconnect for a third one's): each of them gets all its GRANTs, in order."""
    srv = server_factory(credit_bytes=100)
    conns = {}
    for name in ("a", "b", "c"):
        s, rd, sess = raw_connect(srv.address)
        s.sendall(sess.seal(P.enc_register(name, "L")))
        assert sess.open(recv_body(s, rd))[0] == P.T_REGISTERED
        conns[name] = (s, rd, sess)

    def ask(name, token, prio, nbytes):
        s, rd, sess = conns[name]
        s.sendall(sess.seal(P.enc_request(token, prio, nbytes, "x%d" % token)))
        return sess.open(recv_body(s, rd))

    assert ask("a", 1, 0, 100) == P.enc_token(P.T_GRANT, 1)
    for t in (11, 12, 13):
        assert ask("b", t, 20 - t, 30) == P.enc_token(P.T_QUEUED, t)
    s, rd, sess = conns["a"]
    s.sendall(sess.seal(P.enc_token(P.T_COMPLETE, 1)))
    s, rd, sess = conns["b"]
    assert [sess.open(recv_body(s, rd)) for _ in range(3)] == [
        P.enc_token(P.T_GRANT, t) for t in (11, 12, 13)]
    # b holds 90 bytes; c waits for 2 x 50, granted together when b's connection goes
    for t in (21, 22):
        assert ask("c", t, 30 - t, 50) == P.enc_token(P.T_QUEUED, t)
    conns["b"][0].close()
    s, rd, sess = conns["c"]
    assert [sess.open(recv_body(s, rd)) for _ in range(2)] == [
        P.enc_token(P.T_GRANT, t) for t in (21, 22)]
    for s, _, _ in conns.values():
        s.close()


# ------------------------------------------------------------------ fallback
def test_unreachable_arbiter_grants_locally(client_factory, caplog):
    port = free_port()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c, g = client_factory(("127.0.0.1", port), "A", timeout=0.05, wait_connected=False,
                              backoff_initial=0.02, backoff_max=0.05)
        for i in range(20):
            c.request(key("c%d" % i), i, 100)
        assert g.wait(lambda calls: len(calls) == 20)
        time.sleep(0.3)                              # several failed reconnect attempts
        c.request(key("late"), 0, 1)
        assert g.wait_for("late")
    assert not c.connected
    assert sorted(g.count().values()) == [1] * 21
    cnt = c.counters
    assert cnt["fallback_grants"] == 21 and cnt["arbiter_grants"] == 0 and cnt["requests"] == 21
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_arbiter_that_accepts_but_never_answers(client_factory, caplog):
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    accepted = []
    stop = threading.Event()

    def acceptor():
        lsock.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(lsock.accept()[0])
            except socket.timeout:
                pass
    t = threading.Thread(target=acceptor, daemon=True)
    t.start()
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            c, g = client_factory(lsock.getsockname(), "A", timeout=0.05, wait_connected=False,
                                  handshake_timeout=0.2, backoff_initial=0.05, backoff_max=0.1)
            c.request(key("x"), 1, 1)
            assert g.wait_for("x", timeout=2)
            time.sleep(0.6)                          # reconnects, which also hang
            c.request(key("y"), 1, 1)
            assert g.wait_for("y", timeout=2)
        assert c.counters["fallback_grants"] == 2 and not c.connected
        assert len(accepted) >= 2
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    finally:
        stop.set()
        t.join()
        lsock.close()
        for s in accepted:
            s.close()


def test_arbiter_killed_mid_run_then_restarted(server_factory, client_factory, caplog):
    srv = server_factory(credit_bytes=100)
    port = srv.address[1]
    # a kill resets the connections (no timeout involved): a long timeout keeps a
    # slow reply on a loaded machine from being taken for an outage
    a, ga = client_factory(srv.address, "A", timeout=1.0, backoff_initial=0.05, backoff_max=0.1)
    b, gb = client_factory(srv.address, "B", timeout=1.0, backoff_initial=0.05, backoff_max=0.1)
    a.request(key("a0"), 9, 100)
    assert ga.wait_for("a0")
    for i in range(5):
        b.request(key("b%d" % i), 1, 100)                # queued behind a0
    assert wait_until(lambda: link_stats(srv)["pending"] == 5)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        srv.stop()                                   # killed: connections reset
        assert gb.wait(lambda calls: len(calls) == 5)
        assert wait_until(lambda: not a.connected and not b.connected)
        a.complete(key("a0"))                             # completion of an old-session grant: harmless
        a.request(key("during"), 1, 100)
        assert ga.wait_for("during")
        a.complete(key("during"))
        time.sleep(0.3)                              # failed reconnects: no extra warnings
        srv2 = server_factory(port=port, credit_bytes=100)
        assert wait_until(lambda: a.connected and b.connected, timeout=5)
        a.request(key("after"), 1, 100)
        assert ga.wait_for("after")
        assert link_stats(srv2)["grants_per_job"] == {"A": 1}     # went through the new arbiter
    ca, cb = a.counters, b.counters
    assert cb["fallback_grants"] == 5 and ca["fallback_grants"] == 1
    assert ca["arbiter_grants"] == 2 and ca["reconnects"] == 1 and cb["reconnects"] == 1
    for g in (ga, gb):
        assert set(g.count().values()) == {1}
    warns = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]
    assert len(warns) == 2                           # one per client
    assert sum("reachable again" in r.getMessage() for r in caplog.records) == 2


def test_hung_arbiter_mid_run_detected_by_heartbeat(server_factory, client_factory):
    srv = server_factory(credit_bytes=100)
    # max_wait beyond every wait below: only the heartbeat can grant locally here
    a, ga = client_factory(srv.address, "A", timeout=0.3, backoff_initial=0.05, backoff_max=0.1,
                           max_wait=60)
    b, gb = client_factory(srv.address, "B", timeout=0.3, backoff_initial=0.05, backoff_max=0.1,
                           max_wait=60)
    a.request(key("hold"), 9, 100)
    assert ga.wait_for("hold")
    b.request(key("queued"), 1, 100)
    assert wait_until(lambda: link_stats(srv)["pending"] == 1)
    hang = threading.Event()
    srv.call_soon(hang.wait, 20)                    # the arbiter hangs until released
    try:
        # heartbeat unanswered -> local grant, while the arbiter still hangs (so it
        # cannot have come from the arbiter)
        assert gb.wait_for("queued", timeout=10)
        assert b.counters["fallback_grants"] == 1 and b.counters["arbiter_grants"] == 0
    finally:
        hang.set()
    # after the hang the clients reconnect and use the arbiter again
    assert wait_until(lambda: a.connected and b.connected, timeout=5)
    a.complete(key("hold"))          # (dropped already if A fell back as well)
    b.request(key("again"), 1, 100)
    assert gb.wait_for("again")
    assert b.counters["arbiter_grants"] == 1
    assert gb.count() == {"queued": 1, "again": 1}


def test_an_idle_healthy_connection_is_kept_by_its_heartbeats(server_factory, client_factory):
    # the client must send its PINGs: an unanswered heartbeat deadline would
    # count an outage and reconnect every ~0.1 s here
    srv = server_factory(credit_bytes=100)
    a, ga = client_factory(srv.address, "A", timeout=0.05, idle_heartbeat=0.05)
    time.sleep(1.0)                                  # about 20 heartbeat periods
    assert a.connected
    assert (a.counters["outages"], a.counters["reconnects"]) == (0, 0), a.counters
    a.request(key("after"), 1, 100)
    assert ga.wait_for("after") and a.counters["arbiter_grants"] == 1


def test_request_to_hung_arbiter_falls_back(server_factory, client_factory):
    srv = server_factory(credit_bytes=1 << 20)
    a, ga = client_factory(srv.address, "A", timeout=0.3, max_wait=60)
    hang, hung = threading.Event(), threading.Event()
    srv.call_soon(lambda: (hung.set(), hang.wait(20)))  # the arbiter hangs until released
    try:
        assert hung.wait(5)
        a.request(key("x"), 1, 1)
        assert ga.wait_for("x", timeout=10)         # no GRANT/QUEUED within timeout
        assert a.counters["fallback_grants"] == 1 and a.counters["arbiter_grants"] == 0
    finally:
        hang.set()


# ------------------------------------------------------------------ exactly once
class FakeArbiter:
    """Scripted arbiter speaking the real protocol: `on_payload(conn, payload)`."""

    def __init__(self, on_payload):
        self.on_payload = on_payload
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.address = self.lsock.getsockname()
        self.stop = threading.Event()
        self.threads = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self):
        self.lsock.settimeout(0.05)
        while not self.stop.is_set():
            try:
                s, _ = self.lsock.accept()
            except socket.timeout:
                continue
            t = threading.Thread(target=self._serve, args=(s,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, s):
        rd = Reader()
        try:
            hs = P.ServerHandshake(SECRET)
            s.sendall(hs.on_hello(recv_body(s, rd)))
            reply, sess = hs.on_proof(recv_body(s, rd))
            s.sendall(reply)
            conn = (s, sess, threading.Lock())
            queue = rd.backlog
            s.settimeout(0.05)
            while not self.stop.is_set():
                while queue:
                    self.on_payload(conn, sess.open(queue.pop(0)))
                try:
                    data = s.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    return
                queue += rd.feed(data)
        except OSError:
            pass
        finally:
            s.close()

    @staticmethod
    def send(conn, payload):
        s, sess, lock = conn
        with lock:
            try:
                s.sendall(sess.seal(payload))
            except OSError:
                pass

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(2)
        self.lsock.close()


def test_exactly_once_when_late_grant_races_the_timeout(client_factory):
    """The fake arbiter answers each request at about the client's timeout:
    some grants arrive first, some after the fallback; each chunk gets exactly
    one on_grant either way."""
    timeout = 0.02
    rng = random.Random(7)
    timers = []

    def on_payload(conn, p):
        kind = p[0]
        if kind == P.T_REGISTER:
            FakeArbiter.send(conn, P.enc_registered(10.0))
        elif kind == P.T_REQUEST:
            token = P.dec_request(p)[0]
            delay = timeout * rng.uniform(0.5, 1.5)
            t = threading.Timer(delay, FakeArbiter.send, (conn, P.enc_token(P.T_GRANT, token)))
            timers.append(t)
            t.start()
        elif kind == P.T_PING:
            FakeArbiter.send(conn, P.enc_token(P.T_PONG, P.dec_token(p)))

    fake = FakeArbiter(on_payload)
    try:
        c, g = client_factory(fake.address, "A", timeout=timeout, backoff_initial=0.001,
                              backoff_max=0.002)
        n = 0
        end = time.monotonic() + 2.0
        while time.monotonic() < end and n < 200:
            for _ in range(rng.randint(1, 4)):
                c.request(key("k%d" % n), 1, 1)
                n += 1
            time.sleep(rng.uniform(0, 0.01))
        assert g.wait(lambda calls: len(calls) >= n, timeout=5)
        # drain: every GRANT the fake will ever send is sent, then it closes every
        # connection and stops listening; once the client has left READY it has read
        # its connection to the end, so a stray late grant would be counted by now
        for t in list(timers):
            t.join(5)
        fake.close()
        assert wait_until(lambda: c.state != "ready")
        cnt = g.count()
        assert len(cnt) == n and set(cnt.values()) == {1}
        k = c.counters
        assert k["grants"] == n == k["requests"]
        assert k["arbiter_grants"] > 0 and k["fallback_grants"] > 0   # both paths exercised
    finally:
        fake.close()


def test_exactly_once_grant_after_cancel_ignored(client_factory):
    """Arbiter grants a request the client already cancelled (max_wait): ignored."""
    cancelled = []

    def on_payload(conn, p):
        kind = p[0]
        if kind == P.T_REGISTER:
            FakeArbiter.send(conn, P.enc_registered(10.0))
        elif kind == P.T_REQUEST:
            FakeArbiter.send(conn, P.enc_token(P.T_QUEUED, P.dec_request(p)[0]))
        elif kind == P.T_CANCEL:
            tok = P.dec_token(p)
            cancelled.append(tok)
            FakeArbiter.send(conn, P.enc_token(P.T_GRANT, tok))   # crossed on the wire
        elif kind == P.T_PING:
            FakeArbiter.send(conn, P.enc_token(P.T_PONG, P.dec_token(p)))

    fake = FakeArbiter(on_payload)
    try:
        c, g = client_factory(fake.address, "A", timeout=0.5, max_wait=0.1)
        c.request(key("x"), 1, 1)
        assert g.wait_for("x")
        assert wait_until(lambda: cancelled)
        assert wait_until(lambda: c.counters["ignored_grants"] == 1)   # the crossed GRANT
        assert g.calls == ["x"] and c.connected
        assert c.counters["fallback_grants"] == 1 and c.counters["arbiter_grants"] == 0
    finally:
        fake.close()


def test_exactly_once_under_concurrency_and_arbiter_restarts(server_factory, client_factory):
    """Threads request, complete and cancel while the arbiter is killed and
    restarted twice: every request not cancelled gets exactly one on_grant, a
    cancelled one at most one, and none after its cancel() returned."""
    srv = server_factory(credit_bytes=1000, lease_seconds=0.5)
    port = srv.address[1]
    clients = []
    for j in range(4):
        clients.append(client_factory(srv.address, "J%d" % j, timeout=0.2, backoff_initial=0.01,
                                      backoff_max=0.05))
    issued = {}                 # chunk -> Grants of its client
    cancelled = {}              # chunk -> on_grant calls seen when cancel() returned
    issued_lock = threading.Lock()
    stop = threading.Event()

    def worker(wid, c, g):
        rng = random.Random(wid)
        i = 0
        while not stop.is_set():
            chunk = "w%d-%d" % (wid, i)
            i += 1
            c.request(key(chunk), rng.randint(0, 10), rng.choice([10, 100, 400]))
            with issued_lock:
                issued[chunk] = g
            x = rng.random()
            if x < 0.6:
                assert g.wait_for(chunk, timeout=5)
                c.complete(key(chunk))
            else:
                if x < 0.8:
                    time.sleep(rng.uniform(0, 0.002))
                assert c.cancel(key(chunk)) is True
                with issued_lock:
                    cancelled[chunk] = g.count()[chunk]
            time.sleep(rng.uniform(0, 0.003))

    threads = []
    for idx, (c, g) in enumerate(clients):
        for k in range(2):
            t = threading.Thread(target=worker, args=(idx * 10 + k, c, g), daemon=True)
            t.start()
            threads.append(t)
    servers = [srv]
    for _ in range(2):
        time.sleep(0.4)
        servers[-1].stop()
        time.sleep(0.2)
        servers.append(server_factory(port=port, credit_bytes=1000, lease_seconds=0.5))
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(5)
    for c, g in clients:
        want = sum(1 for ch, gg in issued.items() if gg is g and ch not in cancelled)
        assert g.wait(lambda calls: len(set(calls) - set(cancelled)) >= want, timeout=5)
    # drain: a barrier request per client, granted by the arbiter, whose GRANT
    # the arbiter sends after anything it decided for that connection's earlier
    # requests and cancels; once it is delivered, a stray late grant would show
    assert wait_until(lambda: all(c.connected for c, _ in clients))
    for j, (c, g) in enumerate(clients):
        before = c.counters["arbiter_grants"]
        c.request(key("barrier%d" % j), 0, 10)
        assert g.wait_for("barrier%d" % j, timeout=5)
        assert c.counters["arbiter_grants"] == before + 1   # not granted locally
        assert c.complete(key("barrier%d" % j)) is True
        issued["barrier%d" % j] = g
    total_arbiter = 0
    for c, g in clients:
        cnt = g.count()
        mine = {ch for ch, gg in issued.items() if gg is g}
        assert set(cnt) <= mine
        for ch in mine:
            if ch in cancelled:
                assert cnt[ch] == cancelled[ch] <= 1, ch     # nothing after cancel() returned
            else:
                assert cnt[ch] == 1, ch
        k = c.counters
        assert k["requests"] == len(mine) and k["pending"] == 0 and k["outstanding"] == 0
        assert k["grants"] == sum(cnt.values())
        assert k["cancels"] == sum(1 for ch in mine if ch in cancelled)
        total_arbiter += k["arbiter_grants"]
    assert total_arbiter > 0
    assert all(c.connected for c, _ in clients)
    st = link_stats(servers[-1])
    assert st["pending"] == 0 and st["outstanding_grants"] == 0     # the cancels freed the link


def test_request_validation_and_close(server_factory, client_factory, client_class):
    srv = server_factory()
    c, g = client_factory(srv.address, "A")
    for args, field in (((1, 1, 1, "x" * 300), "label"), ((1, 1, 1, 5), "label"),
                        (("x", 1, 1), "key"), ((-1, 1, 1), "key"), ((2 ** 64, 1, 1), "key"),
                        ((True, 1, 1), "key"), ((1, 1.5, 1), "priority"), ((1, 2 ** 63, 1), "priority"),
                        ((1, 1, -1), "nbytes"), ((1, True, 1), "priority"),
                        ((1, 1, 1, "", -1), "step"), ((1, 1, 1, "", 2 ** 64), "step"),
                        ((1, 1, 1, "", 1.0), "step")):
        with pytest.raises(ValueError, match=field):
            c.request(*args)
    c.request(key("dup"), 1, 1)
    with pytest.raises(ValueError, match="already pending or granted"):
        c.request(key("dup"), 1, 1)                 # a key is unique while it lives
    assert g.wait_for("dup")
    with pytest.raises(ValueError, match="already pending or granted"):
        c.request(key("dup"), 1, 1)
    assert c.complete(key("dup")) is True
    assert c.complete(key("dup")) is False          # once
    assert c.complete(key("never-granted")) is False
    assert c.cancel(key("never-requested")) is False
    c.close()
    with pytest.raises(RuntimeError, match="closed"):
        c.request(key("x"), 1, 1)
    with pytest.raises(ValueError, match="address"):
        client_class("nohostport", "L", "j", SECRET, lambda c: None)
    with pytest.raises(ValueError, match="secret"):
        client_class(srv.address, "L", "j", "", lambda c: None)
    with pytest.raises(ValueError, match="link"):
        client_class(srv.address, "", "j", SECRET, lambda c: None)
    with pytest.raises(ValueError, match="job_class"):
        client_class(srv.address, "L", "j", SECRET, lambda c: None, job_class=2 ** 31)


def test_on_grant_may_reenter_and_errors_are_contained(server_factory, client_factory):
    srv = server_factory(credit_bytes=1 << 20)
    seen = []
    holder = {}

    def on_grant(k):
        chunk = _NAMES[k]
        seen.append(chunk)
        if chunk == "first":
            holder["c"].complete(key("first"))
            holder["c"].request(key("second"), 1, 1)      # re-entrant call from the I/O thread
        if chunk == "boom":
            raise RuntimeError("callback bug")

    c, _ = client_factory(srv.address, "A", on_grant=on_grant)
    holder["c"] = c
    c.request(key("first"), 1, 1)
    assert wait_until(lambda: "second" in seen)
    c.request(key("boom"), 1, 1)
    c.request(key("after"), 1, 1)
    assert wait_until(lambda: "after" in seen)
    assert seen == ["first", "second", "boom", "after"]


def cfg(**kw):
    """A config as client_from_config reads it (attributes of PriorityConfig)."""
    import types
    base = dict(arbiter=None, link=None, job_id=None, arbiter_secret=None, arbiter_timeout=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_client_from_config(tmp_path):
    from horovod_prio.arbiter.client import client_from_config
    assert client_from_config(cfg(), lambda c: None) is None
    assert client_from_config(cfg(link="eth0"), lambda c: None) is None
    with pytest.raises(ValueError, match="HOROVOD_PRIO_ARBITER_SECRET"):
        client_from_config(cfg(arbiter="127.0.0.1:1", link="eth0"), lambda c: None)
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match="cannot read .*%s" % missing.name):
        client_from_config(cfg(arbiter="127.0.0.1:1", link="eth0", arbiter_secret_file=str(missing)),
                           lambda c: None)
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    with pytest.raises(ValueError, match="empty.* is empty"):
        client_from_config(cfg(arbiter="127.0.0.1:1", link="eth0", arbiter_secret_file=str(empty)),
                           lambda c: None)
    secret = "ascii-secret-long-enough"
    srv = ArbiterServer("127.0.0.1", 0, secret, credit_bytes=100)
    srv.start()
    path = tmp_path / "secret"
    path.write_text(secret + "\n")
    clients = []
    try:
        g = Grants()
        c = client_from_config(cfg(arbiter="127.0.0.1:%d" % srv.address[1], link="eth0",
                                   job_id="cfg-job", arbiter_secret=secret, arbiter_timeout=0.5), g)
        clients.append(c)
        assert c.timeout == 0.5 and c.link == "eth0" and c.job_id == "cfg-job" and c.job_class == 0
        assert wait_until(lambda: c.connected)
        c.request(key("x"), 1, 10)
        assert g.wait_for("x")
        assert c.counters["arbiter_grants"] == 1
        # the secret from a file (whole file, stripped), the class from job_priority
        c2 = client_from_config(cfg(arbiter="127.0.0.1:%d" % srv.address[1], link="eth0",
                                    job_id="filed", arbiter_secret_file=str(path), job_priority=3),
                                Grants())
        clients.append(c2)
        assert c2.job_class == 3 and c2.job_id == "filed"
        assert wait_until(lambda: c2.connected)
        st = link_stats(srv, "eth0")
        assert st["grants_per_job"] == {"cfg-job": 1}
        assert st["job_classes"] == {"cfg-job": 0, "filed": 3}
    finally:
        for c in clients:
            c.close()
        srv.stop()


def test_short_secret_is_warned_about_on_both_sides(caplog, client_class):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        srv = ArbiterServer("127.0.0.1", 0, "short", credit_bytes=100)
        c = client_class(("127.0.0.1", 1), "L", "j", "short", lambda k: None, timeout=0.05)
        c.close()
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert sum("only 5 bytes" in m for m in msgs) == 2, msgs
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ArbiterServer("127.0.0.1", 0, "x" * 16)
    assert not [r for r in caplog.records if "bytes; use at least" in r.getMessage()]
    del srv


def test_internal_error_in_io_thread_grants_locally(server_factory, python_client_factory,
                                                    monkeypatch):
    srv = server_factory(credit_bytes=100)
    a, ga = python_client_factory(srv.address, "A")
    b, gb = python_client_factory(srv.address, "B", backoff_initial=0.01, backoff_max=0.02)
    a.request(key("hold"), 9, 100)
    assert ga.wait_for("hold")
    b.request(key("queued"), 1, 100)
    assert wait_until(lambda: link_stats(srv)["pending"] == 1)
    boom = {"n": 1}
    orig = ArbiterClient._timers

    def broken(self, now):
        if self is b and boom["n"]:
            boom["n"] -= 1
            raise RuntimeError("injected bug")
        return orig(self, now)
    monkeypatch.setattr(ArbiterClient, "_timers", broken)
    b._wake()
    assert gb.wait_for("queued")                     # granted locally, once
    assert wait_until(lambda: b.connected)           # and back on the arbiter
    b.request(key("next"), 1, 10)
    a.complete(key("hold"))
    assert gb.wait_for("next")
    assert gb.count() == {"queued": 1, "next": 1}
    assert b.counters["arbiter_grants"] == 1


def test_handshakes_cannot_fill_the_connection_table(server_factory, client_factory):
    """Unauthenticated connections have their own small table and a short
    deadline: a flood of them is refused beyond max_handshakes, registered jobs
    keep being served meanwhile, and new jobs get in once the flood times out.
    Authenticated connections are bounded by max_connections."""
    srv = server_factory(max_handshakes=3, max_connections=2, handshake_timeout=0.5)
    a, ga = client_factory(srv.address, "A")
    idle = [socket.create_connection(srv.address, timeout=5) for _ in range(3)]
    assert wait_until(lambda: srv.call(lambda: len(srv.handshaking)) == 3)
    extra = socket.create_connection(srv.address, timeout=5)
    assert is_closed_by_peer(extra)
    assert server_counters(srv)["rejected_connections"] >= 1
    a.request(key("during-flood"), 1, 1)             # the registered job is still served
    assert ga.wait_for("during-flood")
    for s in idle:                                   # the flood times out
        assert is_closed_by_peer(s)
    b, gb = client_factory(srv.address, "B")         # a new job gets in
    b.request(key("b"), 1, 1)
    assert gb.wait_for("b")
    before = server_counters(srv)["rejected_connections"]
    third = socket.create_connection(srv.address, timeout=5)     # 2 authenticated: table full
    assert is_closed_by_peer(third)
    assert server_counters(srv)["rejected_connections"] == before + 1
    assert a.counters["fallback_grants"] == 0 and b.counters["fallback_grants"] == 0
    for s in idle + [extra, third]:
        s.close()


# ------------------------------------------------------------------ cancel, classes, stats size
def test_cancel_withdraws_pending_and_granted_requests_at_once(server_factory, client_factory):
    srv = server_factory(credit_bytes=100, lease_seconds=30)
    a, ga = client_factory(srv.address, "A")
    b, gb = client_factory(srv.address, "B")
    c, gc = client_factory(srv.address, "C")
    a.request(key("hold"), 9, 100)
    assert ga.wait_for("hold")
    b.request(key("b-queued"), 5, 100)
    c.request(key("c-queued"), 1, 100)
    assert wait_until(lambda: link_stats(srv)["pending"] == 2)
    assert b.cancel(key("b-queued")) is True         # pending at the arbiter: dropped now
    assert wait_until(lambda: link_stats(srv)["pending"] == 1)
    assert link_stats(srv)["cancelled"] == 1
    assert a.cancel(key("hold")) is True             # granted: released now, not after the lease
    assert gc.wait_for("c-queued")
    assert link_stats(srv)["grants_per_job"] == {"A": 1, "C": 1}   # B's cancelled one never
    assert gb.calls == [] and b.counters["pending"] == 0 and b.counters["cancels"] == 1
    assert a.complete(key("hold")) is False and a.cancel(key("hold")) is False
    st = link_stats(srv)
    assert st["expired_leases"] == 0 and st["completions"] == 1 and st["outstanding_grants"] == 1
    for cl in (a, b, c):
        assert cl.counters["fallback_grants"] == 0


def test_no_on_grant_after_cancel_even_if_the_grant_arrives_late(client_factory, caplog):
    """The arbiter's GRANT crosses the client's CANCEL on the wire: ignored,
    and not taken for a lie (the key was requested: no warning)."""
    cancelled = []

    def on_payload(conn, p):
        kind = p[0]
        if kind == P.T_REGISTER:
            FakeArbiter.send(conn, P.enc_registered(10.0))
        elif kind == P.T_REQUEST:
            FakeArbiter.send(conn, P.enc_token(P.T_QUEUED, P.dec_request(p)[0]))
        elif kind == P.T_CANCEL:
            tok = P.dec_token(p)
            cancelled.append(tok)
            FakeArbiter.send(conn, P.enc_token(P.T_GRANT, tok))   # too late
        elif kind == P.T_PING:
            FakeArbiter.send(conn, P.enc_token(P.T_PONG, P.dec_token(p)))

    fake = FakeArbiter(on_payload)
    try:
        c, g = client_factory(fake.address, "A", timeout=0.5)
        c.request(key("x"), 1, 1)
        assert wait_until(lambda: c.counters["pending"] == 1)
        time.sleep(0.05)                             # QUEUED arrived
        assert c.cancel(key("x")) is True
        assert wait_until(lambda: cancelled == [key("x")])
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            c.request(key("y"), 1, 1)                # the connection is still fine
            assert wait_until(lambda: c.counters["ignored_grants"] == 1)   # the late GRANT, read
        assert g.calls == [] and c.connected
        assert c.counters["grants"] == 0 and c.counters["cancels"] == 1
        assert not [r for r in caplog.records if "never requested" in r.getMessage()]
    finally:
        fake.close()


def test_job_class_outranks_priorities_the_low_class_gets_the_leftover_link(server_factory,
                                                                           client_factory):
    """A class-1 job keeps a request waiting at all times: the class-0 job's
    priority-100 request is never granted meanwhile (K = 2 does not apply
    across classes); once the class-1 job stops asking it is granted."""
    K = 2
    srv = server_factory(credit_bytes=1, starvation_bound=K)
    hi, ghi = client_factory(srv.address, "hi", job_class=1)
    lo, glo = client_factory(srv.address, "lo")
    sent = [0]

    def ask(client, name, prio):
        client.request(key(name), prio, 1)
        sent[0] += 1
        assert wait_until(lambda: (lambda st: st["waits"] + st["immediate_grants"])(link_stats(srv))
                          == sent[0])           # the arbiter has it before the next step

    ask(hi, "h0", 0)
    assert ghi.wait_for("h0")
    ask(lo, "l0", 100)
    order, cur = [], "h0"
    for i in range(1, 7):
        ask(hi, "h%d" % i, 0)                       # the high class always has one waiting
        hi.complete(key(cur))
        assert wait_until(lambda: len(ghi.calls) + len(glo.calls) == len(order) + 2)
        cur = [n for n in ghi.calls + glo.calls if n not in order and n != "h0"][0]
        order.append(cur)
    assert order == ["h1", "h2", "h3", "h4", "h5", "h6"] and glo.calls == []
    hi.complete(key(cur))                           # the high class has nothing more
    assert glo.wait_for("l0")
    st = link_stats(srv)
    assert st["job_classes"] == {"hi": 1, "lo": 0}
    assert st["starvation_grants"] == 0


def test_stats_stay_valid_with_500_jobs_on_200_links(server_factory, client_factory):
    """The JSON is far beyond one frame (64 KiB): it arrives in fragments and parses."""
    srv = server_factory(credit_bytes=1 << 30)
    a, ga = client_factory(srv.address, "real-job", link="real-link")

    def populate():
        for i in range(500):
            job = srv.arbiter.register("job-%03d-%s" % (i, "x" * 80), "link-%03d" % (i % 200),
                                       None, i % 3)
            srv.arbiter.request(job, 1, 0, 1000, "c")
    srv.call(populate)
    st = fetch_stats(srv.address, SECRET, timeout=10)
    size = len(__import__("json").dumps(st))
    assert size > 2 * P.MAX_FRAME
    assert len(st["links"]) == 201
    jobs = {j for ln in st["links"].values() for j in ln["job_classes"]}
    assert len(jobs) == 501                         # connected: 500 + the real one
    top, granted = {}, 0                            # classes are strict on the link: a request
    for i in range(500):                            # waits while a higher class holds a grant
        ln, cls = i % 200, i % 3
        if cls >= top.get(ln, cls):
            granted += 1
            top[ln] = cls
    assert sum(len(ln["grants_per_job"]) for ln in st["links"].values()) == granted
    assert sum(ln["pending"] for ln in st["links"].values()) == 500 - granted > 0
    assert st["links"]["link-007"]["job_classes"]["job-007-" + "x" * 80] == 1
    assert st["server"]["connected"] == 2            # the job and this stats connection
    a.request(key("after-stats"), 1, 1)              # the service is unaffected
    assert ga.wait_for("after-stats")


def test_cancel_during_its_on_grant_returns_after_it(server_factory, client_factory):
    """cancel(key) while on_grant(key) runs in the I/O thread returns only once
    that call returned, so no on_grant(key) runs after cancel; cancel from
    inside on_grant (same thread) does not wait for itself."""
    import threading as th
    srv = server_factory(credit_bytes=1 << 20)
    entered, release = th.Event(), th.Event()
    calls = []
    holder = {}

    def on_grant(k):
        if _NAMES[k] in ("slow", "slow-completes"):
            entered.set()
            release.wait(5)
        if _NAMES[k] == "slow-completes":
            holder["c"].complete(k)
        if _NAMES[k] == "self-cancel":
            holder["self"] = holder["c"].cancel(k)
        calls.append(_NAMES[k])

    c, _ = client_factory(srv.address, "A", on_grant=on_grant)
    holder["c"] = c
    waiting = th.Event()                             # a cancel waits for an on_grant

    class SpyCV:
        def __init__(self, cv):
            self.cv = cv

        def wait_for(self, pred, timeout=None):
            waiting.set()
            return self.cv.wait_for(pred, timeout)

        def __getattr__(self, name):
            return getattr(self.cv, name)
    if isinstance(c, ArbiterClient):
        c._delivered_cv = SpyCV(c._delivered_cv)
    else:                                            # native: no spy; a cancel blocked in C++
        waiting.wait = lambda timeout=None: time.sleep(0.3) or True
    c.request(key("slow"), 1, 1)
    assert entered.wait(5)
    seen = {}

    def cancel():
        seen["ret"] = c.cancel(key("slow"))
        seen["calls"] = list(calls)
    t = th.Thread(target=cancel)
    t.start()
    assert waiting.wait(5)                           # waits for the running on_grant
    assert t.is_alive() and "ret" not in seen
    release.set()
    t.join(5)
    assert seen == {"ret": True, "calls": ["slow"]}  # it had returned before cancel did
    c.request(key("self-cancel"), 1, 1)
    assert wait_until(lambda: "self-cancel" in calls)
    assert holder["self"] is True
    # on_grant completes its own key while a cancel of it waits: nothing left to withdraw
    entered.clear()
    release.clear()
    waiting.clear()
    c.request(key("slow-completes"), 1, 1)
    assert entered.wait(5)
    t = th.Thread(target=lambda: seen.update(late=c.cancel(key("slow-completes"))))
    t.start()
    assert waiting.wait(5)                           # the cancel waits for this on_grant
    release.set()
    t.join(5)
    assert seen["late"] is False and "slow-completes" in calls
    assert c.counters["outstanding"] == 0 and c.counters["cancels"] == 2


# ------------------------------------------------------------------ the poller without epoll
@pytest.mark.parametrize("scenario", [
    test_grant_order_across_jobs, test_disconnect_frees_grants_and_pending, test_stats_request,
    test_forged_and_replayed_frames_rejected, test_malformed_input_fuzz_server_survives,
], ids=lambda f: f.__name__[5:])
def test_selectors_stand_in_serves_as_epoll_does(monkeypatch, server_factory,
                                                 python_client_factory, scenario):
    """Where the OS has no epoll the loop runs on the selectors stand-in: the
    same scenarios pass on it."""
    from horovod_prio.arbiter import server as server_mod
    monkeypatch.setattr(server_mod, "_new_poller", server_mod._SelectorsPoller)

    def make(*a, **kw):
        srv = server_factory(*a, **kw)
        assert type(srv.poller) is server_mod._SelectorsPoller
        return srv
    scenario(make, python_client_factory)
