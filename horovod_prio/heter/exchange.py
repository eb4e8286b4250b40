"""The heterogeneous step's exchanges through the runtime: gate, collective, done.

One :class:`Exchanges` per :class:`~horovod_prio.heter.trainer.HeterTrainer`.
It puts the step's traffic under the data-parallel path's machinery, nothing
of its own:

* the process's scheduler and arbiter link come from
  :meth:`horovod_prio.runtime.Runtime.setup` with the job's
  :class:`~horovod_prio.method.config.PriorityConfig` (the ``HOROVOD_PRIO_*``
  knobs); the first rank of each role holds
  (:func:`horovod_prio.method.heter.holders`), so with an arbiter configured
  those ranks join it, in external-grant mode, with the job's class;
* each exchange a role sends (:data:`horovod_prio.method.heter.HELD`) passes
  ``HvdPrioGate`` with its priority and its bytes (with an arbiter and
  several ranks in the sending role, every sender's part:
  :func:`horovod_prio.method.heter.whole_collective`), then
  runs its Horovod alltoall, then ``HvdPrioDone`` frees its credit; the dense
  allreduce is the data-parallel chunk plan of the dense part's gradients,
  one ``HvdPrioAllreduce`` per chunk on the ``dense`` process set, in one
  ``tf.function`` so the scheduler picks their order;
* the step clock (``HvdPrioStepBegin``/``End``) times every rank's part of the
  step; rank 0's monitor runs the adaptive policy on its own step times,
  whatever its role. Its priority vector reaches the other holders by a
  broadcast on Horovod's global set (rank 0 is in it whatever its role; the
  role sets need not hold it), one per step on every rank, run by a thread
  beside the step, so no rank waits for another at the step boundary; a
  gate uses the vector last received (the previous step boundary's, as the
  data-parallel gates do).

The gates forward their tensors unchanged and the collectives are Horovod's
own with the same arguments: the weights are those of the ungated step.
"""
import logging
import queue
import threading

import numpy as np

from horovod_prio.method import heter as rule
from horovod_prio.method.plan import TensorSpec, step_plan

__all__ = ["Exchanges", "PriorityRelay"]

log = logging.getLogger("horovod_prio")


class PriorityRelay:
    """Rank 0's priority vector to every rank: one broadcast on the global
    set per :meth:`post`, in posting order, on a thread of its own. Every rank
    posts once per step (the same broadcasts on every rank); :attr:`latest` is
    the last vector received (``base`` before the first)."""

    def __init__(self, hvd, name, base):
        self.hvd = hvd
        self.name = name
        self.latest = tuple(int(p) for p in base)
        self.relayed = 0
        self.error = None
        self._q = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="horovod_prio-heter-relay",
                                        daemon=True)
        self._thread.start()

    def post(self, vector):
        self._q.put(np.asarray(vector, np.int32))

    def _run(self):
        import tensorflow as tf
        while True:
            vector = self._q.get()
            if vector is None:
                return
            if self.error is not None:
                continue                 # Horovod failed (a rank lost): the step fails too
            try:
                out = self.hvd.broadcast(tf.constant(vector), root_rank=0, name=self.name)
                self.latest = tuple(int(p) for p in out.numpy())
                self.relayed += 1
            except Exception as e:  # noqa: BLE001 - reported once; training decides
                self.error = e
                log.warning("horovod_prio: %s: priority broadcast failed (%s: %s); the gates "
                            "keep the last vector received", self.name, type(e).__name__, e)

    def close(self, timeout=120.0):
        """Wait until every posted vector was broadcast (every rank posted as
        many), then stop. False if the thread did not end within ``timeout``."""
        self._q.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()


class Exchanges:
    """Gated collectives of one trainer (see the module docstring)."""

    def __init__(self, owner, config, roles, rank, hvd, dense_vars, dense_set):
        import tensorflow as tf
        from horovod_prio.runtime import get_runtime
        from horovod_prio.tensorflow import ops
        from horovod_prio.tensorflow.fusion import layer_tasks
        self.tf, self.hvd, self.ops = tf, hvd, ops
        self.enabled = bool(config.enabled)
        self.rank = rank
        self.role = roles.role(rank)
        self.held = frozenset(rule.HELD[self.role]) if self.enabled else frozenset()
        self._dense_set = dense_set
        self.monitor = self.relay = self.plan = None
        self.name = "HeterTrainer"
        self.dense_groups = 0
        self.vector = ()
        self.gated = {}              # exchange -> parts gated (this rank)
        #: whether this rank asks for a held exchange with every sender's part
        #: (:func:`horovod_prio.method.heter.whole_collective`); the trainer
        #: then passes their bytes to :meth:`alltoall`
        self.whole = False
        if not self.enabled:
            return
        size = roles.size
        holder = rule.holders(roles.ranks)[self.role] == rank and size > 1
        self.whole = holder and rule.whole_collective(self.role, roles.ranks,
                                                      bool(config.arbiter and config.link))
        runtime = get_runtime()
        runtime.setup(config, rank, size, owner="HeterTrainer", hold=holder)
        self.holds = runtime.hold
        specs = [TensorSpec(int(np.prod(v.shape)), v.dtype.name, v.dtype.size)
                 for v in dense_vars]
        if specs:
            step = step_plan(specs, layer_tasks(dense_vars), config)
            self.dense_groups = len(step.groups)
        else:
            step, self.dense_groups = None, 0
        n = rule.num_groups(self.dense_groups)
        self.base = tuple(rule.base_vector(self.dense_groups))
        self.name, self.monitor = runtime.identity(
            "HeterTrainer", ("heter", id(owner)), config, n,
            ops.StepClock.get() if config.monitor else None,
            step_bytes=step.step_bytes if step else 0,
            partition_bytes=step.partition_bytes if step else None)
        self.plan = step.plan(self.name + ".dense") if step else None
        self.vector = self.base
        self.priorities = rule.priorities(self.base, self.dense_groups)
        if self.monitor is not None and size > 1:
            self.relay = PriorityRelay(hvd, self.name + ".priorities", self.base)
        self._reduce_fn = None

    # -- the step ------------------------------------------------------------
    def begin(self):
        """The step starts: stamp the clock, take the step's priorities."""
        if self.monitor is None:
            return
        own = tuple(int(p) for p in self.ops.step_begin(self.monitor.slot,
                                                        len(self.base)).numpy())
        if self.relay is not None:
            self.relay.post(own)
            if self.rank != 0:
                own = self.relay.latest
        self.vector = own
        self.priorities = rule.priorities(own, self.dense_groups)

    def end(self):
        """This rank's part of the step is done."""
        if self.monitor is not None:
            self.ops.step_end(self.monitor.slot, [])

    def alltoall(self, tensor, splits, process_set, what, nbytes=None):
        """Horovod's alltoall of this rank's part, through the gate if this
        rank's role sends ``what`` (held on the role's first rank), asked for
        with ``nbytes`` (every sender's part, given when :attr:`whole`) or
        this rank's part's bytes."""
        gated = what in self.held
        chunk = "%s.%s" % (self.name, what)
        if gated:
            tensor = self.ops.gate(tensor, self.priorities[what], chunk,
                                   nbytes=nbytes if self.whole else None)
            self.gated[what] = self.gated.get(what, 0) + 1
        try:
            return self.hvd.alltoall(tensor, splits=np.asarray(splits, np.int32),
                                     name="heter.%s" % what, process_set=process_set)
        finally:
            if gated:
                self.ops.done(tensor, chunk)

    def allreduce_dense(self, grads):
        """The dense gradients summed over the dense trainers."""
        hvd = self.hvd
        if "dense" not in self.held or self.plan is None:
            return [hvd.allreduce(g, op=hvd.Sum, name="heter.dense.%d" % i,
                                  process_set=self._dense_set) for i, g in enumerate(grads)]
        tf = self.tf
        if self._reduce_fn is None:
            self._reduce_fn = tf.function(self._reduce, autograph=False)
        prios = tf.constant([self.priorities["dense:%d" % g] for g in range(self.dense_groups)],
                            tf.int32)
        self.gated["dense"] = self.gated.get("dense", 0) + len(self.plan.chunks)
        return self._reduce_fn(list(grads), prios)

    def _reduce(self, grads, prios):
        from horovod_prio.tensorflow.fusion import pack_chunks, unpack_chunks
        tf, hvd, ops = self.tf, self.hvd, self.ops
        flats = [tf.reshape(g, [-1]) for g in grads]
        one_op = not tf.config.list_logical_devices("GPU") and not hvd.rocm_built()
        reduced = []
        for chunk, x in zip(self.plan.chunks, pack_chunks(flats, self.plan)):
            if one_op:
                reduced.append(ops.allreduce(x, prios[chunk.group], chunk.name, hvd.Sum,
                                             process_set_id=self._dense_set.process_set_id))
            else:
                x = ops.gate(x, prios[chunk.group], chunk.name)
                x = hvd.allreduce(x, op=hvd.Sum, name=chunk.name, process_set=self._dense_set,
                                  ignore_name_scope=True)
                reduced.append(ops.done(x, chunk.name))
        return [tf.reshape(f, tf.shape(g)) for g, f in zip(grads, unpack_chunks(reduced, flats,
                                                                                self.plan))]

    def close(self):
        if self.relay is not None:
            if not self.relay.close():
                log.warning("horovod_prio: %s: the priority broadcasts did not finish",
                            self.name)
            self.relay = None
