"""Placement by op type: which trainer kind runs each layer of a Keras model.

Every layer's call is traced under a ``tf.function`` inside a
``GradientTape`` (forward and backward: the gradient of its output with
respect to its trainable variables and float inputs), and the op types of the
traced graph (nested functions included) decide its kind:

* any op in :data:`SPARSE_OP_TYPES` (gathers, lookups, segment reductions,
  unique, hashing, scatters) -> ``"sparse"``: memory-bound, touches a few rows
  of a large table; runs on sparse trainers, its parameters on the
  parameter-server shards;
* else any op in :data:`DENSE_OP_TYPES` (matmul, convolution, einsum) ->
  ``"dense"``: compute-bound; runs on dense trainers;
* else (elementwise, reshapes, concatenation: no typed op) -> ``"dense"``
  with the reason ``"no typed op"``; such layers follow the dense math --
  except a weightless one that reads only sparse-kind outputs and makes them
  smaller (mean-pooling a multi-hot field): it joins the sparse kind, so the
  sparse trainers send the smaller tensor.

A gather of integers (entries of a shape vector, as in ``Tensordot`` or a
mean's gradient) does not count as a sparse op.

A per-layer override (``{"layer_name": "sparse" | "dense"}``) wins over the
op types. The table of op types is stated here once (docs/heter.md repeats it);
:mod:`horovod_prio.heter.tape_placement` applies the same tables and rule
(:func:`classify`) to the variables of a tape-based training step.
"""
import collections
import contextlib

KINDS = ("sparse", "dense")

SPARSE_OP_TYPES = frozenset({
    # gathers and lookups
    "Gather", "GatherV2", "GatherNd", "ResourceGather", "ResourceGatherNd",
    "LookupTableFind", "LookupTableFindV2", "LookupTableImport", "LookupTableImportV2",
    # segment reductions (pooling of multi-hot ids, the gather's gradient)
    "SegmentSum", "SegmentMean", "SegmentMax", "SegmentMin", "SegmentProd",
    "UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin", "UnsortedSegmentProd",
    "SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN",
    "SparseSegmentSumWithNumSegments", "SparseSegmentMeanWithNumSegments",
    "SparseSegmentSqrtNWithNumSegments", "SparseSegmentSumGrad", "SparseSegmentMeanGrad",
    "SparseSegmentSqrtNGrad",
    # deduplication
    "Unique", "UniqueV2", "UniqueWithCounts", "UniqueWithCountsV2",
    # hashing of raw feature values
    "StringToHashBucket", "StringToHashBucketFast", "StringToHashBucketStrong",
    # row scatters
    "ScatterNd", "TensorScatterAdd", "TensorScatterUpdate", "ResourceScatterAdd",
    "ResourceScatterUpdate", "SparseTensorDenseMatMul",
})

DENSE_OP_TYPES = frozenset({
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul", "Einsum",
    "Conv2D", "Conv3D", "_FusedConv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
    "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
})

def classify(op_types):
    """(kind, reason, sparse op types, dense op types) of a unit whose forward
    and backward graph holds ``op_types`` (integer gathers already left out):
    any sparse op -> sparse, else any dense op -> dense, else dense with the
    reason "no typed op"."""
    sparse, dense = sorted(op_types & SPARSE_OP_TYPES), sorted(op_types & DENSE_OP_TYPES)
    if sparse:
        return "sparse", "ops " + ",".join(sparse), tuple(sparse), tuple(dense)
    if dense:
        return "dense", "ops " + ",".join(dense), tuple(sparse), tuple(dense)
    return "dense", "no typed op", tuple(sparse), tuple(dense)


def check_overrides(overrides, names, what, owner):
    """``overrides`` as a dict, every key one of ``names`` (the ``what``s of
    ``owner``, e.g. "layer", "model 'm'") and every value one of KINDS."""
    overrides = dict(overrides or {})
    for name, kind in overrides.items():
        if name not in names:
            raise ValueError("placement override names %s %r, which %s does not have "
                             "(its %ss: %s)" % (what, name, owner, what, ", ".join(names)))
        if kind not in KINDS:
            raise ValueError("placement override for %s %r: kind %r is not one of %s"
                             % (what, name, kind, ", ".join(KINDS)))
    return overrides


def overridden(kind, reason, name, overrides):
    """(kind, reason) after ``overrides`` (checked by :func:`check_overrides`)."""
    if name in overrides:
        return overrides[name], "override (ops said %s: %s)" % (kind, reason)
    return kind, reason


def table_traffic(ids, rows, dim):
    """(key bytes, row bytes) one way for ``ids`` lookups into a table of
    ``rows`` x ``dim``: every id distinct, capped at the table; 8-byte keys,
    float32 rows as the shards hold them."""
    touched = min(ids, rows)
    return touched * 8, touched * dim * 4


def ring_bytes(dense, trainers):
    """Bytes a ring allreduce of ``dense`` bytes sends per trainer."""
    return 0 if trainers == 1 else 2 * (trainers - 1) * dense // trainers


class KindPlan:
    """What every plan answers: a unit's kind, the units and parameter bytes
    of each kind (units: layers of a model, variables of a tape step)."""

    unit_word = "units"

    def __init__(self, units):
        self.units = units
        self._by_name = {p.name: p for p in units}

    def kind(self, name):
        return self._by_name[name].kind

    def names(self, kind):
        return [p.name for p in self.units if p.kind == kind]

    def param_bytes(self, kind):
        return sum(p.param_bytes for p in self.units if p.kind == kind)

    def kind_lines(self):
        return ["%s kind: %d %s, %d parameter bytes"
                % (k, len(self.names(k)), self.unit_word, self.param_bytes(k)) for k in KINDS]

    def require_sparse(self, what):
        if not self.names("sparse"):
            raise ValueError("%s has no %s with a sparse op (%s ...): nothing for sparse "
                             "trainers or parameter-server shards; train it data-parallel, or "
                             "override a %s to 'sparse'"
                             % (what, self.unit_word[:-1], ", ".join(sorted(SPARSE_OP_TYPES)[:4]),
                                self.unit_word[:-1]))


LayerPlacement = collections.namedtuple(
    "LayerPlacement", "name cls kind reason param_bytes out_bytes_per_sample sparse_ops dense_ops")


def _tf():
    import tensorflow as tf
    return tf


def _spec(t):
    tf = _tf()
    return tf.TensorSpec(t.shape, t.dtype)


def _layer_inputs(layer):
    """The KerasTensor structure of the layer's first call (functional or built
    Sequential models)."""
    try:
        return layer.input
    except (AttributeError, ValueError) as e:
        raise ValueError("layer %r has no recorded input (build the model on Keras Inputs "
                         "first): %s" % (layer.name, e)) from e


def layer_op_types(layer):
    """Set of op types in ``layer``'s forward and backward graph."""
    tf = _tf()
    inputs = _layer_inputs(layer)
    specs = tf.nest.map_structure(_spec, inputs)

    def fwd_bwd(*flat):
        x = tf.nest.pack_sequence_as(inputs, list(flat))
        floats = [t for t in flat if t.dtype.is_floating]
        with tf.GradientTape() as tape:
            tape.watch(floats)
            y = layer(x, training=True)
        sources = list(layer.trainable_variables) + floats
        if sources:
            grads = tape.gradient(tf.nest.flatten(y), sources,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            return tf.nest.flatten(y), grads
        return tf.nest.flatten(y)

    concrete = tf.function(fwd_bwd).get_concrete_function(*tf.nest.flatten(specs))
    gd = concrete.graph.as_graph_def()
    nodes = list(gd.node)
    for f in gd.library.function:
        nodes.extend(f.node_def)
    return {n.op for n in nodes if not _gathers_a_shape(n)}


#: gathers whose params are integers pick entries of a shape or index vector
#: (Tensordot, a mean's gradient), not rows of a table: not a sparse op
_INT_TYPES = frozenset({3, 9})          # DT_INT32, DT_INT64


def _gathers_a_shape(node):
    return node.op in ("Gather", "GatherV2", "GatherNd") and \
        node.attr["Tparams"].type in _INT_TYPES


def _nbytes(variables):
    return int(sum(v.shape.num_elements() * v.dtype.size for v in variables))


@contextlib.contextmanager
def placeholder_tables():
    """Within this context ``tf.keras.layers.Embedding`` layers built (e.g. by
    building a model) get a one-row placeholder instead of their table: the
    model traces, places and cuts as before, but no rank allocates a table.
    The declared shape stays on the layer (:func:`table_shape`); the
    parameter-server shards then initialise only their own rows with the
    layer's ``embeddings_initializer``. Build the model inside it on every
    rank of a heterogeneous job whose tables should live only on the shards."""
    tf = _tf()
    cls = tf.keras.layers.Embedding
    real = cls.build

    def build(self, input_shape=None):
        self._heter_table_shape = (int(self.input_dim), int(self.output_dim))
        self.embeddings = self.add_weight(
            shape=(1, self.output_dim), initializer=self.embeddings_initializer,
            name="embeddings", regularizer=self.embeddings_regularizer,
            constraint=self.embeddings_constraint, experimental_autocast=False)
        self.built = True

    cls.build = build
    try:
        yield
    finally:
        cls.build = real


def is_placeholder(layer):
    """True for an embedding layer built under :func:`placeholder_tables`."""
    return getattr(layer, "_heter_table_shape", None) is not None


def table_shape(layer):
    """(rows, dim) of an embedding layer's table as declared (a placeholder's
    too), or None for a layer without a 2-D table."""
    if is_placeholder(layer):
        return layer._heter_table_shape
    table = max(layer.trainable_variables, key=lambda v: v.shape.num_elements(), default=None)
    if table is None or len(table.shape) != 2:
        return None
    return int(table.shape[0]), int(table.shape[1])


def _param_bytes(layer):
    if is_placeholder(layer):
        rows, dim = layer._heter_table_shape
        others = [w for w in layer.weights if w is not layer.embeddings]
        return rows * dim * layer.embeddings.dtype.size + _nbytes(others)
    return _nbytes(layer.weights)


def _out_bytes_per_sample(layer):
    total = 0
    for t in _tf().nest.flatten(layer.output):
        n = 1
        for d in t.shape[1:]:
            if d is None:
                return None
            n *= d
        total += n * t.dtype.size
    return total


class Plan(KindPlan):
    """Layer -> kind for one model, with its sizes (see :func:`place`)."""

    unit_word = "layers"

    def __init__(self, model, layers):
        super().__init__(layers)
        self.model_name = model.name
        self.layers = layers
        self._model = model

    def boundary(self):
        """Sparse-kind layers whose output a dense-kind layer consumes (the
        activations exchanged every step)."""
        out = []
        for p in self.layers:
            if p.kind != "sparse":
                continue
            layer = self._model.get_layer(p.name)
            consumers = [n.outbound_layer for n in layer.outbound_nodes]
            if any(c.name in self._by_name and self.kind(c.name) == "dense" for c in consumers) \
                    or self._feeds_output(layer):
                out.append(p)
        return out

    def _feeds_output(self, layer):
        return any(getattr(t, "_keras_history", None) is not None and t._keras_history.layer is layer
                   for t in self._model.outputs)

    def exchange_bytes(self, batch_size, dense_trainers=1):
        """Upper bound of the bytes one step exchanges, by kind of traffic,
        for a global batch of ``batch_size`` samples: every id distinct (the
        rows a batch touches cannot exceed its ids nor the table)."""
        if batch_size < 1:
            raise ValueError("batch_size=%r: give a positive number of samples" % (batch_size,))
        if dense_trainers < 1:
            raise ValueError("dense_trainers=%r: give at least 1" % (dense_trainers,))
        tf = _tf()
        keys = rows = acts = 0
        for p in self.layers:
            if p.kind != "sparse":
                continue
            layer = self._model.get_layer(p.name)
            ids_per_sample = 1
            for t in tf.nest.flatten(layer.input):
                for d in t.shape[1:]:
                    ids_per_sample *= d or 1
            shape = table_shape(layer)
            if shape is None:
                continue
            k, r = table_traffic(batch_size * ids_per_sample, *shape)
            keys, rows = keys + k, rows + r
        for p in self.boundary():
            acts += batch_size * (p.out_bytes_per_sample or 0)
        ring = ring_bytes(self.param_bytes("dense"), dense_trainers)
        return collections.OrderedDict([
            ("pull_keys", keys), ("pull_rows", rows), ("activations", acts),
            ("activation_grads", acts), ("push_row_grads", rows),
            ("dense_allreduce_per_trainer", ring),
        ])

    def format(self, batch_size=None, dense_trainers=1):
        lines = ["placement of model %r" % self.model_name,
                 "%-24s %-22s %-7s %12s  %s" % ("layer", "class", "kind", "param bytes", "why")]
        for p in self.layers:
            lines.append("%-24s %-22s %-7s %12d  %s" % (p.name, p.cls, p.kind, p.param_bytes, p.reason))
        lines.extend(self.kind_lines())
        if batch_size:
            lines.append("per step at global batch %d (upper bound, every id distinct):" % batch_size)
            for name, n in self.exchange_bytes(batch_size, dense_trainers).items():
                lines.append("  %-28s %12d bytes" % (name, n))
        return "\n".join(lines)

    __str__ = format


def _reductions_to_sparse(model, placed, overrides):
    """A weightless layer with no typed op that reads only sparse-kind outputs
    and makes them smaller (the pooling of a multi-hot field) joins the
    sparse kind: run where the rows are, it shrinks what crosses to the dense
    trainers. Layers come in the model's (topological) order, so a chain of
    such reductions moves as a whole."""
    kinds = {p.name: p.kind for p in placed}
    out = []
    for p in placed:
        layer = model.get_layer(p.name)
        if p.kind == "dense" and p.reason == "no typed op" and p.name not in overrides \
                and not layer.weights and len(layer.inbound_nodes) == 1:
            sources = _tf().nest.flatten(layer.inbound_nodes[0].inbound_layers)
            in_bytes = [_out_bytes_per_sample(s) for s in sources]
            if sources and all(kinds.get(s.name) == "sparse" for s in sources) \
                    and None not in in_bytes and p.out_bytes_per_sample is not None \
                    and p.out_bytes_per_sample < sum(in_bytes):
                p = p._replace(kind="sparse", reason="reduces sparse-kind outputs (%d -> %d "
                               "bytes per sample)" % (sum(in_bytes), p.out_bytes_per_sample))
        kinds[p.name] = p.kind
        out.append(p)
    return out


def place(model, overrides=None, require_sparse=True):
    """Classify every layer of a built Keras ``model`` (see the module doc).

    ``overrides``: ``{layer_name: "sparse" | "dense"}``, checked against the
    model's layer names. Raises ValueError for an unknown layer name or kind,
    and (``require_sparse``) when no layer ends up sparse: such a model has
    nothing for sparse trainers or parameter-server shards to do.
    """
    overrides = check_overrides(overrides, [l.name for l in model.layers], "layer",
                                "model %r" % model.name)
    tf = _tf()
    placed = []
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.InputLayer):
            continue
        kind, reason, sparse, dense = classify(layer_op_types(layer))
        kind, reason = overridden(kind, reason, layer.name, overrides)
        placed.append(LayerPlacement(layer.name, type(layer).__name__, kind, reason,
                                     _param_bytes(layer), _out_bytes_per_sample(layer),
                                     sparse, dense))
    placed = _reductions_to_sparse(model, placed, overrides)
    plan = Plan(model, placed)
    if require_sparse:
        plan.require_sparse("model %r" % model.name)
    return plan
