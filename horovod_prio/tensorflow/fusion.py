"""Priority tensor fusion: the replacement for Horovod's ``allreduce_grads``.

Horovod's optimizers and tapes call ``self._allreduce_grads(grads, vars,
use_generic_names)``. :class:`PriorityAllreduce` is a drop-in for that
callable; it builds the graph side of the chunk plan
(:func:`horovod_prio.method.plan.make_plan`):

1. variables -> tasks (one per layer, backprop order; :func:`layer_tasks`)
   -> groups -> chunks of at most
   :meth:`~horovod_prio.method.config.PriorityConfig.partition_bytes_for` the
   step's gradient bytes, each made of the gradient segments it covers (a
   gradient is cut only where a chunk can be held back, and where none can
   one of half a chunk or more goes alone:
   :meth:`~horovod_prio.method.config.PriorityConfig.splits_tensors`);
2. every chunk is compressed exactly as Horovod would (per tensor, before
   fusion) and goes ``HvdPrioGate -> hvd.allreduce -> HvdPrioDone``; the gate
   takes its group's priority from ``HvdPrioStepBegin`` (the vector rank 0's
   monitor set) and, on rank 0, releases chunks in priority order under the
   credit;
3. the reduced chunks are split back into the gradients, reshaped and
   decompressed; ``HvdPrioStepEnd`` stamps the end of the step.

The arithmetic per element is Horovod's own (same op, prescale/postscale
factors and compression), only the packing differs, so results are identical.
Gradients we cannot fuse without changing the math (``tf.IndexedSlices``
without ``sparse_as_dense``) take Horovod's own path, and we log that once.
"""
import logging

import tensorflow as tf
import horovod.tensorflow as _hvd

from horovod_prio.method.plan import TensorSpec, step_plan
from horovod_prio.method.sequence import base_priorities
from horovod_prio.runtime import get_runtime
from horovod_prio.tensorflow import ops

log = logging.getLogger("horovod_prio")


def layer_tasks(variables):
    """Tasks in backprop order: one per layer, as lists of indices into ``variables``.

    Keras names a layer's variables ``<layer path>/<weight>:0``; consecutive
    variables sharing the layer path are one task. ``variables`` comes in
    forward (creation) order, so the result is reversed: task 0 is the
    output-side layer. Unnamed variables (no ``/``) are one task each.
    """
    tasks, last_key = [], None
    for i, var in enumerate(variables):
        name = getattr(var, "name", None) or ""
        key = name.rsplit("/", 1)[0] if "/" in name else None
        if key is not None and key == last_key:
            tasks[-1].append(i)
        else:
            tasks.append([i])
        last_key = key
    tasks.reverse()
    return tasks


def plan_step(variables, flats, config, overlap=False):
    """The :func:`~horovod_prio.method.plan.step_plan` of the 1-D gradients
    ``flats`` (static sizes) of ``variables`` (in the optimizer's order; None
    for unnamed ones): one task per layer (:func:`layer_tasks`). The
    synchronous path and ``hvd.overlap`` (``overlap=True``) both build their
    chunks from it; the simulator builds the same plan from a profile of the
    model (``tests/tf/test_step_plan.py``)."""
    specs = [TensorSpec(int(f.shape[0]), f.dtype.name, f.dtype.size) for f in flats]
    return step_plan(specs, layer_tasks(variables), config, overlap=overlap)


def _identity_key(variables, grads):
    """What tells two optimizers/tapes apart: the variables they reduce."""
    if variables is not None and all(hasattr(v, "ref") for v in variables):
        return ("vars",) + tuple(v.ref() for v in variables)
    return ("grads",) + tuple((g.dtype.name, tuple(g.shape.as_list())) for g in grads)


class PriorityAllreduce:
    """Callable with Horovod's ``allreduce_grads(grads, vars, use_generic_names)`` signature."""

    overlap_attached = False  # set by horovod_prio.tensorflow.overlapped when it takes over

    def __init__(self, name, config, fallback, *, device_dense="", device_sparse="",
                 compression=None, sparse_as_dense=False, op=None,
                 gradient_predivide_factor=1.0, process_set=None, passthrough=None):
        self.name = name
        self.config = config
        self.fallback = fallback
        self.device_dense = device_dense
        self._one = None        # HvdPrioAllreduce usable (decided at first use)
        self.device_sparse = device_sparse
        self.compression = compression or _hvd.Compression.none
        self.sparse_as_dense = sparse_as_dense
        self.op = _hvd.Average if op is None else op
        self.process_set = process_set or _hvd.global_process_set
        if self.op == _hvd.Average:
            # Horovod splits the average into pre/postscale factors (and adds 1/size in C++).
            self.prescale = 1.0 / gradient_predivide_factor
            self.postscale = gradient_predivide_factor
        else:
            self.prescale = self.postscale = 1.0
        self._warned = set()
        self._graph_fn = None
        reason = passthrough   # (the optimizer's arguments: horovod_path_reason)
        if reason is None:
            if not config.enabled:
                reason = "disabled by configuration (HOROVOD_PRIO_ENABLED=0)"
            elif self.op == getattr(_hvd, "Adasum", None):
                reason = "op=Adasum is not an elementwise reduction, chunked fusion would change it"
            elif self.process_set != _hvd.global_process_set:
                reason = "a non-global process_set is used (rank 0 of the job orders releases)"
        self.passthrough_reason = reason
        if reason:
            log.warning("horovod_prio: %s uses Horovod's own allreduce path: %s", name, reason)

    # -- the Horovod-facing callable -------------------------------------------------
    @tf.autograph.experimental.do_not_convert
    def __call__(self, grads, vars=None, use_generic_names=False):
        if self.config.overlap and not self.overlap_attached:
            raise ValueError(
                "horovod_prio: %s has PriorityConfig.overlap=True (HOROVOD_PRIO_OVERLAP=1) but "
                "was not passed to hvd.overlap(...): call `model = hvd.overlap(model)` before "
                "compile (Keras) or `hvd.overlap(model, optimizer=opt)` (custom loops; a "
                "DistributedGradientTape cannot overlap), or unset overlap" % self.name)
        if self.passthrough_reason:
            return self.fallback(grads, vars, use_generic_names)
        grads = list(grads)
        vars = list(vars) if vars is not None else None
        if tf.executing_eagerly():
            # Like Horovod's _make_subgraph: eager callers get one graph so the
            # chunks really run concurrently and can be reordered.
            if self._graph_fn is None:
                # autograph=False: our graph-building code is plain Python;
                # autograph would convert it (and the op-library loader it calls).
                self._graph_fn = tf.function(self._reduce, autograph=False)
            return self._graph_fn(grads, vars)
        return self._reduce(grads, vars)

    def _warn_once(self, key, msg, *args):
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def _reduce(self, grads, vars):
        with tf.name_scope(self.name + "_PrioAllreduce"):
            if self.sparse_as_dense:
                grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                         for g in grads]
            out = list(grads)
            if not (self.process_set.included() and self.process_set.size() > 1):
                return out  # Horovod's _allreduce_cond is the identity here too
            dense = []
            for i, g in enumerate(grads):
                if g is None:
                    continue
                if isinstance(g, tf.IndexedSlices):
                    self._warn_once("sparse", "horovod_prio: %s: sparse gradients (tf.IndexedSlices) "
                                    "use Horovod's own allgather path; pass sparse_as_dense=True "
                                    "to schedule them by priority", self.name)
                    out[i] = _hvd.allreduce(g, device_dense=self.device_dense,
                                            device_sparse=self.device_sparse,
                                            compression=self.compression, op=self.op,
                                            prescale_factor=self.prescale,
                                            postscale_factor=self.postscale,
                                            process_set=self.process_set)
                else:
                    dense.append(i)
            if not dense:
                return out
            known = vars is not None and len(vars) == len(grads)
            sub_vars = [vars[i] for i in dense] if known else None
            with tf.device(self.device_dense):
                reduced = self._reduce_dense([grads[i] for i in dense], sub_vars)
            for i, r in zip(dense, reduced):
                out[i] = r
            return out

    def reduce_chunk(self, x, priority, name):
        """One fused chunk through the scheduler and Horovod's allreduce.

        On CPU: one HvdPrioAllreduce op (released and completed off
        TensorFlow's inter-op threads, see :func:`ops.allreduce`). Where Horovod
        builds more than its one allreduce op (ROCm averaging, Adasum) or the
        tensors may live on a GPU: gate -> hvd.allreduce -> done.
        """
        if self._one_op():
            return ops.allreduce(x, priority, name, self.op, self.prescale, self.postscale,
                                 self.process_set.process_set_id)
        x = ops.gate(x, priority, name)
        x = _hvd.allreduce(x, op=self.op, prescale_factor=self.prescale,
                           postscale_factor=self.postscale, name=name,
                           process_set=self.process_set, ignore_name_scope=True)
        return ops.done(x, name)

    def _one_op(self):
        if self._one is None:
            self._one = (self.op in (_hvd.Average, _hvd.Sum) and not _hvd.rocm_built()
                         and "GPU" not in self.device_dense.upper()
                         and not tf.config.list_logical_devices("GPU"))
        return self._one

    def _reduce_dense(self, grads, variables):
        runtime = get_runtime()
        runtime.setup(self.config, _hvd.rank(), _hvd.size(), owner=self.name)
        comp = [self.compression.compress(g) for g in grads]
        flats = [tf.reshape(t, [-1]) for t, _ in comp]
        for g, f in zip(grads, flats):
            if f.shape[0] is None:
                raise ValueError("horovod_prio: gradient sizes must be static (unknown size of %s)"
                                 % g.name)
        key = _identity_key(variables, grads)
        step = plan_step(variables if variables is not None else [None] * len(grads), flats,
                         self.config)
        groups = step.groups
        name, monitor = runtime.identity(
            self.name, key, self.config, len(groups),
            ops.StepClock.get() if self.config.monitor else None,
            step_bytes=step.step_bytes, partition_bytes=step.partition_bytes)
        plan = step.plan(name)
        if monitor is not None:
            priorities = ops.step_begin(monitor.slot, len(groups))
        else:  # fixed priorities, no step timing
            priorities = tf.constant(base_priorities(len(groups)), tf.int32)
        reduced = [self.reduce_chunk(x, priorities[chunk.group], chunk.name)
                   for chunk, x in zip(plan.chunks, pack_chunks(flats, plan))]
        if monitor is not None:
            ops.step_end(monitor.slot, reduced)
        return [self.compression.decompress(tf.reshape(flat, tf.shape(g)), ctx)
                for (g, ctx), flat in zip(comp, unpack_chunks(reduced, flats, plan))]


def pack_chunks(flats, plan):
    """The chunks of ``plan`` (a :class:`~horovod_prio.method.plan.Plan`) as
    tensors, from the 1-D gradients ``flats`` (a whole gradient is itself)."""
    out = []
    for chunk in plan.chunks:
        parts = [flats[s.tensor] if (s.offset, s.length) == (0, flats[s.tensor].shape[0])
                 else flats[s.tensor][s.offset:s.offset + s.length] for s in chunk.segments]
        out.append(parts[0] if len(parts) == 1 else tf.concat(parts, 0))
    return out


def unpack_chunks(reduced, flats, plan):
    """The 1-D gradients back from the ``reduced`` chunks (a gradient in no
    chunk stays ``flats``' own)."""
    out = []
    pieces = plan.pieces()
    for t, f in enumerate(flats):
        segs = [reduced[c] if (seg.chunk_offset, seg.length) == (0, plan.chunks[c].nelems)
                else reduced[c][seg.chunk_offset:seg.chunk_offset + seg.length]
                for c, seg in pieces.get(t, [])]
        out.append(f if not segs else segs[0] if len(segs) == 1 else tf.concat(segs, 0))
    return out
