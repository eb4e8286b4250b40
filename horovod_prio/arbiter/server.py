"""The arbiter service: one thread, one ``epoll`` loop, one TCP connection per job.

Single-threaded by design: the grant policy (:class:`.core.Arbiter`) runs in
the loop thread, so there are no locks on the hot path. A plain readiness loop
with non-blocking sockets (not asyncio): on loopback an asyncio echo costs
about twice the round trip of the same echo on a bare ``selectors`` loop, and
the grant round trip is what the arbiter adds to every chunk. The loop uses
``select.epoll`` directly with a file descriptor -> connection table (where
the OS has no epoll, a ``selectors`` stand-in with the same calls): the
``selectors`` layer builds a key object per ready socket, which on a grant's
two wake-ups (its REQUEST, its COMPLETE) cost more than the policy's
decision. Framing and write buffering are :class:`.transport.Transport`'s,
shared with the client.

Every failure is local to one connection: a protocol error (malformed,
oversized, unauthenticated, forged or replayed frame) is logged, counted and
closes only the offending connection; the job behind it loses its pending
requests and grants (as on any disconnect) and the other jobs keep being
served. An exception inside the loop is logged and closes the connection being
served; it never stops the service.

Connections still in the handshake have their own table (``max_handshakes``)
and a short deadline (``handshake_timeout``), so unauthenticated peers can
neither fill the connection table nor hold a slot for long.
"""
import collections
import concurrent.futures
import json
import logging
import select
import selectors
import socket
import struct
import threading
import time

from . import protocol as P
from .core import DEFAULT_CLASS_RESERVE, Arbiter
from .transport import Transport, nodelay

log = logging.getLogger("horovod_prio.arbiter")

# Before authentication a peer may send only the handshake and the frames a
# client pipelines behind its PROOF (REGISTER: <= 1 + 2 x 258 + 4 + MAC bytes).
_PRE_AUTH_MAX_FRAME = 1024
_WAKE = object()
_LISTEN = object()
_MAX_WRITE_BUFFER = 1 << 20
_STATS_LOW_WATER = 256 << 10    # STATS_REPLY fragments are queued while less is unsent


_IN, _OUT = getattr(select, "EPOLLIN", 1), getattr(select, "EPOLLOUT", 4)


class _SelectorsPoller:
    """epoll's calls on ``selectors``, where the OS has no epoll (BSD, macOS):
    ``poll(timeout)`` -> ``[(fd, mask)]`` with the same bits."""

    def __init__(self):
        self._sel = selectors.DefaultSelector()

    @staticmethod
    def _events(mask):
        return (selectors.EVENT_READ if mask & _IN else 0) | \
            (selectors.EVENT_WRITE if mask & _OUT else 0)

    def register(self, fd, mask):
        self._sel.register(fd, self._events(mask))

    def modify(self, fd, mask):
        self._sel.modify(fd, self._events(mask))

    def unregister(self, fd):
        self._sel.unregister(fd)

    def poll(self, timeout):
        return [(k.fd, (_IN if ev & selectors.EVENT_READ else 0)
                 | (_OUT if ev & selectors.EVENT_WRITE else 0))
                for k, ev in self._sel.select(timeout)]

    def close(self):
        self._sel.close()


_new_poller = getattr(select, "epoll", _SelectorsPoller)
_READ, _RW = _IN, _IN | _OUT
_HELLO, _PROOF, _AUTH = 0, 1, 2


class _Conn:
    __slots__ = ("srv", "t", "fd", "peer", "stage", "hs", "session", "job", "closed", "events",
                 "stats_parts", "held", "watch")

    def __init__(self, srv, sock, peer):
        self.srv = srv
        self.t = Transport(sock, _PRE_AUTH_MAX_FRAME, _MAX_WRITE_BUFFER)
        self.fd = sock.fileno()
        self.peer = peer
        self.stage = _HELLO
        self.hs = P.ServerHandshake(srv.secret)
        self.session = None
        self.job = None
        self.closed = False
        self.events = _READ
        self.stats_parts = None
        self.held = None        # sealed frames not written yet (see hold())
        self.watch = None       # WATCH: [link, job_class, last CLASS_STATE sent]

    # -------------------------------------------------------- I/O
    def on_readable(self):
        try:
            bodies = self.t.read()
            if len(bodies) == 1 and self.stage == _AUTH:    # the common case: one sealed frame
                self._dispatch(self.session.open(bodies[0]))
            elif bodies:
                self._frames(bodies)
                if self.closed:
                    return
        except P.ProtocolError as e:
            self.reject(str(e))
            return
        except Exception as e:  # never let one connection take the service down
            log.exception("arbiter: internal error on connection %s", self.peer)
            self.reject("internal error: %s" % type(e).__name__)
            return
        if self.t.error:
            self.fail(None, self.t.error)

    def _frames(self, bodies):
        """Several frames that came together (or the handshake's): their
        answers go out together, in order."""
        if len(bodies) > 1:
            self.held = []
        try:
            for body in bodies:
                if self.stage == _AUTH:
                    self._dispatch(self.session.open(body))
                else:
                    self._handle(body)
                if self.closed:
                    return
        finally:
            if self.held is not None:
                self.release()

    def on_writable(self):
        self.t.flush()
        self._pump_stats()
        self._sync()

    def _sync(self):
        """Close on a transport error, else watch writability while bytes are queued."""
        t = self.t
        if t.error:
            self.fail(logging.WARNING if t.outbuf else None, t.error)
            return
        ev = _RW if t.outbuf else _READ
        if ev != self.events:
            self.events = ev
            self.srv.poller.modify(self.fd, ev)

    def send(self, payload):
        if not self.closed:
            if self.held is None:
                self.t.write(self.session.seal(payload))
                self._sync()
            else:
                self.held.append(self.session.seal(payload))

    def hold(self):
        """Collect what :meth:`send` seals instead of writing it, until
        :meth:`release` writes it all with one ``send()`` (in order). False if
        frames are held already (whoever started it releases them)."""
        if self.held is not None:
            return False
        self.held = []
        return True

    def release(self):
        held, self.held = self.held, None
        if held:
            self.t.write(held[0] if len(held) == 1 else b"".join(held))
            if not self.closed:
                self._sync()

    def _pump_stats(self):
        if self.held:           # frames sealed before the fragments go first
            self.release()
            self.held = []
        parts = self.stats_parts
        while parts and self.t.buffered < _STATS_LOW_WATER and self.t.error is None:
            self.t.write(self.session.seal(parts.popleft()))
        if parts is not None and not parts:
            self.stats_parts = None

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
        if self.stage == _AUTH:
            self.srv.counters["protocol_errors"] += 1
            if self.held:       # what was answered before the bad frame goes out first
                self.release()
            self.t.write(self.session.seal(P.enc_text(P.T_ERROR, why)))
        else:
            self.srv.counters["auth_failures"] += 1
        self.fail(logging.WARNING, "rejected: " + why)

    # -------------------------------------------------------- frames
    def _handle(self, body):
        if self.stage == _AUTH:
            self._dispatch(self.session.open(body))
        elif self.stage == _HELLO:
            self.t.write(self.hs.on_hello(body))
            self.stage = _PROOF
            self._sync()
        else:
            reply, session = self.hs.on_proof(body)
            self.hs = None
            self.t.write(reply)
            if session is None:                 # the reply says "rejected"; nothing secret in it
                self.srv.counters["auth_failures"] += 1
                self.fail(logging.WARNING, "authentication failed (wrong secret?)")
                return
            self.session, self.stage = session, _AUTH
            self.t.reader.max_frame = P.MAX_FRAME
            self.srv.handshaking.pop(self, None)
            self._sync()

    def _dispatch(self, p):
        srv = self.srv
        kind = p[0]
        job = self.job
        if kind == P.T_REQUEST:
            if job is None:
                raise P.ProtocolError("REQUEST before REGISTER")
            token, prio, nbytes, chunk, step = P.dec_request(p)
            try:
                grants = srv.arbiter.request(job, token, prio, nbytes, chunk, step)
            except ValueError as e:
                raise P.ProtocolError(str(e)) from None
            srv.send_grants(grants)
            if srv.arbiter.is_pending(job, token):
                self.send(P.enc_token(P.T_QUEUED, token))
        elif kind == P.T_COMPLETE or kind == P.T_CANCEL:
            if job is None:
                raise P.ProtocolError("COMPLETE/CANCEL before REGISTER")
            grants = srv.arbiter.complete(job, P.dec_token(p))
            if grants is None:
                srv.counters["late_completions"] += 1
            else:
                srv.send_grants(grants)
        elif kind == P.T_RENEW:
            if job is None:
                raise P.ProtocolError("RENEW before REGISTER")
            if not srv.arbiter.renew(job, P.dec_token(p)):
                srv.counters["late_renewals"] += 1
        elif kind == P.T_PING:
            nonce = P.dec_token(p)
            if nonce == P.PROBE:                # a client asking what this arbiter offers
                self.send(P.enc_features())
            self.send(P.enc_token(P.T_PONG, nonce))
        elif kind == P.T_WATCH:
            if self.watch is not None:
                raise P.ProtocolError("second WATCH")
            link, job_class = P.dec_watch(p)
            higher = srv.arbiter.higher_class_connected(link, job_class)
            self.watch = [link, job_class, higher]
            srv.watchers.setdefault(link, set()).add(self)
            self.send(P.enc_class_state(higher))
        elif kind == P.T_REGISTER:
            if job is not None:
                raise P.ProtocolError("second REGISTER")
            job_id, link, job_class = P.dec_register(p)
            self.job = srv.arbiter.register(job_id, link, self, job_class)
            log.info("arbiter: job %s (class %d) joined link %s from %s", job_id, job_class, link,
                     self.peer)
            self.send(P.enc_registered(srv.arbiter.lease_seconds))
            srv.class_changed(link)
        elif kind == P.T_STATS:
            if len(p) != 1:
                raise P.ProtocolError("trailing bytes in STATS")
            if self.stats_parts:
                raise P.ProtocolError("STATS while the previous reply is still unread")
            self.stats_parts = collections.deque(
                P.enc_stats_parts(json.dumps(srv.stats(), sort_keys=True)))
            self._pump_stats()
            self._sync()
        else:
            raise P.ProtocolError("unknown message type 0x%02x" % kind)


class ArbiterServer:
    """The service. ``start()`` runs it in a background thread (tests, embedding)
    and returns ``(host, port)``; ``stop()`` closes every connection.

    ``max_connections`` bounds authenticated connections, ``max_handshakes``
    the connections still in the handshake (each closed after
    ``handshake_timeout`` seconds); a connection beyond either is closed at
    once (``rejected_connections``)."""

    def __init__(self, host="127.0.0.1", port=0, secret=None, credit_bytes=8 << 20,
                 lease_seconds=10.0, starvation_bound=8, link_credits=None,
                 handshake_timeout=2.0, max_connections=1024, order="burst", max_handshakes=64,
                 class_reserve=DEFAULT_CLASS_RESERVE):
        self.secret = P.load_secret(secret, "arbiter")
        self.host, self.port = host, port
        self.arbiter = Arbiter(credit_bytes, lease_seconds, starvation_bound, link_credits,
                               order=order, class_reserve=class_reserve)
        self.handshake_timeout = float(handshake_timeout)
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self.conns = set()
        self.handshaking = collections.OrderedDict()   # _Conn -> deadline, in accept order
        self.dead = []
        self.watchers = {}              # link -> connections that WATCH it
        self.counters = {"connections": 0, "rejected_connections": 0, "auth_failures": 0,
                         "protocol_errors": 0, "late_completions": 0, "late_renewals": 0}
        self.address = None
        self.poller = None
        self._poll = None               # the poller's poll (a probe may wrap it)
        self._fds = {}                  # fd -> _Conn, _LISTEN or _WAKE
        self._lsock = None
        self._thread = None
        self._stop = False
        self._calls = collections.deque()
        self._wake_r = self._wake_w = None
        self._t0 = time.monotonic()
        self._last_reject_log = -1e9

    # -------------------------------------------------------- policy glue
    def send_grants(self, grants):
        """Send a GRANT for each request, in order; several grants to one job go
        out in one ``send()``."""
        if not grants:
            return
        if log.isEnabledFor(logging.DEBUG):
            now = time.monotonic()
            for r in grants:
                log.debug("arbiter: grant link=%s job=%s chunk=%s prio=%d bytes=%d waited=%.6fs",
                          r.job.link, r.job.job_id, r.chunk, r.priority, r.nbytes,
                          now - r.t_arrival)
        if len(grants) == 1:
            peer = grants[0].job.peer
            if peer is not None:
                peer.send(P.enc_token(P.T_GRANT, grants[0].token))
            return
        peers = dict.fromkeys(r.job.peer for r in grants)
        peers.pop(None, None)
        held = [c for c in peers if c.hold()]
        for r in grants:
            if r.job.peer is not None:
                r.job.peer.send(P.enc_token(P.T_GRANT, r.token))
        for c in held:
            c.release()

    def class_changed(self, link):
        """A job joined or left ``link``: send CLASS_STATE to each watcher of the
        link whose answer changed."""
        for c in self.watchers.get(link, ()):
            higher = self.arbiter.higher_class_connected(link, c.watch[1])
            if higher != c.watch[2]:
                c.watch[2] = higher
                c.send(P.enc_class_state(higher))

    def stats(self):
        s = dict(self.counters)
        s["connected"] = len(self.conns) - len(self.handshaking)
        s["watchers"] = sum(len(w) for w in self.watchers.values())
        s["handshaking"] = len(self.handshaking)
        s["uptime_seconds"] = round(time.monotonic() - self._t0, 3)
        s["credit_bytes"] = self.arbiter.credit_bytes
        s["lease_seconds"] = self.arbiter.lease_seconds
        s["starvation_bound"] = self.arbiter.starvation_bound
        s["order"] = self.arbiter.order
        s["class_reserve"] = self.arbiter.class_reserve
        s["pruned_links"] = self.arbiter.pruned_links
        s["max_connections"] = self.max_connections
        s["max_handshakes"] = self.max_handshakes
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
        self.poller = _new_poller()
        self._poll = self.poller.poll
        self._watch(ls.fileno(), _LISTEN)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._watch(self._wake_r.fileno(), _WAKE)
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
    def _watch(self, fd, what):
        self.poller.register(fd, _READ)
        self._fds[fd] = what

    def serve(self):
        """Run the loop in the calling thread until :meth:`stop`."""
        if self._lsock is None:
            self.bind()
        fds = self._fds
        monotonic = time.monotonic
        try:
            while not self._stop:
                now = monotonic()
                due = self._next_timer(now)
                for fd, mask in self._poll(due - now if due > now else 0.0):
                    conn = fds.get(fd)
                    if conn.__class__ is _Conn:
                        # as selectors reads epoll: an error or hang-up is readable and,
                        # while watched for it, writable
                        if mask & ~_OUT and not conn.closed:
                            conn.on_readable()
                        if mask & ~_IN and conn.events & _OUT and not conn.closed:
                            conn.on_writable()
                    elif conn is _LISTEN:
                        self._accept()
                    elif conn is _WAKE:
                        self._drain_wake()
                    if self.dead:
                        self._reap()
                if monotonic() >= due:
                    self._timers()
                if self._calls:
                    self._run_calls()
                if self.dead:
                    self._reap()
        finally:
            self._shutdown()

    def _next_timer(self, now):
        """Earliest of: a lease expiry, the oldest handshake's deadline, 1 s."""
        due = now + 1.0
        nx = self.arbiter.next_expiry()
        if nx is not None and nx < due:
            due = nx
        for d in self.handshaking.values():     # accept order = deadline order
            if d < due:
                due = d
            break
        return due

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
            nhs = len(self.handshaking)
            if nhs >= self.max_handshakes or len(self.conns) - nhs >= self.max_connections:
                self.counters["rejected_connections"] += 1
                now = time.monotonic()
                level = logging.WARNING if now - self._last_reject_log > 60 else logging.DEBUG
                if level == logging.WARNING:
                    self._last_reject_log = now
                log.log(level, "arbiter: too many connections (%d authenticated, %d in the "
                        "handshake), rejecting %s (repeats within 60 s logged at debug level)",
                        len(self.conns) - nhs, nhs, peer)
                sock.close()
                continue
            sock.setblocking(False)
            nodelay(sock)
            conn = _Conn(self, sock, peer)
            self.conns.add(conn)
            self.handshaking[conn] = time.monotonic() + self.handshake_timeout
            self.counters["connections"] += 1
            self._watch(conn.fd, conn)

    def _drain_wake(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError, OSError):
            pass

    def _timers(self):
        now = time.monotonic()
        while self.handshaking:
            c, d = next(iter(self.handshaking.items()))
            if d > now:
                break
            del self.handshaking[c]
            if not c.closed:
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
            self.handshaking.pop(conn, None)
            if self._fds.get(conn.fd) is conn:
                del self._fds[conn.fd]
                try:
                    self.poller.unregister(conn.fd)
                except (KeyError, ValueError, OSError):
                    pass
            conn.t.close()
            if conn.watch is not None:
                w = self.watchers.get(conn.watch[0])
                if w is not None:
                    w.discard(conn)
                    if not w:
                        del self.watchers[conn.watch[0]]
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
                self.class_changed(job.link)

    def _shutdown(self):
        for c in list(self.conns):
            c.closed = True
            try:
                # RST instead of FIN: peers see the arbiter vanish, as on a crash
                c.t.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            c.t.close()
        self.conns.clear()
        self.handshaking.clear()
        for s in (self._lsock, self._wake_r, self._wake_w):
            try:
                s.close()
            except (OSError, AttributeError):
                pass
        self._fds.clear()
        try:
            self.poller.close()
        except Exception:
            pass
        while self._calls:
            fn, args, fut = self._calls.popleft()
            fut.set_exception(RuntimeError("arbiter stopped"))
        log.info("arbiter: stopped")
