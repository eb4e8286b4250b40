"""Placement by op type for a tape-based training step: which trainer kind
each trainable variable (or named group of variables) of the step would run on.

``place_step(step_fn, *example_args)`` traces ``step_fn(*example_args)`` -- a
Python function (or a ``tf.function``, unwrapped) that runs its forward pass
under ``tf.GradientTape`` and computes gradients, applying them or not -- with
``tf.function(...).get_concrete_function`` and attributes op types to each
variable it reads:

* *reads*: the ops that take the variable's handle, or its value through
  ``ReadVariableOp``/``Identity``/``Cast``, including inside nested functions
  and control-flow branches (``ResourceGather`` of a lookup, ``MatMul`` of a
  kernel, the optimizer's ``ResourceScatterAdd`` on a table);
* *gradient*: the ops that ``tape.gradient`` built for this unit's gradient
  alone (ancestors of its gradient that no other gradient of the step needs;
  a call op counts with every op of the function it calls), e.g. the
  ``SparseSegmentMeanGrad`` of ``tf.nn.embedding_lookup_sparse`` or a gather
  in a custom gradient.

Those op types go through :func:`horovod_prio.heter.placement.classify`, the
rule and tables layers use (an integer gather does not count); an override
by unit name wins. The plan is printable like a model's; it is for
inspection: :class:`~horovod_prio.heter.trainer.HeterTrainer` runs Keras
models only.
"""
import collections
import contextlib
import re

from horovod_prio.heter.placement import (
    KindPlan, _gathers_a_shape, _nbytes, check_overrides, classify, overridden, ring_bytes,
    table_traffic)

UnitPlacement = collections.namedtuple(
    "UnitPlacement",
    "name variables shapes kind reason param_bytes sparse_ops dense_ops reads grad_ops")

#: ops through which a variable's value passes unchanged on its way to an op that uses it
_PASS_THROUGH = frozenset({"ReadVariableOp", "Identity", "IdentityN", "Snapshot", "Cast"})
#: call ops whose first input is a condition or branch index, not a function argument
_FIRST_INPUT_SELECTS = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})
#: ops of a backward pass that two equal-looking nodes may not share (random draws)
_STATEFUL_GRAD_OPS = frozenset({"RandomUniform", "RandomStandardNormal", "TruncatedNormal",
                                "StatefulPartitionedCall"})

_NOT_CUT = ("a tape step has no layers, so which tensors cross from the sparse to "
            "the dense trainers is not defined until the step is written as Keras layers")


def _tf():
    import tensorflow as tf
    return tf


def _unit_name(variable):
    return re.sub(r":0$", "", variable.name)


def _source(inp):
    return inp.split(":")[0]


class _Graph:
    """A traced step's GraphDef with its function library: who consumes what,
    inside every function body too."""

    def __init__(self, graph_def):
        self.lib = {f.signature.name: f for f in graph_def.library.function}
        self.args = {f: [a.name for a in d.signature.input_arg] for f, d in self.lib.items()}
        self.outer = {n.name: n for n in graph_def.node}
        self.consumers = collections.defaultdict(list)     # (scope, source) -> [(scope, node, i)]
        scopes = [(None, graph_def.node)] + [(f, d.node_def) for f, d in self.lib.items()]
        for scope, nodes in scopes:
            for node in nodes:
                data = [i for i in node.input if not i.startswith("^")]
                for i, inp in enumerate(data):
                    self.consumers[(scope, _source(inp))].append((scope, node, i))
        self._types = {}

    def bodies(self, node):
        """(function, index of the input its first argument takes) per function ``node`` calls."""
        first = 1 if node.op in _FIRST_INPUT_SELECTS else 0
        out = [(node.op, 0)] if node.op in self.lib else []
        for key in sorted(node.attr):
            attr = node.attr[key]
            out += [(f, first) for f in [attr.func.name] + [g.name for g in attr.list.func]]
        return [(f, i) for f, i in out if f in self.lib]

    def readers(self, handle):
        """Nodes that use the variable whose handle is the outer node ``handle``."""
        seen, todo, found = set(), [(None, handle)], []
        while todo:
            key = todo.pop()
            if key in seen:
                continue
            seen.add(key)
            for scope, node, i in self.consumers[key]:
                bodies = self.bodies(node)
                for f, first in bodies:
                    if 0 <= i - first < len(self.args[f]):
                        todo.append((f, self.args[f][i - first]))
                if not bodies and node.op in _PASS_THROUGH:
                    todo.append((scope, node.name))
                elif not bodies:
                    found.append((scope, node))
        return found

    def types(self, node):
        """Op types ``node`` stands for: its own, or every op of the functions it calls."""
        calls = self.bodies(node)
        if not calls:
            return set() if _gathers_a_shape(node) else {node.op}
        out = set()
        for f, _ in calls:
            if f not in self._types:
                self._types[f] = set()                     # recursion guard
                self._types[f] = set().union(*[self.types(n) for n in self.lib[f].node_def])
            out |= self._types[f]
        return out

    def same_values(self, within):
        """name -> the first of the nodes among ``within`` computing the same
        value (same op, attributes and inputs): a gradient converted to dense
        once per use (an IndexedSlices read by both inputs' gradients of a
        MatMul) is one computation shared by both, not one per variable."""
        rep, first = {}, {}
        for name, node in self.outer.items():                 # inputs come first
            if name not in within or node.op in _STATEFUL_GRAD_OPS:
                continue
            inputs = tuple((rep.get(_source(i), _source(i)),) + tuple(i.split(":")[1:])
                           for i in node.input if not i.startswith("^"))
            attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                                 for k, v in node.attr.items() if not k.startswith("_")))
            rep[name] = first.setdefault((node.op, inputs, attrs), name)
        return rep

    def cone(self, names, within):
        """Outer nodes among ``within`` that ``names`` depend on through data inputs."""
        out, todo = set(), [n for n in names if n in within]
        while todo:
            name = todo.pop()
            if name in out:
                continue
            out.add(name)
            todo += [s for s in map(_source, self.outer[name].input)
                     if not s.startswith("^") and s in within]
        return out


@contextlib.contextmanager
def _recording_gradients(records):
    """While tracing, note every ``GradientTape.gradient`` call: its graph, the
    ops it built, its sources and their gradients."""
    tf = _tf()
    real = tf.GradientTape.gradient

    def gradient(self, target, sources, *args, **kwargs):
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        result = real(self, target, sources, *args, **kwargs)
        records.append((graph, {op.name for op in graph.get_operations()[before:]},
                        tf.nest.flatten(sources), tf.nest.flatten(result)))
        return result

    tf.GradientTape.gradient = gradient
    try:
        yield
    finally:
        tf.GradientTape.gradient = real


def _trace(step_fn, args):
    tf = _tf()
    fn = getattr(step_fn, "python_function", step_fn)      # a tf.function: trace its Python
    name = getattr(fn, "__name__", repr(fn))
    records = []
    try:
        with _recording_gradients(records):
            concrete = tf.function(fn).get_concrete_function(*args)
    except Exception as e:
        raise ValueError("step function %r failed to trace with the example arguments: %s: %s"
                         % (name, type(e).__name__, e)) from e
    return name, concrete, [r for r in records if r[0] is concrete.graph]


def _units(variables, captured, name):
    """[(unit name, [variables])] from ``variables`` (None, a list, or a dict
    of unit name -> variable or list of variables)."""
    if variables is None:
        found = [v for v in captured if v.trainable]
        if not found:
            raise ValueError("step function %r reads no trainable variable: nothing to place"
                             % name)
        units = [(_unit_name(v), [v]) for v in found]
    elif isinstance(variables, dict):
        units = [(str(k), list(v) if isinstance(v, (list, tuple)) else [v])
                 for k, v in variables.items()]
    else:
        units = [(_unit_name(v) if hasattr(v, "handle") else repr(v), [v]) for v in variables]
    if not units:
        raise ValueError("variables=%r: name at least one variable to place" % (variables,))
    read = {id(v) for v in captured}
    seen = set()
    for unit, members in units:
        if unit in seen:
            raise ValueError("two variables of step %r are named %r: give them distinct names "
                             "or pass variables={unit name: variable}" % (name, unit))
        seen.add(unit)
        if not members:
            raise ValueError("variables: unit %r holds no variable" % unit)
        for v in members:
            if not hasattr(v, "handle"):
                raise ValueError("variables: unit %r holds %r, which is not a tf.Variable"
                                 % (unit, v))
            if id(v) not in read:
                raise ValueError("variables: unit %r holds variable %r, which step function %r "
                                 "does not read" % (unit, v.name, name))
    ids = [id(v) for _, members in units for v in members]
    if len(ids) != len(set(ids)):
        raise ValueError("variables: a variable is in more than one unit")
    return units


def place_step(step_fn, *example_args, variables=None, overrides=None, require_sparse=True):
    """Place the trainable variables of a tape-based training step (see the
    module doc); returns a :class:`StepPlan`.

    ``example_args``: what ``step_fn`` is called with (tensors, arrays,
    SparseTensors, nested structures); the step is traced at their shapes.
    ``variables``: None (every trainable variable the step reads, one unit
    each, named like the variable without ``:0``), a list of variables (one
    unit each) or ``{unit name: variable or list of variables}`` (groups).
    ``overrides``: ``{unit name: "sparse" | "dense"}``. Raises ValueError for
    a step that does not trace, reads no trainable variable or computes no
    gradient, a unit holding a variable the step does not read, an unknown
    unit or kind in ``overrides``, and (``require_sparse``) when no unit ends
    up sparse.
    """
    tf = _tf()
    name, concrete, records = _trace(step_fn, example_args)
    graph = concrete.graph
    handles = {id(ext): internal.op.name for ext, internal in graph.captures}
    captured = [v for v in graph.variables if id(v.handle) in handles]
    g = _Graph(graph.as_graph_def())
    order = {n: i for i, n in enumerate(g.outer)}
    captured.sort(key=lambda v: order[handles[id(v.handle)]])
    units = _units(variables, captured, name)
    overrides = check_overrides(overrides, [u for u, _ in units], "variable", "step %r" % name)
    if not records:
        raise ValueError("step function %r computes no gradient (no tf.GradientTape.gradient "
                         "call in its own graph, outside control flow): place_step places a "
                         "training step's forward and backward ops" % name)

    # every gradient source owns the backward ops that only its gradient needs
    unit_of = {id(v): u for u, members in units for v in members}
    owners, cones, same = collections.defaultdict(set), collections.defaultdict(set), {}
    for k, (_, built, sources, grads) in enumerate(records):
        same.update(g.same_values(built))
        for j, (src, grad) in enumerate(zip(sources, grads)):
            owner = unit_of.get(id(src), (k, j))
            tensors = [] if grad is None else (
                [grad.values, grad.indices] if isinstance(grad, tf.IndexedSlices) else [grad])
            for node in g.cone([t.op.name for t in tensors], built):
                owners[same.get(node, node)].add(owner)
                cones[owner].add(node)

    placed = []
    for unit, members in units:
        reads = [(s, n) for v in members for s, n in g.readers(handles[id(v.handle)])]
        read_types = set().union(*[g.types(n) for _, n in reads])
        grad_types = set().union(*[g.types(g.outer[n]) for n in cones[unit]
                                   if owners[same.get(n, n)] == {unit}])
        kind, reason, sparse, dense = classify(read_types | grad_types)
        kind, reason = overridden(kind, reason, unit, overrides)
        placed.append(UnitPlacement(unit, tuple(v.name for v in members),
                                    tuple(tuple(v.shape.as_list()) for v in members), kind, reason,
                                    _nbytes(members), sparse, dense, tuple(sorted(read_types)),
                                    tuple(sorted(grad_types))))
    plan = StepPlan(name, placed, _lookups(g, graph, units, handles))
    if require_sparse:
        plan.require_sparse("step function %r" % name)
    return plan


def _lookups(g, graph, units, handles):
    """unit -> [(ids, rows, dim)] per row lookup of its variables (ids None
    where the count of ids is not static or the lookup is not a ResourceGather
    in the step's own graph)."""
    out = {}
    for unit, members in units:
        out[unit] = []
        for v in members:
            for scope, node in g.readers(handles[id(v.handle)]):
                if node.op not in ("ResourceGather", "GatherV2", "Gather", "ResourceGatherNd",
                                   "GatherNd") or _gathers_a_shape(node):
                    continue
                ids = None
                if scope is None and node.op == "ResourceGather" and len(v.shape) >= 1:
                    ids = graph.get_operation_by_name(node.name).inputs[1].shape.num_elements()
                dim = v.shape[1:].num_elements() if len(v.shape) >= 1 else None
                out[unit].append((ids, int(v.shape[0]) if len(v.shape) else None, dim))
    return out


class StepPlan(KindPlan):
    """Unit (a variable or a named group) -> kind for one tape step, with
    parameter bytes; see :func:`place_step`. For inspection: the heterogeneous
    trainer runs Keras models (:func:`horovod_prio.heter.placement.place`)."""

    def __init__(self, step_name, units, lookups):
        super().__init__(units)
        self.step_name = step_name
        self._lookups = lookups

    def _unknown_rows(self):
        """Sparse units whose rows per step are not known: no row lookup, or
        one whose count of ids is not static."""
        return [u for u in self.names("sparse")
                if not self._lookups[u] or any(ids is None for ids, _, _ in self._lookups[u])]

    def exchange_bytes(self, dense_trainers=1):
        """Upper bound of the bytes one step at the traced example arguments
        exchanges, by kind of traffic (every id distinct, capped at the
        table); None where it cannot be computed (:meth:`not_computed` says why)."""
        if dense_trainers < 1:
            raise ValueError("dense_trainers=%r: give at least 1" % (dense_trainers,))
        keys = rows = None
        if not self._unknown_rows():
            keys = rows = 0
            for unit in self.names("sparse"):
                for ids, n_rows, dim in self._lookups[unit]:
                    k, r = table_traffic(ids, n_rows, dim)
                    keys, rows = keys + k, rows + r
        return collections.OrderedDict([
            ("pull_keys", keys), ("pull_rows", rows), ("activations", None),
            ("activation_grads", None), ("push_row_grads", rows),
            ("dense_allreduce_per_trainer", ring_bytes(self.param_bytes("dense"), dense_trainers)),
        ])

    def not_computed(self):
        """{traffic name: why it cannot be computed for this step}."""
        why = {"activations": _NOT_CUT, "activation_grads": _NOT_CUT}
        unknown = self._unknown_rows()
        if unknown:
            rows = ("%s not looked up by a ResourceGather in the step's own graph "
                    "whose number of ids is static at the example arguments" % ", ".join(unknown))
            why.update(pull_keys=rows, pull_rows=rows, push_row_grads=rows)
        return why

    def format(self, dense_trainers=1):
        lines = ["placement of tape step %r" % self.step_name,
                 "%-24s %-16s %-7s %12s  %s" % ("unit", "shape", "kind", "param bytes", "why")]
        for p in self.units:
            lines.append("%-24s %-16s %-7s %12d  %s" % (p.name, self._shape(p), p.kind,
                                                         p.param_bytes, p.reason))
        lines.extend(self.kind_lines())
        lines.append("per step at the example arguments (upper bound, every id distinct):")
        why, notes = self.not_computed(), []
        for name, n in self.exchange_bytes(dense_trainers).items():
            if n is None:
                if why[name] not in notes:
                    notes.append(why[name])
                lines.append("  %-28s not computed (%d)" % (name, notes.index(why[name]) + 1))
            else:
                lines.append("  %-28s %12d bytes" % (name, n))
        lines += ["  (%d) %s" % (i + 1, text) for i, text in enumerate(notes)]
        return "\n".join(lines)

    __str__ = format

    @staticmethod
    def _shape(p):
        if len(p.shapes) == 1:
            return "x".join(str(d) for d in p.shapes[0]) or "scalar"
        return "%d variables" % len(p.shapes)
