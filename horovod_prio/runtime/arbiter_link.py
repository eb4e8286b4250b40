"""Job side of the cross-job link arbiter: rank 0's scheduler <-> an
:class:`~horovod_prio.arbiter.client.ArbiterClient`. No TensorFlow.

:meth:`ArbiterLink.attach` (called by the runtime on a holding rank -- rank 0
of a multi-rank data-parallel job, the first rank of each role of a
heterogeneous one -- whose config names an arbiter) builds the client, registers the
scheduler's grant callbacks and turns external-grant mode on: every chunk
that passes the local rule (priority order within the local credit) is then
requested at the arbiter under its scheduler *ticket*, and released by the
arbiter's grant of that ticket (or by the client's local fallback grant when
the arbiter is unreachable, dead or hung). A chunk withdrawn while it waits
(its step failed) is cancelled at the arbiter at once, and since grants name
tickets, a late grant can never release another step's chunk of the same
name.

The scheduler calls the callbacks from TensorFlow kernel threads, outside its
lock. They never block (the client only queues a non-blocking send) and never
raise: should the client refuse a request, the chunk is granted locally at
once -- a nested grant from inside the request callback is safe, the
scheduler queues its release behind the callback being delivered -- and one
warning is logged.

Priorities sent to the arbiter are the gates' priorities (the group's base
priority + boost x step), the same scale in every job; the job's class
(``job_priority``) goes with its registration. Each request also carries
the job's training step (:attr:`ArbiterLink.steps`, the step clock's count of
steps begun, set by the runtime once a monitor exists; untagged without one)
so that the arbiter's burst order treats a step as one burst, gaps in its
backward pass included.

Two clients (``config.arbiter_client``): ``native`` (the default) is the
scheduler library's C++ client
(:class:`~horovod_prio.scheduler.arbiter_client.NativeArbiterClient`),
hooked into the scheduler itself: the request is sealed and sent by the
thread that passed the chunk through the local rule, the client's I/O thread
releases the chunk on the grant, and the step tag is read from the step
clock's C counter -- no Python and no GIL on the grant path; the callbacks
below are then not used. ``python`` is
:class:`~horovod_prio.arbiter.client.ArbiterClient` behind the callbacks
below. Both behave the same (one test suite runs against both).
"""
import logging
import threading

__all__ = ["ArbiterLink"]

log = logging.getLogger("horovod_prio")


class ArbiterLink:
    """The attached client plus the scheduler callbacks (one per process)."""

    def __init__(self, scheduler, client, address, link, native=False):
        self.scheduler = scheduler
        self.client = client
        self.address = address
        self.link = link
        self.native = native       # the native client releases chunks itself (no callbacks here)
        self.job_id = client.job_id
        self.steps = None          # () -> steps begun in this process (the request's step tag)
        self.callback_errors = 0   # request/complete/cancel calls that raised
        self.local_grants = 0      # chunks granted locally because request() raised
        self._warned = False
        self._closed = False
        self._close_lock = threading.Lock()

    @classmethod
    def attach(cls, scheduler, config):
        """Join ``config.link`` at ``config.arbiter`` with ``config.arbiter_client``;
        ``None`` if the job did not opt in."""
        if not config.arbiter:
            return None
        from horovod_prio.arbiter.client import client_from_config
        native = getattr(config, "arbiter_client", "native") == "native"
        if native:      # the scheduler sends requests and takes grants itself
            from horovod_prio.scheduler.arbiter_client import NativeArbiterClient
            client = client_from_config(config, on_grant=None, client_cls=NativeArbiterClient,
                                        scheduler=scheduler)
            al = cls(scheduler, client, config.arbiter, config.link, native=True)
            hook = client.attach
        else:           # the scheduler calls back into Python for each chunk
            box = []
            client = client_from_config(config, on_grant=lambda ticket: box[0].on_grant(ticket))
            al = cls(scheduler, client, config.arbiter, config.link)
            box.append(al)

            def hook():
                scheduler.set_grant_callbacks(request=al.on_request, complete=al.on_complete,
                                              cancel=al.on_cancel)
        try:
            hook()
            scheduler.set_external_grant(True)
        except BaseException:
            al.close()
            raise
        log.info("horovod_prio: job %s joined link %s at arbiter %s (class %d, %s client)",
                 al.job_id, config.link, config.arbiter, config.job_priority,
                 "native" if native else "python")
        return al

    def set_steps(self, steps, address=None):
        """The request's step tag: ``steps()`` -> steps begun in this process;
        ``address``, if given, of a C function ``int64_t (*)(void)`` returning
        the same (the native client reads it without Python)."""
        self.steps = steps
        if self.native:
            self.client.set_steps(address or steps)

    # -- scheduler callbacks (TF kernel threads; never block, never raise) ----------
    def on_request(self, ticket, name, priority, nbytes):
        try:
            steps = self.steps
            self.client.request(ticket, priority, nbytes, label=name,
                                step=steps() if steps is not None else 0)
            return
        except BaseException as e:  # noqa: B902 - a ctypes callback must never raise
            self._error("request(%r)" % (name,), e)
        try:
            self.local_grants += 1
            self.scheduler.grant(ticket)
        except BaseException as e:  # noqa: B902
            self._error("local grant of %r" % (name,), e)

    def on_complete(self, ticket):
        try:
            self.client.complete(ticket)
        except BaseException as e:  # noqa: B902
            self._error("complete(%d)" % ticket, e)

    def on_cancel(self, ticket):
        try:
            self.client.cancel(ticket)
        except BaseException as e:  # noqa: B902
            self._error("cancel(%d)" % ticket, e)

    # -- client callback (its I/O thread) --------------------------------------------
    def on_grant(self, ticket):
        self.scheduler.grant(ticket)  # False if withdrawn meanwhile: nothing to do

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
        for what, fn in (("external grant off", lambda: self.scheduler.set_external_grant(False)),
                         ("callbacks off", lambda: self.scheduler.set_grant_callbacks()),
                         ("client close", self.client.close)):
            try:
                fn()
            except Exception:  # the library may be half torn down at exit
                log.debug("horovod_prio: arbiter link %s failed at exit", what, exc_info=True)

    @property
    def counters(self):
        d = dict(self.client.counters)
        # the native client refuses and grants locally inside the scheduler's hook
        refused = d.pop("refused_requests", 0)
        d["callback_errors"] = self.callback_errors + refused
        d["link_local_grants"] = self.local_grants + refused
        return d
