"""Job-side client of the link arbiter (rank 0's scheduler uses one per job).

``ArbiterClient(address, link, job_id, secret, on_grant, timeout=0.05, *, job_class=0, ...)``.
Requests are named by the caller's *key* (an int, unique per request, never
reused -- the scheduler's ticket); the key is also the wire token.

* ``request(key, priority, nbytes, label="")`` never blocks: it sends the
  request (non-blocking write from the caller's thread) and returns. The grant
  arrives later as ``on_grant(key)``, exactly once unless the request is
  cancelled first, always from the client's I/O thread and never while the
  client holds its lock (``on_grant`` may call the client).
* ``complete(key)``: the granted chunk finished.
* A request still waiting after ``max_wait`` s is cancelled at the arbiter
  and granted locally (one warning); the wait counts only while none of this
  job's own grants is outstanding (those hold credit until the job's slowest
  rank joins their allreduce: the job then waits on itself).
* ``cancel(key)``: withdraw a request: a pending one is dropped at the arbiter
  at once (CANCEL), a granted one is released like a completion. No
  ``on_grant(key)`` starts after ``cancel(key)`` returned, even if a GRANT
  arrives late.

One state machine, run by the I/O thread (``_state``)::

    CONNECTING --connected--> HANDSHAKE --REGISTERED--> READY
        ^                         |                       |
        +------- BACKOFF <--------+-------- failure ------+
    any state --close()--> CLOSED

A failure (connect refused, handshake not done within ``handshake_timeout``,
connection dropped, protocol error, a REQUEST not answered by GRANT or QUEUED
within ``timeout``, a PING not answered in time) closes the connection,
grants every waiting request locally (``on_grant`` from the I/O thread),
logs ONE warning per outage on logger ``horovod_prio.arbiter`` and enters
BACKOFF: new requests are granted locally at once; after the backoff
(``backoff_initial`` doubling up to ``backoff_max``) it connects again.
Requests made during the very first connection attempt wait for it at most
``timeout`` (``_hold_first``); later reconnects do not hold requests. While
READY the client pings every ``timeout/2`` when requests wait (every
``idle_heartbeat`` when idle), and renews, every third of the arbiter's lease,
the lease of every grant it still holds, so a slow allreduce never loses its
grant. All deadlines are checked in one place, :meth:`_timers`, which also
returns when the next one is due.

Exactly once: only the I/O thread delivers ``on_grant``, and only for a
request whose grant was decided (by the arbiter's GRANT in the current
session, or locally) and which was not cancelled meanwhile; falling back
closes the connection first, so no GRANT of an old session can arrive after a
local grant, and a GRANT for anything not waiting is ignored (with a warning
when the key was never requested: not pending and not among the last
``_RECENT_KEYS`` finished ones, whose late grants are expected).

``io_priority`` (``HOROVOD_PRIO_ARBITER_IO_PRIORITY``: ``realtime[=N]`` or
``nice=N``) is applied by the I/O thread to itself when it starts, so a grant
wakes it ahead of the job's busy threads; a refusal (no CAP_SYS_NICE) is one
warning and the thread runs on at its default priority.
"""
import collections
import logging
import os
import selectors
import socket
import threading
import time

from . import placement
from . import protocol as P
from .stats import fetch_stats  # noqa: F401 (re-exported)
from .transport import Transport, parse_address, tcp_socket

log = logging.getLogger("horovod_prio.arbiter")

CONNECTING, HANDSHAKE, READY, BACKOFF, CLOSED = "connecting", "handshake", "ready", "backoff", "closed"

_MAX_OUTBUF = 1 << 20
_RECENT_KEYS = 4096     # finished keys remembered: a GRANT for one is late, not a lie
# request states
_HELD, _SENT, _QUEUED, _GRANTED = 0, 1, 2, 3


class _Req:
    __slots__ = ("key", "label", "priority", "nbytes", "step", "t", "state", "session", "local",
                 "cancelled", "delivered")

    def __init__(self, key, label, priority, nbytes, t, step=0):
        self.key, self.label, self.priority, self.nbytes, self.t = key, label, priority, nbytes, t
        self.step = step
        self.state = _HELD
        self.session = 0        # session the request was sent / granted in (0: local grant)
        self.local = False
        self.cancelled = False
        self.delivered = False


def _check_int(name, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError("%s must be an int in %d..%d, got %r" % (name, lo, hi, v))


def _check_name(name, v, empty_ok=False):
    if not isinstance(v, str) or (not v and not empty_ok) or len(v.encode()) > P.MAX_NAME:
        raise ValueError("%s must be a %sstring of at most %d bytes, got %r"
                         % (name, "" if empty_ok else "non-empty ", P.MAX_NAME, v))


class ArbiterClient:
    """See the module docstring. Thread-safe."""

    def __init__(self, address, link, job_id, secret, on_grant, timeout=0.05, *, job_class=0,
                 max_wait=10.0, idle_heartbeat=1.0, handshake_timeout=None,
                 backoff_initial=0.05, backoff_max=2.0, io_priority=None):
        self._addr = parse_address(address)
        self.io_priority = placement.io_priority(io_priority)
        _check_name("link", link)
        _check_name("job_id", job_id)
        _check_int("job_class", job_class, P.I32_MIN, P.I32_MAX)
        if not callable(on_grant):
            raise ValueError("on_grant must be callable, got %r" % (on_grant,))
        if not timeout > 0:
            raise ValueError("timeout must be > 0 seconds, got %r" % (timeout,))
        if not max_wait > 0:
            raise ValueError("max_wait must be > 0 seconds, got %r" % (max_wait,))
        self.link, self.job_id, self.job_class = link, job_id, job_class
        self._secret = P.load_secret(secret, "arbiter client %s" % job_id)
        self._on_grant = on_grant
        self.timeout = float(timeout)
        self.max_wait = float(max_wait)
        self._idle_hb = float(idle_heartbeat)
        self._hs_timeout = float(handshake_timeout if handshake_timeout is not None
                                 else max(1.0, 4 * self.timeout))
        self._backoff0 = float(backoff_initial)
        self._backoff_max = float(backoff_max)
        self._backoff = self._backoff0

        self._lock = threading.Lock()
        self._delivered_cv = threading.Condition(self._lock)
        self._delivering = None         # the _Req whose on_grant runs right now
        self._close_requested = False
        self._state = CONNECTING
        self._hold_first = True         # first attempt: requests wait for it (<= timeout)
        self._t = None                  # Transport while CONNECTING/HANDSHAKE/READY
        self._hs = None                 # ClientHandshake while HANDSHAKE
        self._session = None
        self._session_no = 0
        self._lease = 0.0               # the arbiter's lease (from REGISTERED)
        self._deadline = 0.0            # CONNECTING/HANDSHAKE must be done by then
        self._reconnect_at = 0.0        # BACKOFF ends then
        self._ping_sent = None          # time of the unanswered PING
        self._last_ping = 0.0
        self._ping_nonce = 0
        self._outage_warned = False
        self._maxwait_warned = False
        self._reqs = {}                             # key -> _Req, until completed/cancelled
        self._own_clear_t = 0.0         # since then none of this job's grants is outstanding
        self._waiting = collections.OrderedDict()   # key -> _Req not granted yet, request order
        self._unacked = collections.OrderedDict()   # key -> ack deadline, send order
        self._held = collections.OrderedDict()      # key -> renewal due, arbiter grants held
        self._due = []                              # granted _Req to deliver (I/O thread)
        self._recent = collections.OrderedDict()    # keys finished lately (late GRANTs expected)
        self._lie_warned = False
        self._c = {"requests": 0, "grants": 0, "arbiter_grants": 0, "fallback_grants": 0,
                   "wait_seconds_total": 0.0, "wait_seconds_max": 0.0, "outages": 0,
                   "reconnects": 0, "max_wait_cancels": 0, "cancels": 0, "renewals": 0,
                   "ignored_grants": 0}

        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._sock_events = 0
        with self._lock:
            self._connect(time.monotonic())
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="hvdprio-arbiter-client-%s" % job_id)
        self._thread.start()

    # ================================================================ API
    def request(self, key, priority, nbytes, label="", step=0):
        """Ask for the link for one chunk; ``on_grant(key)`` follows once.
        ``step``: the job's training step the chunk belongs to (> 0; 0 = not
        known): the arbiter keeps a job's burst across gaps inside its step."""
        _check_int("key", key, 0, P.U64_MAX)
        _check_int("priority", priority, P.I64_MIN, P.I64_MAX)
        _check_int("nbytes", nbytes, 0, P.U64_MAX)
        _check_int("step", step, 0, P.U64_MAX)
        _check_name("label", label, empty_ok=True)
        now = time.monotonic()
        with self._lock:
            if self._close_requested:
                raise RuntimeError("ArbiterClient is closed")
            if key in self._reqs:
                raise ValueError("key %d is already pending or granted" % key)
            req = self._reqs[key] = self._waiting[key] = _Req(key, label, priority, nbytes, now, step)
            self._recent.pop(key, None)
            self._c["requests"] += 1
            if self._state == READY:
                self._send_request(req, now)
            elif not (self._hold_first and self._state in (CONNECTING, HANDSHAKE)):
                self._grant(req, now, local=True)
            wake = self._needs_io()
        if wake:
            self._wake()

    def complete(self, key):
        """The granted chunk finished. False if ``key`` is not a delivered grant."""
        with self._lock:
            req = self._reqs.get(key)
            if req is None or not req.delivered:
                return False
            self._forget(req, P.T_COMPLETE)
            wake = self._needs_io()
        if wake:
            self._wake()
        return True

    def cancel(self, key):
        """Withdraw a request (pending: dropped at the arbiter now; granted:
        released like a completion). No on_grant(key) runs or starts after
        this returned: should that call be running in the I/O thread right
        now, cancel waits for it to return (so never cancel while holding a
        lock that on_grant takes). Returns whether something was withdrawn."""
        with self._lock:
            req = self._reqs.get(key)
            if req is None:
                return False
            req.cancelled = True
            if self._delivering is req and threading.current_thread() is not self._thread:
                # its on_grant is running: let it return, so none runs after us
                self._delivered_cv.wait_for(lambda: self._delivering is not req)
                if self._reqs.get(key) is not req:
                    return False        # on_grant completed (or cancelled) it meanwhile
            self._c["cancels"] += 1
            self._forget(req, P.T_CANCEL)
            wake = self._needs_io()
        if wake:
            self._wake()
        return True

    def close(self, timeout=5.0):
        """Stop the I/O thread. Requests still waiting are granted locally first."""
        with self._lock:
            if self._close_requested:
                return
            self._close_requested = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def connected(self):
        """True while registered with the arbiter (requests go through it)."""
        return self._state == READY

    @property
    def state(self):
        return self._state

    @property
    def counters(self):
        """Snapshot: requests, grants, arbiter_grants, fallback_grants,
        wait_seconds_total, wait_seconds_max, outages, reconnects,
        max_wait_cancels, cancels, renewals, ignored_grants (GRANTs for a
        request no longer waiting), pending, outstanding."""
        with self._lock:
            d = dict(self._c)
            d["pending"] = len(self._waiting)
            d["outstanding"] = self._outstanding()
        return d

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ================================================================ bookkeeping (locked)
    def _wake(self):
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _outstanding(self):
        """This job's grants not completed or cancelled yet."""
        return len(self._reqs) - len(self._waiting)

    def _needs_io(self):
        """After a caller-thread write: must the I/O thread act (flush, fail, deliver)?"""
        t = self._t
        return bool(self._due) or (t is not None and (t.buffered or t.error is not None))

    def _send(self, payload):
        self._t.write(self._session.seal(payload))

    def _send_request(self, req, now):
        req.state, req.session = _SENT, self._session_no
        self._unacked[req.key] = now + self.timeout
        self._send(P.enc_request(req.key, req.priority, req.nbytes, req.label, req.step))

    def _grant(self, req, now, local):
        del self._waiting[req.key]
        self._unacked.pop(req.key, None)
        req.state, req.local = _GRANTED, local
        if local:
            req.session = 0
        elif self._lease:
            self._held[req.key] = now + self._lease / 3
        self._due.append(req)

    def _forget(self, req, kind):
        """Drop a completed/cancelled request; tell the arbiter if it knows it."""
        del self._reqs[req.key]
        self._waiting.pop(req.key, None)
        self._recent[req.key] = None
        if len(self._recent) > _RECENT_KEYS:
            self._recent.popitem(last=False)
        if req.state == _GRANTED and not self._outstanding():
            self._own_clear_t = time.monotonic()
        self._unacked.pop(req.key, None)
        self._held.pop(req.key, None)
        if self._state == READY and req.session == self._session_no and req.state != _HELD:
            self._send(P.enc_token(kind, req.key))

    # ================================================================ I/O thread
    def _run(self):
        if self.io_priority is not None:
            placement.apply_io_priority(self.io_priority, self.job_id, log)
        try:
            while self._loop_once():
                pass
        finally:
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _loop_once(self):
        """One turn: timers, deliveries, then wait for I/O. False once closed."""
        try:
            with self._lock:
                now = time.monotonic()
                if self._close_requested:
                    self._shut_down(now)
                else:
                    wait = max(0.0, min(self._timers(now), now + 0.5) - now)
                    self._update_interest()
                due, self._due = self._due, []
            if due:
                self._deliver(due)
            if self._state == CLOSED:
                return False
            if due:
                return True         # deadlines may have passed while delivering
            events = self._sel.select(wait)
            with self._lock:
                for key, mask in events:
                    if key.fileobj is self._wake_r:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                    elif self._t is not None and key.fileobj is self._t.sock:
                        self._on_io(mask, time.monotonic())
                # grants that just arrived go out in this turn, before the next
                # pass over the timers: a grant's round trip ends at its on_grant
                due, self._due = self._due, []
            if due:
                self._deliver(due)
        except Exception:
            # a bug here must not stop chunks from being granted: drop the
            # connection (waiting requests are granted locally) and go on
            log.exception("arbiter client %s: internal error in the I/O thread", self.job_id)
            with self._lock:
                self._fail("internal error", time.monotonic())
            time.sleep(0.01)
        return True

    def _deliver(self, due):
        for req in due:
            with self._lock:
                if req.cancelled:
                    continue
                req.delivered = True
                self._delivering = req
                c = self._c
                c["grants"] += 1
                c["fallback_grants" if req.local else "arbiter_grants"] += 1
                w = time.monotonic() - req.t
                c["wait_seconds_total"] += w
                if w > c["wait_seconds_max"]:
                    c["wait_seconds_max"] = w
            try:
                self._on_grant(req.key)
            except Exception:
                log.exception("arbiter client: on_grant(%r) raised", req.key)
            finally:
                with self._lock:
                    self._delivering = None
                    self._delivered_cv.notify_all()

    def _update_interest(self):
        t = self._t
        if t is None:
            return
        ev = selectors.EVENT_READ
        if t.wants_write or self._state == CONNECTING:
            ev |= selectors.EVENT_WRITE
        if ev != self._sock_events:
            self._sel.modify(t.sock, ev)
            self._sock_events = ev

    # ---------------------------------------------------------------- deadlines
    def _timers(self, now):
        """Every deadline of the client, in one place: act on those due and
        return when the next one is."""
        st = self._state
        if self._t is not None and self._t.error:
            self._fail(self._t.error, now)
            st = self._state
        if st == BACKOFF:
            if now < self._reconnect_at:
                return self._reconnect_at
            self._connect(now)
            st = self._state
            if st == BACKOFF:
                return self._reconnect_at
        if st in (CONNECTING, HANDSHAKE):
            nxt = self._deadline
            if now >= nxt:
                self._fail("no handshake within %.3fs" % self._hs_timeout, now)
                return self._reconnect_at
            if self._hold_first and self._waiting:
                t_req = next(iter(self._waiting.values())).t + self.timeout
                if t_req <= now:
                    self._fail("not connected within %.3fs of a request" % self.timeout, now)
                    return self._reconnect_at
                nxt = min(nxt, t_req)
            return nxt
        # READY. A late answer may be sitting unread (this thread was busy or
        # descheduled): read before judging.
        if (self._unacked and next(iter(self._unacked.values())) <= now) or \
                (self._ping_sent is not None and now - self._ping_sent > self.timeout):
            self._on_io(selectors.EVENT_READ, now)
            if self._state != READY:
                return self._reconnect_at
        if self._unacked:
            d = next(iter(self._unacked.values()))
            if d <= now:
                self._fail("no reply to a request within %.3fs" % self.timeout, now)
                return self._reconnect_at
            nxt = d
        else:
            nxt = now + 3600.0
        # while requests wait, a PING must be answered within `timeout`; while
        # idle within max(timeout, idle_heartbeat) (a new request has its own ack deadline)
        busy = bool(self._waiting)
        limit = self.timeout if busy else max(self.timeout, self._idle_hb)
        if self._ping_sent is not None:
            if now - self._ping_sent > limit:
                self._fail("no heartbeat reply within %.3fs" % limit, now)
                return self._reconnect_at
            nxt = min(nxt, self._ping_sent + limit)
        else:
            t_ping = self._last_ping + (self.timeout / 2 if busy else self._idle_hb)
            if t_ping <= now:
                self._ping_nonce += 1
                self._ping_sent = self._last_ping = now
                self._send(P.enc_token(P.T_PING, self._ping_nonce))
                nxt = min(nxt, now + limit)
            else:
                nxt = min(nxt, t_ping)
        # max_wait: a request waits on the arbiter only while none of this
        # job's own grants is outstanding (else it may wait on this job: a late
        # rank holds the job's granted chunks, and with them the link's credit)
        while self._waiting and not self._outstanding():
            req = next(iter(self._waiting.values()))
            due = max(req.t, self._own_clear_t) + self.max_wait
            if due > now:
                nxt = min(nxt, due)
                break
            self._max_wait(req, now)
        while self._held:
            key, d = next(iter(self._held.items()))
            if d > now:
                nxt = min(nxt, d)
                break
            self._send(P.enc_token(P.T_RENEW, key))
            self._c["renewals"] += 1
            self._held[key] = now + self._lease / 3
            self._held.move_to_end(key)
        return nxt

    def _max_wait(self, req, now):
        self._c["max_wait_cancels"] += 1
        if not self._maxwait_warned:
            self._maxwait_warned = True
            log.warning("arbiter client %s: chunk %d (%s) waited more than %.3fs for link %s; "
                        "granting it locally (further cases logged at debug level)",
                        self.job_id, req.key, req.label, self.max_wait, self.link)
        else:
            log.debug("arbiter client %s: max_wait exceeded for %d", self.job_id, req.key)
        if req.state != _HELD:
            self._send(P.enc_token(P.T_CANCEL, req.key))
        self._grant(req, now, local=True)

    # ---------------------------------------------------------------- transitions
    def _connect(self, now):
        """-> CONNECTING (or BACKOFF if the socket cannot even be created)."""
        self._state = CONNECTING
        self._deadline = now + self._hs_timeout
        try:
            sock, sockaddr = tcp_socket(*self._addr)
        except OSError as e:
            self._fail("cannot resolve/create a socket for %s:%d: %s" % (self._addr + (e,)), now)
            return
        self._t = Transport(sock, P.MAX_FRAME, _MAX_OUTBUF)
        self._sel.register(sock, selectors.EVENT_WRITE)
        self._sock_events = selectors.EVENT_WRITE
        try:
            sock.connect(sockaddr)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            self._fail("connect to %s:%d failed: %s" % (self._addr + (e,)), now)

    def _drop_connection(self):
        t, self._t = self._t, None
        if t is not None:
            try:
                self._sel.unregister(t.sock)
            except (KeyError, ValueError):
                pass
            t.close()
        self._sock_events = 0
        self._hs = self._session = None
        self._ping_sent = None
        self._unacked.clear()
        self._held.clear()      # the arbiter released this session's grants with the connection

    def _fail(self, why, now):
        """-> BACKOFF: close the connection, grant every waiting request locally."""
        if self._state in (CLOSED, BACKOFF) and self._t is None:
            return
        was_ready = self._state == READY
        self._drop_connection()
        self._state = BACKOFF
        self._hold_first = False
        if not self._outage_warned:
            self._outage_warned = True
            self._c["outages"] += 1
            log.warning("arbiter %s:%d unavailable for job %s on link %s (%s); granting chunks "
                        "locally and reconnecting in the background",
                        self._addr[0], self._addr[1], self.job_id, self.link, why)
        else:
            log.debug("arbiter client %s: %s", self.job_id, why)
        for req in list(self._waiting.values()):
            self._grant(req, now, local=True)
        if was_ready:
            self._backoff = self._backoff0
        self._reconnect_at = now + self._backoff
        self._backoff = min(self._backoff * 2, self._backoff_max)

    def _ready(self, lease, now):
        """HANDSHAKE -> READY: send what waited for the first connection."""
        self._state = READY
        self._session_no += 1
        self._lease = lease
        self._backoff = self._backoff0
        self._last_ping, self._ping_sent = now, None
        if not self._hold_first:
            self._c["reconnects"] += 1
            log.info("arbiter %s:%d reachable again; job %s on link %s uses it for new chunks",
                     self._addr[0], self._addr[1], self.job_id, self.link)
        self._hold_first = False
        self._outage_warned = False
        for req in self._waiting.values():
            if req.state == _HELD:
                self._send_request(req, now)

    def _shut_down(self, now):
        """-> CLOSED: waiting requests are granted locally (delivered once more)."""
        self._drop_connection()
        for req in list(self._waiting.values()):
            self._grant(req, now, local=True)
        self._state = CLOSED

    # ---------------------------------------------------------------- socket events
    def _on_io(self, mask, now):
        t = self._t
        if self._state == CONNECTING:
            if not mask & selectors.EVENT_WRITE:
                return
            err = t.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._fail("connect failed: %s" % _strerror(err), now)
                return
            self._state = HANDSHAKE
            self._hs = P.ClientHandshake(self._secret)
            t.write(self._hs.hello())
        if mask & selectors.EVENT_WRITE:
            t.flush()
        if mask & selectors.EVENT_READ:
            try:
                for body in t.read():
                    self._on_frame(body, now)
                    if self._t is not t:
                        return
            except P.ProtocolError as e:
                self._fail(str(e) if isinstance(e, P.AuthError) else "protocol error: %s" % e, now)
                return
        if t.error:
            if self._state == HANDSHAKE and self._hs is not None and self._hs.session is not None:
                why = "arbiter closed the connection during authentication (wrong secret?)"
            else:
                why = "arbiter: " + t.error
            self._fail(why, now)

    def _on_frame(self, body, now):
        if self._state == HANDSHAKE:
            hs = self._hs
            if hs.session is None:              # CHALLENGE: prove, then register (pipelined)
                self._t.write(hs.on_challenge(body))
                self._session = hs.session
                self._send(P.enc_register(self.job_id, self.link, self.job_class))
                return
            if not hs.done:                     # VERDICT: the arbiter proves in turn
                hs.on_verdict(body)
                return
        p = self._session.open(body)
        kind = p[0]
        if kind == P.T_GRANT or kind == P.T_QUEUED:
            key = P.dec_token(p)
            self._unacked.pop(key, None)
            req = self._waiting.get(key)
            if req is None or req.session != self._session_no:
                if kind == P.T_GRANT:   # withdrawn, or granted locally (max_wait) meanwhile
                    self._c["ignored_grants"] += 1
                    if req is None and key not in self._reqs and key not in self._recent:
                        # never requested by this job: a confused or lying arbiter
                        log.log(logging.DEBUG if self._lie_warned else logging.WARNING,
                                "arbiter client %s: the arbiter granted token %d, which this job "
                                "never requested; ignored%s", self.job_id, key,
                                "" if self._lie_warned else
                                " (further cases logged at debug level)")
                        self._lie_warned = True
                return
            if kind == P.T_GRANT:
                self._grant(req, now, local=False)
            elif req.state == _SENT:
                req.state = _QUEUED
        elif kind == P.T_PONG:
            self._ping_sent = None
        elif kind == P.T_REGISTERED:
            if self._state != HANDSHAKE:
                raise P.ProtocolError("unexpected REGISTERED")
            self._ready(P.dec_registered(p), now)
        elif kind == P.T_ERROR:
            raise P.ProtocolError("arbiter error: %s" % p[1:].decode("utf-8", "replace"))
        elif kind != P.T_STATS_REPLY:
            raise P.ProtocolError("unknown message type 0x%02x from arbiter" % kind)


def client_from_config(cfg, on_grant, client_cls=None, **kwargs):
    """An :class:`ArbiterClient` (or ``client_cls``, a class with its
    constructor, e.g. the native client) from a ``PriorityConfig`` (fields ``arbiter``,
    ``link``, ``job_id``, ``arbiter_secret`` or ``arbiter_secret_file``,
    ``arbiter_timeout``, ``job_priority``), or ``None`` when the job has not
    opted in (``arbiter`` or ``link`` unset).

    ``job_id`` defaults to ``"<hostname>-<pid>"``, ``job_priority`` (the
    job's class at the arbiter) to 0. The secret is ``arbiter_secret``, or the
    whole file ``arbiter_secret_file`` (surrounding whitespace stripped); a
    missing secret, or an unreadable or empty file, raises ``ValueError``
    naming it. ``kwargs`` go to the constructor (``max_wait``, ...)."""
    address = getattr(cfg, "arbiter", None)
    link = getattr(cfg, "link", None)
    if not address or not link:
        return None
    secret = P.config_secret(cfg)
    if not secret:
        raise ValueError("PriorityConfig.arbiter_secret is required when arbiter is set "
                         "(env HOROVOD_PRIO_ARBITER_SECRET or HOROVOD_PRIO_ARBITER_SECRET_FILE)")
    job_id = getattr(cfg, "job_id", None) or "%s-%d" % (socket.gethostname(), os.getpid())
    timeout = getattr(cfg, "arbiter_timeout", None) or 0.05
    kwargs.setdefault("job_class", getattr(cfg, "job_priority", None) or 0)
    kwargs.setdefault("io_priority", getattr(cfg, "arbiter_io_priority", None))
    return (client_cls or ArbiterClient)(address, link, job_id, secret, on_grant, timeout=timeout,
                                         **kwargs)


def _strerror(err):
    try:
        return os.strerror(err)
    except ValueError:
        return "error %d" % err
