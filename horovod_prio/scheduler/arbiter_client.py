"""The native arbiter client (``arbiter_client.h/.cc`` in ``libhvdprio_scheduler.so``).

:class:`NativeArbiterClient` has the interface and the behaviour of
:class:`horovod_prio.arbiter.client.ArbiterClient` (that module's docstring
describes both: requests by key, ``on_grant`` exactly once, local fallback
grants, heartbeats, lease renewals, ``max_wait``, reconnects), but its state
machine, HMAC-SHA256 and I/O thread are C++. Given a :class:`Scheduler`
(``scheduler=``) it releases that scheduler's chunks itself: every grant is
``Scheduler::Grant(ticket)`` from its I/O thread, and :meth:`attach` points
the scheduler's external-grant hooks at it, so a chunk's request is sealed
and sent by the thread that passed it through the local rule -- no Python on
the grant path. Without a scheduler ``on_grant(key)`` is called from the I/O
thread, as the Python client does (the tests run both clients through the
same suite that way).

Messages go to the logger ``horovod_prio.arbiter`` (from whichever thread
produced them, never under the client's lock).
"""
import atexit
import ctypes
import logging
import weakref

from horovod_prio.arbiter import placement
from horovod_prio.arbiter import protocol as P
from horovod_prio.arbiter.transport import parse_address

from . import _GRANT_CB, _LOG_CB, _STEPS_CB, _load, _lock, _thunks

__all__ = ["NativeArbiterClient", "hmac_sha256", "STATES"]

_IO_POLICY = {"realtime": 1, "nice": 2}     # ArbiterClient::IoPolicy (arbiter_client.h)

log = logging.getLogger("horovod_prio.arbiter")

#: State names by the C API's code (the Python client's names).
STATES = ("connecting", "handshake", "ready", "backoff", "closed")
_INT_COUNTERS = ("requests", "grants", "arbiter_grants", "fallback_grants", "outages",
                 "reconnects", "max_wait_cancels", "cancels", "renewals", "ignored_grants",
                 "pending", "outstanding", "refused_requests", "sessions")


def _check_int(name, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError("%s must be an int in %d..%d, got %r" % (name, lo, hi, v))


def _check_name(name, v, empty_ok=False):
    if not isinstance(v, str) or (not v and not empty_ok) or len(v.encode()) > P.MAX_NAME:
        raise ValueError("%s must be a %sstring of at most %d bytes, got %r"
                         % (name, "" if empty_ok else "non-empty ", P.MAX_NAME, v))


def _emit(level, msg):
    try:
        log.log(level, "%s", msg.decode("utf-8", "replace"))
    except Exception:  # noqa: BLE001 - a ctypes callback must never raise
        pass


# one logging thunk for every client (never freed: the I/O threads may log at exit)
_LOG_THUNK = _LOG_CB(_emit)
# clients not closed yet: closed at exit, so no I/O thread calls into an
# interpreter that is shutting down (the runtime closes its link earlier)
_live = weakref.WeakSet()


@atexit.register
def _close_all():
    for c in list(_live):
        try:
            c.close(1.0)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def hmac_sha256(key, msg):
    """HMAC-SHA256 as the native client computes it (32 bytes)."""
    out = ctypes.create_string_buffer(32)
    _load().hvdprio_hmac_sha256(bytes(key), len(key), bytes(msg), len(msg), out)
    return out.raw


class NativeArbiterClient:
    """See the module docstring. Thread-safe."""

    def __init__(self, address, link, job_id, secret, on_grant=None, timeout=0.05, *,
                 job_class=0, max_wait=10.0, idle_heartbeat=1.0, handshake_timeout=None,
                 backoff_initial=0.05, backoff_max=2.0, scheduler=None, io_priority=None):
        host, port = parse_address(address)
        io = placement.io_priority(io_priority)
        self.io_priority = io
        _check_name("link", link)
        _check_name("job_id", job_id)
        _check_int("job_class", job_class, P.I32_MIN, P.I32_MAX)
        if scheduler is None and not callable(on_grant):
            raise ValueError("on_grant must be callable, got %r" % (on_grant,))
        if not timeout > 0:
            raise ValueError("timeout must be > 0 seconds, got %r" % (timeout,))
        if not max_wait > 0:
            raise ValueError("max_wait must be > 0 seconds, got %r" % (max_wait,))
        self.link, self.job_id, self.job_class = link, job_id, job_class
        self.address = "%s:%d" % (host, port)
        self.timeout = float(timeout)
        self.max_wait = float(max_wait)
        secret = P.load_secret(secret, "arbiter client %s" % job_id)
        self._lib = _load()
        self._scheduler = scheduler     # kept alive while the client may grant into it
        self._closed = False
        grant = _GRANT_CB()
        if scheduler is None:
            def deliver(key, on_grant=on_grant):
                try:
                    on_grant(int(key))
                except Exception:  # noqa: BLE001 - contained, as the Python client does
                    log.exception("arbiter client: on_grant(%r) raised", int(key))
            grant = _GRANT_CB(deliver)
        self._steps = _STEPS_CB()
        with _lock:
            _thunks.append(grant)       # never freed: a late call must find it
        timing = (ctypes.c_double * 6)(
            self.timeout, self.max_wait, float(idle_heartbeat),
            -1.0 if handshake_timeout is None else float(handshake_timeout),
            float(backoff_initial), float(backoff_max))
        self._h = self._lib.hvdprio_arbiter_new(
            host.encode(), port, link.encode(), job_id.encode(), secret, len(secret), job_class,
            timing, 6, scheduler._h if scheduler is not None else None, grant, _LOG_THUNK,
            _IO_POLICY[io[0]] if io else 0, io[1] if io else 0)
        if not self._h:
            raise ValueError("native arbiter client rejected its settings (address %r, timing %r)"
                             % (address, list(timing)))
        self._fields = tuple(self._lib.hvdprio_arbiter_counter_fields().decode().split(","))
        _live.add(self)

    # ================================================================ API
    def request(self, key, priority, nbytes, label="", step=0):
        """As :meth:`ArbiterClient.request`: ``on_grant(key)`` (or the
        scheduler's release) follows once."""
        _check_int("key", key, 0, P.U64_MAX)
        _check_int("priority", priority, P.I64_MIN, P.I64_MAX)
        _check_int("nbytes", nbytes, 0, P.U64_MAX)
        _check_int("step", step, 0, P.U64_MAX)
        _check_name("label", label, empty_ok=True)
        raw = label.encode()
        rc = self._lib.hvdprio_arbiter_request(self._handle(), key, priority, nbytes, raw,
                                               len(raw), step)
        if rc == 1:
            raise RuntimeError("ArbiterClient is closed")
        if rc == 2:
            raise ValueError("key %d is already pending or granted" % key)
        if rc != 0:
            raise ValueError("label must be a string of at most %d bytes, got %r"
                             % (P.MAX_NAME, label))

    def complete(self, key):
        """The granted chunk finished. False if ``key`` is not a delivered grant."""
        return bool(self._lib.hvdprio_arbiter_complete(self._h, key))

    def cancel(self, key):
        """As :meth:`ArbiterClient.cancel`; returns whether something was withdrawn."""
        return bool(self._lib.hvdprio_arbiter_cancel(self._h, key))

    def attach(self):
        """Point the scheduler's external-grant hooks (request, complete, cancel)
        at this client; a request it refuses is granted locally with a warning."""
        if self._scheduler is None:
            raise RuntimeError("attach needs the client built with scheduler=")
        self._lib.hvdprio_arbiter_attach(self._handle())

    def set_steps(self, steps):
        """The step tag of the scheduler's requests: ``None`` (untagged), a
        Python callable returning an int, or the address of a C function
        ``int64_t (*)(void)`` (the step clock's own counter: no Python)."""
        if steps is None:
            thunk = _STEPS_CB()
        elif isinstance(steps, int) and not isinstance(steps, bool):
            thunk = ctypes.cast(ctypes.c_void_p(steps), _STEPS_CB)
        elif callable(steps):
            def read(steps=steps):
                try:
                    return max(0, int(steps()))
                except Exception:  # noqa: BLE001 - a ctypes callback must never raise
                    return 0
            thunk = _STEPS_CB(read)
        else:
            raise ValueError("steps must be None, a callable or a C function address, got %r"
                             % (steps,))
        with _lock:
            _thunks.append(thunk)
        self._steps = thunk
        self._lib.hvdprio_arbiter_set_steps(self._handle(), thunk)

    def close(self, timeout=5.0):
        """Stop the I/O thread. Requests still waiting are granted locally first."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        self._lib.hvdprio_arbiter_close(self._h, float(timeout))

    def _handle(self):
        return self._h

    @property
    def connected(self):
        return self.state == "ready"

    @property
    def state(self):
        return STATES[self._lib.hvdprio_arbiter_state(self._h)]

    @property
    def counters(self):
        """The Python client's counters, plus ``refused_requests`` (requests
        from the scheduler the client refused, granted locally) and
        ``sessions`` (registrations so far)."""
        arr = (ctypes.c_double * len(self._fields))()
        self._lib.hvdprio_arbiter_counters(self._h, arr, len(self._fields))
        d = dict(zip(self._fields, arr))
        for k in _INT_COUNTERS:
            d[k] = int(d[k])
        return d

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # the handle is freed only here: the I/O thread and the scheduler's
        # hooks keep the C++ client alive as long as they need it
        try:
            if getattr(self, "_h", None):
                self.close()
                self._lib.hvdprio_arbiter_free(self._h)
                self._h = None
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
