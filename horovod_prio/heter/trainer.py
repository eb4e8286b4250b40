"""One synchronous heterogeneous step over Horovod collectives on process sets.

Every rank calls :meth:`HeterTrainer.step` with the same global batch; each
does its role's part (docs/heter.md has the picture):

1. every rank checks the batch's ids against the tables (a bad id raises the
   same ValueError everywhere before any collective: no rank is left waiting);
2. sparse trainers take their contiguous slice of the batch, dedupe each
   table's ids (``tf.unique``), and send the keys (table offset + id) to the
   shards that own them -- ``alltoall`` on ``sparse_ps``;
3. shards answer with those rows -- ``alltoall`` on ``sparse_ps``;
4. sparse trainers gather the rows back into the batch's activations and
   send each dense trainer the samples of its slice -- ``alltoall`` on
   ``sparse_dense``;
5. dense trainers run the dense part (every layer not of the sparse kind)
   forward and backward, and send the activations' gradients back --
   ``alltoall`` on ``sparse_dense``;
6. sparse trainers sum each unique id's gradient (``unsorted_segment_sum``,
   as Keras's IndexedSlices path does) and push the sums to the shards --
   ``alltoall`` on ``sparse_ps``; each shard applies its optimizer
   (:mod:`horovod_prio.heter.ps`);
7. dense trainers allreduce the dense gradients on ``dense`` and each applies
   the same Keras optimizer to its copy of the dense weights.

Step 7 replaces "push dense gradients to the parameter server, pull the
weights back": the update is a deterministic function of the reduced gradient
and the optimizer state, every dense trainer holds the same state and applies
the same kernels to the same inputs, so every copy is the one a server would
hold, and a ring allreduce moves 2(D-1)/D of the dense bytes per trainer
instead of a push and a pull of all of them through one server.
"""
import numpy as np

from horovod_prio.heter import placement as placement_mod
from horovod_prio.heter import ps as ps_mod


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


class HeterTrainer:
    """Train a functional Keras ``model`` with the roles of ``roles``.

    ``loss``: ``loss(y_true, y_pred)`` -> the batch mean (a Keras loss);
    ``optimizer``: the Keras optimizer single-process training would use (the
    dense trainers apply it; the shards apply the same rule to the tables);
    ``plan``: :func:`horovod_prio.heter.placement.place` of the model (done
    here unless given); ``sharding``: ``"mod"`` or ``"range"``.
    Call after ``hvd.init(process_sets=roles.process_sets())``, and
    :meth:`close` before the script ends.
    """

    def __init__(self, model, loss, optimizer, roles, plan=None, sharding="mod", hvd=None):
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
        self.plan = plan or placement_mod.place(model)
        self._tables(sharding)
        self._sets = {n: roles.process_set(n) for n in ("sparse_ps", "sparse_dense", "dense")}
        self._ranks = roles.set_ranks()
        self.ps_ranks, self.sparse_ranks = roles.ranks["ps"], roles.ranks["sparse"]
        self.dense_ranks = roles.ranks["dense"]
        self.steps = 0
        if self.role == "ps":
            self.shard = ps_mod.Shard(
                self.ps_ranks.index(self.rank), len(self.ps_ranks),
                {t["name"]: self._initial(t) for t in self.tables},
                ps_mod.Optimizer.from_keras(optimizer), sharding)
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
            if not isinstance(layer, tf.keras.layers.Embedding) or layer.sparse \
                    or layer._use_one_hot_matmul:
                raise ValueError("sparse-kind layer %r is a %s; the heterogeneous trainer runs "
                                 "dense tf.keras.layers.Embedding lookups on sparse trainers"
                                 % (name, type(layer).__name__))
            if len(layer.inbound_nodes) != 1 or id(layer.input) not in model_inputs:
                raise ValueError("embedding layer %r must be called once, directly on a model "
                                 "input of ids" % name)
            input_name = layer.input.name
            id_inputs.add(id(layer.input))
            rows, dim = placement_mod.table_shape(layer)
            if len(self.roles.ranks["ps"]) > rows:
                raise ValueError("HOROVOD_PRIO_HETER_ROLES: %d parameter-server shards but table "
                                 "%r has only %d rows" % (len(self.roles.ranks["ps"]), name, rows))
            per_sample = int(np.prod([d for d in layer.input.shape[1:]] or [1]))
            self.tables.append(dict(name=name, layer=layer, input=input_name, rows=rows, dim=dim,
                                    offset=offset, per_sample=per_sample,
                                    shape=tuple(layer.input.shape[1:]),
                                    sharding=ps_mod.Sharding(rows, len(self.roles.ranks["ps"]),
                                                             sharding)))
            offset += rows
        self.offsets = np.array([t["offset"] for t in self.tables] + [offset], np.int64)
        self.dense_input_names = [t.name for t in self.model.inputs if id(t) not in id_inputs]
        self._dense_inputs = [t for t in self.model.inputs if id(t) not in id_inputs]
        self.features = sum(t["per_sample"] * t["dim"] for t in self.tables)

    @staticmethod
    def _initial(t):
        """A table's initial rows for the shards: the model's table, or -- for a
        placeholder (``placement.placeholder_tables``) -- the layer's initializer,
        which each shard applies to its own rows only."""
        layer = t["layer"]
        if placement_mod.is_placeholder(layer):
            return ps_mod.TableSpec(t["rows"], t["dim"], layer.embeddings_initializer)
        return layer.embeddings.numpy()

    def _build_dense(self):
        tf = self.tf
        acts = [t["layer"].output for t in self.tables]
        try:
            self.dense_model = tf.keras.Model(self._dense_inputs + acts, self.model.outputs)
        except ValueError as e:
            raise ValueError("the dense part of model %r cannot be cut at its embedding outputs "
                             "(does a dense layer read an id input?): %s" % (self.model.name, e))
        self.dense_vars = self.dense_model.trainable_variables
        if len(self.dense_ranks) > 1:
            self.hvd.broadcast_variables(self.dense_vars, root_rank=self.dense_ranks[0],
                                         process_set=self._sets["dense"])
        self._dense_grad = tf.function(self._dense_forward_backward)
        self._dense_apply = tf.function(
            lambda grads: self.optimizer.apply_gradients(zip(grads, self.dense_vars)))

    def _dense_forward_backward(self, inputs, acts, labels, weight):
        tf = self.tf
        with tf.GradientTape() as tape:
            tape.watch(acts)
            pred = self.dense_model(list(inputs) + list(acts), training=True)
            loss = self.loss(labels, pred)
        grads = tape.gradient(loss, list(self.dense_vars) + list(acts))
        n = len(self.dense_vars)
        dense, act_grads = grads[:n], grads[n:]
        if weight is not None:                       # several dense trainers: global mean
            dense = [g * weight for g in dense]
            act_grads = [g * weight for g in act_grads]
        return loss, dense, act_grads

    # -- the step --------------------------------------------------------------

    def check_batch(self, inputs, labels):
        """ValueError naming the input and the ids out of its table (every
        rank runs this on the same global batch before any collective)."""
        n = len(labels)
        for t in self.tables:
            if t["input"] not in inputs:
                raise ValueError("batch has no input %r (table %r)" % (t["input"], t["name"]))
            ids = np.asarray(inputs[t["input"]])
            if ids.shape[0] != n or tuple(ids.shape[1:]) != t["shape"]:
                raise ValueError("input %r: shape %s, expected (%d,) + %s"
                                 % (t["input"], ids.shape, n, t["shape"]))
            bad = ids[(ids < 0) | (ids >= t["rows"])]
            if bad.size:
                raise ValueError("input %r: ids %s out of table %r's rows 0-%d"
                                 % (t["input"], np.unique(bad)[:5].tolist(), t["name"],
                                    t["rows"] - 1))
        for name in self.dense_input_names:
            if name not in inputs:
                raise ValueError("batch has no input %r" % name)
        if n < max(len(self.sparse_ranks), len(self.dense_ranks)):
            raise ValueError("global batch of %d samples is smaller than the %d sparse / %d "
                             "dense trainers" % (n, len(self.sparse_ranks), len(self.dense_ranks)))

    def step(self, inputs, labels):
        """One synchronous step on the global batch (``inputs``: model input
        name -> array, ``labels``). Returns the dense trainer's local loss on
        dense trainers, None elsewhere."""
        self.check_batch(inputs, labels)
        n = len(labels)
        self._bounds = {"sparse": split_batch(n, len(self.sparse_ranks)),
                        "dense": split_batch(n, len(self.dense_ranks))}
        self.steps += 1
        return getattr(self, "_step_" + self.role)(inputs, labels)

    def _alltoall(self, tensor, splits, set_name, what):
        out, received = self.hvd.alltoall(tensor, splits=np.asarray(splits, np.int32),
                                          name="heter.%s" % what,
                                          process_set=self._sets[set_name])
        return out, received.numpy()

    # sparse trainer ------------------------------------------------------------

    def _step_sparse(self, inputs, labels):
        tf = self.tf
        si = self.sparse_ranks.index(self.rank)
        lo, hi = self._bounds["sparse"][si]
        sp = self._ranks["sparse_ps"]
        per_table, key_chunks = [], [[] for _ in self.ps_ranks]
        for t in self.tables:
            ids = tf.constant(np.asarray(inputs[t["input"]][lo:hi], np.int64))
            uniq, pos = tf.unique(tf.reshape(ids, [-1]))
            uniq_np = uniq.numpy()
            owner = t["sharding"].owner(uniq_np)
            where = [np.nonzero(owner == k)[0] for k in range(len(self.ps_ranks))]
            for k, w in enumerate(where):
                key_chunks[k].append(uniq_np[w] + t["offset"])
            per_table.append(dict(uniq=uniq_np, pos=pos, where=where))
        keys = [np.concatenate(c) if c else np.zeros([0], np.int64) for c in key_chunks]
        splits = [0] * len(sp)
        for k, r in enumerate(self.ps_ranks):
            splits[sp.index(r)] = len(keys[k])
        self._alltoall(tf.constant(np.concatenate(keys), tf.int64), splits, "sparse_ps", "keys")
        # rows come back in sparse_ps rank order = shard order (ps ranks ascending)
        row_splits = [0] * len(sp)
        for k, r in enumerate(self.ps_ranks):
            row_splits[sp.index(r)] = sum(len(pt["where"][k]) * t["dim"]
                                          for pt, t in zip(per_table, self.tables))
        flat, _ = self._alltoall(tf.zeros([0], tf.float32), [0] * len(sp), "sparse_ps", "rows")
        flat = flat.numpy()
        acts, start = [], 0
        rows_by_table = [np.empty((len(pt["uniq"]), t["dim"]), np.float32)
                         for pt, t in zip(per_table, self.tables)]
        for k in range(len(self.ps_ranks)):
            for pt, t, rows in zip(per_table, self.tables, rows_by_table):
                w = pt["where"][k]
                size = len(w) * t["dim"]
                rows[w] = flat[start:start + size].reshape(len(w), t["dim"])
                start += size
        for pt, t, rows in zip(per_table, self.tables, rows_by_table):
            act = tf.gather(tf.constant(rows), pt["pos"])          # = embedding_lookup(table, ids)
            acts.append(tf.reshape(act, [hi - lo, -1]))
        act = tf.concat(acts, axis=1) if len(acts) > 1 else acts[0]
        sd = self._ranks["sparse_dense"]
        to_dense = [0] * len(sd)
        for d, r in enumerate(self.dense_ranks):
            to_dense[sd.index(r)] = _overlap((lo, hi), self._bounds["dense"][d])
        self._alltoall(act, to_dense, "sparse_dense", "activations")
        dact, _ = self._alltoall(tf.zeros([0, self.features], tf.float32), [0] * len(sd),
                                 "sparse_dense", "activation_grads")
        # row gradients: unique ids' sums, as Keras's IndexedSlices path forms them
        grads_flat, col = [[] for _ in self.ps_ranks], 0
        sums = []
        for pt, t in zip(per_table, self.tables):
            width = t["per_sample"] * t["dim"]
            values = tf.reshape(dact[:, col:col + width], [-1, t["dim"]])
            col += width
            sums.append(tf.math.unsorted_segment_sum(values, pt["pos"], len(pt["uniq"])).numpy())
        for k in range(len(self.ps_ranks)):
            for pt, s in zip(per_table, sums):
                grads_flat[k].append(s[pt["where"][k]].reshape(-1))
        push = np.concatenate([np.concatenate(g) if g else np.zeros([0], np.float32)
                               for g in grads_flat]).astype(np.float32)
        self._alltoall(tf.constant(push), row_splits, "sparse_ps", "row_grads")
        return None

    # parameter-server shard ------------------------------------------------------

    def _step_ps(self, inputs, labels):
        tf = self.tf
        sp = self._ranks["sparse_ps"]
        keys, got = self._alltoall(tf.zeros([0], tf.int64), [0] * len(sp), "sparse_ps", "keys")
        keys = keys.numpy()
        table_of = np.searchsorted(self.offsets, keys, side="right") - 1
        dims = np.array([t["dim"] for t in self.tables], np.int64)
        parts = []
        for i, t in enumerate(self.tables):
            mask = table_of == i
            if mask.any():
                rows = self.shard.pull(t["name"], keys[mask] - t["offset"]).numpy()
                parts.append((np.nonzero(mask)[0], rows))
        # rows in key order (each key's row flattened), split back per source
        per_key = dims[table_of] if len(keys) else np.zeros([0], np.int64)
        starts = np.concatenate([[0], np.cumsum(per_key)]).astype(np.int64)
        flat = np.empty(int(starts[-1]), np.float32)
        for idx, rows in parts:
            flat[starts[idx][:, None] + np.arange(rows.shape[1])] = rows
        bounds = np.concatenate([[0], np.cumsum(got)])
        splits = [int(per_key[bounds[i]:bounds[i + 1]].sum()) for i in range(len(sp))]
        self._alltoall(tf.constant(flat), splits, "sparse_ps", "rows")
        grads, _ = self._alltoall(tf.zeros([0], tf.float32), [0] * len(sp), "sparse_ps",
                                  "row_grads")
        grads = grads.numpy()
        push = {}
        for i, t in enumerate(self.tables):
            idx = np.nonzero(table_of == i)[0]
            values = grads[starts[idx][:, None] + np.arange(t["dim"])]
            push[t["name"]] = (keys[idx] - t["offset"], values)
        self.shard.push(push)
        return None

    # dense trainer ------------------------------------------------------------------

    def _step_dense(self, inputs, labels):
        tf = self.tf
        di = self.dense_ranks.index(self.rank)
        lo, hi = self._bounds["dense"][di]
        sd = self._ranks["sparse_dense"]
        act, _ = self._alltoall(tf.zeros([0, self.features], tf.float32), [0] * len(sd),
                                "sparse_dense", "activations")
        acts, col = [], 0
        for t in self.tables:
            width = t["per_sample"] * t["dim"]
            acts.append(tf.reshape(act[:, col:col + width], (hi - lo,) + t["shape"] + (t["dim"],)))
            col += width
        dense_in = [tf.constant(np.asarray(inputs[nm][lo:hi])) for nm in self.dense_input_names]
        weight = None if len(self.dense_ranks) == 1 else \
            tf.constant((hi - lo) / len(labels), tf.float32)
        loss, grads, act_grads = self._dense_grad(dense_in, acts,
                                                  tf.constant(np.asarray(labels[lo:hi])), weight)
        dact = tf.concat([tf.reshape(g, [hi - lo, -1]) for g in act_grads], axis=1) \
            if len(act_grads) > 1 else tf.reshape(act_grads[0], [hi - lo, -1])
        back = [0] * len(sd)
        for s, r in enumerate(self.sparse_ranks):
            back[sd.index(r)] = _overlap((lo, hi), self._bounds["sparse"][s])
        self._alltoall(dact, back, "sparse_dense", "activation_grads")
        if len(self.dense_ranks) > 1:
            grads = [self.hvd.allreduce(g, op=self.hvd.Sum, name="heter.dense.%d" % i,
                                        process_set=self._sets["dense"])
                     for i, g in enumerate(grads)]
        self._dense_apply(grads)
        return float(loss.numpy())

    def close(self):
        """A barrier over every rank; call it before ``hvd.shutdown()`` or the
        end of the script. A rank's part of the last step ends before the
        others' (a dense trainer is done before the shards take their
        pushes), and Horovod's shutdown on one rank -- explicit or at exit --
        fails every collective still in flight on the others."""
        if not getattr(self, "_closed", False):
            self.hvd.allreduce(np.zeros(1, np.float32), name="heter.close")
            self._closed = True

    # -- state -------------------------------------------------------------------------

    def dense_weights(self):
        """The dense part's weights on a dense trainer (name -> array)."""
        return {v.name: v.numpy() for v in self.dense_vars}
