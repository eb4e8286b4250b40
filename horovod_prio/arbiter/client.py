"""Job-side client of the link arbiter (rank 0's scheduler uses one per job).

``ArbiterClient(address, link, job_id, secret, on_grant, timeout=0.05)``:

* ``request(chunk_id, priority, nbytes)`` never blocks: it sends the request
  (non-blocking socket write from the caller's thread) and returns. The grant
  arrives later as ``on_grant(chunk_id)``, always called from the client's
  I/O thread, never while the client holds its lock (``on_grant`` may call
  ``request``/``complete``).
* ``complete(chunk_id)`` reports that a granted chunk finished (returns
  ``False`` if no grant of that chunk is outstanding). The same chunk id may be
  requested again later (each step); completions match grants first in, first
  out.
* Every request gets exactly one ``on_grant`` call: a request's record is
  removed by the single I/O thread either on the arbiter's GRANT or when it
  grants locally, whichever comes first; the other finds nothing to do.

Fallback (never block training). The I/O thread grants locally -- calls
``on_grant`` itself for every pending and every later request -- and logs ONE
warning on logger ``horovod_prio.arbiter`` when the arbiter is

* unreachable (connect refused / fails, handshake not done in time),
* gone (connection closed or reset, e.g. killed or restarted),
* hung or slow: every REQUEST must be answered (GRANT, or QUEUED when it
  legitimately waits behind other jobs' traffic) within ``timeout`` seconds;
  while requests are queued the client pings every ``timeout/2`` and the
  arbiter must answer within ``timeout``. So waiting behind higher-priority
  traffic is fine for as long as the arbiter is alive, while a dead or hung
  arbiter is detected within about ``1.5 * timeout``.

It then reconnects in the background with exponential backoff
(``backoff_initial`` doubling up to ``backoff_max``); once registered again,
new requests go through the arbiter again (logged at INFO). A grant of the old
session can never arrive late: falling back closes that connection first.

A single request queued longer than ``max_wait`` seconds (arbiter alive but
the link held that long) is cancelled at the arbiter and granted locally,
also counted in ``fallback_grants`` (warned once per client).
"""
import collections
import logging
import os
import selectors
import socket
import threading
import time

from . import protocol as P

log = logging.getLogger("horovod_prio.arbiter")

_MAX_OUTBUF = 1 << 20
# recv() buffer: keep it <= 64 KiB; larger sizes make CPython allocate (mmap) and
# shrink a big bytes object on every call (measured ~20 us extra per recv here).
_RECV_SIZE = 65536

# request states
_NEW, _SENT, _QUEUED, _LOCAL = 0, 1, 2, 3


def parse_address(address):
    """``"host:port"`` (``"[v6]:port"``) or ``(host, port)`` -> ``(host, port)``."""
    if isinstance(address, (tuple, list)) and len(address) == 2:
        host, port = address
    elif isinstance(address, str) and ":" in address:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
    else:
        raise ValueError("arbiter address must be 'host:port', got %r" % (address,))
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise ValueError("arbiter address must be 'host:port' with a numeric port, got %r"
                         % (address,)) from None
    if not host or not 0 < port < 65536:
        raise ValueError("arbiter address must be 'host:port' with port 1..65535, got %r"
                         % (address,))
    return host, port


class _Req:
    __slots__ = ("token", "chunk", "priority", "nbytes", "t", "state")

    def __init__(self, token, chunk, priority, nbytes, t):
        self.token = token
        self.chunk = chunk
        self.priority = priority
        self.nbytes = nbytes
        self.t = t
        self.state = _NEW


class ArbiterClient:
    """See the module docstring. Thread-safe."""

    def __init__(self, address, link, job_id, secret, on_grant, timeout=0.05, *,
                 max_wait=10.0, idle_heartbeat=1.0, handshake_timeout=None,
                 backoff_initial=0.05, backoff_max=2.0):
        self._addr = parse_address(address)
        if not isinstance(link, str) or not link or len(link.encode()) > P.MAX_NAME:
            raise ValueError("link must be a non-empty string of at most %d bytes, got %r"
                             % (P.MAX_NAME, link))
        if not isinstance(job_id, str) or not job_id or len(job_id.encode()) > P.MAX_NAME:
            raise ValueError("job_id must be a non-empty string of at most %d bytes, got %r"
                             % (P.MAX_NAME, job_id))
        if not callable(on_grant):
            raise ValueError("on_grant must be callable, got %r" % (on_grant,))
        if not timeout > 0:
            raise ValueError("timeout must be > 0 seconds, got %r" % (timeout,))
        if not max_wait > 0:
            raise ValueError("max_wait must be > 0 seconds, got %r" % (max_wait,))
        self.link, self.job_id = link, job_id
        self._secret = P.load_secret(secret)
        self._on_grant = on_grant
        self.timeout = float(timeout)
        self.max_wait = float(max_wait)
        self._idle_hb = float(idle_heartbeat)
        self._hs_timeout = float(handshake_timeout if handshake_timeout is not None
                                 else max(1.0, 4 * self.timeout))
        self._backoff0 = float(backoff_initial)
        self._backoff_max = float(backoff_max)
        self._backoff = self._backoff0
        self._tick = min(max(self.timeout / 2, 0.001), 0.5)

        self._lock = threading.Lock()
        self._closed = False
        self._mode = "connecting"       # connecting (first attempt) | ready | fallback
        self._sock = None
        self._cstate = None             # None | connect | hello | register | ready
        self._reader = None
        self._session = None
        self._session_no = 0
        self._cn = None
        self._hs_deadline = 0.0
        self._reconnect_at = 0.0
        self._outbuf = bytearray()
        self._io_error = None           # error met by a caller-thread send
        self._last_rx = 0.0
        self._ping_sent = None          # time of the outstanding PING
        self._last_ping = 0.0
        self._ping_nonce = 0
        self._outage_warned = False
        self._maxwait_warned = False
        self._next_token = 1
        self._pending = collections.OrderedDict()   # token -> _Req, request order
        self._unacked = collections.OrderedDict()   # token -> ack deadline, send order
        self._local = collections.deque()           # _Req to grant locally (fallback)
        self._granted = {}                          # chunk -> deque[(token, session_no)]
        self._c = {"requests": 0, "grants": 0, "arbiter_grants": 0, "fallback_grants": 0,
                   "wait_seconds_total": 0.0, "wait_seconds_max": 0.0, "outages": 0,
                   "reconnects": 0, "max_wait_cancels": 0}

        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._sock_events = 0
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="hvdprio-arbiter-client-%s" % job_id)
        self._thread.start()

    # ================================================================ API
    def request(self, chunk_id, priority, nbytes):
        """Ask for the link for one chunk; ``on_grant(chunk_id)`` follows exactly once."""
        if not isinstance(chunk_id, str) or len(chunk_id.encode()) > P.MAX_NAME:
            raise ValueError("chunk_id must be a string of at most %d bytes, got %r"
                             % (P.MAX_NAME, chunk_id))
        if isinstance(priority, bool) or not isinstance(priority, int) \
                or not P.I64_MIN <= priority <= P.I64_MAX:
            raise ValueError("priority must be a 64-bit signed int, got %r" % (priority,))
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes <= P.U64_MAX:
            raise ValueError("nbytes must be an int >= 0, got %r" % (nbytes,))
        now = time.monotonic()
        wake = False
        with self._lock:
            if self._closed:
                raise RuntimeError("ArbiterClient is closed")
            token = self._next_token
            self._next_token += 1
            req = _Req(token, chunk_id, priority, nbytes, now)
            self._pending[token] = req
            self._c["requests"] += 1
            if self._mode == "ready":
                wake = self._send_request_locked(req, now)
            elif self._mode == "fallback":
                req.state = _LOCAL
                self._local.append(req)
                wake = True
            # "connecting": sent once registered, or granted locally on failure
        if wake:
            self._wake()

    def complete(self, chunk_id):
        """Report that a granted chunk finished. Returns False if none was outstanding."""
        wake = False
        with self._lock:
            dq = self._granted.get(chunk_id)
            if not dq:
                return False
            token, sess = dq.popleft()
            if not dq:
                del self._granted[chunk_id]
            if sess and sess == self._session_no and self._cstate == "ready":
                wake = self._write_locked(self._session.seal(P.enc_token(P.T_COMPLETE, token)))
        if wake:
            self._wake()
        return True

    def close(self, timeout=5.0):
        """Stop the I/O thread. Requests still pending are granted locally first
        (every request gets its on_grant)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def connected(self):
        """True while registered with the arbiter (requests go through it)."""
        return self._mode == "ready"

    @property
    def counters(self):
        """Snapshot: requests, grants, arbiter_grants, fallback_grants,
        wait_seconds_total, wait_seconds_max, outages, reconnects,
        max_wait_cancels, pending."""
        with self._lock:
            d = dict(self._c)
            d["pending"] = len(self._pending)
        return d

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ================================================================ sending
    def _wake(self):
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    def _send_request_locked(self, req, now):
        req.state = _SENT
        self._unacked[req.token] = now + self.timeout
        return self._write_locked(self._session.seal(
            P.enc_request(req.token, req.priority, req.nbytes, req.chunk)))

    def _write_locked(self, data):
        """Non-blocking write; returns True if the I/O thread must be woken."""
        if self._outbuf:
            self._outbuf += data
            if len(self._outbuf) > _MAX_OUTBUF and self._io_error is None:
                self._io_error = "arbiter is not reading (%d bytes unsent)" % len(self._outbuf)
            return True
        try:
            n = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as e:
            if self._io_error is None:
                self._io_error = "send failed: %s" % e
            return True
        if n < len(data):
            self._outbuf += data[n:]
            return True
        return False

    # ================================================================ I/O thread
    def _run(self):
        try:
            while True:
                try:
                    if self._loop_once():
                        break
                except Exception:
                    # a bug here must not stop chunks from being granted: drop
                    # the connection (pending requests are granted locally) and
                    # carry on with a fresh one
                    log.exception("arbiter client %s: internal error in the I/O thread", self.job_id)
                    cbs = []
                    with self._lock:
                        try:
                            self._fail_locked("internal error", time.monotonic(), cbs)
                        except Exception:
                            self._close_sock_locked()
                    self._deliver(cbs)
                    time.sleep(0.01)
        finally:
            try:
                self._sel.close()
                self._wake_r.close()
                self._wake_w.close()
            except OSError:
                pass

    def _loop_once(self):
        """One turn of the I/O loop; returns True once closed."""
        cbs = []
        with self._lock:
            if self._closed:
                self._shutdown_locked(cbs)
                closing = True
            else:
                closing = False
                now = time.monotonic()
                self._timers_locked(now, cbs)
                self._update_interest_locked()
                timeout = self._select_timeout_locked(now)
        if closing or cbs:
            self._deliver(cbs)
            return closing
        events = self._sel.select(timeout)
        with self._lock:
            for key, mask in events:
                if key.fileobj is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                elif key.fileobj is self._sock:
                    if mask & selectors.EVENT_WRITE:
                        self._on_writable_locked(cbs)
                    if self._sock is not None and mask & selectors.EVENT_READ:
                        self._on_readable_locked(cbs)
        if cbs:
            self._deliver(cbs)
        return False

    def _deliver(self, cbs):
        for chunk in cbs:
            try:
                self._on_grant(chunk)
            except Exception:
                log.exception("arbiter client: on_grant(%r) raised", chunk)

    def _shutdown_locked(self, cbs):
        self._close_sock_locked()
        for req in list(self._pending.values()):
            self._grant_locked(req, 0, cbs, local=True)
        self._pending.clear()
        self._unacked.clear()
        self._local.clear()
        self._mode = "fallback"

    def _select_timeout_locked(self, now):
        t = self._tick      # bounds how late an ack/heartbeat deadline is noticed
        if self._cstate is None and not self._closed:
            t = min(t, max(0.0, self._reconnect_at - now))
        if self._cstate == "ready":
            if self._unacked:
                t = min(t, max(0.0, next(iter(self._unacked.values())) - now))
            if self._ping_sent is not None:
                t = min(t, max(0.0, self._ping_sent + self.timeout - now))
        return t

    def _update_interest_locked(self):
        if self._sock is None:
            return
        ev = selectors.EVENT_READ
        if self._outbuf or self._cstate == "connect":
            ev |= selectors.EVENT_WRITE
        if ev != self._sock_events:
            self._sel.modify(self._sock, ev)
            self._sock_events = ev

    def _timers_locked(self, now, cbs):
        if self._io_error is not None:
            why, self._io_error = self._io_error, None
            if self._sock is not None:
                self._fail_locked(why, now, cbs)
        while self._local:
            self._grant_locked(self._local.popleft(), 0, cbs, local=True)
        cs = self._cstate
        if cs is None:
            if now >= self._reconnect_at:
                self._start_connect_locked(now, cbs)
            return
        if cs != "ready":
            if now >= self._hs_deadline:
                self._fail_locked("no handshake within %.3fs" % self._hs_timeout, now, cbs)
            elif self._mode == "connecting" and self._pending and \
                    next(iter(self._pending.values())).t + self.timeout <= now:
                self._fail_locked("not connected within %.3fs of a request" % self.timeout, now, cbs)
            return
        # ready
        # While requests wait, a PING must be answered within `timeout`; while
        # idle, within max(timeout, idle_heartbeat) (a request made meanwhile
        # is guarded by its own ack deadline).
        ping_limit = self.timeout if self._pending else max(self.timeout, self._idle_hb)
        ack_late = self._unacked and next(iter(self._unacked.values())) <= now
        ping_late = self._ping_sent is not None and self._last_rx < self._ping_sent \
            and now - self._ping_sent > ping_limit
        if ack_late or ping_late:
            # this thread may itself have been descheduled: read what has arrived first
            self._on_readable_locked(cbs)
            if self._cstate != "ready":
                return
            if self._unacked and next(iter(self._unacked.values())) <= now:
                self._fail_locked("no reply to a request within %.3fs" % self.timeout, now, cbs)
                return
            if self._ping_sent is not None and self._last_rx < self._ping_sent \
                    and now - self._ping_sent > ping_limit:
                self._fail_locked("no heartbeat reply within %.3fs" % ping_limit, now, cbs)
                return
        if self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.t + self.max_wait <= now:
                self._max_wait_locked(now, cbs)
        interval = self.timeout / 2 if self._pending else self._idle_hb
        if self._ping_sent is None and now - self._last_ping >= interval:
            self._ping_nonce += 1
            self._ping_sent = self._last_ping = now
            self._write_locked(self._session.seal(P.enc_token(P.T_PING, self._ping_nonce)))

    def _max_wait_locked(self, now, cbs):
        while self._pending:
            req = next(iter(self._pending.values()))
            if req.t + self.max_wait > now:
                break
            self._c["max_wait_cancels"] += 1
            if not self._maxwait_warned:
                self._maxwait_warned = True
                log.warning("arbiter client %s: chunk %r waited more than %.3fs for link %s; "
                            "granting it locally (further cases logged at debug level)",
                            self.job_id, req.chunk, self.max_wait, self.link)
            else:
                log.debug("arbiter client %s: max_wait exceeded for %r", self.job_id, req.chunk)
            self._unacked.pop(req.token, None)
            self._write_locked(self._session.seal(P.enc_token(P.T_CANCEL, req.token)))
            self._grant_locked(req, 0, cbs, local=True)

    def _grant_locked(self, req, sess, cbs, local):
        self._pending.pop(req.token, None)
        c = self._c
        c["grants"] += 1
        c["fallback_grants" if local else "arbiter_grants"] += 1
        w = time.monotonic() - req.t
        c["wait_seconds_total"] += w
        if w > c["wait_seconds_max"]:
            c["wait_seconds_max"] = w
        dq = self._granted.get(req.chunk)
        if dq is None:
            dq = self._granted[req.chunk] = collections.deque()
        dq.append((req.token, sess))
        cbs.append(req.chunk)

    # ---------------------------------------------------------------- connection
    def _start_connect_locked(self, now, cbs):
        host, port = self._addr
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            family, _, _, _, sockaddr = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:
            self._fail_locked("cannot resolve/create socket for %s:%d: %s" % (host, port, e), now, cbs)
            return
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self._sock = sock
        self._cstate = "connect"
        self._hs_deadline = now + self._hs_timeout
        self._reader = P.FrameReader(P.MAX_FRAME)
        self._outbuf = bytearray()
        self._session = None
        self._sel.register(sock, selectors.EVENT_WRITE)
        self._sock_events = selectors.EVENT_WRITE
        try:
            sock.connect(sockaddr)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            self._fail_locked("connect to %s:%d failed: %s" % (host, port, e), now, cbs)

    def _close_sock_locked(self):
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            try:
                sock.close()
            except OSError:
                pass
        self._cstate = None
        self._session = None
        self._outbuf = bytearray()
        self._sock_events = 0
        self._ping_sent = None

    def _fail_locked(self, why, now, cbs):
        """Drop the connection; grant every pending request locally."""
        if self._closed:
            return
        was_ready = self._cstate == "ready"
        self._close_sock_locked()
        if not self._outage_warned:
            self._outage_warned = True
            self._c["outages"] += 1
            log.warning("arbiter %s:%d unavailable for job %s on link %s (%s); granting chunks "
                        "locally and reconnecting in the background",
                        self._addr[0], self._addr[1], self.job_id, self.link, why)
        else:
            log.debug("arbiter client %s: %s", self.job_id, why)
        self._mode = "fallback"
        for req in list(self._pending.values()):
            self._grant_locked(req, 0, cbs, local=True)
        self._pending.clear()
        self._unacked.clear()
        self._local.clear()
        if was_ready:
            self._backoff = self._backoff0
        self._reconnect_at = now + self._backoff
        self._backoff = min(self._backoff * 2, self._backoff_max)

    def _on_writable_locked(self, cbs):
        now = time.monotonic()
        if self._cstate == "connect":
            err = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._fail_locked("connect failed: %s" % os_strerror(err), now, cbs)
                return
            self._cn = P.new_nonce()
            self._cstate = "hello"
            self._outbuf += P.frame(P.MAGIC + self._cn)
        if self._outbuf:
            try:
                n = self._sock.send(self._outbuf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._fail_locked("send failed: %s" % e, now, cbs)
                return
            del self._outbuf[:n]

    def _on_readable_locked(self, cbs):
        now = time.monotonic()
        try:
            data = self._sock.recv(_RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._fail_locked("connection error: %s" % e, now, cbs)
            return
        if not data:
            self._fail_locked("arbiter closed the connection", now, cbs)
            return
        self._last_rx = now
        try:
            for body in self._reader.feed(data):
                self._on_frame_locked(body, now, cbs)
                if self._sock is None:
                    return
        except P.ProtocolError as e:
            self._fail_locked("protocol error: %s" % e, now, cbs)

    def _on_frame_locked(self, body, now, cbs):
        if self._cstate == "hello":
            n = len(P.MAGIC) + P.NONCE_LEN
            if len(body) != n + P.MAC_LEN or body[:4] != P.MAGIC:
                raise P.ProtocolError("bad CHALLENGE from arbiter")
            sn = body[4:n]
            if not P.hmac.compare_digest(body[n:], P.server_proof(self._secret, self._cn, sn)):
                raise P.ProtocolError("arbiter failed authentication (wrong secret?)")
            self._session = P.Session(P.session_key(self._secret, self._cn, sn), is_server=False)
            self._cstate = "register"
            self._write_locked(P.frame(P.client_proof(self._secret, self._cn, sn)))
            self._write_locked(self._session.seal(P.enc_register(self.job_id, self.link)))
            return
        p = self._session.open(body)
        kind = p[0]
        if kind == P.T_GRANT:
            token = P.dec_token(p)
            self._unacked.pop(token, None)
            req = self._pending.get(token)
            if req is not None and req.state != _LOCAL:
                self._grant_locked(req, self._session_no, cbs, local=False)
            # else: cancelled after max_wait and already granted locally
        elif kind == P.T_QUEUED:
            token = P.dec_token(p)
            self._unacked.pop(token, None)
            req = self._pending.get(token)
            if req is not None and req.state == _SENT:
                req.state = _QUEUED
        elif kind == P.T_PONG:
            self._ping_sent = None
        elif kind == P.T_REGISTERED:
            if self._cstate != "register":
                raise P.ProtocolError("unexpected REGISTERED")
            self._cstate = "ready"
            self._session_no += 1
            self._backoff = self._backoff0
            self._last_ping = now
            self._ping_sent = None
            if self._mode == "fallback":
                self._c["reconnects"] += 1
                log.info("arbiter %s:%d reachable again; job %s on link %s uses it for new chunks",
                         self._addr[0], self._addr[1], self.job_id, self.link)
            self._outage_warned = False
            self._mode = "ready"
            # grant any still-undelivered local grants first, then send the
            # requests that waited for the first connection
            while self._local:
                self._grant_locked(self._local.popleft(), 0, cbs, local=True)
            for req in self._pending.values():
                if req.state == _NEW:
                    self._send_request_locked(req, now)
        elif kind == P.T_ERROR:
            raise P.ProtocolError("arbiter error: %s" % p[1:].decode("utf-8", "replace"))
        elif kind == P.T_STATS_REPLY:
            pass
        else:
            raise P.ProtocolError("unknown message type 0x%02x from arbiter" % kind)


def client_from_config(cfg, on_grant, **kwargs):
    """An :class:`ArbiterClient` from a ``PriorityConfig`` (fields ``arbiter``,
    ``link``, ``job_id``, ``arbiter_secret``, ``arbiter_timeout``), or ``None``
    when the job has not opted in (``arbiter`` or ``link`` unset).

    ``job_id`` defaults to ``"<hostname>-<pid>"``; a missing secret raises
    ``ValueError`` naming ``HOROVOD_PRIO_ARBITER_SECRET``. ``kwargs`` go to
    the constructor (``max_wait``, ``backoff_max``, ...)."""
    address = getattr(cfg, "arbiter", None)
    link = getattr(cfg, "link", None)
    if not address or not link:
        return None
    secret = getattr(cfg, "arbiter_secret", None)
    if not secret:
        raise ValueError("PriorityConfig.arbiter_secret is required when arbiter is set "
                         "(env HOROVOD_PRIO_ARBITER_SECRET)")
    job_id = getattr(cfg, "job_id", None) or "%s-%d" % (socket.gethostname(), os.getpid())
    timeout = getattr(cfg, "arbiter_timeout", None) or 0.05
    return ArbiterClient(address, link, job_id, secret, on_grant, timeout=timeout, **kwargs)


def os_strerror(err):
    try:
        return os.strerror(err)
    except ValueError:
        return "error %d" % err


# ==================================================================== stats
def _recv_frame(sock, reader, deadline):
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("arbiter did not answer in time")
        sock.settimeout(remaining)
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("arbiter closed the connection")
        bodies = reader.feed(data)
        if bodies:
            if len(bodies) > 1:
                raise P.ProtocolError("unexpected extra frames")
            return bodies[0]


def fetch_stats(address, secret, timeout=2.0):
    """Connect, authenticate, return the arbiter's stats dict (blocking)."""
    import json
    host, port = parse_address(address)
    secret = P.load_secret(secret)
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as sock:
        reader = P.FrameReader()
        cn = P.new_nonce()
        sock.sendall(P.frame(P.MAGIC + cn))
        body = _recv_frame(sock, reader, deadline)
        n = len(P.MAGIC) + P.NONCE_LEN
        if len(body) != n + P.MAC_LEN or body[:4] != P.MAGIC:
            raise P.ProtocolError("bad CHALLENGE from arbiter")
        sn = body[4:n]
        if not P.hmac.compare_digest(body[n:], P.server_proof(secret, cn, sn)):
            raise P.ProtocolError("arbiter failed authentication (wrong secret?)")
        sess = P.Session(P.session_key(secret, cn, sn), is_server=False)
        sock.sendall(P.frame(P.client_proof(secret, cn, sn)) + sess.seal(P.enc_empty(P.T_STATS)))
        p = sess.open(_recv_frame(sock, reader, deadline))
        if p[0] != P.T_STATS_REPLY:
            raise P.ProtocolError("unexpected reply type 0x%02x" % p[0])
        return json.loads(p[1:].decode("utf-8"))
