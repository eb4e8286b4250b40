"""Job side of the cross-job link arbiter: connects rank 0's C++ scheduler to
an :class:`~horovod_prio.arbiter.client.ArbiterClient`.

``attach_arbiter(config, hold)`` is called by every
:class:`~horovod_prio.tensorflow.monitor.PriorityMonitor` right after
``cc.configure``. On rank 0 of a multi-rank job (``hold``) whose config names
an arbiter and a link, it (once per process -- all monitors share the one
scheduler) builds the client with ``on_grant=cc.grant``, registers the
scheduler's grant callbacks and turns external-grant mode on: every chunk that
passes the local rule (priority order within the local credit) is then asked
for at the arbiter, and released by the arbiter's grant (or by the client's
local fallback grant when the arbiter is unreachable, dead or hung).

The scheduler calls the callbacks from TensorFlow kernel threads, outside its
lock. They never block (``ArbiterClient.request``/``complete`` only queue a
non-blocking send) and never raise: should the client refuse a request (bad
chunk name, closed, internal error) the chunk is granted locally at once via
``cc.grant`` -- a nested ``Grant`` from inside the request callback is safe,
the scheduler queues its release behind the callback being delivered -- and
one warning is logged.

At interpreter exit: external grant off first (releases every chunk still
waiting for a grant), then the callbacks are unregistered and the client
closed (its pending requests get local grants, which find nothing left and
are ignored).

Priorities sent to the arbiter are the gate's priorities, i.e. the group's
base priority + boost x step -- the same scale in every job.
"""
import atexit
import collections
import logging
import threading

from horovod_prio import cc

__all__ = ["attach_arbiter", "active_link", "ArbiterLink", "trace_arbiter_wait"]

log = logging.getLogger("horovod_prio")

_lock = threading.Lock()
_link = None          # the process's ArbiterLink, once attached
_closed = False       # detached at exit: never attach again


class ArbiterLink:
    """The attached client plus the scheduler callbacks (one per process)."""

    def __init__(self, client, address, link, job_id):
        self.client = client
        self.address = address
        self.link = link
        self.job_id = job_id
        self.callback_errors = 0        # request/complete calls that raised
        self.local_grants = 0           # chunks granted locally because request() raised
        self._warned = False
        self._closed = False
        self._close_lock = threading.Lock()

    # -- scheduler callbacks (TF kernel threads; never block, never raise) ----------
    def on_request(self, name, priority, nbytes):
        try:
            self.client.request(name, priority, nbytes)
            return
        except BaseException as e:  # noqa: B902 - a ctypes callback must never raise
            self._error("request(%r)" % (name,), e)
        try:
            self.local_grants += 1
            cc.grant(name)
        except BaseException as e:  # noqa: B902
            self._error("local grant of %r" % (name,), e)

    def on_complete(self, name):
        try:
            self.client.complete(name)
        except BaseException as e:  # noqa: B902
            self._error("complete(%r)" % (name,), e)

    def _error(self, what, exc):
        self.callback_errors += 1
        if self._closed:
            return                      # client closed at exit: expected, stay quiet
        if not self._warned:
            self._warned = True
            log.warning("horovod_prio: arbiter client %s failed (%s: %s); the chunk is granted "
                        "locally (further failures are logged at debug level)",
                        what, type(exc).__name__, exc)
        else:
            log.debug("horovod_prio: arbiter client %s failed: %r", what, exc)

    # -- lifecycle ------------------------------------------------------------------
    def close(self):
        """Idempotent: external grant off (releases all pending), callbacks off, client closed."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            cc.set_external_grant(False)
        except Exception:  # the op library may be half torn down at exit
            log.debug("horovod_prio: set_external_grant(False) failed at exit", exc_info=True)
        try:
            cc.set_grant_callbacks(None, None)
        except Exception:
            log.debug("horovod_prio: unregistering the grant callbacks failed", exc_info=True)
        try:
            self.client.close()
        except Exception:
            log.debug("horovod_prio: closing the arbiter client failed", exc_info=True)

    @property
    def counters(self):
        d = dict(self.client.counters)
        d["callback_errors"] = self.callback_errors
        d["link_local_grants"] = self.local_grants
        return d


def _on_grant(name):
    cc.grant(name)  # False if the chunk was already released (exit): nothing to do


def attach_arbiter(config, hold):
    """Join ``config.link`` at ``config.arbiter`` (rank 0 of a multi-rank job only).

    Returns the process's :class:`ArbiterLink`, or ``None`` (and changes
    nothing) when ``hold`` is false or the job did not opt in (``arbiter`` or
    ``link`` unset). Raises ``ValueError`` (on every rank, so the job fails
    consistently) when the arbiter is set without ``arbiter_secret``.
    """
    global _link
    address = getattr(config, "arbiter", None)
    link = getattr(config, "link", None)
    if not address or not link:
        return None
    if not getattr(config, "arbiter_secret", None):
        raise ValueError("PriorityConfig.arbiter_secret is required when arbiter is set "
                         "(env HOROVOD_PRIO_ARBITER_SECRET)")
    if not hold:
        return None
    with _lock:
        if _link is not None:
            if (address, link) != (_link.address, _link.link):
                log.warning("horovod_prio: this process already joined link %s at arbiter %s; "
                            "ignoring arbiter %s / link %s of another optimizer",
                            _link.link, _link.address, address, link)
            return _link
        if _closed:
            return None
        from horovod_prio.arbiter.client import client_from_config
        client = client_from_config(config, on_grant=_on_grant)
        if client is None:
            return None
        al = ArbiterLink(client, address, link, client.job_id)
        try:
            cc.set_grant_callbacks(request=al.on_request, complete=al.on_complete)
            cc.set_external_grant(True)
        except BaseException:
            al.close()
            raise
        _link = al
        atexit.register(_detach)
    log.info("horovod_prio: job %s joined link %s at arbiter %s", al.job_id, link, address)
    return al


def active_link():
    """The process's attached :class:`ArbiterLink` (None if not attached)."""
    return _link


def _detach():
    global _closed
    with _lock:
        _closed = True
        al = _link
    if al is not None:
        al.close()


_requested_at = {}    # chunk name -> request times (us) not yet released, oldest first


def trace_arbiter_wait(writer, e):
    """Trace hook (rank 0's monitor calls it for every scheduler event): a span
    "arbiter <chunk>" from a chunk's request to its release, i.e. the time it
    waited for the arbiter's (or the local fallback's) grant."""
    kind, name = e["kind"], e["name"]
    if kind == "request":
        _requested_at.setdefault(name, collections.deque()).append(e["t_us"])
    elif kind in ("release", "cancel"):
        dq = _requested_at.get(name)
        if not dq:
            return
        start = dq.popleft()
        if not dq:
            del _requested_at[name]
        if kind == "release":
            writer.span("arbiter " + name, start, e["t_us"] - start, "arbiter", "arbiter",
                        {"priority": e["priority"], "bytes": e["bytes"]})
