"""Barrier crossing ("overlap"): the next step's forward starts on layers already reduced.

User API (``horovod_prio.tensorflow`` and ``horovod_prio.tensorflow.keras``)::

    model = hvd.overlap(model)                 # Keras: before model.compile(optimizer=hvd.DistributedOptimizer(...))
    model = hvd.overlap(model, optimizer=opt)  # custom tf.GradientTape loop: opt.minimize(loss, vars, tape=tape)
    opt = hvd.overlap(opt)                     # a loop without a Keras model (flush yourself)
    hvd.flush()                                # apply every pending update (model methods do it for you)

How it works (details in docs/overlap.md):

* **Training call** (one tf.function call of the step). The optimizer's
  gradient allreduce is replaced: every chunk of the priority plan
  (:func:`horovod_prio.method.plan.step_plan`, same names as the synchronous
  path) is compressed and *posted* (``HvdPrioOverlapPost``) into a
  process-wide mailbox (a *channel*, C++ ``kernels/overlap.cc``) together
  with what the update needs from this call: the optimizer's ``iterations``,
  its hyperparameter variables (learning rate, momentum, ...) and the
  step's priority vector. ``apply_gradients`` applies nothing: it only
  advances ``iterations`` exactly as the synchronous optimizer would (so
  callbacks see the same counter). Every read of a reduced variable in the
  step graph gets a control input from ``HvdPrioOverlapWait(layer)``: it
  runs once the previous steps applied that layer.
* **Background call** (one per step, on a runtime-owned thread per channel,
  :class:`horovod_prio.runtime.overlap.OverlapWorker`): take the chunks ->
  gate -> ``hvd.allreduce`` -> done -> split back -> decompress -> per layer:
  the wrapped optimizer's own per-variable update with the posted
  ``iterations`` and hyperparameters -> ``HvdPrioOverlapLayerDone(layer)``.
* **Flush**: wait until every posted step is applied (local, no collective).
  The Keras model's ``fit`` (end, exception, epoch end before callbacks),
  ``evaluate``, ``predict``, ``save``, ``save_weights``, ``load_weights``,
  ``get_weights``, ``set_weights``, ``test_on_batch``, ``predict_on_batch``
  flush first; so do callbacks that may touch weights between steps.
"""

import ctypes
import functools
import inspect
import json
import logging
import threading
import weakref

import tensorflow as tf
import horovod.tensorflow as _hvd
from tensorflow.python.framework.func_graph import FuncGraph

from horovod_prio.runtime import get_runtime
from horovod_prio.runtime.overlap import OverlapWorker, trace_events
from horovod_prio.tensorflow import ops
from horovod_prio.tensorflow.fusion import PriorityAllreduce, _identity_key, plan_step

__all__ = ["overlap", "flush", "OverlapError", "Channel", "channels", "stats"]

log = logging.getLogger("horovod_prio")

_lock = threading.RLock()
_no_gradients = [False]   # the overlap ops are registered as not differentiable
_event_source = [False]

EAGER_MSG = (
    "horovod_prio overlap: the training step must run inside a tf.function (Keras fit does, "
    "unless run_eagerly=True): the next step's per-layer waits are graph ops")
WRITE_OP_PREFIXES = ("Assign", "ResourceApply", "ResourceSparseApply", "ResourceScatter",
                     "ResourceStridedSliceAssign", "DestroyResourceOp")


class OverlapError(RuntimeError):
    """The overlap pipeline failed (a failed step, a failed background update); the
    message says why. Pending updates of that optimizer are not applied."""


# --------------------------------------------------------------------------- C library
def _load():
    """(op module, ctypes library) of the kernel library (:func:`ops.library`, its one
    loader); the overlap ops have no gradient."""
    tf_ops, lib = ops.library()
    if not _no_gradients[0]:
        from tensorflow.python.framework import ops as tf_framework_ops
        for op_type in ("HvdPrioOverlapBegin", "HvdPrioOverlapPost", "HvdPrioOverlapWait",
                        "HvdPrioOverlapTakeBegin", "HvdPrioOverlapTake",
                        "HvdPrioOverlapLayerDone", "HvdPrioOverlapFinish"):
            try:
                tf_framework_ops.NotDifferentiable(op_type)
            except KeyError:
                pass
        _no_gradients[0] = True
    return tf_ops, lib


STATS_FIELDS = ("begun", "started", "finished", "dropped", "live", "posts", "takes", "waits",
                "waits_blocked", "layers_applied", "pending_requests")


class Channel:
    """A mailbox between the training calls and the background calls of one
    overlapped optimizer identity (C++ ``kernels/overlap.cc``)."""

    STATES = {0: "open", 1: "closed", 2: "failed"}

    def __init__(self, name, ntasks, nslots, nmeta=0):
        _, lib = _load()
        self._lib = lib
        self.name = name
        self.id = int(lib.hvdprio_overlap_new(name.encode(), int(ntasks), int(nslots),
                                              int(nmeta)))
        if self.id < 0:
            raise ValueError("overlap channel %r: bad sizes (%r layers, %r slots, %r values)"
                             % (name, ntasks, nslots, nmeta))

    def state(self):
        return self.STATES.get(self._lib.hvdprio_overlap_state(self.id), "unknown")

    def error(self):
        buf = ctypes.create_string_buffer(4096)
        self._lib.hvdprio_overlap_error(self.id, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def fail(self, message):
        self._lib.hvdprio_overlap_fail(self.id, str(message).encode("utf-8", "replace"))

    def close(self):
        self._lib.hvdprio_overlap_close(self.id)

    def flush(self, timeout=None):
        """Seal the open step and wait until everything posted is applied.
        True when done, False on timeout; raises :class:`OverlapError` if the
        channel failed. Call it between training calls (from the training thread)."""
        import time
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
            r = self._lib.hvdprio_overlap_flush(self.id, left)
            if r == 0:
                return True
            if r == -1:
                raise OverlapError("horovod_prio overlap %s: %s" % (
                    self.name, self.error() or "the channel is closed with updates pending"))
            if r != 1:
                raise OverlapError("horovod_prio overlap %s: flush failed (%d)" % (self.name, r))
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def stats(self):
        arr = (ctypes.c_int64 * len(STATS_FIELDS))()
        self._lib.hvdprio_overlap_stats(self.id, arr, len(STATS_FIELDS))
        return dict(zip(STATS_FIELDS, (int(v) for v in arr)))


def _drain_events():
    """The recorded channel events (dicts), oldest first."""
    _, lib = _load()
    cap = 1 << 16
    out = []
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = lib.hvdprio_overlap_drain_events(buf, cap)
        if n < 0:
            cap = max(-n, cap * 2)
            continue
        if n == 0:
            return out
        out.extend(json.loads(line) for line in buf.raw[:n].decode("utf-8", "replace").splitlines()
                   if line)


def _ensure_trace(runtime):
    with _lock:
        if _event_source[0] or runtime.writer is None:
            return
        _, lib = _load()
        lib.hvdprio_overlap_set_tracing(1)
        runtime.add_event_source(lambda: trace_events(_drain_events()))
        _event_source[0] = True


# --------------------------------------------------------------------------- support checks
def _classes(module, names):
    return tuple(c for c in (getattr(module, n, None) for n in names) if isinstance(c, type))


def _supported():
    k = tf.keras.optimizers
    legacy = _classes(getattr(k, "legacy", None),
                      ("SGD", "Adam", "RMSprop", "Adagrad", "Adamax", "Adadelta", "Ftrl"))
    new = _classes(k, ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "Adadelta", "Ftrl",
                       "Lion"))
    return legacy, new


def _user_class(opt):
    """The optimizer class the user wrapped (Horovod subclasses it dynamically)."""
    mro = type(opt).__mro__
    return mro[1] if len(mro) > 1 and hasattr(type(opt), "_allreduce") else type(opt)


def _check_optimizer(opt, base):
    legacy, new = _supported()
    cls = _user_class(opt)
    names = sorted({c.__name__ for c in legacy + new})
    if cls not in legacy + new:
        raise TypeError(
            "hvd.overlap: %s.%s cannot be applied layer by layer: overlap supports the Keras "
            "optimizers %s (tf.keras.optimizers.* and tf.keras.optimizers.legacy.*) whose update "
            "of one variable reads only that variable, its slots, the learning rate/"
            "hyperparameters and `iterations` (LossScaleOptimizer, Nadam, Adafactor, custom "
            "subclasses and optimizers with shared per-step state are not). Use one of them or "
            "drop hvd.overlap(...) (synchronous training)."
            % (cls.__module__, cls.__name__, ", ".join(names)))
    if cls in new:
        if getattr(opt, "use_ema", False):
            raise ValueError("hvd.overlap: %s(use_ema=True) is not supported: the moving "
                             "average of every variable is updated after the whole step"
                             % cls.__name__)
        if getattr(opt, "_mesh", None) is not None or getattr(opt, "_run_with_dtensor", False):
            raise ValueError("hvd.overlap: DTensor optimizers are not supported")
    local = set(getattr(opt, "_local_vars", ()) or ())
    helper = getattr(opt, "_agg_helper", None)
    local |= set(getattr(helper, "_local_vars", ()) or ())
    if local:
        raise ValueError("hvd.overlap: register_local_var() variables are not supported")
    return cls in legacy


# --------------------------------------------------------------------------- graph helpers
def _graph_chain():
    """The FuncGraphs being built, innermost (current) first."""
    chain = []
    g = tf.compat.v1.get_default_graph()
    while isinstance(g, FuncGraph):
        chain.append(g)
        g = g.outer_graph
    return chain


# FuncGraph -> what overlap added to it: names of its wait ops by (channel, task), the
# channels that began a step in it, ids of the gradients the optimizer reduced in it.
# (Values hold no reference to the graph, so an entry goes with its graph.) Not the
# runtime's: the graph substitution's bookkeeping, per TF graph, gone with it.
_graph_states = weakref.WeakKeyDictionary()


def _graph_state(graph):
    with _lock:
        st = _graph_states.get(graph)
        if st is None:
            st = _graph_states[graph] = {"waits": {}, "begin": set(), "reduced": set()}
        return st


def _handles_by_graph(chain, variables):
    """For every graph of the chain: {id(internal handle tensor): variable index}."""
    out = {}
    current = {id(v.handle): i for i, v in enumerate(variables)}
    for g in reversed(chain):                  # outermost first: captures link outward
        inner = {}
        for external, internal in g.captures:
            i = current.get(id(external))
            if i is not None:
                inner[id(internal)] = (i, internal)
        out[g] = inner
        current = {k: i for k, (i, _) in inner.items()}
    return out


# --------------------------------------------------------------------------- optimizer hooks
class _Substitution:
    """Makes the optimizer's per-variable math read the posted values while the
    background function is traced (restored right after; the trace runs on the
    training thread, inside the training step's own trace)."""

    def __init__(self, opt, legacy, iterations, hypers):
        self.opt, self.legacy, self.it, self.hypers = opt, legacy, iterations, hypers
        self.saved = {}

    def __enter__(self):
        d = self.opt.__dict__
        sub = {"_iterations": self.it}
        if self.legacy:
            hyper = dict(d["_hyper"])
            hyper.update(self.hypers)
            sub["_hyper"] = hyper
        else:
            lr = d.get("_learning_rate")
            if "learning_rate" in self.hypers:
                sub["_learning_rate"] = self.hypers["learning_rate"]
            elif isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule):
                # apply_gradients sets _current_learning_rate = schedule(iterations) first
                sub["_current_learning_rate"] = tf.convert_to_tensor(lr(self.it))
        for k, v in sub.items():
            self.saved[k] = d.get(k, _MISSING)
            d[k] = v
        return self

    def __exit__(self, *exc):
        d = self.opt.__dict__
        for k, v in self.saved.items():
            if v is _MISSING:
                d.pop(k, None)
            else:
                d[k] = v
        return False


_MISSING = object()


def _hyper_variables(opt, legacy):
    """[(name, variable)] the update reads and callbacks may change between steps."""
    if legacy:
        with tf.init_scope():
            opt._create_hypers()
        return [(n, v) for n, v in sorted(opt._hyper.items()) if isinstance(v, tf.Variable)]
    lr = opt.__dict__.get("_learning_rate")
    return [("learning_rate", lr)] if isinstance(lr, tf.Variable) else []


class _Pipeline:
    """One overlapped optimizer identity (the variables it reduces): its plan,
    channel, background function and worker."""

    def __init__(self, state, variables, grads, flats, ctxs):
        base, opt = state.base, state.opt
        runtime = get_runtime()
        runtime.setup(base.config, _hvd.rank(), _hvd.size(), owner=base.name)
        self.state = state
        self.variables = list(variables)
        self.shapes = [g.shape for g in grads]
        for v, s in zip(self.variables, self.shapes):
            if not s.is_fully_defined():
                raise ValueError("hvd.overlap: gradient of %s has no static shape %s" % (v.name, s))
        self.ctxs = ctxs
        key = ("overlap",) + _identity_key(self.variables, grads)
        step = plan_step(self.variables, flats, base.config, overlap=True)
        self.tasks = step.tasks
        self.name, self.monitor = runtime.identity(base.name, key, base.config, len(step.groups),
                                                   ops.StepClock.get(),
                                                   partition_bytes=step.partition_bytes)
        self.num_groups = len(step.groups)
        self.plan = step.plan(self.name)
        runtime.use_overlap_credit(step.credit_bytes)
        self.hypers = _hyper_variables(opt, state.legacy)
        # slots: iterations, priorities, hyperparameters, then the chunks
        self.meta = [("iterations", tf.int64, []), ("priorities", tf.int32, [self.num_groups])]
        self.meta += [(n, v.dtype.base_dtype, []) for n, v in self.hypers]
        self.chunk_slot0 = len(self.meta)
        self.channel = Channel(self.name, len(self.tasks),
                               self.chunk_slot0 + len(self.plan.chunks), self.chunk_slot0)
        self.size = base.process_set.size()
        with tf.init_scope():
            # The optimizer's weights exist before the step reads `iterations` (the
            # synchronous apply_gradients creates them in its first trace too).
            if state.legacy:
                opt._create_all_weights(self.variables)
            else:
                opt.build(self.variables)
            self.step_fn = tf.function(self._background_step,
                                       autograph=False).get_concrete_function()
        _ensure_trace(runtime)
        self.worker = OverlapWorker(self.name, self.channel, self._run_step)
        runtime.add_overlap_worker(self.worker)
        log.info("horovod_prio: %s: overlap on: %d layers, %d chunks; the next step's forward "
                 "waits per layer for this step's update", self.name, len(self.tasks),
                 len(self.plan.chunks))

    def _run_step(self):
        self.step_fn()

    # -- the background call (traced once, run once per step) --------------------------
    def _background_step(self):
        tf_ops, _ = _load()
        base, opt, ch = self.state.base, self.state.opt, self.channel.id

        def take(ticket, slot, dtype, shape):
            return ops.independent(tf_ops.hvd_prio_overlap_take(
                ticket, T=dtype, shape=shape, channel=ch, slot=slot))

        ticket = ops.independent(tf_ops.hvd_prio_overlap_take_begin(channel=ch))
        meta = [take(ticket, i, d, s) for i, (_, d, s) in enumerate(self.meta)]
        iterations, priorities = meta[0], meta[1]
        hypers = {n: t for (n, _), t in zip(self.hypers, meta[2:])}
        reduced = []
        with tf.device(base.device_dense):
            for c, chunk in enumerate(self.plan.chunks):
                x = take(ticket, self.chunk_slot0 + c, tf.as_dtype(chunk.dtype), [chunk.nelems])
                if self.size > 1:
                    x = base.reduce_chunk(x, priorities[chunk.group], chunk.name)
                reduced.append(x)
            pieces = self.plan.pieces()
            grads = []
            for t, (shape, ctx) in enumerate(zip(self.shapes, self.ctxs)):
                whole = lambda c, seg: (seg.chunk_offset, seg.length) == (  # noqa: E731
                    0, self.plan.chunks[c].nelems)
                segs = [reduced[c] if whole(c, seg)
                        else reduced[c][seg.chunk_offset:seg.chunk_offset + seg.length]
                        for c, seg in pieces.get(t, [])]
                flat = segs[0] if len(segs) == 1 else tf.concat(segs, 0)
                grads.append(base.compression.decompress(tf.reshape(flat, shape), ctx))
        with _Substitution(opt, self.state.legacy, iterations, hypers):
            dones = self._apply(grads, ticket)
        # Finish after every take too (a value the update does not read, e.g.
        # `iterations` for plain SGD, is still taken before the step is gone).
        with tf.control_dependencies(dones + meta + reduced):
            ops.independent(tf_ops.hvd_prio_overlap_finish(ticket, channel=ch))

    def _apply(self, grads, ticket):
        """The wrapped optimizer's per-variable update, layer by layer; returns
        the LayerDone ops."""
        tf_ops, _ = _load()
        opt, legacy, variables = self.state.opt, self.state.legacy, self.variables
        graph = tf.compat.v1.get_default_graph()
        if legacy:
            apply_state = opt._prepare(variables)
            gv = list(zip(grads, variables))
            gv = opt._transform_unaggregated_gradients(gv)
            gv = opt._aggregate_gradients(gv)
            gv = opt._transform_gradients(gv)
            by_var = {v.ref(): g for g, v in gv}
            grads = [by_var[v.ref()] for v in variables]
            with_state = "apply_state" in opt._dense_apply_args
        else:
            grads = list(opt._clip_gradients(grads))
        dones = []
        for t, idx in enumerate(self.tasks):
            first = len(graph.get_operations())
            with tf.control_dependencies([grads[i] for i in idx]):
                layer_vars = [variables[i] for i in idx]
                if not legacy:
                    opt._apply_weight_decay(layer_vars)
                for i in idx:
                    g, v = grads[i], variables[i]
                    if legacy:
                        op = opt._resource_apply_dense(g, v, apply_state=apply_state) \
                            if with_state else opt._resource_apply_dense(g, v)
                    elif opt.jit_compile:
                        op = opt._update_step_xla(g, v, id(opt._var_key(v)))
                    else:
                        op = opt._update_step(g, v)
                    if v.constraint is not None:
                        deps = [op] if op is not None else []
                        with tf.control_dependencies(deps):
                            v.assign(v.constraint(v))
            created = graph.get_operations()[first:]
            with tf.control_dependencies(created):
                dones.append(ops.independent(tf_ops.hvd_prio_overlap_layer_done(
                    ticket, channel=self.channel.id, task=t)))
        return dones

    # -- the training call ------------------------------------------------------------
    def post(self, flats):
        """Post this step's chunks (training graph; called while it is traced)."""
        tf_ops, _ = _load()
        state, opt, ch = self.state, self.state.opt, self.channel.id
        chain = _graph_chain()
        for g in chain:
            if type(g).__name__ == "WhileBodyFuncGraph":
                raise ValueError(
                    "hvd.overlap: the training step runs inside a tf.while_loop (Keras "
                    "steps_per_execution > 1, or a loop of steps inside one tf.function); overlap "
                    "needs one training step per tf.function call")
        home, _ = state.guard(chain, ch)
        gstate = _graph_state(home)
        if ch in gstate["begin"]:
            raise ValueError("hvd.overlap: %s posts twice in one tf.function call; overlap needs "
                             "one training step per call" % self.name)
        # Begin has no inputs, so it runs first in the call and each chunk is
        # posted as soon as its gradients exist (during the backward pass); the
        # call's waits skip its own, unsealed step (kernels/overlap.cc).
        with home.as_default(), home.control_dependencies(None):
            ticket = ops.independent(tf_ops.hvd_prio_overlap_begin(channel=ch))
        gstate["begin"].add(ch)
        priorities = ops.step_begin(self.monitor.slot, self.num_groups)
        values = [opt.iterations.read_value(), priorities]
        values += [v.read_value() for _, v in self.hypers]
        posts = [ops.independent(tf_ops.hvd_prio_overlap_post(ticket, x, channel=ch, slot=i))
                 for i, x in enumerate(values)]
        with tf.device(state.base.device_dense):
            for c, chunk in enumerate(self.plan.chunks):
                parts = [flats[s.tensor] if (s.offset, s.length) == (0, flats[s.tensor].shape[0])
                         else flats[s.tensor][s.offset:s.offset + s.length] for s in chunk.segments]
                x = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
                posts.append(ops.independent(tf_ops.hvd_prio_overlap_post(
                    ticket, x, channel=ch, slot=self.chunk_slot0 + c)))
        ops.step_end(self.monitor.slot, posts)


class _OverlapState:
    """Overlap mode of one horovod_prio DistributedOptimizer."""

    def __init__(self, opt, base, legacy):
        self.opt = opt
        self.base = base
        self.legacy = legacy
        self.pipelines = {}
        self.lock = threading.Lock()
        self.hvd_allreduce = opt._allreduce
        self.sparse_vars = set()   # refs of variables whose gradients came sparse

    def _reduce_sparse(self, g, v):
        """A sparse gradient (tf.IndexedSlices) in the training call: Horovod's own
        allgather path (what plain Horovod does with it); the optimizer applies it
        in this call, with its own sparse update (see :meth:`_apply_sparse`)."""
        base, opt = self.base, self.opt
        helper = getattr(opt, "_agg_helper", None)
        if helper is not None:
            raise ValueError(
                "hvd.overlap: the gradient of %s is sparse (tf.IndexedSlices) and "
                "backward_passes_per_step > 1: overlap applies sparse gradients in the training "
                "call, the aggregation helper would apply them a step late. Pass "
                "sparse_as_dense=True or backward_passes_per_step=1" % v.name)
        if getattr(opt, "global_clipnorm", None) is not None:
            raise ValueError(
                "hvd.overlap: the gradient of %s is sparse (tf.IndexedSlices) and the optimizer "
                "has global_clipnorm: the global norm would span gradients applied in two places "
                "(sparse ones in the training call, dense ones in the background). Use clipnorm, "
                "sparse_as_dense=True, or drop global_clipnorm" % v.name)
        if v.constraint is not None:
            raise ValueError("hvd.overlap: %s has a constraint and a sparse gradient (Keras "
                             "refuses constraints on sparse updates too)" % v.name)
        self.sparse_vars.add(v.ref())
        if not (base.process_set.included() and base.process_set.size() > 1):
            return g   # Horovod's identity here too (its _allreduce_cond)
        return _hvd.allreduce(g, device_dense=base.device_dense, device_sparse=base.device_sparse,
                              compression=base.compression, op=base.op,
                              prescale_factor=base.prescale, postscale_factor=base.postscale,
                              process_set=base.process_set)

    def _apply_sparse(self, sparse_gv):
        """Apply the reduced sparse gradients in the training call, as the optimizer's own
        apply_gradients would (clipping, duplicate rows summed, its sparse update), with
        the step's ``iterations`` (before it advances) -- the value the background update
        of the dense variables reads for the same step."""
        opt = self.opt
        grads = [g for g, _ in sparse_gv]
        variables = [v for _, v in sparse_gv]
        updates = []
        if self.legacy:
            with tf.init_scope():
                opt._create_all_weights(variables)
            apply_state = opt._prepare(variables)
            gv = opt._transform_unaggregated_gradients(list(sparse_gv))
            gv = opt._aggregate_gradients(gv)
            gv = opt._transform_gradients(gv)
            kwargs = {"apply_state": apply_state} if "apply_state" in opt._sparse_apply_args \
                else {}
            for g, v in gv:
                updates.append(opt._resource_apply_sparse_duplicate_indices(
                    g.values, v, g.indices, **kwargs))
        else:
            opt._compute_current_learning_rate()
            grads = opt._clip_gradients(grads)
            grads = opt._deduplicate_sparse_grad(grads)
            opt._apply_weight_decay(variables)
            for g, v in zip(grads, variables):
                updates.append(opt._update_step_xla(g, v, id(opt._var_key(v))) if opt.jit_compile
                               else opt._update_step(g, v))
        return [u for u in updates if u is not None]

    # -- hooks installed on the optimizer ---------------------------------------------
    @tf.autograph.experimental.do_not_convert
    def reduce(self, grads, vars=None, use_generic_names=False):
        """Replaces the optimizer's ``_allreduce_grads``: posts and returns the local gradients."""
        if tf.executing_eagerly():
            raise RuntimeError(EAGER_MSG)
        grads = list(grads)
        if vars is None or len(vars) != len(grads):
            raise ValueError("hvd.overlap: the reduced gradients must come with their variables")
        vars = list(vars)
        base = self.base
        if base.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        if not self.legacy and any(isinstance(g, tf.IndexedSlices) for g in grads):
            with tf.init_scope():   # every variable it updates, in one build (as Keras does)
                self.opt.build([v for g, v in zip(grads, vars) if g is not None])
        dense = []
        for i, (g, v) in enumerate(zip(grads, vars)):
            if isinstance(g, tf.IndexedSlices):   # only the rows the batch touched
                grads[i] = self._reduce_sparse(g, v)
            elif g is not None:
                dense.append(i)
        if not dense:
            return grads
        d_vars, d_grads = [vars[i] for i in dense], [grads[i] for i in dense]
        with tf.name_scope(base.name + "_Overlap"):
            comp = [base.compression.compress(g) for g in d_grads]
            flats = [tf.reshape(t, [-1]) for t, _ in comp]
            for v, f in zip(d_vars, flats):
                if f.shape[0] is None:
                    raise ValueError("hvd.overlap: gradient sizes must be static (%s)" % v.name)
            ctxs = [ctx for _, ctx in comp]
            for v, ctx in zip(d_vars, ctxs):
                if tf.is_tensor(ctx):
                    raise ValueError("hvd.overlap: compression %r returns a tensor context; "
                                     "overlap supports Compression.none and Compression.fp16"
                                     % (base.compression,))
            pipe = self.pipeline(d_vars, d_grads, flats, ctxs)
            pipe.post(flats)
        return grads

    def pipeline(self, variables, grads, flats, ctxs):
        key = _identity_key(variables, grads)
        with self.lock:
            pipe = self.pipelines.get(key)
            if pipe is None:
                pipe = self.pipelines[key] = _Pipeline(self, variables, grads, flats, ctxs)
            return pipe

    @tf.autograph.experimental.do_not_convert
    def recording_allreduce(self, grads, vars):
        """Wraps Horovod's ``_allreduce``: remembers what it returned (apply checks it)."""
        out = self.hvd_allreduce(grads, vars)
        # (ids are stable: the graph keeps its tensors alive while it can be traced into)
        _graph_state(tf.compat.v1.get_default_graph())["reduced"].update(
            id(t) for t in out if t is not None)
        return out

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Replaces Horovod's ``apply_gradients``: the update happens in the
        background; here only ``iterations`` advances, as it would synchronously."""
        if tf.executing_eagerly():
            raise RuntimeError(EAGER_MSG)
        gv = list(grads_and_vars)
        reduced = _graph_state(tf.compat.v1.get_default_graph())["reduced"]
        posted = {v.ref() for p in self.pipelines.values() for v in p.variables}
        sparse_gv = []
        for g, v in gv:
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices) and v.ref() in self.sparse_vars \
                    and id(g) in reduced:
                sparse_gv.append((g, v))
                continue
            if id(g) not in reduced:
                raise ValueError(
                    "hvd.overlap: apply_gradients got a gradient for %s that is not the one this "
                    "optimizer reduced in this step (modified after compute_gradients, or from "
                    "another tape). With overlap the reduced gradients are applied in the "
                    "background exactly as posted: compute and apply them with "
                    "opt.minimize(loss, vars, tape=tape), clip with the optimizer's clipnorm/"
                    "clipvalue/global_clipnorm, or drop hvd.overlap(...)" % v.name)
            if v.ref() not in posted:
                raise ValueError("hvd.overlap: %s was not reduced by this optimizer" % v.name)
        self.guard(_graph_chain())   # reads created since the reduction wait too
        opt, legacy = self.opt, self.legacy

        def advance():
            if legacy:
                return opt.iterations.assign_add(1, read_value=False)
            opt._compute_current_learning_rate()
            return opt.iterations.assign_add(1)

        helper = getattr(opt, "_agg_helper", None)
        if helper is not None:
            return helper.apply_gradients(advance, opt, gv, *args, **kwargs)
        if sparse_gv:   # in this call, before `iterations` advances (as synchronously)
            with tf.control_dependencies(self._apply_sparse(sparse_gv)):
                return advance()
        return advance()

    # -- waits before every read of a reduced variable ----------------------------------
    def guard(self, chain, channel=None):
        """Give every op of the step graph(s) that uses a reduced variable a control
        input from the wait of the variable's layer. Returns the graph of the
        innermost reads and the waits of ``channel`` there (the step's Begin goes
        there, after them)."""
        tf_ops, _ = _load()
        home, home_waits = None, []
        for pipe in list(self.pipelines.values()):
            task_of = {}
            for t, idx in enumerate(pipe.tasks):
                for i in idx:
                    task_of[i] = t
            handles = _handles_by_graph(chain, pipe.variables)
            for g in chain:                       # innermost first
                gstate = _graph_state(g)
                used = False
                for key, (i, internal) in handles.get(g, {}).items():
                    for op in internal.consumers():
                        if op.type.startswith(WRITE_OP_PREFIXES):
                            raise ValueError(
                                "hvd.overlap: the training step writes the trainable variable %s "
                                "(op %s %r); with overlap each step's update of it is applied in "
                                "the background and a write inside the step would race with it. "
                                "Move the write out of the step (kernel constraints are "
                                "supported) or drop hvd.overlap(...)"
                                % (pipe.variables[i].name, op.type, op.name))
                        used = True
                        wkey = (pipe.channel.id, task_of[i])
                        name = gstate["waits"].get(wkey)
                        wait = g.get_operation_by_name(name) if name else None
                        if wait is None:
                            with g.as_default(), g.control_dependencies(None):
                                wait = ops.independent(tf_ops.hvd_prio_overlap_wait(
                                    channel=pipe.channel.id, task=task_of[i],
                                    name="HvdPrioOverlapWait_%d" % task_of[i]))
                            gstate["waits"][wkey] = wait.name
                        if wait not in op.control_inputs:
                            op._add_control_input(wait)
                if used and home is None:
                    home = g
        if home is None:
            home = chain[0]
        home_waits = [home.get_operation_by_name(n)
                      for (c, _), n in _graph_state(home)["waits"].items() if c == channel]
        return home, home_waits

    def flush(self, timeout=None):
        for pipe in list(self.pipelines.values()):
            if not pipe.channel.flush(timeout):
                raise TimeoutError("horovod_prio overlap %s: updates still pending after %s s"
                                   % (pipe.name, timeout))


def _attach(opt):
    """Put a horovod_prio DistributedOptimizer into overlap mode (idempotent).
    Returns its state, or None when overlap is switched off by configuration."""
    st = opt.__dict__.get("_hvdprio_overlap")
    if st is not None:
        return st
    base = opt.__dict__.get("_allreduce_grads")
    if not isinstance(base, PriorityAllreduce):
        raise TypeError(
            "hvd.overlap: %r is not a horovod_prio DistributedOptimizer; create it with "
            "horovod_prio.tensorflow.keras.DistributedOptimizer(...) (or "
            "horovod_prio.tensorflow.DistributedOptimizer) and pass that to compile()/overlap()"
            % (type(opt).__name__,))
    if base.config.overlap is False or not base.config.enabled:
        log.info("horovod_prio: %s: hvd.overlap switched off (%s): synchronous training",
                 base.name, "HOROVOD_PRIO_ENABLED=0" if not base.config.enabled
                 else "PriorityConfig.overlap=False / HOROVOD_PRIO_OVERLAP=0")
        return None
    if base.passthrough_reason:
        if base.config.overlap:   # HOROVOD_PRIO_OVERLAP=1 / overlap=True: required
            raise ValueError("hvd.overlap: %s uses Horovod's own allreduce path (%s), but "
                             "PriorityConfig.overlap=True (HOROVOD_PRIO_OVERLAP=1) requires "
                             "barrier crossing" % (base.name, base.passthrough_reason))
        log.warning("horovod_prio: %s: hvd.overlap does nothing, synchronous training: it "
                    "uses Horovod's own allreduce path (%s)", base.name, base.passthrough_reason)
        return None
    legacy = _check_optimizer(opt, base)
    with _lock:
        st = _OverlapState(opt, base, legacy)
        object.__setattr__(opt, "_allreduce_grads", st.reduce)
        helper = getattr(opt, "_agg_helper", None)
        if helper is not None:
            if hasattr(helper, "_allreduce_grads"):
                helper._allreduce_grads = st.reduce
            if hasattr(helper, "allreduce_grads"):
                helper.allreduce_grads = st.reduce
        object.__setattr__(opt, "apply_gradients", st.apply_gradients)
        object.__setattr__(opt, "_allreduce", st.recording_allreduce)
        object.__setattr__(opt, "_hvdprio_overlap", st)
        base.overlap_attached = True
        get_runtime().add_overlap_state(st)
    return st


# --------------------------------------------------------------------------- Keras model
_FLUSH_FIRST = ("evaluate", "predict", "predict_on_batch", "test_on_batch", "save",
                "save_weights", "load_weights", "get_weights", "set_weights")


def _guard_callbacks(callbacks, do_flush):
    """Batch-level callbacks that may touch weights flush first (the decisions:
    ``horovod_prio.tensorflow.keras.callback_guard``). Returns an undo function."""
    from horovod_prio.tensorflow.keras import callback_guard
    return callback_guard.guard(callbacks, do_flush)


class _FlushAtEpochEnd(tf.keras.callbacks.Callback):
    """First callback of an overlapped fit: pending updates are applied before
    any other callback sees the epoch's end."""
    hvd_prio_overlap_safe = True

    def __init__(self, do_flush):
        super().__init__()
        self._do_flush = do_flush

    def on_epoch_end(self, epoch, logs=None):
        self._do_flush()


class _ModelHooks:
    """The overlap wrappers of one Keras model."""

    def __init__(self, model):
        self.model = model
        self.extra = []      # optimizers given to overlap(model, optimizer=...)
        self.orig = {}

    def states(self):
        out = []
        for opt in [getattr(self.model, "optimizer", None)] + self.extra:
            st = opt.__dict__.get("_hvdprio_overlap") if opt is not None else None
            if st is not None and st not in out:
                out.append(st)
        return out

    def flush(self):
        for st in self.states():
            st.flush()

    def flush_quietly(self):
        try:
            self.flush()
        except Exception as e:  # the original exception is the one to see
            log.error("horovod_prio: overlap: flush after a failed call: %s", e)

    def check(self):
        m = self.model
        if getattr(m, "run_eagerly", False) and self.states():
            raise RuntimeError(EAGER_MSG + " (model.run_eagerly is True)")
        spe = getattr(m, "_steps_per_execution", None)
        try:
            spe = int(spe.numpy()) if hasattr(spe, "numpy") else int(spe or 1)
        except (TypeError, ValueError):
            spe = 1
        if spe > 1 and self.states():
            raise ValueError("hvd.overlap: steps_per_execution=%d is not supported (the steps of "
                             "one call would run inside a tf.while_loop); use 1" % spe)
        if getattr(m, "_jit_compile", False) and self.states():
            raise ValueError("hvd.overlap: compile(jit_compile=True) is not supported (XLA cannot "
                             "compile the overlap kernels)")

    def install(self):
        m = self.model
        for name in _FLUSH_FIRST:
            self._wrap(name, self._flush_first)
        self._wrap("fit", self._fit)
        self._wrap("train_on_batch", self._flush_on_error)
        self._wrap("compile", self._compile)
        self._wrap("train_step", self._train_step)
        object.__setattr__(m, "_hvdprio_overlap_hooks", self)
        if getattr(m, "train_function", None) is not None:
            m.train_function = None   # retrace with the waits

    def _wrap(self, name, make):
        orig = getattr(self.model, name)
        self.orig[name] = orig
        wrapped = functools.wraps(orig)(make(orig))
        object.__setattr__(self.model, name, wrapped)

    def _flush_first(self, orig):
        def call(*args, **kwargs):
            self.flush()
            return orig(*args, **kwargs)
        return call

    def _flush_on_error(self, orig):
        def call(*args, **kwargs):
            self.check()
            try:
                return orig(*args, **kwargs)
            except BaseException:
                self.flush_quietly()
                raise
        return call

    def _compile(self, orig):
        def call(*args, **kwargs):
            out = orig(*args, **kwargs)
            opt = getattr(self.model, "optimizer", None)
            if opt is not None:
                _attach(opt)
            self.check()
            return out
        return call

    def _train_step(self, orig):
        @tf.autograph.experimental.do_not_convert
        def call(*args, **kwargs):
            out = orig(*args, **kwargs)
            if not tf.executing_eagerly():
                for st in self.states():   # reads added after the reduction wait too
                    st.guard(_graph_chain())
            return out
        return call

    def _fit(self, orig):
        sig = inspect.signature(orig)

        def call(*args, **kwargs):
            self.check()
            bound = sig.bind(*args, **kwargs)
            cbs = bound.arguments.get("callbacks")
            if cbs is None:
                cb_list = []
            elif isinstance(cbs, (list, tuple)):
                cb_list = list(cbs)
            elif hasattr(cbs, "callbacks"):        # a CallbackList
                cb_list = cbs.callbacks
            else:
                cb_list = [cbs]
            # (imported here: the keras package imports this module)
            restore = _guard_callbacks(cb_list, self.flush)
            first = _FlushAtEpochEnd(self.flush)
            if hasattr(cbs, "callbacks") and not isinstance(cbs, (list, tuple)):
                cbs.callbacks.insert(0, first)
                first.set_model(self.model)
            else:
                bound.arguments["callbacks"] = [first] + cb_list
            self.flush()
            try:
                out = orig(*bound.args, **bound.kwargs)
            except BaseException:
                self.flush_quietly()
                raise
            finally:
                restore()
                if hasattr(cbs, "callbacks") and not isinstance(cbs, (list, tuple)) \
                        and first in cbs.callbacks:
                    cbs.callbacks.remove(first)
            self.flush()
            return out
        return call


@tf.autograph.experimental.do_not_convert
def overlap(model, optimizer=None):
    """Barrier crossing for a Keras model (and/or a horovod_prio DistributedOptimizer).

    * ``model = hvd.overlap(model)`` before ``model.compile(optimizer=hvd.DistributedOptimizer(...))``
      (or after: the compiled optimizer is switched over): ``fit``'s steps overlap.
    * ``model = hvd.overlap(model, optimizer=opt)`` for a custom ``tf.GradientTape``
      loop: call ``opt.minimize(loss, vars, tape=tape)`` (or ``opt.compute_gradients`` +
      ``opt.apply_gradients`` with the returned pairs) inside a ``tf.function``.
    * ``opt = hvd.overlap(opt)``: only the optimizer (no model to hook): call
      :func:`flush` yourself before reading weights outside a training step.

    Returns its first argument. See docs/overlap.md for what flushes, what is
    supported and the errors raised otherwise."""
    _load()
    _warn_one_inter_op_thread()
    if isinstance(model, (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer)):
        if optimizer is not None:
            raise TypeError("hvd.overlap(optimizer, optimizer=...): pass one optimizer")
        _attach(model)
        return model
    if not isinstance(model, tf.keras.Model):
        raise TypeError("hvd.overlap: expected a tf.keras.Model or a horovod_prio "
                        "DistributedOptimizer, got %r" % (type(model).__name__,))
    hooks = model.__dict__.get("_hvdprio_overlap_hooks")
    if hooks is None:
        hooks = _ModelHooks(model)
        hooks.install()
    if optimizer is not None:
        if _attach(optimizer) is not None and optimizer not in hooks.extra:
            hooks.extra.append(optimizer)
    elif getattr(model, "optimizer", None) is not None:
        _attach(model.optimizer)
    return model


def _warn_one_inter_op_thread():
    """With one TF inter-op thread the background update of step k can only run
    when the training call of step k+1 leaves the thread: the math is the same,
    the overlap is gone. Said once per process (TF's default, 0, picks per core)."""
    if tf.config.threading.get_inter_op_parallelism_threads() != 1 \
            or not get_runtime().first_time("overlap with one inter-op thread"):
        return
    log.warning("horovod_prio: hvd.overlap with 1 TensorFlow inter-op thread: the background "
                "update cannot run beside the training call, so steps do not overlap (same "
                "math); set tf.config.threading.set_inter_op_parallelism_threads(2) or more")


@tf.autograph.experimental.do_not_convert
def flush(target=None, timeout=None):
    """Apply every pending overlapped update of ``target`` (a model or optimizer given
    to :func:`overlap`; default: all of this process) before returning. A local
    wait, no collective. Raises :class:`OverlapError` if a step failed, and
    ``TimeoutError`` after ``timeout`` seconds."""
    if target is None:
        states = list(get_runtime().overlap_states)
    elif isinstance(target, tf.keras.Model):
        hooks = target.__dict__.get("_hvdprio_overlap_hooks")
        states = hooks.states() if hooks is not None else []
    else:
        st = getattr(target, "__dict__", {}).get("_hvdprio_overlap")
        states = [st] if st is not None else []
    for st in states:
        st.flush(timeout)


def channels():
    """The overlap channels of this process (for tests and tools)."""
    return [p.channel for st in list(get_runtime().overlap_states)
            for p in list(st.pipelines.values())]


def stats():
    """{channel name: counters} of this process's overlap channels."""
    return {c.name: c.stats() for c in channels()}
