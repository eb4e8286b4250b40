"""Rank-0 batch-time monitor and the per-step priority broadcast.

Each training step's graph holds one ``tf.numpy_function`` (the "tick") that
takes no input, so TensorFlow runs it as the step starts; on rank 0 the
interval between two ticks is the batch training time the patent measures.
Rank 0's tick runs :class:`~horovod_prio.policy.AdaptivePriorityPolicy`
(``after_batch`` for the batch that just ended, ``before_batch`` for the one
starting) and returns the priority vector, which ``hvd.broadcast`` then sends
from rank 0 so every rank gates with the same priorities. The tick never
blocks; on other ranks it only moves trace events.
"""
import atexit
import os
import logging
import time

import numpy as np
import tensorflow as tf
import horovod.tensorflow as _hvd

from horovod_prio import cc
from horovod_prio.sequence import base_priorities
from horovod_prio.tensorflow.arbiter_link import attach_arbiter, trace_arbiter_wait
from horovod_prio.trace import TraceWriter

log = logging.getLogger("horovod_prio")
_QUIET = {"warmup", "within"}
_TRACES = {}


class _Trace:
    """The trace file of this process plus the chunks whose spans are still open."""

    def __init__(self, path):
        self.writer = TraceWriter(path)
        self.open_chunks = {}

    def flush_scheduler_events(self):
        _flush_scheduler_events(self.writer, self.open_chunks)


def _trace_for(path):
    if path not in _TRACES:
        _TRACES[path] = _Trace(path)
    return _TRACES[path]


@atexit.register
def _close_traces():
    for trace in list(_TRACES.values()):
        trace.flush_scheduler_events()
        trace.writer.close()


def _flush_scheduler_events(writer, open_chunks):
    """Move the C++ scheduler's chunk events into the trace."""
    try:
        events = cc.drain_events()
    except Exception:  # the op library may be gone at interpreter exit
        return
    for e in events:
        kind, name, ts = e["kind"], e["name"], e["t_us"]
        writer.instant("%s %s" % (kind, name), ts, "chunks", "chunk", e)
        trace_arbiter_wait(writer, e)
        if kind == "ready":
            open_chunks[name] = [ts, None]
        elif kind == "release" and name in open_chunks:
            start = open_chunks[name][0]
            open_chunks[name][1] = ts
            writer.span("wait " + name, start, ts - start, "wait", "chunk",
                        {"priority": e["priority"], "bytes": e["bytes"]})
        elif kind == "done" and name in open_chunks:
            rel = open_chunks.pop(name)[1]
            if rel is not None:
                writer.span("allreduce " + name, rel, ts - rel, "allreduce", "chunk",
                            {"priority": e["priority"], "bytes": e["bytes"]})


def trace_path_for_rank(path, rank):
    """Rank 0 writes HOROVOD_PRIO_TRACE itself; rank r writes <stem>.rank<r><ext>."""
    if rank == 0:
        return path
    stem, ext = os.path.splitext(path)
    return "%s.rank%d%s" % (stem, rank, ext or ".json")


_MONITORS = {}


def get_monitor(name, config, num_groups, process_set=None):
    """One monitor per optimizer/tape name and group count, kept across retraces
    and across the fresh tape objects an eager loop creates every step."""
    key = (name, num_groups, config)
    if key not in _MONITORS:
        _MONITORS[key] = PriorityMonitor(name, config, num_groups, process_set)
    return _MONITORS[key]


class PriorityMonitor:
    """One per DistributedOptimizer / tape: policy on rank 0, broadcast everywhere."""

    def __init__(self, name, config, num_groups, process_set=None):
        self.name = name
        self.config = config
        self.num_groups = num_groups
        self.process_set = process_set or _hvd.global_process_set
        self.rank = _hvd.rank()
        self.base = base_priorities(num_groups)
        self.policy = config.make_policy(num_groups) if self.rank == 0 else None
        self.batches = 0
        self._last = None
        self._trace = None  # _Trace
        hold = self.rank == 0 and self.process_set.size() > 1
        cc.configure(config.credit_bytes, hold)
        self.arbiter = attach_arbiter(config, hold)
        if config.trace_path:
            self._trace = _trace_for(trace_path_for_rank(config.trace_path, self.rank))
            cc.set_tracing(True)
        if self.policy is not None:
            self.policy.add_listener(self._on_event)
        with tf.init_scope():
            # The vector the gates use: last step's broadcast (see priorities_tensor).
            self._vector = tf.Variable(self.base, dtype=tf.int32, trainable=False,
                                       name=name + "_priorities")
        log.info("horovod_prio: %s: %d groups, base priorities %s, partition %d B, credit %d B",
                 name, num_groups, self.base, config.partition_bytes, config.credit_bytes)

    # -- graph side ----------------------------------------------------------------
    def priorities_tensor(self):
        """The priority vector this step's gates use.

        It is the vector rank 0 decided and broadcast at the previous step
        boundary: reading it costs nothing, so no gate ever waits for the tick
        or the broadcast (with few TF threads they can run late in a step).
        This step's tick and broadcast then store the next vector. A decision
        taken as batch k starts therefore applies from batch k + 1, on every
        rank alike.
        """
        current = self._vector.read_value()
        # Every rank builds the same graph (the tick is a no-op off rank 0): an op
        # present on one rank only changes TF's automatic control dependencies
        # there, and two ranks ordering their collectives differently deadlock.
        p = tf.numpy_function(self._tick, [], tf.int32, name=self.name + "_PrioTick")
        p = tf.ensure_shape(p, [self.num_groups])
        p = _hvd.broadcast(p, root_rank=0, name=self.name + "_PrioBcast",
                           process_set=self.process_set, ignore_name_scope=True)
        self._vector.assign(p)  # stateful: tf.function runs it after the read above
        return current

    # -- Python, once per step ----------------------------------------------------
    def _tick(self):
        """Runs as each step starts (on every rank; the policy only on rank 0)."""
        policy = self.policy
        if policy is not None:
            now = time.perf_counter()
            if self._last is not None:
                seconds = now - self._last
                policy.after_batch(seconds)
                if self._trace:
                    wall_us = time.time() * 1e6
                    self._trace.writer.span("step %d" % (self.batches - 1), wall_us - seconds * 1e6,
                                            seconds * 1e6, "steps", "step", {"seconds": seconds})
            self._last = now
            policy.before_batch()
        self.batches += 1
        if self._trace:
            self._trace.flush_scheduler_events()
        return np.asarray(policy.priorities if policy is not None else self.base, dtype=np.int32)

    def _on_event(self, ev):
        msg = ("horovod_prio: %s batch %d %s: time %.4fs min %s threshold %s count %d boost %d "
               "priorities %s" % (self.name, ev.batch, ev.kind, ev.seconds if ev.seconds is not None else -1,
                                  _fmt(ev.min_batch_time), _fmt(ev.threshold), ev.count, ev.boost,
                                  list(ev.priorities)))
        log.log(logging.DEBUG if ev.kind in _QUIET else logging.INFO, msg)
        if self._trace:
            self._trace.writer.instant(ev.kind, time.time() * 1e6, "policy", "policy",
                                       {"batch": ev.batch, "seconds": ev.seconds,
                                        "min": ev.min_batch_time, "threshold": ev.threshold,
                                        "count": ev.count, "boost": ev.boost,
                                        "priorities": list(ev.priorities)})


def _fmt(x):
    return "-" if x is None else "%.4fs" % x
