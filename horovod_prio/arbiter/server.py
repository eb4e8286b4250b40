"""The arbiter service: one thread, one ``selectors`` loop, one TCP connection per job.

Single-threaded by design: the grant policy (:class:`.core.Arbiter`) runs in
the loop thread, so there are no locks on the hot path. A plain selector loop
with non-blocking sockets (not asyncio): on loopback an asyncio echo costs
about twice the round trip of the same echo on a bare ``selectors`` loop, and
the grant round trip is what the arbiter adds to every chunk.

Every failure is local to one connection: a protocol error (malformed,
oversized, unauthenticated, forged or replayed frame) is logged, counted and
closes only the offending connection; the job behind it loses its pending
requests and grants (as on any disconnect) and the other jobs keep being
served. An exception inside the loop is logged and closes the connection being
served; it never stops the service.
"""
import collections
import concurrent.futures
import json
import logging
import selectors
import socket
import struct
import threading
import time

from . import protocol as P
from .core import Arbiter

log = logging.getLogger("horovod_prio.arbiter")

_HELLO_LEN = len(P.MAGIC) + P.NONCE_LEN
_PRE_AUTH_MAX_FRAME = 256      # handshake frames are <= 36 bytes
_WAKE = object()
_MAX_WRITE_BUFFER = 1 << 20
# recv() buffer: keep it <= 64 KiB; larger sizes make CPython allocate (mmap) and
# shrink a big bytes object on every call (measured ~20 us extra per recv here).
_RECV_SIZE = 65536
_READ, _RW = selectors.EVENT_READ, selectors.EVENT_READ | selectors.EVENT_WRITE


class _Conn:
    __slots__ = ("srv", "sock", "peer", "state", "reader", "session", "job", "hs_deadline",
                 "cn", "sn", "closed", "outbuf", "events")

    def __init__(self, srv, sock, peer):
        self.srv = srv
        self.sock = sock
        self.peer = peer
        self.state = "hello"
        self.reader = P.FrameReader(_PRE_AUTH_MAX_FRAME)
        self.session = None
        self.job = None
        self.hs_deadline = time.monotonic() + srv.handshake_timeout
        self.closed = False
        self.outbuf = bytearray()
        self.events = _READ

    # -------------------------------------------------------- I/O
    def on_readable(self):
        try:
            data = self.sock.recv(_RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.fail(None, "connection error: %s" % e)
            return
        if not data:
            self.fail(None, "closed by peer")
            return
        try:
            for body in self.reader.feed(data):
                self._handle(body)
                if self.closed:
                    return
        except P.ProtocolError as e:
            self.reject(str(e))
        except Exception as e:  # never let one connection take the service down
            log.exception("arbiter: internal error on connection %s", self.peer)
            self.reject("internal error: %s" % type(e).__name__)

    def on_writable(self):
        try:
            n = self.sock.send(self.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.fail(None, "send failed: %s" % e)
            return
        del self.outbuf[:n]
        if not self.outbuf and self.events != _READ:
            self.events = _READ
            self.srv.sel.modify(self.sock, _READ, self)

    def write(self, data):
        if self.closed:
            return
        if not self.outbuf:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self.fail(None, "send failed: %s" % e)
                return
            if n == len(data):
                return
            data = data[n:]
        self.outbuf += data
        if len(self.outbuf) > _MAX_WRITE_BUFFER:
            self.fail(logging.WARNING, "does not read its replies (%d bytes queued)" % len(self.outbuf))
            return
        if self.events != _RW:
            self.events = _RW
            self.srv.sel.modify(self.sock, _RW, self)

    def send(self, payload):
        if not self.closed:
            self.write(self.session.seal(payload))

    def fail(self, level, why):
        """Stop serving this connection; the loop closes it and drops its job."""
        if self.closed:
            return
        self.closed = True
        if level is not None:
            who = ("job %s" % self.job.job_id) if self.job is not None else self.peer
            log.log(level, "arbiter: closing %s: %s", who, why)
        self.srv.dead.append(self)

    def reject(self, why):
        if self.closed:
            return
        self.srv.counters["protocol_errors"] += 1
        if self.session is not None:
            try:
                self.sock.send(self.session.seal(P.enc_text(P.T_ERROR, why)))
            except OSError:
                pass
        self.fail(logging.WARNING, "rejected: " + why)

    # -------------------------------------------------------- frames
    def _handle(self, body):
        st = self.state
        if st == "auth":
            self._dispatch(self.session.open(body))
        elif st == "hello":
            if len(body) != _HELLO_LEN or body[:4] != P.MAGIC:
                self.srv.counters["auth_failures"] += 1
                raise P.ProtocolError("bad HELLO")
            self.cn = body[4:]
            self.sn = P.new_nonce()
            self.write(P.frame(P.MAGIC + self.sn + P.server_proof(self.srv.secret, self.cn, self.sn)))
            self.state = "proof"
        else:  # "proof"
            secret = self.srv.secret
            want = P.client_proof(secret, self.cn, self.sn)
            if len(body) != P.MAC_LEN or not P.hmac.compare_digest(body, want):
                self.srv.counters["auth_failures"] += 1
                raise P.ProtocolError("authentication failed (wrong secret?)")
            self.session = P.Session(P.session_key(secret, self.cn, self.sn), is_server=True)
            self.state = "auth"
            self.reader.max_frame = P.MAX_FRAME
            self.hs_deadline = None
            self.srv.handshaking.discard(self)

    def _dispatch(self, p):
        srv = self.srv
        kind = p[0]
        job = self.job
        if kind == P.T_REQUEST:
            if job is None:
                raise P.ProtocolError("REQUEST before REGISTER")
            token, prio, nbytes, chunk = P.dec_request(p)
            try:
                grants = srv.arbiter.request(job, token, prio, nbytes, chunk)
            except ValueError as e:
                raise P.ProtocolError(str(e)) from None
            srv.send_grants(grants)
            if srv.arbiter.is_pending(job, token):
                self.send(P.enc_token(P.T_QUEUED, token))
        elif kind == P.T_COMPLETE or kind == P.T_CANCEL:
            if job is None:
                raise P.ProtocolError("COMPLETE before REGISTER")
            grants = srv.arbiter.complete(job, P.dec_token(p))
            if grants is None:
                srv.counters["late_completions"] += 1
            else:
                srv.send_grants(grants)
        elif kind == P.T_PING:
            self.send(P.enc_token(P.T_PONG, P.dec_token(p)))
        elif kind == P.T_REGISTER:
            if job is not None:
                raise P.ProtocolError("second REGISTER")
            job_id, link = P.dec_register(p)
            self.job = srv.arbiter.register(job_id, link, peer=self)
            log.info("arbiter: job %s joined link %s from %s", job_id, link, self.peer)
            self.send(P.enc_empty(P.T_REGISTERED))
        elif kind == P.T_STATS:
            if len(p) != 1:
                raise P.ProtocolError("trailing bytes in STATS")
            self.send(P.enc_text(P.T_STATS_REPLY, json.dumps(srv.stats(), sort_keys=True)))
        else:
            raise P.ProtocolError("unknown message type 0x%02x" % kind)


class ArbiterServer:
    """The service. ``start()`` runs it in a background thread (tests, embedding)
    and returns ``(host, port)``; ``stop()`` closes every connection."""

    def __init__(self, host="127.0.0.1", port=0, secret=None, credit_bytes=16 << 20,
                 lease_seconds=10.0, starvation_bound=8, link_credits=None,
                 handshake_timeout=5.0, max_connections=1024, order="burst"):
        self.secret = P.load_secret(secret)
        self.host, self.port = host, port
        self.arbiter = Arbiter(credit_bytes, lease_seconds, starvation_bound, link_credits,
                               order=order)
        self.handshake_timeout = float(handshake_timeout)
        self.max_connections = max_connections
        self.conns = set()
        self.handshaking = set()     # connections not yet authenticated
        self.dead = []
        self.counters = {"connections": 0, "rejected_connections": 0, "auth_failures": 0,
                         "protocol_errors": 0, "late_completions": 0}
        self.address = None
        self.sel = None
        self._lsock = None
        self._thread = None
        self._stop = False
        self._calls = collections.deque()
        self._wake_r = self._wake_w = None
        self._t0 = time.monotonic()

    # -------------------------------------------------------- policy glue
    def send_grants(self, grants):
        if not grants:
            return
        debug = log.isEnabledFor(logging.DEBUG)
        for r in grants:
            job = r.job
            if debug:
                log.debug("arbiter: grant link=%s job=%s chunk=%s prio=%d bytes=%d waited=%.6fs",
                          job.link, job.job_id, r.chunk, r.priority, r.nbytes,
                          time.monotonic() - r.t_arrival)
            if job.peer is not None:
                job.peer.send(P.enc_token(P.T_GRANT, r.token))

    def stats(self):
        s = dict(self.counters)
        s["connected"] = len(self.conns)
        s["uptime_seconds"] = round(time.monotonic() - self._t0, 3)
        s["credit_bytes"] = self.arbiter.credit_bytes
        s["lease_seconds"] = self.arbiter.lease_seconds
        s["starvation_bound"] = self.arbiter.starvation_bound
        s["order"] = self.arbiter.order
        return {"server": s, "links": self.arbiter.stats()}

    # -------------------------------------------------------- lifecycle
    def bind(self):
        """Create the listening socket; returns ``(host, port)``."""
        infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        ls = socket.socket(family, socket.SOCK_STREAM)
        try:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(sockaddr)
            ls.listen(256)
        except OSError:
            ls.close()
            raise
        ls.setblocking(False)
        self._lsock = ls
        self.address = ls.getsockname()[:2]
        self.sel = selectors.DefaultSelector()
        self.sel.register(ls, _READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, _READ, _WAKE)
        a = self.arbiter
        log.info("arbiter: listening on %s:%d (credit %d bytes, lease %.3fs, starvation bound %d, "
                 "order %s)", self.address[0], self.address[1], a.credit_bytes, a.lease_seconds,
                 a.starvation_bound, a.order)
        return self.address

    def start(self):
        """Bind, then serve in a daemon thread; returns ``(host, port)``."""
        self.bind()
        self._thread = threading.Thread(target=self.serve, name="hvdprio-arbiter", daemon=True)
        self._thread.start()
        return self.address

    def stop(self, timeout=5.0):
        """Stop serving and close every connection (as if the process died)."""
        self._stop = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def is_alive(self):
        return self._thread is not None and self._thread.is_alive()

    def call_soon(self, fn, *args):
        """Run ``fn(*args)`` in the loop thread (thread-safe); returns a Future."""
        fut = concurrent.futures.Future()
        self._calls.append((fn, args, fut))
        self._wake()
        return fut

    def call(self, fn, *args, timeout=5.0):
        """Run ``fn(*args)`` in the loop thread and return its result."""
        return self.call_soon(fn, *args).result(timeout)

    def _wake(self):
        try:
            self._wake_w.send(b"\0")
        except (OSError, AttributeError):
            pass

    # -------------------------------------------------------- the loop
    def serve(self):
        """Run the loop in the calling thread until :meth:`stop`."""
        if self._lsock is None:
            self.bind()
        sel = self.sel
        arb = self.arbiter
        try:
            while not self._stop:
                now = time.monotonic()
                # next timer: lease expiry or handshake deadline (both only move
                # later while serving events, so checking them after is enough)
                due = now + 1.0
                nx = arb.next_expiry()
                if nx is not None and nx < due:
                    due = nx
                if self.handshaking:
                    hs = self._next_handshake_deadline()
                    if hs is not None and hs < due:
                        due = hs
                events = sel.select(max(due - now, 0.0))
                for key, mask in events:
                    conn = key.data
                    if conn is None:
                        self._accept()
                    elif conn is _WAKE:
                        self._drain_wake()
                    else:
                        if mask & selectors.EVENT_READ and not conn.closed:
                            conn.on_readable()
                        if mask & selectors.EVENT_WRITE and not conn.closed:
                            conn.on_writable()
                    if self.dead:
                        self._reap()
                if time.monotonic() >= due:
                    self._timers()
                if self._calls:
                    self._run_calls()
                if self.dead:
                    self._reap()
        finally:
            self._shutdown()

    def _accept(self):
        while True:
            try:
                sock, addr = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("arbiter: accept failed: %s", e)
                return
            peer = "%s:%s" % tuple(addr[:2])
            if len(self.conns) >= self.max_connections:
                self.counters["rejected_connections"] += 1
                log.warning("arbiter: too many connections (%d), rejecting %s", len(self.conns), peer)
                sock.close()
                continue
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            conn = _Conn(self, sock, peer)
            self.conns.add(conn)
            self.handshaking.add(conn)
            self.counters["connections"] += 1
            self.sel.register(sock, _READ, conn)

    def _drain_wake(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError, OSError):
            pass

    def _next_handshake_deadline(self):
        best = None
        for c in self.handshaking:
            d = c.hs_deadline
            if d is not None and (best is None or d < best):
                best = d
        return best

    def _timers(self):
        now = time.monotonic()
        for c in list(self.handshaking):
            if c.hs_deadline is not None and c.hs_deadline <= now and not c.closed:
                self.handshaking.discard(c)
                self.counters["auth_failures"] += 1
                c.fail(logging.WARNING, "handshake timeout")
        nx = self.arbiter.next_expiry()
        if nx is not None and nx <= now:
            try:
                before = {n: ln.c["expired_leases"] for n, ln in self.arbiter.links.items()}
                grants = self.arbiter.expire(now)
                for n, ln in self.arbiter.links.items():
                    k = ln.c["expired_leases"] - before.get(n, 0)
                    if k:
                        log.info("arbiter: %d lease(s) expired on link %s", k, n)
                self.send_grants(grants)
            except Exception:
                log.exception("arbiter: error expiring leases")

    def _run_calls(self):
        while self._calls:
            fn, args, fut = self._calls.popleft()
            try:
                fut.set_result(fn(*args))
            except BaseException as e:
                fut.set_exception(e)

    def _reap(self):
        while self.dead:
            conn = self.dead.pop()
            self.conns.discard(conn)
            self.handshaking.discard(conn)
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            try:
                conn.sock.close()
            except OSError:
                pass
            job, conn.job = conn.job, None
            if job is not None:
                n = len(job.reqs)
                try:
                    grants = self.arbiter.drop(job)
                except Exception:
                    log.exception("arbiter: error dropping job %s", job.job_id)
                    continue
                log.info("arbiter: job %s left link %s (%s); released %d requests/grants",
                         job.job_id, job.link, conn.peer, n)
                self.send_grants(grants)

    def _shutdown(self):
        for c in list(self.conns):
            c.closed = True
            try:
                # RST instead of FIN: peers see the arbiter vanish, as on a crash
                c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            try:
                c.sock.close()
            except OSError:
                pass
        self.conns.clear()
        self.handshaking.clear()
        for s in (self._lsock, self._wake_r, self._wake_w):
            try:
                s.close()
            except (OSError, AttributeError):
                pass
        try:
            self.sel.close()
        except Exception:
            pass
        while self._calls:
            fn, args, fut = self._calls.popleft()
            fut.set_exception(RuntimeError("arbiter stopped"))
        log.info("arbiter: stopped")
