"""The release scheduler: a TF-free Python handle on ``libhvdprio_scheduler.so``.

The release rule itself is C++ (``scheduler.h``/``scheduler.cc``, no
TensorFlow or Horovod types); ``c_api.h`` exposes it to C callers and, through
ctypes, to this module. One class, :class:`Scheduler`:

* ``Scheduler.process()`` - the process-wide instance the TensorFlow kernels
  (``HvdPrioGate`` / ``HvdPrioDone``) submit to and complete; the runtime
  configures it (credit, hold, tracing, arbiter hooks).
* ``Scheduler()`` - a private instance, e.g. one per job in the simulator,
  which drives it through the polling calls (``submit`` then
  ``take_released``).

Chunks are named by the *ticket* ``submit`` returns; ``grant``, ``cancel``
and ``complete_ticket`` take tickets, so a late call about one submission can
never reach another submission of the same chunk name.
"""
import ctypes
import json
import os
import threading

__all__ = ["Scheduler", "SchedulerError", "library_path", "STATS_FIELDS", "UNLIMITED",
           "CANCEL_RESULTS"]

LIBRARY = "libhvdprio_scheduler.so"
API_VERSION = 3
#: ``credit_bytes`` value meaning "no byte limit".
UNLIMITED = (1 << 63) - 1
STATS_FIELDS = (
    "submitted", "released", "completed", "max_inflight_bytes", "queued",
    "inflight_bytes", "inflight_chunks", "unknown_completions", "dropped_events",
    "credit_bytes", "hold", "external_grant", "requested", "unknown_grants", "tracing",
    "cancelled", "abandoned",
)
#: What :meth:`Scheduler.cancel` found, by the C API's return code.
CANCEL_RESULTS = ("unknown", "waiting", "requested", "inflight")

_HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_HINT = ("build it with `make install` or `pip install --no-build-isolation --no-deps -e .` "
              "in the repository root")

_REQUEST_CB = ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_int64,
                               ctypes.c_int64)
_TICKET_CB = ctypes.CFUNCTYPE(None, ctypes.c_uint64)
_GRANT_CB = ctypes.CFUNCTYPE(None, ctypes.c_uint64)
_LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p)
_STEPS_CB = ctypes.CFUNCTYPE(ctypes.c_int64)

# Module state that stays here rather than in the runtime (the owner of the
# process's settings): the loaded library (one per process, like any shared
# library) and the Python handle of its process-wide scheduler, which is a C++
# singleton because the TensorFlow kernels, loaded by TF outside our control,
# reach it through hvdprio_global(); the runtime configures it.
_lock = threading.RLock()
_lib = None
_process = None
# ctypes callback thunks are never freed: a thread may still be inside an old
# one right after it was replaced.
_thunks = []


class SchedulerError(RuntimeError):
    """The scheduler library is missing, stale or cannot be loaded."""


def library_path():
    """Real path of ``libhvdprio_scheduler.so`` (SchedulerError if not built)."""
    path = os.path.join(_HERE, LIBRARY)
    if not os.path.exists(path):
        raise SchedulerError("horovod_prio scheduler library %s not found: %s" % (path, BUILD_HINT))
    return os.path.realpath(path)


def _load():
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise SchedulerError("cannot load %s (%s): %s" % (path, e, BUILD_HINT)) from e
        u64, i64, i64p, c_int = ctypes.c_uint64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), \
            ctypes.c_int
        h = ctypes.c_void_p
        sigs = {
            "hvdprio_api_version": (c_int, []),
            "hvdprio_global": (h, []),
            "hvdprio_new": (h, []),
            "hvdprio_free": (None, [h]),
            "hvdprio_configure": (c_int, [h, i64, c_int]),
            "hvdprio_set_tracing": (None, [h, c_int]),
            "hvdprio_set_max_events": (None, [h, i64]),
            "hvdprio_submit": (u64, [h, ctypes.c_char_p, i64, i64]),
            "hvdprio_submit_notify": (u64, [h, ctypes.c_char_p, i64, i64, c_int]),
            "hvdprio_take_released": (i64, [h, ctypes.POINTER(u64), i64]),
            "hvdprio_take_requests": (i64, [h, ctypes.POINTER(u64), i64p, i64p, i64]),
            "hvdprio_complete": (c_int, [h, ctypes.c_char_p]),
            "hvdprio_complete_ticket": (c_int, [h, u64]),
            "hvdprio_cancel": (c_int, [h, u64]),
            "hvdprio_abandon_inflight": (i64, [h]),
            "hvdprio_set_external_grant": (None, [h, c_int]),
            "hvdprio_set_grant_callbacks": (None, [h, _REQUEST_CB, _TICKET_CB, _TICKET_CB]),
            "hvdprio_grant": (c_int, [h, u64]),
            "hvdprio_drain_events": (i64, [h, ctypes.c_char_p, i64]),
            "hvdprio_stats_fields": (ctypes.c_char_p, []),
            "hvdprio_stats": (c_int, [h, i64p, c_int]),
            "hvdprio_reset": (c_int, [h]),
            # the native arbiter client (arbiter_client.py)
            "hvdprio_arbiter_counter_fields": (ctypes.c_char_p, []),
            "hvdprio_arbiter_new": (h, [ctypes.c_char_p, c_int, ctypes.c_char_p, ctypes.c_char_p,
                                        ctypes.c_char_p, i64, ctypes.c_int32,
                                        ctypes.POINTER(ctypes.c_double), c_int, h,
                                        _GRANT_CB, _LOG_CB, c_int, c_int]),
            "hvdprio_arbiter_request": (c_int, [h, u64, i64, u64, ctypes.c_char_p, i64, u64]),
            "hvdprio_arbiter_complete": (c_int, [h, u64]),
            "hvdprio_arbiter_cancel": (c_int, [h, u64]),
            "hvdprio_arbiter_attach": (c_int, [h]),
            "hvdprio_arbiter_set_steps": (None, [h, _STEPS_CB]),
            "hvdprio_arbiter_state": (c_int, [h]),
            "hvdprio_arbiter_counters": (c_int, [h, ctypes.POINTER(ctypes.c_double), c_int]),
            "hvdprio_arbiter_close": (None, [h, ctypes.c_double]),
            "hvdprio_arbiter_free": (None, [h]),
            "hvdprio_hmac_sha256": (None, [ctypes.c_char_p, i64, ctypes.c_char_p, i64,
                                           ctypes.c_char_p]),
        }
        try:
            for name, (res, args) in sigs.items():
                fn = getattr(lib, name)
                fn.restype = res
                fn.argtypes = args
        except AttributeError as e:
            raise SchedulerError("stale scheduler library %s (%s): %s" % (path, e, BUILD_HINT)) from e
        version = lib.hvdprio_api_version()
        fields = tuple(lib.hvdprio_stats_fields().decode().split(","))
        if version != API_VERSION or fields != STATS_FIELDS:
            raise SchedulerError("stale scheduler library %s (API %d, stats %s; expected API %d): %s"
                                 % (path, version, ",".join(fields), API_VERSION, BUILD_HINT))
        _lib = lib
        return lib


def _check_name(name, what):
    if not isinstance(name, str) or not name:
        raise ValueError("%s: name must be a non-empty str, got %r" % (what, name))
    return name.encode()


def _check_int(value, what, minimum=None, maximum=None):
    if isinstance(value, bool) or not isinstance(value, int) \
            or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        rng = "" if minimum is None else " >= %d" % minimum
        raise ValueError("%s must be an int%s, got %r" % (what, rng, value))
    return value


class Scheduler:
    """One scheduler instance; see the module docstring.

    ``Scheduler()`` owns a new instance (freed by :meth:`close` or when
    garbage-collected); ``Scheduler.process()`` is the process-wide one.
    """

    def __init__(self, _handle=None):
        self._lib = _load()
        if _handle is None:
            self._h = self._lib.hvdprio_new()
            self._owned = True
        else:
            self._h = _handle
            self._owned = False

    @classmethod
    def process(cls):
        """The process-wide scheduler (the one the TensorFlow kernels use)."""
        global _process
        lib = _load()
        with _lock:
            if _process is None:
                _process = cls(_handle=lib.hvdprio_global())
            return _process

    def close(self):
        if self._owned and self._h:
            self._lib.hvdprio_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    # ------------------------------------------------------------ configuration
    def configure(self, credit_bytes, hold):
        """Credit (int >= 0 bytes; :data:`UNLIMITED` = no limit) and hold (rank 0: True)."""
        _check_int(credit_bytes, "configure: credit_bytes", 0, UNLIMITED)
        if not isinstance(hold, bool):
            raise ValueError("configure: hold must be a bool, got %r" % (hold,))
        if self._lib.hvdprio_configure(self._h, credit_bytes, int(hold)) != 0:
            raise ValueError("configure: credit_bytes rejected by the scheduler: %r" % (credit_bytes,))

    def set_tracing(self, on):
        """Record ready/request/release/done/cancel/abandon events (see drain_events)."""
        self._lib.hvdprio_set_tracing(self._h, int(bool(on)))

    def set_max_events(self, n):
        """Bound of the event buffer (default 1,000,000); extra events count as dropped."""
        _check_int(n, "set_max_events: n", 0)
        self._lib.hvdprio_set_max_events(self._h, n)

    # ------------------------------------------------------------ polling calls
    def submit(self, name, priority, nbytes):
        """Submit a chunk without a release callback; returns its ticket. Released
        tickets are collected with :meth:`take_released`."""
        raw = _check_name(name, "submit")
        _check_int(priority, "submit: priority", -(1 << 63), (1 << 63) - 1)
        _check_int(nbytes, "submit: nbytes", 0)
        return int(self._lib.hvdprio_submit(self._h, raw, priority, nbytes))

    def submit_notify(self, name, priority, nbytes, fd):
        """Submit a chunk whose release writes its ticket (8 bytes, native byte
        order) to the file descriptor ``fd`` (e.g. a pipe's write end), so a
        caller can block in ``os.read`` until it is released; returns the ticket.
        The chunk never appears in :meth:`take_released`."""
        raw = _check_name(name, "submit_notify")
        _check_int(priority, "submit_notify: priority", -(1 << 63), (1 << 63) - 1)
        _check_int(nbytes, "submit_notify: nbytes", 0)
        _check_int(fd, "submit_notify: fd", 0, (1 << 31) - 1)
        return int(self._lib.hvdprio_submit_notify(self._h, raw, priority, nbytes, fd))

    def take_released(self):
        """Tickets released since the last call, in release order."""
        out = []
        buf = (ctypes.c_uint64 * 256)()
        while True:
            n = self._lib.hvdprio_take_released(self._h, buf, 256)
            out.extend(int(buf[i]) for i in range(n))
            if n < 256:
                return out

    def take_requests(self):
        """External-grant requests since the last call (no request callback set),
        as ``(ticket, priority, nbytes)`` in request order."""
        out = []
        t = (ctypes.c_uint64 * 256)()
        p = (ctypes.c_int64 * 256)()
        b = (ctypes.c_int64 * 256)()
        while True:
            n = self._lib.hvdprio_take_requests(self._h, t, p, b, 256)
            out.extend((int(t[i]), int(p[i]), int(b[i])) for i in range(n))
            if n < 256:
                return out

    # ------------------------------------------------------------ lifecycle of a chunk
    def complete(self, name):
        """The oldest in-flight chunk named ``name`` finished; False if none is in flight."""
        return bool(self._lib.hvdprio_complete(self._h, _check_name(name, "complete")))

    def complete_ticket(self, ticket):
        """In-flight chunk ``ticket`` finished; False if it is not in flight."""
        return bool(self._lib.hvdprio_complete_ticket(self._h, _check_int(ticket, "ticket", 1)))

    def cancel(self, ticket):
        """Withdraw a waiting/requested chunk or abandon an in-flight one; returns what
        was found: ``"unknown"``, ``"waiting"``, ``"requested"`` or ``"inflight"``."""
        return CANCEL_RESULTS[self._lib.hvdprio_cancel(self._h, _check_int(ticket, "ticket", 1))]

    def abandon_inflight(self):
        """Abandon every in-flight chunk (their bytes are freed); returns how many."""
        return int(self._lib.hvdprio_abandon_inflight(self._h))

    # ------------------------------------------------------------ external grants
    def set_external_grant(self, on):
        """When on (and hold is on), a chunk that passes the local rule is requested and
        released only by :meth:`grant`. Turning it off releases every pending request."""
        self._lib.hvdprio_set_external_grant(self._h, int(bool(on)))

    def set_grant_callbacks(self, request=None, complete=None, cancel=None):
        """``request(ticket, name, priority, nbytes)``: a chunk asks for the link;
        ``complete(ticket)``: a granted chunk finished; ``cancel(ticket)``: a requested
        chunk was withdrawn or a granted one abandoned. Called from the thread whose call
        caused them, outside the scheduler's lock; they must not block or raise. None
        unregisters one (requests then queue for :meth:`take_requests`)."""
        req = _REQUEST_CB(lambda t, n, p, b: request(int(t), n.decode(), int(p), int(b))) \
            if request else _REQUEST_CB()
        com = _TICKET_CB(lambda t: complete(int(t))) if complete else _TICKET_CB()
        can = _TICKET_CB(lambda t: cancel(int(t))) if cancel else _TICKET_CB()
        with _lock:
            _thunks.append((req, com, can))
        self._lib.hvdprio_set_grant_callbacks(self._h, req, com, can)

    def grant(self, ticket):
        """Release requested chunk ``ticket``; False if it is not waiting for a grant."""
        return bool(self._lib.hvdprio_grant(self._h, _check_int(ticket, "ticket", 1)))

    # ------------------------------------------------------------ observation
    def drain_events(self):
        """Return and forget the recorded events, oldest first, as dicts with keys kind,
        name, ticket, priority, bytes, t_us (system clock, microseconds), queued,
        inflight_bytes and, for "request"/"release", waiting and waiting_max_priority."""
        cap = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = self._lib.hvdprio_drain_events(self._h, buf, cap)
            if n >= 0:
                text = buf.raw[:n].decode("utf-8", "replace")
                return [json.loads(line) for line in text.splitlines() if line]
            cap = max(-n, cap * 2)

    def stats(self):
        """Counters and state as a dict (keys: STATS_FIELDS); hold/tracing/external_grant are bools."""
        arr = (ctypes.c_int64 * len(STATS_FIELDS))()
        self._lib.hvdprio_stats(self._h, arr, len(STATS_FIELDS))
        out = dict(zip(STATS_FIELDS, (int(v) for v in arr)))
        for k in ("hold", "tracing", "external_grant"):
            out[k] = bool(out[k])
        return out

    def reset(self):
        """Back to defaults (credit 0, hold off, tracing off, counters/events cleared).
        Raises RuntimeError if chunks are still waiting or requested."""
        if not self._lib.hvdprio_reset(self._h):
            raise RuntimeError("reset: refused, chunks are still waiting in the scheduler: %r"
                               % self.stats())
