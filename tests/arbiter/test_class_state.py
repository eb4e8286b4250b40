"""The class-state feature of the arbiter's protocol: the PROBE ping and its
FEATURES answer, WATCH and CLASS_STATE; old peers on either side; the job
side's watcher (every rank's) through joins, leaves, an old arbiter and a
dead one."""
import logging
import socket
import threading
import time
import types

import pytest

from horovod_prio.arbiter import protocol as P
from horovod_prio.arbiter import server as server_mod
from horovod_prio.arbiter.client import ArbiterClient
from horovod_prio.arbiter.server import ArbiterServer
from horovod_prio.runtime.class_watch import ClassWatcher

SECRET = "class-state-test-secret-0123456789"


def wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture
def arbiter():
    srv = ArbiterServer("127.0.0.1", 0, SECRET, credit_bytes=1000)
    host, port = srv.start()
    yield srv, "%s:%d" % (host, port)
    srv.stop()


class Raw:
    """A blocking test client speaking the protocol frame by frame."""

    def __init__(self, address):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.reader = P.FrameReader()
        self.backlog = []
        hs = P.ClientHandshake(P.load_secret(SECRET))
        self.sock.sendall(hs.hello())
        self.sock.sendall(hs.on_challenge(self._body()))
        hs.on_verdict(self._body())
        self.s = hs.session

    def _body(self):
        while not self.backlog:
            data = self.sock.recv(65536)
            assert data, "arbiter closed the connection"
            self.backlog += self.reader.feed(data)
        return self.backlog.pop(0)

    def send(self, payload):
        self.sock.sendall(self.s.seal(payload))

    def recv(self):
        return self.s.open(self._body())

    def quiet(self, seconds=0.3):
        """No frame arrives for ``seconds``."""
        self.sock.settimeout(seconds)
        try:
            return not self.backlog and not self.sock.recv(65536, socket.MSG_PEEK)
        except socket.timeout:
            return True
        finally:
            self.sock.settimeout(5)


def test_frames_round_trip_and_bad_ones_are_named():
    assert P.dec_watch(P.enc_watch("uplink", -3)) == ("uplink", -3)
    assert P.dec_features(P.enc_features()) == P.F_CLASS_STATE
    assert P.dec_class_state(P.enc_class_state(True)) is True
    assert P.dec_class_state(P.enc_class_state(False)) is False
    for bad, msg in ((P.enc_watch("L", 0) + b"x", "WATCH"), (P.enc_watch("", 0), "empty link"),
                     (bytes([P.T_CLASS_STATE, 2]), "CLASS_STATE"),
                     (P.enc_features() + b"\0", "FEATURES")):
        with pytest.raises(P.ProtocolError, match=msg):
            {P.T_WATCH: P.dec_watch, P.T_CLASS_STATE: P.dec_class_state,
             P.T_FEATURES: P.dec_features}[bad[0]](bad)
    assert P.PROBE not in range(1 << 32)        # clients count their ping nonces from 1


def test_probe_gets_features_before_its_pong_and_a_plain_ping_does_not(arbiter):
    _, address = arbiter
    c = Raw(address)
    c.send(P.enc_token(P.T_PING, 7))
    assert c.recv() == P.enc_token(P.T_PONG, 7)
    c.send(P.enc_token(P.T_PING, P.PROBE))
    assert P.dec_features(c.recv()) & P.F_CLASS_STATE
    assert c.recv() == P.enc_token(P.T_PONG, P.PROBE)


def test_watch_is_told_now_and_on_every_change_of_higher_classes_on_its_link(arbiter):
    srv, address = arbiter
    w = Raw(address)
    w.send(P.enc_watch("L", 0))
    assert P.dec_class_state(w.recv()) is False
    same = ArbiterClient(address, "L", "same", SECRET, lambda k: None)     # class 0: no change
    other_link = ArbiterClient(address, "M", "other", SECRET, lambda k: None, job_class=5)
    assert wait_for(lambda: same.connected and other_link.connected)
    assert w.quiet()
    high = ArbiterClient(address, "L", "high", SECRET, lambda k: None, job_class=1)
    assert P.dec_class_state(w.recv()) is True
    high2 = ArbiterClient(address, "L", "high2", SECRET, lambda k: None, job_class=2)
    assert wait_for(lambda: high2.connected) and w.quiet()   # still true: nothing sent
    high.close()
    assert w.quiet()
    high2.close()
    assert P.dec_class_state(w.recv()) is False
    w2 = Raw(address)                               # a watcher of class 1 beside class 0 jobs
    w2.send(P.enc_watch("L", -1))
    assert P.dec_class_state(w2.recv()) is True
    assert srv.call(lambda: srv.stats()["server"]["watchers"]) == 2
    w2.send(P.enc_watch("L", 0))                    # one WATCH per connection
    assert w2.recv()[0] == P.T_ERROR
    assert wait_for(lambda: srv.call(lambda: srv.stats()["server"]["watchers"]) == 1)
    for c in (same, other_link):
        c.close()


def test_an_old_client_never_sees_the_new_frames(arbiter):
    """A job client that never probes (every client before the feature) keeps
    its connection and its grants while higher classes come and go."""
    srv, address = arbiter
    grants = []
    low = ArbiterClient(address, "L", "low", SECRET, grants.append)
    assert wait_for(lambda: low.connected)
    for i in range(3):
        high = ArbiterClient(address, "L", "high%d" % i, SECRET, lambda k: None, job_class=1)
        assert wait_for(lambda: high.connected)
        high.close()
    low.request(1, 0, 10)
    assert wait_for(lambda: grants == [1])
    c = low.counters
    assert (c["outages"], c["arbiter_grants"], c["fallback_grants"]) == (0, 1, 0), c
    assert srv.counters["protocol_errors"] == 0
    low.close()


def old_arbiter(monkeypatch):
    """The server as it was before the feature: PROBE is a plain nonce, WATCH an
    unknown frame type."""
    old = types.SimpleNamespace(**{k: getattr(P, k) for k in dir(P) if not k.startswith("__")})
    old.PROBE, old.T_WATCH = -1, -1
    monkeypatch.setattr(server_mod, "P", old)


def test_watcher_against_an_old_arbiter_says_so_once_and_changes_nothing(monkeypatch, caplog):
    caplog.set_level(logging.INFO, "horovod_prio")
    old_arbiter(monkeypatch)
    srv = ArbiterServer("127.0.0.1", 0, SECRET)
    host, port = srv.start()
    try:
        changes = []
        high = ArbiterClient("%s:%d" % (host, port), "L", "high", SECRET, lambda k: None,
                             job_class=1)
        w = ClassWatcher("%s:%d" % (host, port), SECRET, "L", 0, changes.append,
                         interval=0.1).start()
        assert wait_for(lambda: w.supported is False)
        w._thread.join(5)
        assert not w._thread.is_alive() and changes == []
        assert srv.counters["protocol_errors"] == 0     # it never sent the unknown WATCH
        assert "does not report job classes" in caplog.text
        high.close()
    finally:
        srv.stop()


def test_watcher_follows_joins_and_leaves(arbiter):
    _, address = arbiter
    changes = []
    w = ClassWatcher(address, SECRET, "L", 0, changes.append, interval=0.1).start()
    assert wait_for(lambda: w.sessions == 1) and w.supported
    high = ArbiterClient(address, "L", "high", SECRET, lambda k: None, job_class=1)
    assert wait_for(lambda: changes == [True])
    high.close()
    assert wait_for(lambda: changes == [True, False])
    time.sleep(1.5)                     # 15 ping intervals: a live arbiter keeps its session
    assert w.sessions == 1 and changes == [True, False]
    w.close()
    assert not w._thread.is_alive()


def test_arbiter_dying_while_a_higher_class_is_on_returns_the_job_to_normal():
    """The arbiter stops (connections reset) while the flag is set: the
    watcher calls back False at once, keeps retrying without blocking, and
    watches again when an arbiter answers on the address."""
    srv = ArbiterServer("127.0.0.1", 0, SECRET)
    host, port = srv.start()
    address = "%s:%d" % (host, port)
    changes = []
    w = ClassWatcher(address, SECRET, "L", 0, changes.append, interval=0.1,
                     backoff_initial=0.05, backoff_max=0.2).start()
    high = ArbiterClient(address, "L", "high", SECRET, lambda k: None, job_class=1)
    assert wait_for(lambda: changes == [True])
    srv.stop()
    assert wait_for(lambda: changes == [True, False], timeout=3)
    srv2 = ArbiterServer("127.0.0.1", port, SECRET)
    srv2.start()
    try:
        assert wait_for(lambda: changes == [True, False, True], timeout=15)  # high reconnected
        high.close()
        assert wait_for(lambda: changes[-1] is False)
    finally:
        t = time.monotonic()
        w.close()
        assert time.monotonic() - t < 2 and not w._thread.is_alive()
        srv2.stop()


def test_a_hung_arbiter_counts_as_gone():
    """An arbiter that stops answering (its loop blocked, no reset) is given
    up after three ping intervals: the flag drops."""
    srv = ArbiterServer("127.0.0.1", 0, SECRET)
    host, port = srv.start()
    address = "%s:%d" % (host, port)
    changes = []
    w = ClassWatcher(address, SECRET, "L", 0, changes.append, interval=0.1,
                     backoff_initial=5, backoff_max=5).start()
    high = ArbiterClient(address, "L", "high", SECRET, lambda k: None, job_class=1,
                         max_wait=60)
    try:
        assert wait_for(lambda: changes == [True])
        hang = threading.Event()
        srv.call_soon(hang.wait, 10)                 # the service's one thread blocks
        assert wait_for(lambda: changes == [True, False], timeout=3)
        hang.set()
    finally:
        w.close()
        high.close()
        srv.stop()
