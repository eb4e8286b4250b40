"""The one owner of horovod_prio's process-wide state. No TensorFlow.

A process has one :class:`Runtime` (:func:`get_runtime`, created on first
use). It

* configures the process-wide scheduler once (credit; ``hold`` on rank 0 of a
  multi-rank job only: the other ranks never hold a chunk -- a heterogeneous
  trainer's job holds on the first rank of each role instead);
* attaches the arbiter link (on a holding rank, when the job opted in);
* owns the Chrome trace (one file per rank);
* sets every thread's nice value (``cpu_nice``, :mod:`horovod_prio.runtime.cpu`),
  or, with an arbiter and ``class_auto`` (the default), watches the job's
  link and nices the process while a higher job class is connected to it
  (:mod:`horovod_prio.runtime.class_watch`; every rank);
* tunes glibc malloc where asked (``malloc_tuning``, :mod:`horovod_prio.runtime.malloc`;
  a heterogeneous trainer decides before it reaches here);
* keeps one :class:`~horovod_prio.runtime.monitor.Monitor` per
  optimizer/tape identity and runs the thread that feeds them finished steps
  and flushes the trace;
* on rank 0 with ``autotune`` and an automatic credit, runs the
  :class:`~horovod_prio.runtime.autotune.CreditTuner` on the first monitor's
  step times and applies its choices to the scheduler;
* shuts all of it down once, at exit.

Settings that exist once per process (the scheduler's credit, the arbiter,
the link, the job id and class, the trace file) are taken from the first
optimizer/tape; a later one that asks for a different value gets a
``ValueError`` naming the field and both values - never "the last one
silently wins". Per-optimizer settings (groups, partition size, the policy's
knobs) are each optimizer's own.
"""
import atexit
import logging
import threading

from horovod_prio.method.config import PROCESS_FIELDS  # declared with the fields
from horovod_prio.runtime.autotune import CreditTuner, credit_candidates
from horovod_prio.runtime import malloc
from horovod_prio.runtime.cpu import LowerClassNice, set_process_nice
from horovod_prio.runtime.monitor import Monitor
from horovod_prio.runtime.trace import ChunkTracer, TraceWriter, trace_path_for_rank

__all__ = ["Runtime", "get_runtime", "PROCESS_FIELDS"]

log = logging.getLogger("horovod_prio")



class Runtime:
    """See the module docstring. Thread-safe."""

    def __init__(self, scheduler_factory=None):
        self._scheduler_factory = scheduler_factory
        self._lock = threading.RLock()
        self.scheduler = None
        self.rank = None
        self.size = None
        self.settings = None          # the config whose process fields are in force
        self._settings_owner = None
        self.writer = None
        self.tracer = None
        self.arbiter = None
        self.class_watch = None       # ClassWatcher (class_auto)
        self.lower_nice = None        # LowerClassNice it drives
        self.clock = None
        self.tuner = None
        self.overlap_credit = None      # set once an optimizer overlaps (use_overlap_credit)
        self._tuned_monitor = None
        self.hold = False
        self.monitors = []
        self._identities = {}         # (base name, key) -> (name, monitor)
        self._names = {}              # base name -> how many identities use it
        self._cache = {}
        self._thread = None
        self._stop = threading.Event()
        self._pump_lock = threading.Lock()   # one pump at a time: steps reach a monitor in order
        self._closed = False
        # barrier crossing (runtime/overlap.py): background workers, extra trace events
        self._overlap_workers = []
        self._event_sources = []
        self.overlap_states = []      # the binding's hvd.overlap optimizers (hvd.flush())
        self._said = set()            # first_time()

    # ------------------------------------------------------------------ set-up
    def setup(self, config, rank, size, owner="an optimizer", hold=None):
        """Configure the process for ``config`` (first call) or check that
        ``config`` agrees with the process settings (later calls).

        ``hold``: whether this process's scheduler holds chunks (and, with an
        arbiter configured, joins it). Default: rank 0 of a multi-rank job,
        which is a member of every collective of a data-parallel job. The
        heterogeneous trainer's collectives run on process sets, so there the
        first rank of each role holds (:func:`horovod_prio.method.heter.holders`)."""
        if hold is None:
            hold = rank == 0 and size > 1
        with self._lock:
            if self._closed:
                raise RuntimeError("horovod_prio runtime is shut down (interpreter exit)")
            if self.settings is None:
                self._first_setup(config, rank, size, owner, bool(hold))
                return
            if (rank, size) != (self.rank, self.size):
                raise RuntimeError(
                    "horovod_prio: the process was set up as rank %s of %s, now rank %s of %s: "
                    "Horovod elastic resizing is not supported" % (self.rank, self.size, rank, size))
            if bool(hold) != self.hold:
                raise ValueError(
                    "horovod_prio: %s set the process up %s chunks, %s needs it %s: a "
                    "process is either a data-parallel rank or a heterogeneous trainer's"
                    % (self._settings_owner, "holding" if self.hold else "not holding", owner,
                       "holding" if hold else "not holding"))
            for f in PROCESS_FIELDS:
                mine, theirs = getattr(self.settings, f), getattr(config, f)
                if mine != theirs:
                    shown = ("***", "***") if f == "arbiter_secret" else (mine, theirs)
                    raise ValueError(
                        "PriorityConfig.%s is one setting per process: %s already set it to %r, "
                        "%s asks for %r (env %s); give every optimizer/tape the same value"
                        % (f, self._settings_owner, shown[0], owner, shown[1],
                           config.env_var(f)))

    def _first_setup(self, config, rank, size, owner, hold):
        from horovod_prio.scheduler import Scheduler
        self.scheduler = self._scheduler_factory() if self._scheduler_factory else \
            Scheduler.process()
        self.rank, self.size = rank, size
        self.hold = hold
        if config.cpu_nice is not None:
            set_process_nice(config.cpu_nice, log)
        elif config.class_auto and config.arbiter:
            from horovod_prio.runtime.class_watch import watcher_from_config
            self.lower_nice = LowerClassNice(log)
            try:
                self.class_watch = watcher_from_config(config, self.lower_nice.on_class_state)
            except ValueError as e:
                log.warning("horovod_prio: class_auto off: %s", e)
        malloc.apply(config, False, log)       # data-parallel: only when asked (decided once)
        self._set_credit(config.credit_bytes)
        if config.trace_path:
            path = trace_path_for_rank(config.trace_path, rank)
            self.writer = TraceWriter(path, process_name="horovod_prio rank %d" % rank)
            self.tracer = ChunkTracer(self.writer)
            self.scheduler.set_tracing(True)
        if self.hold:
            from horovod_prio.runtime.arbiter_link import ArbiterLink
            self.arbiter = ArbiterLink.attach(self.scheduler, config)
        if rank == 0 and self.arbiter is None:
            log.info("horovod_prio: no arbiter: priorities order this job's own chunks only; "
                     "the adaptive boost acts against other jobs' traffic only through an "
                     "arbiter (HOROVOD_PRIO_ARBITER), so here it changes nothing")
        self.settings = config
        self._settings_owner = owner
        atexit.register(self.shutdown)

    # ------------------------------------------------------------------ identities
    def cached(self, key, factory):
        """Process-wide cache for objects that must outlive one optimizer/tape
        object (e.g. the reducer an eager loop's fresh tapes share)."""
        with self._lock:
            try:
                return self._cache[key]
            except KeyError:
                value = self._cache[key] = factory()
                return value
            except TypeError:  # unhashable key: no caching
                return factory()

    def identity(self, base_name, key, config, num_groups, clock, step_bytes=0,
                 partition_bytes=None):
        """``(name, monitor)`` of one optimizer/tape identity.

        ``key`` tells identities apart (e.g. the variables reduced): the same
        key always gets the same name and monitor (a fresh tape every step is
        one identity); two keys under one base name get ``base``, ``base_1``,
        ... in first-use order, which is the same on every rank. ``monitor``
        is None when ``config.monitor`` is off (fixed priorities, no step
        timing). ``step_bytes``: the gradient bytes one step sends (the
        tuner's candidates are fractions of it). ``partition_bytes``: the
        chunk size this identity uses (logged; default
        ``config.partition_bytes_for(step_bytes)``)."""
        with self._lock:
            ident = self._identities.get((base_name, key))
            if ident is not None:
                return ident
            n = self._names.get(base_name, 0)
            self._names[base_name] = n + 1
            name = base_name if n == 0 else "%s_%d" % (base_name, n)
            if not config.monitor:
                ident = self._identities[(base_name, key)] = (name, None)
                return ident
            if self.clock is None:
                self.clock = clock
                if self.arbiter is not None:
                    self.arbiter.set_steps(getattr(clock, "steps_begun", None),
                                           getattr(clock, "steps_begun_address", None))
            elif clock is not self.clock:
                raise RuntimeError("horovod_prio: one step clock per process")
            if partition_bytes is None:
                partition_bytes = config.partition_bytes_for(step_bytes)
            monitor = Monitor(name, config, num_groups, self.rank, clock, partition_bytes,
                              self.writer)
            self.monitors.append(monitor)
            ident = self._identities[(base_name, key)] = (name, monitor)
            if self.tuner is None and self.hold and self.settings.autotune \
                    and self.settings.credit_bytes is None:
                from horovod_prio.scheduler import UNLIMITED
                self.tuner = CreditTuner(credit_candidates(step_bytes, UNLIMITED))
                self._tuned_monitor = monitor
                self._apply_tuning(self.tuner.start_value(), "start")
            if self._thread is None and (self.rank == 0 or self.writer is not None):
                self._thread = threading.Thread(target=self._run, name="horovod_prio-runtime",
                                                daemon=True)
                self._thread.start()
            return ident

    # ------------------------------------------------------------------ overlap (docs/overlap.md)
    def use_overlap_credit(self, credit_bytes):
        """An optimizer overlaps, its plan made for ``credit_bytes``
        (:func:`horovod_prio.method.plan.step_plan`: one chunk unless a credit
        was given or autotune decides): where that is not the credit already
        in force it becomes the process's credit - without one the priority
        order never acts and the next forward waits behind every chunk. The
        first overlapped optimizer decides; only rank 0 holds chunks, the
        other ranks record it."""
        if credit_bytes == self.settings.credit_bytes:   # given, or autotune's: in force
            return
        with self._lock:
            if self.overlap_credit is not None:
                return
            self.overlap_credit = credit_bytes
        self._set_credit(credit_bytes)
        log.info("horovod_prio: hvd.overlap: credit %d B (set HOROVOD_PRIO_CREDIT_BYTES to "
                 "choose; 'auto' = no limit)", credit_bytes)

    def add_overlap_worker(self, worker):
        """Own and start an :class:`~horovod_prio.runtime.overlap.OverlapWorker`
        (flushed and stopped at shutdown, before the trace closes)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("horovod_prio runtime is shut down (interpreter exit)")
            self._overlap_workers.append(worker)
        worker.start()

    def add_overlap_state(self, state):
        """Keep an optimizer's ``hvd.overlap`` state (the binding's object) for
        the process-wide ``hvd.flush()``."""
        with self._lock:
            self.overlap_states.append(state)

    def first_time(self, key):
        """True the first time ``key`` is asked about in this process: for
        what is said once per process (a warning per callback class, ...)."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
            return True

    def add_event_source(self, drain):
        """``drain()`` returns Chrome-trace events to write; called by :meth:`pump`."""
        with self._lock:
            self._event_sources.append(drain)

    # ------------------------------------------------------------------ the thread
    def _run(self):
        while not self._stop.is_set():
            try:
                self.clock.wait(0.25)
                self.pump()
            except Exception:  # never take the job down; say it once per kind
                log.exception("horovod_prio: runtime thread error (carrying on)")
                self._stop.wait(0.25)

    def pump(self, wait=None):
        """Hand finished steps to the monitors (and the tuner) and flush the
        trace (the thread's body; also called once more at shutdown, which
        may overlap a thread that did not stop in time). One pump at a time,
        so steps taken from the clock reach their monitor and the tuner in
        order; ``wait`` (s): give up, returning False, if another pump holds
        on that long (None: wait)."""
        if not self._pump_lock.acquire(timeout=-1 if wait is None else wait):
            return False
        try:
            with self._lock:
                monitors = list(self.monitors)
            for m in monitors:
                steps = self.clock.take_steps(m.slot)
                m.on_steps(steps)
                if self.tuner is not None and m is self._tuned_monitor:
                    for begin, end in steps:
                        credit = self.tuner.on_step(max(0.0, end - begin))
                        if credit is not None:
                            self._apply_tuning(credit, self.tuner.choices[-1][2])
            if self.tracer is not None:
                self.tracer.add(self.scheduler.drain_events())
                for drain in list(self._event_sources):
                    for event in drain():
                        self.writer.emit(event)
                self.writer.flush()
        finally:
            self._pump_lock.release()
        return True

    def autotune_state(self):
        """``{"step", "choice", "why", "credit_bytes"}``: the tuner's latest choice
        (the step it was made at, the credit, why) and the scheduler's credit in
        force, read together (under the pump lock, so never a choice the runtime
        thread has half applied); None where nothing is tuned (autotune off, an
        explicit credit, or a rank other than 0)."""
        with self._pump_lock:
            if self.tuner is None:
                return None
            step, choice, why = self.tuner.choices[-1]
            return {"step": step, "choice": choice, "why": why,
                    "credit_bytes": self.scheduler.stats()["credit_bytes"]}

    def _set_credit(self, credit_bytes):
        """Put ``credit_bytes`` (``None``: no limit) in force: the one place
        the process's scheduler credit is set (set-up, hvd.overlap, autotune)."""
        from horovod_prio.scheduler import UNLIMITED
        self.scheduler.configure(UNLIMITED if credit_bytes is None else credit_bytes, self.hold)

    def _apply_tuning(self, credit, why):
        """Rank 0's credit (only rank 0 holds chunks and tunes)."""
        from horovod_prio.scheduler import UNLIMITED
        self._set_credit(credit)
        shown = "unlimited" if credit == UNLIMITED else "%d B" % credit
        log.info("horovod_prio: autotune: credit %s (%s)", shown, why)
        if self.writer is not None:
            import time
            self.writer.instant("autotune credit " + shown, time.time() * 1e6, "policy",
                                "autotune", {"credit_bytes": credit, "why": why})

    # ------------------------------------------------------------------ exit
    def shutdown(self):
        """Idempotent: stop the thread, flush and close the trace, detach the arbiter."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for worker in self._overlap_workers:  # flush posted updates while Horovod is alive
            worker.stop()
        self._stop.set()
        if self.clock is not None:
            self.clock.wake()
        if self._thread is not None:
            self._thread.join(5.0)
        if self.class_watch is not None:
            self.class_watch.close()
        if self.arbiter is not None:
            self.arbiter.close()
        if self.writer is not None:
            try:
                if self.clock is not None:
                    if not self.pump(wait=5.0):
                        log.debug("horovod_prio: runtime thread still pumping; final trace "
                                  "flush skipped")
                else:
                    self.tracer.add(self.scheduler.drain_events())
            except Exception:
                log.debug("horovod_prio: final trace flush failed", exc_info=True)
            self.writer.close()


_runtime = None
_runtime_lock = threading.Lock()


def get_runtime():
    """The process's :class:`Runtime` (created on first use)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime()
        return _runtime
