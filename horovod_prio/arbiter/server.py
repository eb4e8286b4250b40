"""The arbiter service: one asyncio event loop, one TCP connection per job.

Single-threaded by design: the grant policy (:class:`.core.Arbiter`) runs in
the loop thread, so there are no locks on the hot path. Uses the low-level
``asyncio.Protocol`` API (callbacks, no streams/coroutines per frame) to keep
a grant round trip short.

Every connection failure mode is local to that connection: a protocol error
(malformed, oversized, unauthenticated, forged frame) is logged, counted and
closes only the offending connection; the job behind it loses its pending
requests and grants (as on any disconnect) and the others keep being served.
"""
import asyncio
import json
import logging
import socket
import threading
import time

from . import protocol as P
from .core import Arbiter

log = logging.getLogger("horovod_prio.arbiter")

_HELLO_LEN = len(P.MAGIC) + P.NONCE_LEN
_MAX_WRITE_BUFFER = 1 << 20


class _Conn(asyncio.Protocol):
    __slots__ = ("srv", "transport", "peer", "state", "reader", "session", "job",
                 "hs_timer", "cn", "sn", "closed")

    def __init__(self, srv):
        self.srv = srv
        self.transport = None
        self.peer = "?"
        self.state = "hello"
        self.reader = P.FrameReader(P.MAX_FRAME)
        self.session = None
        self.job = None
        self.hs_timer = None
        self.closed = False

    # -------------------------------------------------------- asyncio hooks
    def connection_made(self, transport):
        self.transport = transport
        srv = self.srv
        try:
            self.peer = "%s:%s" % transport.get_extra_info("peername")[:2]
        except Exception:
            pass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        if len(srv.conns) >= srv.max_connections:
            srv.counters["rejected_connections"] += 1
            log.warning("arbiter: too many connections (%d), rejecting %s", len(srv.conns), self.peer)
            self.closed = True
            transport.abort()
            return
        srv.conns.add(self)
        srv.counters["connections"] += 1
        self.hs_timer = srv.loop.call_later(srv.handshake_timeout, self._hs_timeout)

    def data_received(self, data):
        if self.closed:
            return
        try:
            for body in self.reader.feed(data):
                self._handle(body)
                if self.closed:
                    return
        except P.ProtocolError as e:
            self._reject(str(e))
        except Exception as e:  # never let one connection take the service down
            log.exception("arbiter: internal error on connection %s", self.peer)
            self._reject("internal error: %s" % type(e).__name__)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        self.closed = True
        srv = self.srv
        srv.conns.discard(self)
        if self.hs_timer is not None:
            self.hs_timer.cancel()
            self.hs_timer = None
        if self.job is not None:
            job, self.job = self.job, None
            n = len(job.reqs)
            try:
                grants = srv.arbiter.drop(job)
            except Exception:
                log.exception("arbiter: error dropping job %s", job.job_id)
                return
            log.info("arbiter: job %s left link %s (%s); released %d requests/grants",
                     job.job_id, job.link, self.peer, n)
            srv.send_grants(grants)

    # -------------------------------------------------------- helpers
    def _hs_timeout(self):
        self.hs_timer = None
        if self.state != "auth" and not self.closed:
            self.srv.counters["auth_failures"] += 1
            log.warning("arbiter: handshake timeout from %s", self.peer)
            self._close()

    def _close(self):
        if not self.closed:
            self.closed = True
            self.transport.close()

    def _reject(self, why):
        if self.closed:
            return
        self.srv.counters["protocol_errors"] += 1
        who = ("job %s" % self.job.job_id) if self.job is not None else self.peer
        log.warning("arbiter: rejecting %s: %s", who, why)
        if self.session is not None:
            try:
                self.transport.write(self.session.seal(P.enc_text(P.T_ERROR, why)))
            except Exception:
                pass
        self._close()

    def send(self, payload):
        if self.closed:
            return
        t = self.transport
        t.write(self.session.seal(payload))
        if t.get_write_buffer_size() > _MAX_WRITE_BUFFER:
            log.warning("arbiter: %s does not read its replies; closing", self.peer)
            self.closed = True
            t.abort()

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
            self.transport.write(P.frame(P.MAGIC + self.sn + P.server_proof(self.srv.secret, self.cn, self.sn)))
            self.state = "proof"
        elif st == "proof":
            secret = self.srv.secret
            if len(body) != P.MAC_LEN or not P.hmac.compare_digest(body, P.client_proof(secret, self.cn, self.sn)):
                self.srv.counters["auth_failures"] += 1
                raise P.ProtocolError("authentication failed (wrong secret?)")
            self.session = P.Session(P.session_key(secret, self.cn, self.sn), is_server=True)
            self.state = "auth"
            if self.hs_timer is not None:
                self.hs_timer.cancel()
                self.hs_timer = None

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
            srv.arm()
        elif kind == P.T_COMPLETE or kind == P.T_CANCEL:
            if job is None:
                raise P.ProtocolError("COMPLETE before REGISTER")
            grants = srv.arbiter.complete(job, P.dec_token(p))
            if grants is None:
                srv.counters["late_completions"] += 1
            else:
                srv.send_grants(grants)
                srv.arm()
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
    """The service. ``start()`` runs it in a background thread (tests, embedding);
    ``serve()`` runs it in the calling thread until ``stop()`` / a signal."""

    def __init__(self, host="127.0.0.1", port=0, secret=None, credit_bytes=16 << 20,
                 lease_seconds=10.0, starvation_bound=8, link_credits=None,
                 handshake_timeout=5.0, max_connections=1024):
        self.secret = P.load_secret(secret)
        self.host, self.port = host, port
        self.arbiter = Arbiter(credit_bytes, lease_seconds, starvation_bound, link_credits)
        self.handshake_timeout = handshake_timeout
        self.max_connections = max_connections
        self.conns = set()
        self.counters = {"connections": 0, "rejected_connections": 0, "auth_failures": 0,
                         "protocol_errors": 0, "late_completions": 0}
        self.loop = None
        self.address = None
        self._server = None
        self._timer = None
        self._timer_at = None
        self._thread = None
        self._stopped = None
        self._t0 = time.monotonic()

    # -------------------------------------------------------- policy glue
    def send_grants(self, grants):
        debug = log.isEnabledFor(logging.DEBUG)
        for r in grants:
            conn = r.job.peer
            if debug:
                log.debug("arbiter: grant link=%s job=%s chunk=%s prio=%d bytes=%d waited=%.6fs",
                          r.job.link, r.job.job_id, r.chunk, r.priority, r.nbytes,
                          time.monotonic() - r.t_arrival)
            if conn is not None:
                conn.send(P.enc_token(P.T_GRANT, r.token))

    def arm(self):
        nx = self.arbiter.next_expiry()
        if nx is None or (self._timer is not None and self._timer_at <= nx):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = nx
        # loop.time() is time.monotonic(), the arbiter's clock.
        self._timer = self.loop.call_at(nx, self._on_timer)

    def _on_timer(self):
        self._timer = None
        try:
            before = {n: ln.c["expired_leases"] for n, ln in self.arbiter.links.items()}
            grants = self.arbiter.expire()
            for n, ln in self.arbiter.links.items():
                k = ln.c["expired_leases"] - before.get(n, 0)
                if k:
                    log.info("arbiter: %d lease(s) expired on link %s", k, n)
            self.send_grants(grants)
        except Exception:
            log.exception("arbiter: error expiring leases")
        self.arm()

    def stats(self):
        s = dict(self.counters)
        s["connected"] = len(self.conns)
        s["uptime_seconds"] = round(time.monotonic() - self._t0, 3)
        s["credit_bytes"] = self.arbiter.credit_bytes
        s["lease_seconds"] = self.arbiter.lease_seconds
        s["starvation_bound"] = self.arbiter.starvation_bound
        return {"server": s, "links": self.arbiter.stats()}

    # -------------------------------------------------------- lifecycle
    async def start_async(self):
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._server = await self.loop.create_server(
            lambda: _Conn(self), self.host, self.port, reuse_address=True, backlog=256)
        self.address = self._server.sockets[0].getsockname()[:2]
        log.info("arbiter: listening on %s:%d (credit %d bytes, lease %.3fs, starvation bound %d)",
                 self.address[0], self.address[1], self.arbiter.credit_bytes,
                 self.arbiter.lease_seconds, self.arbiter.starvation_bound)
        return self.address

    async def _serve_async(self, started=None):
        try:
            await self.start_async()
        except BaseException as e:
            if started is not None:
                started.append(e)
                started[0].set()
            raise
        if started is not None:
            started[0].set()
        await self._stopped.wait()
        self._shutdown()

    def _shutdown(self):
        if self._server is not None:
            self._server.close()
        for c in list(self.conns):
            c.closed = True
            c.transport.abort()
        if self._timer is not None:
            self._timer.cancel()

    def serve(self):
        """Run in the calling thread until :meth:`stop`."""
        asyncio.run(self._serve_async())

    def start(self):
        """Run in a daemon thread; returns ``(host, port)`` once listening."""
        ev = threading.Event()
        started = [ev]
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve_async(started)),
                                        name="hvdprio-arbiter", daemon=True)
        self._thread.start()
        ev.wait(10)
        if len(started) > 1:
            raise started[1]
        return self.address

    def call(self, fn, *args, timeout=5.0):
        """Run ``fn(*args)`` in the loop thread and return its result (tests)."""
        fut = asyncio.run_coroutine_threadsafe(self._acall(fn, *args), self.loop)
        return fut.result(timeout)

    @staticmethod
    async def _acall(fn, *args):
        return fn(*args)

    def stop(self, timeout=5.0):
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._stopped.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)
