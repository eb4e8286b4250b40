"""Priority tensor fusion: the replacement for Horovod's ``allreduce_grads``.

Horovod's optimizers and tapes call ``self._allreduce_grads(grads, vars,
use_generic_names)``. :class:`PriorityAllreduce` is a drop-in for that
callable:

1. variables -> tasks (one per layer, backprop order) -> groups
   (:func:`horovod_prio.sequence.partition_groups`);
2. each group's dense gradients are compressed exactly as Horovod would,
   flattened and concatenated per dtype (backprop order), and cut into chunks
   of at most ``partition_bytes``; each chunk is assembled only from the
   tensors it covers, so it can leave before the rest of its group is ready;
3. every chunk goes ``HvdPrioGate -> hvd.allreduce -> HvdPrioDone``; the gate
   takes its group's priority (broadcast from rank 0 each step) and, on rank 0,
   releases chunks in priority order under ``credit_bytes``;
4. the reduced chunks are split back into the gradients, reshaped and decompressed.

The arithmetic per element is Horovod's own (same op, prescale/postscale
factors and compression), only the packing differs, so results are identical.
Gradients we cannot fuse without changing the math (``tf.IndexedSlices``
without ``sparse_as_dense``) take Horovod's own path, and we log that once.
"""
import logging

import tensorflow as tf
import horovod.tensorflow as _hvd

from horovod_prio import cc
from horovod_prio.tensorflow.monitor import get_monitor

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


def _op_name(op):
    for name in ("Average", "Sum", "Adasum", "Min", "Max", "Product"):
        if op == getattr(_hvd, name, object()):
            return name
    return str(op)


class PriorityAllreduce:
    """Callable with Horovod's ``allreduce_grads(grads, vars, use_generic_names)`` signature."""

    def __init__(self, name, config, fallback, *, device_dense="", device_sparse="",
                 compression=None, sparse_as_dense=False, op=None,
                 gradient_predivide_factor=1.0, process_set=None):
        self.name = name
        self.config = config
        self.fallback = fallback
        self.device_dense = device_dense
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
        reason = None
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
        if self.passthrough_reason:
            return self.fallback(grads, vars, use_generic_names)
        if tf.executing_eagerly():
            # Like Horovod's _make_subgraph: eager callers get one graph so the
            # chunks really run concurrently and can be reordered.
            if self._graph_fn is None:
                self._graph_fn = tf.function(self._reduce)
            return self._graph_fn(list(grads), list(vars) if vars is not None else None)
        return self._reduce(list(grads), list(vars) if vars is not None else None)

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
            sub_vars = [vars[i] if known else None for i in dense]
            tasks = [[dense[j] for j in task] for task in layer_tasks(sub_vars)]
            groups = self.config.make_groups(len(tasks))
            group_indices = [[i for t in grp for i in tasks[t]] for grp in groups]
            monitor = get_monitor(self.name, self.config, len(groups), self.process_set)
            priorities = monitor.priorities_tensor()
            with tf.device(self.device_dense):
                for g, idx in enumerate(group_indices):
                    reduced = self._reduce_group(g, [grads[i] for i in idx], priorities[g])
                    for i, r in zip(idx, reduced):
                        out[i] = r
            return out

    def _reduce_group(self, g, grads, priority):
        comp = [self.compression.compress(t) for t in grads]
        by_dtype = {}
        for k, (t, _) in enumerate(comp):
            by_dtype.setdefault(t.dtype, []).append(k)
        result = [None] * len(grads)
        for dtype, members in by_dtype.items():
            flats = [tf.reshape(comp[k][0], [-1]) for k in members]
            reduced = self._reduce_flats(flats, "%s_g%d_%s" % (self.name, g, dtype.name), priority)
            for k, part in zip(members, reduced):
                t, ctx = comp[k]
                result[k] = self.compression.decompress(tf.reshape(part, tf.shape(t)), ctx)
        return result

    def _reduce_flats(self, flats, base, priority):
        """Fuse 1-D tensors (backprop order) into chunks, gate + allreduce each, split back.

        The group's buffer is the concatenation of ``flats`` cut every
        ``partition_bytes``; each chunk is built from just the tensor segments
        it covers, so it is ready as soon as those layers' gradients are (the
        first chunks of a group do not wait for its last layer), and the
        group buffer itself is never materialised.
        """
        sizes = [f.shape[0] for f in flats]
        if any(n is None for n in sizes):
            raise ValueError("horovod_prio: gradient sizes must be static (unknown size in %s)" % base)
        per_chunk = max(1, self.config.partition_bytes // max(1, flats[0].dtype.size))
        total = sum(sizes)
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        segments = [[] for _ in flats]  # per tensor: (chunk index, start in chunk, length)
        chunks = []
        for c, lo in enumerate(range(0, total, per_chunk)):
            hi = min(total, lo + per_chunk)
            parts, pos = [], 0
            for i, (off, n) in enumerate(zip(offsets, sizes)):
                a, b = max(lo, off), min(hi, off + n)
                if a >= b:
                    continue
                parts.append(flats[i] if (a, b) == (off, off + n) else flats[i][a - off:b - off])
                segments[i].append((c, pos, b - a))
                pos += b - a
            chunk = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
            name = "%s_c%d" % (base, c)
            chunk = cc.gate(chunk, priority, name)
            chunk = _hvd.allreduce(chunk, op=self.op, prescale_factor=self.prescale,
                                   postscale_factor=self.postscale, name=name,
                                   process_set=self.process_set, ignore_name_scope=True)
            chunks.append((cc.done(chunk, name), hi - lo))
        out = []
        for segs in segments:
            pieces = [chunks[c][0] if (start, length) == (0, chunks[c][1])
                      else chunks[c][0][start:start + length] for c, start, length in segs]
            out.append(pieces[0] if len(pieces) == 1 else tf.concat(pieces, 0))
        return out
