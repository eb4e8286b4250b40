"""The timing monitor of one optimizer/tape. No TensorFlow.

What is measured: the *training step* itself, from the moment the step's
graph starts running (``HvdPrioStepBegin``, an op with no inputs) to the
moment its last gradient is reduced (``HvdPrioStepEnd``, after every chunk's
allreduce). Input stalls between steps, callbacks, checkpoints and epoch-end
validation run outside that window and do not count. (With
``backward_passes_per_step > 1`` the reduction runs inside Horovod's
aggregation branch, so the window covers the reducing pass only.)

The framework binding stamps those two moments into a *step clock* (for
TensorFlow: kernels in ``horovod_prio/tensorflow/kernels``); the runtime's
thread hands the finished steps to :meth:`Monitor.on_steps`. On rank 0 that
runs :class:`~horovod_prio.method.policy.AdaptivePriorityPolicy`
(``after_batch`` with the step time, then ``before_batch`` for the next
step) and puts the new priority vector into the clock, where the gates of
the next step to start read it. Only rank 0's priorities take effect (it
alone holds chunks and talks to the arbiter), so no rank broadcasts them.

A step clock (duck-typed, see ``horovod_prio.tensorflow.ops.StepClock``) has
``new_slot(priorities) -> slot``, ``set_priorities(slot, priorities)``,
``wait(timeout)``, ``take_steps(slot) -> [(begin_s, end_s)]`` (monotonic
seconds), ``wake()`` and, optionally, ``steps_begun() -> int`` (steps begun
so far in the process; the arbiter link tags requests with it) and
``steps_begun_address`` (of a C function returning the same: the native
arbiter client reads it without Python).
"""
import collections
import logging
import time

from horovod_prio.method.sequence import base_priorities

__all__ = ["Monitor"]

log = logging.getLogger("horovod_prio")



class Monitor:
    """One per optimizer/tape identity: policy on rank 0, step spans in the trace."""

    def __init__(self, name, config, num_groups, rank, clock, partition_bytes, writer=None):
        self.name = name
        self.config = config
        self.num_groups = num_groups
        self.rank = rank
        self.clock = clock
        self.writer = writer
        self.base = tuple(base_priorities(num_groups))
        self.slot = clock.new_slot(self.base)
        self.steps = 0
        self.policy = config.make_policy(num_groups) if rank == 0 else None
        self._last_boost = 0
        # what the end-of-fit summary and TensorBoard show (bounded: a long job keeps
        # its totals and the most recent steps/events)
        self.total_seconds = 0.0
        self.min_seconds = None
        self.max_seconds = None
        self.recent = collections.deque(maxlen=100000)   # (step, seconds, boost)
        self.events = collections.deque(maxlen=10000)    # (step, kind, boost)
        self.raises = self.decays = 0
        if self.policy is not None:
            self.policy.add_listener(self._on_event)
            self.policy.before_batch()  # the patent's check before the first batch
        log.info("horovod_prio: %s: %d groups, base priorities %s, partition %d B",
                 name, num_groups, list(self.base), partition_bytes)

    @property
    def priorities(self):
        return self.policy.priorities if self.policy is not None else self.base

    def on_steps(self, steps):
        """Feed finished steps ``[(begin_s, end_s), ...]`` (monotonic seconds), oldest first."""
        if not steps:
            return
        offset_us = (time.time() - time.monotonic()) * 1e6
        for begin, end in steps:
            seconds = max(0.0, end - begin)
            if self.writer is not None:
                self.writer.span("step %d" % self.steps, begin * 1e6 + offset_us, seconds * 1e6,
                                 "steps", "step", {"seconds": seconds, "monitor": self.name})
            if self.policy is not None:
                self.policy.after_batch(seconds)
                self.policy.before_batch()
            self.total_seconds += seconds
            self.min_seconds = seconds if self.min_seconds is None else min(self.min_seconds,
                                                                            seconds)
            self.max_seconds = seconds if self.max_seconds is None else max(self.max_seconds,
                                                                            seconds)
            self.recent.append((self.steps, seconds, self._last_boost))
            self.steps += 1
        if self.policy is not None:
            self.clock.set_priorities(self.slot, self.policy.priorities)

    def _on_event(self, ev):
        if ev.kind == "calibrate" and not self.policy.calibrating:
            log.info("horovod_prio: %s: slow-step threshold measured over %d steps: min %.4fs + "
                     "slack %.4fs (from the spread of step times; set "
                     "HOROVOD_PRIO_COEFFICIENT to fix it)", self.name, self.policy.calibration_batches,
                     ev.min_batch_time, self.policy.coefficient)
        # INFO for what changes the priorities (a raise, a decay that lowered the
        # boost); the rest (warm-up, calibration, new min, within, no-op decay) at DEBUG.
        changed = ev.boost != self._last_boost
        if changed:
            self.raises += ev.boost > self._last_boost
            self.decays += ev.boost < self._last_boost
            self.events.append((self.steps, ev.kind, ev.boost))
        self._last_boost = ev.boost
        log.log(logging.INFO if changed or ev.kind == "slow" else logging.DEBUG,
                "horovod_prio: %s batch %d %s: time %s min %s threshold %s count %d boost %d "
                "priorities %s", self.name, ev.batch, ev.kind, _fmt(ev.seconds),
                _fmt(ev.min_batch_time), _fmt(ev.threshold), ev.count, ev.boost,
                list(ev.priorities))
        if self.writer is not None:
            self.writer.instant(ev.kind, time.time() * 1e6, "policy", "policy",
                                dict(ev.as_dict(), monitor=self.name))


def _fmt(x):
    return "-" if x is None else "%.4fs" % x
