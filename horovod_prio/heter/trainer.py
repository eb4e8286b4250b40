"""One synchronous heterogeneous step over Horovod collectives on process sets.

Every rank calls :meth:`HeterTrainer.step` with the same global batch; each
does its role's part (docs/heter.md has the picture):

1. every rank checks the batch's ids against the tables (a bad id raises the
   same ValueError everywhere before any collective: no rank is left waiting);
2. sparse trainers take their contiguous slice of the batch, dedupe the ids
   of all tables of one row width at once (``tf.unique`` over the keys
   table offset + id), and send the keys to the shards that own them --
   ``alltoall`` on ``sparse_ps``;
3. shards answer with those rows -- ``alltoall`` on ``sparse_ps``;
4. sparse trainers gather the rows back into the embeddings' outputs, run
   the *sparse side* (the sparse-kind layers after the tables, e.g. the
   pooling of multi-hot fields) and send each dense trainer the samples of
   its slice -- ``alltoall`` on ``sparse_dense``;
5. dense trainers run the dense part (every dense-kind layer) forward and
   backward, and send the gradients of what they received back --
   ``alltoall`` on ``sparse_dense``;
6. sparse trainers backpropagate through the sparse side, sum each unique
   id's gradient (``unsorted_segment_sum``, as Keras's IndexedSlices path
   does) and push the sums to the shards -- ``alltoall`` on ``sparse_ps``;
   each shard applies its optimizer to all its tables in one call
   (:mod:`horovod_prio.heter.ps`) -- with the next step's keys known, where
   it is exact, only the rows the next step reads, the rest after the next
   step's rows are sent (:meth:`HeterTrainer._answer`);
7. dense trainers allreduce the dense gradients on ``dense`` and each applies
   the same Keras optimizer to its copy of the dense weights.

Given the next batch (``next_inputs``, :meth:`HeterTrainer.fit`), step 6
also carries the next step's keys, which skips step 2 next time.

Every collective goes through :mod:`horovod_prio.heter.exchange`: the
priority scheduler's gate (priorities and holders:
:mod:`horovod_prio.method.heter`), the step clock of rank 0's monitor and,
if the job names one, the link arbiter.

Step 7 replaces "push dense gradients to the parameter server, pull the
weights back": the update is a deterministic function of the reduced gradient
and the optimizer state, every dense trainer holds the same state and applies
the same kernels to the same inputs, so every copy is the one a server would
hold, and a ring allreduce moves 2(D-1)/D of the dense bytes per trainer
instead of a push and a pull of all of them through one server.
"""
import collections
import logging

import numpy as np

from horovod_prio.heter import placement as placement_mod
from horovod_prio.heter import ps as ps_mod
from horovod_prio.heter.tape_placement import StepPlan
from horovod_prio.runtime import malloc


log = logging.getLogger("horovod_prio")


def split_batch(n, parts):
    """[start, end) of each of ``parts`` contiguous slices of n samples."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _overlap(a, b):
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def _with_keys(rows, row_splits, keys, key_splits):
    """Row gradients (float32, ``row_splits`` per shard) and the next step's
    keys (int64, ``key_splits`` per shard) as one float32 message: each
    shard's part is its row gradients, then its keys' bits (two float32 words
    each; only copied, never computed on). Returns the message and its splits."""
    words = np.ascontiguousarray(keys, np.int64).view(np.float32)
    r = np.concatenate([[0], np.cumsum(row_splits)]).astype(np.int64)
    k = 2 * np.concatenate([[0], np.cumsum(key_splits)]).astype(np.int64)
    parts = []
    for s in range(len(row_splits)):
        parts += [rows[r[s]:r[s + 1]], words[k[s]:k[s + 1]]]
    return np.concatenate(parts), [int(a) + 2 * int(b) for a, b in zip(row_splits, key_splits)]


def _split_keys(message, got, row_floats):
    """:func:`_with_keys` taken apart on a shard: ``got`` floats came from
    each sparse trainer, the first ``row_floats`` of them row gradients.
    Returns the row gradients and ``(next keys, keys per sender)``."""
    rows, words, per = [], [], []
    off = 0
    for n, r in zip(got, row_floats):
        n, r = int(n), int(r)
        if n < r or (n - r) % 2:
            raise RuntimeError("row gradients with next keys: %d floats from a sparse trainer "
                               "that was sent %d row floats" % (n, r))
        rows.append(message[off:off + r])
        words.append(message[off + r:off + n])
        per.append((n - r) // 2)
        off += n
    keys = np.ascontiguousarray(np.concatenate(words)).view(np.int64) if words else \
        np.zeros([0], np.int64)
    return np.concatenate(rows) if rows else message[:0], (keys, np.asarray(per, np.int64))


def _per_sample(shape):
    return int(np.prod([int(d) for d in shape] or [1]))


class KeyLayout:
    """Where each unique key of a sparse trainer's slice goes and comes back
    from: keys of every group (tables of one row width) sorted by owning
    shard, then by group, each group's keys in order of first occurrence --
    so a shard meets each table's ids in the order Keras's ``tf.unique``
    lists them (the row order its optimizer kernels see).

    ``keys``: the sorted keys; ``splits``: keys per shard; ``group``/``inner``:
    each sorted key's group and its index among that group's unique keys;
    ``starts``: offset of each key's row in the flat buffer of rows (the rows
    of a shard's keys follow each other, each row ``dim`` floats)."""

    def __init__(self, uniques, dims, owners, num_shards):
        keys = np.concatenate(uniques) if uniques else np.zeros([0], np.int64)
        group = np.concatenate([np.full(len(u), g, np.int64) for g, u in enumerate(uniques)])
        inner = np.concatenate([np.arange(len(u), dtype=np.int64) for u in uniques])
        owner = np.concatenate(owners)
        if len(uniques) == 1:     # one group: a stable sort by shard keeps first occurrence
            order = np.argsort(owner.astype(np.int32), kind="stable")
        else:
            order = np.lexsort((inner, group, owner))
        self.keys, self.group, self.inner = keys[order], group[order], inner[order]
        self.owner = owner[order]
        self.dims = np.asarray(dims, np.int64)[self.group]
        self.starts = np.concatenate([[0], np.cumsum(self.dims)]).astype(np.int64)
        self.splits = np.bincount(self.owner, minlength=num_shards)
        self.row_splits = np.bincount(self.owner, weights=self.dims,
                                      minlength=num_shards).astype(np.int64)
        self.uniform = len(set(dims)) == 1        # then there is one group
        self.sizes = [len(u) for u in uniques]
        if self.uniform:
            # each unique key's place in the sorted order (:meth:`sorted_positions`)
            self._place = np.empty(len(order), np.int32)
            self._place[order] = np.arange(len(order), dtype=np.int32)
        self._mask = [self.group == g for g in range(len(uniques))]

    def sorted_positions(self, pos):
        """One group: the ids' positions among the unique keys (first-occurrence
        order) -> among the sorted keys. Gathering the rows as they arrive with
        these copies the same rows; an ``unsorted_segment_sum`` over them sums
        each key's gradients in the same order, only its output row moves, to
        where the push sends it -- no :meth:`unpack`, no :meth:`pack`."""
        return self._place[pos]

    def unpack(self, flat, sizes, dims):
        """Flat rows in key order -> one (unique keys, dim) array per group."""
        out = [np.empty((n, d), np.float32) for n, d in zip(sizes, dims)]
        if self.uniform:
            rows = flat.reshape(-1, dims[0]) if len(flat) else np.zeros([0, dims[0]], np.float32)
            for g, o in enumerate(out):
                o[self.inner[self._mask[g]]] = rows[self._mask[g]]
        else:
            for g, (o, d) in enumerate(zip(out, dims)):
                m = self._mask[g]
                o[self.inner[m]] = flat[self.starts[:-1][m][:, None] + np.arange(d)]
        return out

    def pack(self, per_group, dims):
        """One (unique keys, dim) array per group -> flat rows in key order."""
        if self.uniform:
            flat = np.empty((len(self.keys), dims[0]), np.float32)
            for g, v in enumerate(per_group):
                flat[self._mask[g]] = v[self.inner[self._mask[g]]]
            return flat.reshape(-1)
        flat = np.empty(int(self.starts[-1]), np.float32)
        for g, (v, d) in enumerate(zip(per_group, dims)):
            m = self._mask[g]
            flat[self.starts[:-1][m][:, None] + np.arange(d)] = v[self.inner[m]]
        return flat


class HeterTrainer:
    """Train a functional Keras ``model`` with the roles of ``roles``.

    ``loss``: ``loss(y_true, y_pred)`` -> the batch mean (a Keras loss);
    ``optimizer``: the Keras optimizer single-process training would use (the
    dense trainers apply it; the shards apply the same rule to the tables);
    ``plan``: :func:`horovod_prio.heter.placement.place` of the model (done
    here unless given; a tape step's plan is refused with a TypeError);
    ``sharding``: ``"mod"`` or ``"range"``; ``priority``: a
    :class:`~horovod_prio.method.config.PriorityConfig`, a dict of its fields
    or None (from the ``HOROVOD_PRIO_*`` variables, as for a data-parallel
    optimizer): the exchanges go through the priority scheduler, its monitor
    and, if configured, the link arbiter
    (:mod:`horovod_prio.heter.exchange`).
    Call after ``hvd.init(process_sets=roles.process_sets())``, and
    :meth:`close` before the script ends.
    """

    def __init__(self, model, loss, optimizer, roles, plan=None, sharding="mod", hvd=None,
                 priority=None):
        if isinstance(plan, StepPlan):
            raise TypeError(
                "plan is the placement of tape step %r (tape_placement.place_step), which is for "
                "inspection: HeterTrainer runs Keras models only; build the model as Keras "
                "layers (tf.keras.layers.Embedding tables, a functional tf.keras.Model) and pass "
                "plan=placement.place(model) or no plan" % plan.step_name)
        from horovod_prio.tensorflow.optimizer import resolve_config
        config = resolve_config(priority)
        import tensorflow as tf
        if hvd is None:
            import horovod.tensorflow as hvd
        self.hvd, self.tf = hvd, tf
        self.model, self.loss, self.optimizer, self.roles = model, loss, optimizer, roles
        if hvd.size() != roles.size:
            raise ValueError("HOROVOD_PRIO_HETER_ROLES: roles for %d ranks, the job has %d"
                             % (roles.size, hvd.size()))
        self.rank = hvd.rank()
        self.role = roles.role(self.rank)
        # before any of the trainer's tensors exist: glibc malloc keeps freed blocks for the
        # next step's (runtime/malloc.py; the first set-up of the process decides)
        malloc.apply(config, True, log)
        self.plan = plan or placement_mod.place(model)
        self._tables(sharding)
        self._cut()
        self._sets = {n: roles.process_set(n) for n in ("sparse_ps", "sparse_dense", "dense")}
        self._ranks = roles.set_ranks()
        self.ps_ranks, self.sparse_ranks = roles.ranks["ps"], roles.ranks["sparse"]
        self.dense_ranks = roles.ranks["dense"]
        self.steps = 0
        self._ahead = None           # the next_inputs' ids the step before was given
        self._pending = None         # what this rank received or made for them
        #: this step's unique-key counts ("now", "next": :meth:`_unique_counts`)
        self._counts = {}
        self.exchange_counts = collections.Counter()   # alltoalls this rank ran, by exchange
        self.dense_model = self._dense_part()
        from horovod_prio.heter.exchange import Exchanges
        self.exchanges = Exchanges(self, config, roles, self.rank, hvd,
                                   self.dense_model.trainable_variables, self._sets["dense"])
        if self.role == "ps":
            self.shard = ps_mod.Shard(
                self.ps_ranks.index(self.rank), len(self.ps_ranks),
                {t["name"]: self._initial(t) for t in self.tables},
                ps_mod.Optimizer.from_keras(optimizer), sharding)
        if self.role == "sparse":
            self._build_sparse()
        if self.role == "dense":
            self._build_dense()

    # -- set-up --------------------------------------------------------------

    def _tables(self, sharding):
        tf = self.tf
        model_inputs = {id(t): t for t in self.model.inputs}
        self.tables, offset = [], 0
        id_inputs = set()
        for name in self.plan.names("sparse"):
            layer = self.model.get_layer(name)
            if not isinstance(layer, tf.keras.layers.Embedding):
                continue                                 # a sparse-side layer (_cut checks it)
            if layer.sparse or layer._use_one_hot_matmul:
                raise ValueError("sparse-kind layer %r is an Embedding with sparse=%r, "
                                 "use_one_hot_matmul=%r; the heterogeneous trainer runs dense "
                                 "row lookups" % (name, layer.sparse, layer._use_one_hot_matmul))
            if len(layer.inbound_nodes) != 1 or id(layer.input) not in model_inputs:
                raise ValueError("embedding layer %r must be called once, directly on a model "
                                 "input of ids" % name)
            input_name = layer.input.name
            id_inputs.add(id(layer.input))
            rows, dim = placement_mod.table_shape(layer)
            if len(self.roles.ranks["ps"]) > rows:
                raise ValueError("HOROVOD_PRIO_HETER_ROLES: %d parameter-server shards but table "
                                 "%r has only %d rows" % (len(self.roles.ranks["ps"]), name, rows))
            shape = tuple(int(d) for d in layer.input.shape[1:])
            self.tables.append(dict(name=name, layer=layer, input=input_name, rows=rows, dim=dim,
                                    offset=offset, per_sample=_per_sample(shape), shape=shape,
                                    sharding=ps_mod.Sharding(rows, len(self.roles.ranks["ps"]),
                                                             sharding)))
            offset += rows
        if not self.tables:
            raise ValueError("model %r: no sparse-kind tf.keras.layers.Embedding; the "
                             "parameter-server shards hold embedding tables only" % self.model.name)
        self.offsets = np.array([t["offset"] for t in self.tables] + [offset], np.int64)
        self.dense_input_names = [t.name for t in self.model.inputs if id(t) not in id_inputs]
        self._dense_inputs = [t for t in self.model.inputs if id(t) not in id_inputs]
        # tables of one row width are looked up, deduplicated and summed together
        dims = sorted({t["dim"] for t in self.tables})
        self.groups = [[i for i, t in enumerate(self.tables) if t["dim"] == d] for d in dims]
        self.group_dims = dims
        self.group_cols = [sum(self.tables[i]["per_sample"] for i in g) for g in self.groups]

    def _cut(self):
        """The tensors sent to the dense trainers: outputs of sparse-kind
        layers that a dense-kind layer or the model's output reads. Sparse-kind
        layers other than the tables (the *sparse side*: pooling and the like)
        run on the sparse trainers; they must read only sparse-kind outputs
        and hold no trainable weights."""
        tf = self.tf
        table_names = {t["name"] for t in self.tables}
        sparse = set(self.plan.names("sparse"))
        self.side_layers = []
        for name in self.plan.names("sparse"):
            if name in table_names:
                continue
            layer = self.model.get_layer(name)
            if layer.trainable_weights:
                raise ValueError("sparse-kind layer %r (a %s) has trainable weights; sparse "
                                 "trainers train only embedding tables (place it 'dense')"
                                 % (name, type(layer).__name__))
            if len(layer.inbound_nodes) != 1:
                raise ValueError("sparse-kind layer %r (a %s) is called %d times; a sparse-side "
                                 "layer must be called once" % (name, type(layer).__name__,
                                                                len(layer.inbound_nodes)))
            for src in tf.nest.flatten(layer.inbound_nodes[0].inbound_layers):
                if src.name not in sparse:
                    raise ValueError("sparse-kind layer %r (a %s) reads %r, which is not of the "
                                     "sparse kind; sparse trainers run only layers that read the "
                                     "embeddings (place %r 'dense')"
                                     % (name, type(layer).__name__, src.name, name))
            self.side_layers.append(name)
        self.cut = []
        for p in self.plan.boundary():
            out = self.model.get_layer(p.name).output
            if len(tf.nest.flatten(out)) != 1:
                raise ValueError("sparse-kind layer %r has %d outputs; the cut to the dense part "
                                 "takes one tensor per layer" % (p.name, len(tf.nest.flatten(out))))
            shape = tuple(out.shape[1:])
            if any(d is None for d in shape):
                raise ValueError("sparse-kind layer %r: output shape %s is not fixed per sample"
                                 % (p.name, out.shape))
            self.cut.append(dict(name=p.name, tensor=out, shape=tuple(int(d) for d in shape),
                                 width=_per_sample(shape)))
        if not self.cut:
            raise ValueError("model %r: no dense-kind layer reads a sparse-kind output" %
                             self.model.name)
        self.features = sum(c["width"] for c in self.cut)

    @staticmethod
    def _initial(t):
        """A table's initial rows for the shards: the model's table, or -- for a
        placeholder (``placement.placeholder_tables``) -- the layer's initializer,
        which each shard applies to its own rows only."""
        layer = t["layer"]
        if placement_mod.is_placeholder(layer):
            return ps_mod.TableSpec(t["rows"], t["dim"], layer.embeddings_initializer)
        return layer.embeddings.numpy()

    def _build_sparse(self):
        tf = self.tf
        by_table = {t["name"]: i for i, t in enumerate(self.tables)}
        # each cut tensor: a table's output as looked up, or an output of the sparse side
        self._cut_source = [("table", by_table[c["name"]]) if c["name"] in by_table else
                            ("side", None) for c in self.cut]
        side_out = [c["tensor"] for c in self.cut if c["name"] not in by_table]
        self._side_inputs = sorted({by_table[t.name] for c in self.cut if c["name"] not in by_table
                                    for t in self._tables_under(c["name"], by_table)})
        self.side_model = tf.keras.Model([self.tables[i]["layer"].output
                                          for i in self._side_inputs], side_out) \
            if side_out else None
        self._sparse_fns = {}

    def _sparse_functions(self, n):
        """The sparse side's forward and backward graphs for slices of ``n``
        samples. The sample count is static in them, as in the graph Keras
        builds for a fixed batch: a gradient such as the mean's then divides
        by a constant, which grappler rewrites the same way in both (with the
        count unknown the quotient may differ from Keras's in the last bit)."""
        tf = self.tf
        if n not in self._sparse_fns:
            rows_spec = [tf.TensorSpec([None, d], tf.float32) for d in self.group_dims]
            pos_spec = [tf.TensorSpec([n * c], tf.int32) for c in self.group_cols]
            emb_spec = [tf.TensorSpec((n,) + t["shape"] + (t["dim"],), tf.float32)
                        for t in self.tables]
            self._sparse_fns[n] = (
                tf.function(self._forward_sparse_side, input_signature=[rows_spec, pos_spec]),
                tf.function(self._backward_sparse_side, input_signature=[
                    emb_spec, pos_spec, [tf.TensorSpec([], tf.int32) for _ in self.groups],
                    tf.TensorSpec([n, self.features], tf.float32)]))
        return self._sparse_fns[n]

    def _embeddings(self, rows, pos):
        """Each table's embedding output (= ``embedding_lookup(table, ids)``)
        from its group's unique rows and the ids' positions among them."""
        tf = self.tf
        embs = [None] * len(self.tables)
        for g, members in enumerate(self.groups):
            looked = tf.gather(rows[g], pos[g])                     # (n * cols, dim)
            block = tf.reshape(looked, [pos[g].shape[0] // self.group_cols[g], self.group_cols[g],
                                        self.group_dims[g]])
            parts = tf.split(block, [self.tables[i]["per_sample"] for i in members], axis=1) \
                if len(members) > 1 else [block]
            for i, part in zip(members, parts):
                t = self.tables[i]
                embs[i] = tf.reshape(part, (block.shape[0],) + t["shape"] + (t["dim"],))
        return embs

    def _tables_under(self, name, by_table):
        """The table layers a sparse-side layer reads, directly or not."""
        layer = self.model.get_layer(name)
        if name in by_table:
            return [layer]
        out = []
        for src in self.tf.nest.flatten(layer.inbound_nodes[0].inbound_layers):
            out += self._tables_under(src.name, by_table)
        return out

    def _side(self, embs):
        tf = self.tf
        side = []
        if self.side_model is not None:
            side = tf.nest.flatten(self.side_model([embs[i] for i in self._side_inputs],
                                                   training=True))
        outs, j = [], 0
        for kind, i in self._cut_source:
            if kind == "table":
                outs.append(embs[i])
            else:
                outs.append(side[j])
                j += 1
        flat = [tf.reshape(o, [tf.shape(o)[0], -1]) for o in outs]
        return tf.concat(flat, axis=1) if len(flat) > 1 else flat[0]

    def _forward_sparse_side(self, rows, pos):
        embs = self._embeddings(rows, pos)
        return self._side(embs), embs

    def _backward_sparse_side(self, embs, pos, uniques, dact):
        """Row gradients: each group's unique ids' summed gradients."""
        tf = self.tf
        if self.side_model is None:
            grads = [None] * len(self.tables)
            col = 0
            for c, (_, i) in zip(self.cut, self._cut_source):
                grads[i] = dact[:, col:col + c["width"]]
                col += c["width"]
        else:
            with tf.GradientTape() as tape:
                tape.watch(embs)
                acts = self._side(embs)
            grads = tape.gradient(acts, embs, output_gradients=dact,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
        sums = []
        for g, members in enumerate(self.groups):
            d = self.group_dims[g]
            per = []
            for i in members:
                t = self.tables[i]
                gi = grads[i] if grads[i] is not None else tf.zeros_like(embs[i])
                per.append(tf.reshape(gi, [-1, t["per_sample"], d]))
            values = tf.reshape(tf.concat(per, axis=1) if len(per) > 1 else per[0], [-1, d])
            # as Keras's IndexedSlices de-duplication: summed in order of occurrence
            sums.append(tf.math.unsorted_segment_sum(values, pos[g], uniques[g]))
        return sums

    def _dense_part(self):
        """The model cut at the sparse-kind outputs (every rank builds it: the
        dense allreduce's chunk plan, which sizes the priority vector, is the
        same everywhere; it holds no weights of its own)."""
        acts = [c["tensor"] for c in self.cut]
        try:
            return self.tf.keras.Model(self._dense_inputs + acts, self.model.outputs)
        except ValueError as e:
            raise ValueError("the dense part of model %r cannot be cut at the sparse-kind "
                             "outputs (does a dense layer read an id input?): %s"
                             % (self.model.name, e))

    def _build_dense(self):
        tf = self.tf
        self.dense_vars = self.dense_model.trainable_variables
        if len(self.dense_ranks) > 1:
            self.hvd.broadcast_variables(self.dense_vars, root_rank=self.dense_ranks[0],
                                         process_set=self._sets["dense"])
        self._dense_grad = tf.function(self._dense_forward_backward)
        self._dense_apply = tf.function(
            lambda grads: self.optimizer.apply_gradients(zip(grads, self.dense_vars)))

    def _dense_forward_backward(self, inputs, act, labels, weight):
        """Loss, dense gradients and the gradient of ``act`` (the cut's
        tensors side by side, one row per sample), all in one graph: the cut
        is taken apart here (slices: copies), so its gradient comes back as
        one tensor, the cut's parts side by side."""
        tf = self.tf
        n = act.shape[0]
        with tf.GradientTape() as tape:
            tape.watch(act)
            parts = tf.split(act, [c["width"] for c in self.cut], axis=1) \
                if len(self.cut) > 1 else [act]
            acts = [tf.reshape(p, (n,) + c["shape"]) for p, c in zip(parts, self.cut)]
            pred = self.dense_model(list(inputs) + acts, training=True)
            loss = self.loss(labels, pred)
        grads = tape.gradient(loss, list(self.dense_vars) + [act])
        dense, act_grad = grads[:-1], grads[-1]
        if weight is not None:                       # several dense trainers: global mean
            dense = [g * weight for g in dense]
            act_grad = act_grad * weight
        return loss, dense, act_grad

    # -- the step --------------------------------------------------------------

    def check_batch(self, inputs, labels):
        """ValueError naming the input and the ids out of its table (every
        rank runs this on the same global batch before any collective)."""
        n = len(labels)
        self._check_ids(inputs, n, "batch")
        for name in self.dense_input_names:
            if name not in inputs:
                raise ValueError("batch has no input %r" % name)
        self._check_size(n, "global batch")

    def _check_size(self, n, what):
        if n < max(len(self.sparse_ranks), len(self.dense_ranks)):
            raise ValueError("%s of %d samples is smaller than the %d sparse / %d dense trainers"
                             % (what, n, len(self.sparse_ranks), len(self.dense_ranks)))

    def _check_ids(self, inputs, n, what):
        """The id inputs of ``inputs`` (``what``: "batch" or "next_inputs"):
        present, ``n`` samples (None: as many as the first table's input), in
        their tables' rows. Returns the sample count."""
        prefix = "" if what == "batch" else what + ": "
        for t in self.tables:
            if t["input"] not in inputs:
                raise ValueError("%s has no input %r (table %r)" % (what, t["input"], t["name"]))
            ids = np.asarray(inputs[t["input"]])
            if n is None:
                n = int(ids.shape[0]) if ids.ndim else -1
            if ids.shape[0:1] != (n,) or tuple(ids.shape[1:]) != t["shape"]:
                raise ValueError("%sinput %r: shape %s, expected (%d,) + %s"
                                 % (prefix, t["input"], ids.shape, n, t["shape"]))
            if ids.size == 0 or (ids.min() >= 0 and ids.max() < t["rows"]):
                continue
            bad = ids[(ids < 0) | (ids >= t["rows"])]
            if bad.size:
                raise ValueError("%sinput %r: ids %s out of table %r's rows 0-%d"
                                 % (prefix, t["input"], np.unique(bad)[:5].tolist(), t["name"],
                                    t["rows"] - 1))
        return n

    def step(self, inputs, labels, next_inputs=None):
        """One synchronous step on the global batch (``inputs``: model input
        name -> array, ``labels``). Returns the dense trainer's local loss on
        dense trainers, None elsewhere.

        ``next_inputs``: the next step's inputs, if known (the same on every
        rank, as the batch is). The sparse trainers then send the next step's
        keys with this step's row gradients, and the next step starts at the
        pull: one exchange fewer on the step's path, the same math. If the
        next call's inputs differ from them, that step sends its keys as
        usual (a warning says so). :meth:`fit` looks ahead for you."""
        self.check_batch(inputs, labels)
        n_next = None if next_inputs is None else \
            self._check_ids(next_inputs, None, "next_inputs")
        if n_next is not None:
            self._check_size(n_next, "next_inputs")
        ahead = self._ahead is not None and self._same_ids(inputs, self._ahead)
        if self._ahead is not None and not ahead:
            log.warning("horovod_prio: HeterTrainer step %d: the inputs differ from the "
                        "next_inputs given to the step before; sending their keys again",
                        self.steps + 1)
        self._ahead = None if next_inputs is None else \
            {t["input"]: np.array(next_inputs[t["input"]], copy=True) for t in self.tables}
        n = len(labels)
        self._bounds = {"sparse": split_batch(n, len(self.sparse_ranks)),
                        "dense": split_batch(n, len(self.dense_ranks))}
        # the next batch's counts, if the last step made them, are this batch's
        self._counts = {"now": self._counts["next"]} if ahead and "next" in self._counts else {}
        self.steps += 1
        self.exchanges.begin()
        out = getattr(self, "_step_" + self.role)(inputs, labels, ahead, next_inputs, n_next)
        self.exchanges.end()
        return out

    def _same_ids(self, inputs, ahead):
        return all(np.array_equal(np.asarray(inputs[t["input"]]), ahead[t["input"]])
                   for t in self.tables)

    def fit(self, batches, steps=None):
        """Train on ``batches`` (an iterable of ``(inputs, labels)``, the same
        on every rank), one :meth:`step` each -- at most ``steps`` -- looking
        one batch ahead (``next_inputs``). Returns the steps' results."""
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or steps < 0):
            raise ValueError("steps=%r: give a number of steps >= 0 or None" % (steps,))
        it, out = iter(batches), []
        cur = next(it, None) if steps != 0 else None
        while cur is not None:
            last = steps is not None and len(out) + 1 >= steps
            nxt = None if last else next(it, None)
            out.append(self.step(cur[0], cur[1],
                                 next_inputs=None if nxt is None else nxt[0]))
            cur = nxt
        return out

    def _alltoall(self, tensor, splits, set_name, what, nbytes=None):
        self.exchange_counts[what] += 1
        out, received = self.exchanges.alltoall(tensor, splits, self._sets[set_name], what,
                                                nbytes)
        return out, received.numpy()

    def _unique_counts(self, inputs, n, which):
        """Unique keys of every sparse trainer's slice of a batch of ``n``
        samples, per group (tables of one width): (sparse trainers, groups).
        Only a holder that asks for whole collectives computes them
        (``Exchanges.whole``): every rank holds the batch. Counted once per
        batch: ``which`` ("now": this step's, "next": the next step's) keys
        them for the rest of the step, and "next" becomes the next step's
        "now" when it comes as announced."""
        if which in self._counts:
            return self._counts[which]
        out = np.zeros((len(self.sparse_ranks), len(self.groups)), np.int64)
        for s, (lo, hi) in enumerate(split_batch(n, len(self.sparse_ranks))):
            for g, members in enumerate(self.groups):
                keys = np.concatenate(
                    [np.asarray(inputs[self.tables[i]["input"]][lo:hi], np.int64).reshape(-1)
                     + self.tables[i]["offset"] for i in members])
                out[s, g] = len(np.unique(keys))
        self._counts[which] = out
        return out

    def _whole_bytes(self, inputs, n, what, next_inputs=None, n_next=None):
        """The bytes every sender's part of exchange ``what`` holds, or None
        where this rank asks for its own part (not ``Exchanges.whole``):
        keys 8 per unique key of every slice, rows and row gradients their
        rows (float32), with the next step's keys (8 bytes each) riding on
        the row gradients; activation gradients the global batch's cut."""
        if not self.exchanges.whole:
            return None
        if what == "activation_grads":
            return 4 * n * self.features
        counts = self._unique_counts(inputs, n, "now")
        if what == "keys":
            return 8 * int(counts.sum())
        rows = 4 * int((counts * np.asarray(self.group_dims, np.int64)).sum())
        if what == "row_grads" and next_inputs is not None:
            rows += 8 * int(self._unique_counts(next_inputs, n_next, "next").sum())
        return rows

    def _set_splits(self, set_name, ranks, counts):
        """Per-rank counts (``ranks[i]`` gets ``counts[i]``) in the set's rank order."""
        members = self._ranks[set_name]
        out = [0] * len(members)
        for r, c in zip(ranks, counts):
            out[members.index(r)] = int(c)
        return out

    # sparse trainer ------------------------------------------------------------

    def _owners(self, uniq, members):
        """Owning shard of each key of one group (keys = table offset + id)."""
        table = np.searchsorted(self.offsets, uniq, side="right") - 1
        local = uniq - self.offsets[table]
        shards = len(self.ps_ranks)
        if self.tables[members[0]]["sharding"].mode == "mod":
            return local % shards
        blocks = np.array([t["sharding"].block for t in self.tables], np.int64)
        return local // blocks[table]

    def _keys(self, inputs, n):
        """This sparse trainer's slice of a batch of ``n`` samples: its unique
        keys per group, where they go (:class:`KeyLayout`), the ids' positions
        among them, and the slice's bounds."""
        tf = self.tf
        lo, hi = split_batch(n, len(self.sparse_ranks))[self.sparse_ranks.index(self.rank)]
        uniques, positions, owners = [], [], []
        for members in self.groups:
            keys = np.concatenate(
                [np.asarray(inputs[self.tables[i]["input"]][lo:hi], np.int64).reshape(hi - lo, -1)
                 + self.tables[i]["offset"] for i in members], axis=1)
            uniq, pos = tf.unique(tf.constant(keys.reshape(-1)))
            uniq = uniq.numpy()
            uniques.append(uniq)
            positions.append(pos)
            owners.append(self._owners(uniq, members))
        layout = KeyLayout(uniques, self.group_dims, owners, len(self.ps_ranks))
        if layout.uniform:
            positions = [tf.constant(layout.sorted_positions(positions[0].numpy()))]
        return layout, positions, (lo, hi)

    def _step_sparse(self, inputs, labels, ahead, next_inputs, n_next):
        tf = self.tf
        if ahead:                    # the shards have these keys since the last push
            layout, positions, (lo, hi) = self._pending
        else:
            layout, positions, (lo, hi) = self._keys(inputs, len(labels))
            self._alltoall(tf.constant(layout.keys, tf.int64),
                           self._set_splits("sparse_ps", self.ps_ranks, layout.splits),
                           "sparse_ps", "keys", self._whole_bytes(inputs, len(labels), "keys"))
        self._pending = None
        sp = self._ranks["sparse_ps"]
        flat, _ = self._alltoall(tf.zeros([0], tf.float32), [0] * len(sp), "sparse_ps", "rows")
        sizes = layout.sizes
        if layout.uniform:           # the rows stay in the shards' order (sorted_positions)
            rows = [tf.reshape(flat, [-1, self.group_dims[0]])]
        else:
            rows = [tf.constant(r) for r in layout.unpack(flat.numpy(), sizes, self.group_dims)]
        forward, backward = self._sparse_functions(hi - lo)
        act, embs = forward(rows, positions)
        to_dense = [_overlap((lo, hi), b) for b in self._bounds["dense"]]
        self._alltoall(act, self._set_splits("sparse_dense", self.dense_ranks, to_dense),
                       "sparse_dense", "activations")
        # the next batch's keys while the dense trainers compute
        nxt = None if next_inputs is None else self._keys(next_inputs, n_next)
        sd = self._ranks["sparse_dense"]
        dact, _ = self._alltoall(tf.zeros([0, self.features], tf.float32), [0] * len(sd),
                                 "sparse_dense", "activation_grads")
        sums = backward(embs, positions, [tf.constant(s, tf.int32) for s in sizes], dact)
        push = sums[0].numpy().reshape(-1) if layout.uniform else \
            layout.pack([s.numpy() for s in sums], self.group_dims)
        splits = layout.row_splits
        if nxt is not None:          # each shard's part: its row gradients, then its next keys
            push, splits = _with_keys(push, layout.row_splits, nxt[0].keys, nxt[0].splits)
        self._alltoall(tf.constant(push), self._set_splits("sparse_ps", self.ps_ranks, splits),
                       "sparse_ps", "row_grads",
                       self._whole_bytes(inputs, len(labels), "row_grads", next_inputs, n_next))
        self._pending = nxt
        return None

    # parameter-server shard ------------------------------------------------------

    def _step_ps(self, inputs, labels, ahead, next_inputs, n_next):
        tf = self.tf
        sp = self._ranks["sparse_ps"]
        if ahead:                    # sent with the last step's row gradients
            keys, got, (table_of, key_local) = self._pending
        else:
            keys, got = self._alltoall(tf.zeros([0], tf.int64), [0] * len(sp), "sparse_ps", "keys")
            keys = keys.numpy()
            table_of, key_local = self._local_keys(keys)
        self._pending = None
        rows_bytes = self._whole_bytes(inputs, len(labels), "rows")
        if self.shard.dim is not None:          # tables of one width: no loop over tables
            return self._serve_uniform(table_of, key_local, got, sp, next_inputs, ahead,
                                       rows_bytes)
        dims = np.array([t["dim"] for t in self.tables], np.int64)
        per_key = dims[table_of]
        starts = np.concatenate([[0], np.cumsum(per_key)]).astype(np.int64)
        uniform = len(self.group_dims) == 1
        # each table's keys, in arrival order (a stable sort by table)
        by_table = np.argsort(table_of.astype(np.int32), kind="stable")
        idx = np.split(by_table, np.cumsum(np.bincount(table_of, minlength=len(self.tables)))[:-1])
        local = [key_local[w] for w in idx]
        pulled = self.shard.gather_local(local, ahead=ahead)
        if uniform:
            flat = np.empty((len(keys), self.group_dims[0]), np.float32)
            for w, r in zip(idx, pulled):
                flat[w] = r.numpy()
            flat = flat.reshape(-1)
        else:
            flat = np.empty(int(starts[-1]), np.float32)
            for w, r, t in zip(idx, pulled, self.tables):
                flat[starts[w][:, None] + np.arange(t["dim"])] = r.numpy()
        bounds = np.concatenate([[0], np.cumsum(got)])
        splits = [int(per_key[bounds[i]:bounds[i + 1]].sum()) for i in range(len(sp))]
        grads = self._answer(tf.constant(flat), splits, sp, next_inputs, rows_bytes)
        if uniform:
            rows = grads.reshape(-1, self.group_dims[0])
            values = [rows[w] for w in idx]
        else:
            values = [grads[starts[w][:, None] + np.arange(t["dim"])]
                      for w, t in zip(idx, self.tables)]
        self.shard.apply_local(local, values, next_keys=self._next_keys())
        return None

    def _local_keys(self, keys):
        """Each key's table and local row on this shard (a key not owned
        here is a ValueError naming its table)."""
        table_of = np.searchsorted(self.offsets, keys, side="right") - 1
        return table_of, self.shard.check_keys(table_of, keys - self.offsets[table_of])

    def _next_keys(self):
        """The next step's keys that came with the row gradients, as the
        shard's (table, local row): kept for the next step and given to the
        apply, which then applies the rows the next step does not read only
        after the next rows are sent (:meth:`_answer`)."""
        if self._pending is None:
            return None
        keys, per = self._pending
        where = self._local_keys(keys)
        self._pending = (keys, per, where)
        return where

    def _serve_uniform(self, table_of, local, got, sp, next_inputs, ahead, rows_bytes):
        """:meth:`_step_ps` for tables of one row width: the keys of every
        table gathered, and their gradients applied, in one graph call each
        (:meth:`~horovod_prio.heter.ps.Shard.gather_keys`, ``apply_keys``)."""
        dim = self.shard.dim
        flat = self.shard.gather_keys(table_of, local, ahead=ahead)
        grads = self._answer(self.tf.reshape(flat, [-1]), [int(c) * dim for c in got], sp,
                             next_inputs, rows_bytes)
        self.shard.apply_keys(table_of, local, grads.reshape(-1, dim),
                              next_keys=self._next_keys())
        return None

    def _answer(self, flat, splits, sp, next_inputs, rows_bytes):
        """A shard sends the rows (``splits`` floats to each member of
        ``sparse_ps``), applies what the last step's push kept back for
        after them (rows this step does not read: ``Shard.flush``), and
        receives the row gradients; with ``next_inputs`` it keeps the next
        step's keys that came with them. ``rows_bytes``: what the rows are
        asked for (:meth:`_whole_bytes`). Returns the row gradients (numpy,
        in key order)."""
        tf = self.tf
        self._alltoall(flat, splits, "sparse_ps", "rows", rows_bytes)
        self.shard.flush()
        grads, got = self._alltoall(tf.zeros([0], tf.float32), [0] * len(sp), "sparse_ps",
                                    "row_grads")
        grads = grads.numpy()
        if next_inputs is not None:
            grads, self._pending = _split_keys(grads, got, splits)
        return grads

    # dense trainer ------------------------------------------------------------------

    def _step_dense(self, inputs, labels, ahead, next_inputs, n_next):
        tf = self.tf
        di = self.dense_ranks.index(self.rank)
        lo, hi = self._bounds["dense"][di]
        sd = self._ranks["sparse_dense"]
        act, _ = self._alltoall(tf.zeros([0, self.features], tf.float32), [0] * len(sd),
                                "sparse_dense", "activations")
        dense_in = [tf.constant(np.asarray(inputs[nm][lo:hi])) for nm in self.dense_input_names]
        weight = None if len(self.dense_ranks) == 1 else \
            tf.constant((hi - lo) / len(labels), tf.float32)
        loss, grads, dact = self._dense_grad(dense_in, tf.reshape(act, [hi - lo, self.features]),
                                             tf.constant(np.asarray(labels[lo:hi])), weight)
        back = [_overlap((lo, hi), b) for b in self._bounds["sparse"]]
        self._alltoall(dact, self._set_splits("sparse_dense", self.sparse_ranks, back),
                       "sparse_dense", "activation_grads",
                       self._whole_bytes(inputs, len(labels), "activation_grads"))
        if len(self.dense_ranks) > 1:
            grads = self.exchanges.allreduce_dense(grads)
        self._dense_apply(grads)
        return float(loss.numpy())

    def drop_look_ahead(self):
        """Forget the next batch the last step was told (every rank calls
        this, as :func:`horovod_prio.heter.checkpoint.restore` does, so every
        rank's next step takes the same path): a shard first applies the rest
        of a split push it kept back, to the state it belongs to; the next
        step sends its keys as usual."""
        if self.role == "ps":
            self.shard.flush()
        self._ahead = self._pending = None

    def close(self):
        """A barrier over every rank; call it before ``hvd.shutdown()`` or the
        end of the script. A rank's part of the last step ends before the
        others' (a dense trainer is done before the shards take their
        pushes), and Horovod's shutdown on one rank -- explicit or at exit --
        fails every collective still in flight on the others."""
        if not getattr(self, "_closed", False):
            if self.role == "ps":
                self.shard.flush()
            self.exchanges.close()
            self.hvd.allreduce(np.zeros(1, np.float32), name="heter.close")
            self._closed = True

    # -- state -------------------------------------------------------------------------

    def dense_weights(self):
        """The dense part's weights on a dense trainer (name -> array)."""
        return {v.name: v.numpy() for v in self.dense_vars}
