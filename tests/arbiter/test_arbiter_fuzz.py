"""Property test: malformed, truncated, oversized and replayed frames thrown at
a running arbiter over real loopback sockets. It never crashes, never answers
an unauthenticated peer with anything but its challenge and a rejection (so
never grants to one), and keeps serving an honest job after every example."""
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from horovod_prio.arbiter import protocol as P
from horovod_prio.arbiter.client import ArbiterClient
from horovod_prio.arbiter.server import ArbiterServer
from waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SECRET = b"fuzz-secret-of-sufficient-length"


def drain(s, timeout=2.0):
    """Everything the server sends until it closes (we already shut our side)."""
    s.settimeout(timeout)
    out = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return out, True
            out += data
    except (ConnectionResetError, BrokenPipeError):
        return out, True
    except socket.timeout:
        return out, False


def frames(data):
    """Split what an unauthenticated peer received; a partial tail counts as a frame."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    if pos < len(data):
        out.append(data[pos:])
    return out


def allowed_before_auth(body):
    """The only things an unauthenticated peer may get: the CHALLENGE (magic +
    nonce) and the one-byte rejection."""
    return (len(body) == 4 + P.NONCE_LEN and body[:4] == P.MAGIC) or body == b"\x01"


def captured_session(addr):
    """A legitimate client's whole byte stream (HELLO, PROOF, sealed REGISTER,
    REQUEST, COMPLETE), recorded for replay in other connections."""
    s = socket.create_connection(addr, timeout=5)
    rd = P.FrameReader()
    got = []

    def body():
        while not got:
            got.extend(rd.feed(s.recv(65536)))
        return got.pop(0)
    hs = P.ClientHandshake(SECRET)
    sent = [hs.hello()]
    s.sendall(sent[-1])
    sent.append(hs.on_challenge(body()))
    sent.append(hs.session.seal(P.enc_register("captured", "L")))
    sent.append(hs.session.seal(P.enc_request(1, 5, 10, "c")))
    sent.append(hs.session.seal(P.enc_token(P.T_COMPLETE, 1)))
    for b in sent[1:]:
        s.sendall(b)
    hs.on_verdict(body())
    s.close()
    return sent


def authenticate(addr):
    s = socket.create_connection(addr, timeout=5)
    rd = P.FrameReader()
    got = []

    def body():
        while not got:
            got.extend(rd.feed(s.recv(65536)))
        return got.pop(0)
    hs = P.ClientHandshake(SECRET)
    s.sendall(hs.hello())
    s.sendall(hs.on_challenge(body()))
    hs.on_verdict(body())
    return s, hs.session


_TEMPLATES = [P.enc_register("j", "L"), P.enc_request(1, 5, 10, "c"), P.enc_token(P.T_COMPLETE, 1),
              P.enc_token(P.T_PING, 1), P.enc_empty(P.T_STATS), P.enc_token(P.T_CANCEL, 2),
              P.enc_token(P.T_RENEW, 1), P.enc_request(3, 5, 10, "c", 7)]

unauth = st.one_of(
    st.tuples(st.just("raw"), st.binary(min_size=1, max_size=300)),
    st.tuples(st.just("length"), st.sampled_from([0, 1025, P.MAX_FRAME + 1, 2 ** 32 - 1]),
              st.binary(max_size=64)),
    st.tuples(st.just("hello_cut"), st.integers(0, 4 + 4 + P.NONCE_LEN - 1)),
    st.tuples(st.just("bad_hello"), st.binary(max_size=64)),
    st.tuples(st.just("proof"), st.binary(max_size=64)),
    st.tuples(st.just("replay"), st.integers(1, 5)),
)
auth = st.one_of(
    st.tuples(st.just("payload"), st.binary(min_size=1, max_size=80)),
    st.tuples(st.just("mutated"), st.sampled_from(range(len(_TEMPLATES))), st.integers(0, 3),
              st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("oversized"), st.integers(P.MAX_FRAME + 1, 2 ** 32 - 1)),
    st.tuples(st.just("replay_sealed"), st.integers(2, 4)),
    st.tuples(st.just("bad_mac"), st.sampled_from(range(len(_TEMPLATES)))),
)


def run_unauth(addr, action, captured):
    """Returns the bodies the server sent to this unauthenticated peer."""
    kind = action[0]
    s = socket.create_connection(addr, timeout=5)
    try:
        if kind == "raw":
            s.sendall(action[1])
        elif kind == "length":
            s.sendall(action[1].to_bytes(4, "big") + action[2])
        elif kind == "hello_cut":
            s.sendall(P.frame(P.MAGIC + P.new_nonce())[:action[1]])
        elif kind == "bad_hello":
            s.sendall(P.frame(action[1]) if action[1] else b"\0\0\0\0")
        elif kind == "proof":       # a real HELLO, then a wrong proof of any length
            s.sendall(P.frame(P.MAGIC + P.new_nonce()))
            s.settimeout(5)
            first = s.recv(4 + 4 + P.NONCE_LEN)
            s.sendall(P.frame(action[1]) if action[1] else b"\0\0\0\0")
            s.shutdown(socket.SHUT_WR)
            rest, closed = drain(s)
            assert closed, "the arbiter kept a failed handshake open"
            return frames(first + rest)
        else:                       # "replay": a recorded client's stream prefix, new connection
            s.sendall(b"".join(captured[:action[1] + 1]))
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass                        # the arbiter may close on us mid-send: fine
    data, _ = drain(s)
    s.close()
    return frames(data)


def run_auth(addr, action, captured):
    s, sess = authenticate(addr)
    kind = action[0]
    try:
        if kind == "payload":
            s.sendall(sess.seal(action[1]))
        elif kind == "mutated":
            t = bytearray(_TEMPLATES[action[1]])
            op, extra = action[2], action[3]
            if op == 0:
                del t[max(1, len(t) - len(extra)):]           # truncated
            elif op == 1:
                t += extra                                    # trailing bytes
            else:
                for i, b in enumerate(extra):                 # flipped bytes
                    t[i % len(t)] ^= b or 1
            s.sendall(sess.seal(bytes(t)))
        elif kind == "oversized":
            s.sendall(action[1].to_bytes(4, "big") + b"x" * 64)
        elif kind == "replay_sealed":                         # frames of another session
            s.sendall(captured[action[1]])
        else:                                                 # "bad_mac"
            body = _TEMPLATES[action[1]] + b"\0" * P.MAC_LEN
            s.sendall(P.frame(body))
        s.sendall(sess.seal(P.enc_token(P.T_PING, 7)))
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    drain(s)
    s.close()


def test_fuzzed_frames_never_crash_or_grant_to_unauthenticated_peers():
    srv = ArbiterServer("127.0.0.1", 0, SECRET, credit_bytes=1 << 30, handshake_timeout=1.0)
    addr = srv.start()
    granted = []
    honest = ArbiterClient(addr, "L", "honest", SECRET, granted.append, timeout=2.0)
    n = [0]
    try:
        assert wait_until(lambda: honest.connected)
        captured = captured_session(addr)
        assert wait_until(lambda: srv.call(lambda: len(srv.conns)) == 1)

        @settings(max_examples=80, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(st.lists(st.one_of(unauth, auth), min_size=1, max_size=3))
        def example(actions):
            for action in actions:
                if action[0] in ("payload", "mutated", "oversized", "replay_sealed", "bad_mac"):
                    run_auth(addr, action, captured)
                else:
                    bodies = run_unauth(addr, action, captured)
                    assert all(allowed_before_auth(b) for b in bodies), (action, bodies)
            assert srv.is_alive()
            # every fuzz connection is gone; only the honest job is registered
            assert wait_until(lambda: srv.call(lambda: len(srv.conns)) == 1), action
            links = srv.call(lambda: srv.stats()["links"])
            assert set(links) == {"L"} and links["L"]["job_classes"].keys() == {"honest"}
            # and it is still served by the arbiter
            n[0] += 1
            honest.request(n[0], 1, 1)
            assert wait_until(lambda: n[0] in granted), "honest job not served after %r" % (actions,)
            assert honest.complete(n[0])
            assert honest.counters["fallback_grants"] == 0

        example()
        c = srv.call(lambda: dict(srv.counters))
        assert n[0] == 80                           # every example ran to its end
        assert c["auth_failures"] > 10 and c["protocol_errors"] > 10
        assert granted == list(range(1, n[0] + 1))
    finally:
        honest.close()
        srv.stop()
