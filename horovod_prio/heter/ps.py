"""Parameter-server shards: row ranges of the embedding tables and the
optimizer that updates them, exactly as Keras's optimizer would.

* :class:`Sharding` - which shard owns which row of a table (``"mod"``: id
  modulo the shard count, local row id // shards; ``"range"``: contiguous
  blocks of ceil(rows / shards)).
* :class:`Optimizer` - SGD (no momentum), Adagrad and Adam (no amsgrad) with
  the update formulas, operation order and constants of TF 2.15's Keras
  optimizers, on sparse rows (Keras's ``IndexedSlices`` path: duplicate ids
  summed first, ``tf.unique`` + ``tf.math.unsorted_segment_sum`` in order of
  occurrence) and on dense variables. Every formula is elementwise per row,
  so a shard updating its rows gives the bits Keras gives the whole table --
  Adam's sparse path decays every row's moments each step, touched or not,
  and so does each shard. One caveat, measured: inside a ``tf.function``
  grappler's arithmetic optimizer rewrites Adagrad's ``x / sqrt(y)``, and
  the rewritten kernel's result depends on the element's position in the
  array (vector lanes vs scalar tail), so a row at another offset in its
  shard can differ from Keras by one ulp per step. With that rewrite off
  (or one shard) the bits are equal; tests/heter/test_ps.py checks both.
  Rows a multiple of 32 bytes wide leave no scalar tail, whatever their
  offset (measured; :data:`SPLIT_ROW_BYTES`). Adam's divisor is
  ``sqrt(v) + epsilon``, which the rewrite leaves alone: its bits do not
  depend on a row's offset (measured at widths 1-33, 48 and 64 floats).
* :class:`Shard` - one shard's tables, slots and step counter; pulls rows,
  applies pushed row gradients, saves and loads its state. Given the keys
  the next step reads, it applies a push in two parts where that is exact
  (:meth:`Optimizer.splits`): those rows first, the rest at :meth:`Shard.flush`.
  For SGD and Adagrad a part is the gradients of its rows. Adam moves every
  row each step, so its first part is every row the next step reads (their
  moments' decay, their gradients if any, their update) and its rest every
  other row, with the same step's bias correction
  (:meth:`Optimizer.apply_part`: the one rule of :meth:`Optimizer.apply_sparse`
  on a copy of the rows read next, then on the whole table with those rows
  put back).
"""
import collections

import numpy as np

SHARDINGS = ("mod", "range")


class Sharding:
    """Rows of one table over ``num_shards`` shards."""

    def __init__(self, rows, num_shards, mode="mod"):
        if mode not in SHARDINGS:
            raise ValueError("sharding=%r: give one of %s" % (mode, ", ".join(SHARDINGS)))
        if not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError("num_shards=%r: give a positive number of shards" % (num_shards,))
        if num_shards > rows:
            raise ValueError("num_shards=%d: more parameter-server shards than the table's %d rows"
                             % (num_shards, rows))
        self.rows, self.num_shards, self.mode = int(rows), num_shards, mode
        self.block = -(-self.rows // num_shards)

    def owner(self, ids):
        ids = np.asarray(ids, np.int64)
        return ids % self.num_shards if self.mode == "mod" else ids // self.block

    def local(self, ids):
        ids = np.asarray(ids, np.int64)
        return ids // self.num_shards if self.mode == "mod" else ids - (ids // self.block) * self.block

    def global_ids(self, shard):
        """The table ids shard ``shard`` owns, in local-row order."""
        if self.mode == "mod":
            return np.arange(shard, self.rows, self.num_shards, dtype=np.int64)
        return np.arange(shard * self.block, min(self.rows, (shard + 1) * self.block), dtype=np.int64)


OPTIMIZERS = ("sgd", "adagrad", "adam")

#: Adagrad's update of some rows, then of the others, has the bits of one
#: update of all when a row is a multiple of this many bytes wide: grappler's
#: rewrite of ``x / sqrt(y)`` rounds differently in the scalar tail of an
#: array than in its vector lanes, and such rows leave no tail. Measured with
#: TF 2.15.1's wheel: 32 bytes (8 float32 lanes) suffice; 64 is the widest
#: x86 vector (AVX-512), for builds with wider packets.
SPLIT_ROW_BYTES = 64


class Optimizer:
    """Keras-exact update rules (see the module doc); build with
    :meth:`from_keras` from the optimizer a single-process run would use."""

    def __init__(self, kind, learning_rate, epsilon=1e-7, beta_1=0.9, beta_2=0.999,
                 initial_accumulator_value=0.1):
        if kind not in OPTIMIZERS:
            raise ValueError("optimizer %r: give one of %s" % (kind, ", ".join(OPTIMIZERS)))
        self.kind, self.learning_rate, self.epsilon = kind, float(learning_rate), epsilon
        self.beta_1, self.beta_2 = beta_1, beta_2
        self.initial_accumulator_value = initial_accumulator_value

    @classmethod
    def from_keras(cls, opt):
        import tensorflow as tf
        name = type(opt).__name__.lower()
        if name not in OPTIMIZERS:
            raise ValueError("optimizer %s: the parameter server applies %s only"
                             % (type(opt).__name__, ", ".join(OPTIMIZERS)))
        for field in ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm"):
            if getattr(opt, field, None) is not None:
                raise ValueError("optimizer %s: %s=%r is not supported by the parameter server"
                                 % (type(opt).__name__, field, getattr(opt, field)))
        if getattr(opt, "use_ema", False):
            raise ValueError("optimizer %s: use_ema=True is not supported" % type(opt).__name__)
        if isinstance(opt._learning_rate, tf.keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError("optimizer %s: learning_rate schedules are not supported"
                             % type(opt).__name__)
        lr = float(opt._learning_rate.numpy() if hasattr(opt._learning_rate, "numpy")
                   else opt._learning_rate)
        if name == "sgd":
            if opt.momentum != 0 or opt.nesterov:
                raise ValueError("optimizer SGD: momentum=%r nesterov=%r; the parameter server "
                                 "applies plain SGD" % (opt.momentum, opt.nesterov))
            return cls("sgd", lr)
        if name == "adagrad":
            return cls("adagrad", lr, epsilon=opt.epsilon,
                       initial_accumulator_value=opt.initial_accumulator_value)
        if opt.amsgrad:
            raise ValueError("optimizer Adam: amsgrad=True is not supported")
        return cls("adam", lr, epsilon=opt.epsilon, beta_1=opt.beta_1, beta_2=opt.beta_2)

    def splits(self, dim, itemsize=4):
        """Whether rows ``dim`` wide may be updated in two parts (the rows the
        next step reads, then the others) with the bits of one update: SGD
        (a multiply and an add per element) and Adam (multiplies, adds, a
        square root and a division, each correctly rounded in a vector lane
        and in the scalar tail alike; measured bitwise at widths 1-33, 48 and
        64) always; Adagrad if a row is a multiple of :data:`SPLIT_ROW_BYTES`
        bytes."""
        if self.kind == "adagrad":
            return (int(dim) * int(itemsize)) % SPLIT_ROW_BYTES == 0
        return True

    @property
    def moves_every_row(self):
        """Adam: Keras's sparse path decays every row's moments and moves
        every row each step, touched or not, so a part of a step is a set of
        rows (:meth:`apply_part`), not only a set of gradients."""
        return self.kind == "adam"

    @property
    def slot_names(self):
        return {"sgd": (), "adagrad": ("accumulator",), "adam": ("m", "v")}[self.kind]

    def initial_slot(self, name, shape, dtype=np.float32):
        value = self.initial_accumulator_value if name == "accumulator" else 0.0
        return np.full(shape, value, dtype=dtype)

    def _lr(self, dtype):
        import tensorflow as tf
        # Keras keeps the rate in a float32 variable and casts it: a constant
        # here would let grappler fold -lr and reorder the arithmetic
        if getattr(self, "_lr_var", None) is None:
            with tf.init_scope():
                self._lr_var = tf.Variable(self.learning_rate, dtype=tf.float32, trainable=False,
                                           name="heter_learning_rate")
        return tf.cast(self._lr_var, dtype)

    def apply_sparse(self, var, slots, indices, values, step):
        """Keras's IndexedSlices update of rows ``indices`` (unique) by
        ``values``; ``step``: the optimizer's iteration count before it."""
        import tensorflow as tf
        lr = self._lr(var.dtype)
        if self.kind == "sgd":
            var.scatter_add(tf.IndexedSlices(-values * lr, indices))
        elif self.kind == "adagrad":
            acc = slots["accumulator"]
            acc.scatter_add(tf.IndexedSlices(values * values, indices))
            denominator = tf.sqrt(tf.gather(acc, indices=indices) + self.epsilon)
            var.scatter_add(tf.IndexedSlices(-lr * values / denominator, indices))
        else:
            m, v, alpha = slots["m"], slots["v"], self._alpha(lr, step, var.dtype)
            m.assign_add(-m * (1 - self.beta_1))
            m.scatter_add(tf.IndexedSlices(values * (1 - self.beta_1), indices))
            v.assign_add(-v * (1 - self.beta_2))
            v.scatter_add(tf.IndexedSlices(tf.square(values) * (1 - self.beta_2), indices))
            var.assign_sub((m * alpha) / (tf.sqrt(v) + self.epsilon))

    def apply_part(self, part, var, slots, rows, indices, values, step, copy=None):
        """One part of :meth:`apply_sparse`'s step split around ``rows`` (the
        sorted unique rows the next step reads): ``"ahead"`` updates those
        rows (``indices`` among them), ``"rest"`` every other row (``indices``
        none of them), ``"whole"`` all. Both parts take the same ``step``.
        Where only touched rows move (SGD, Adagrad) a part is its gradients.
        Adam's "ahead" runs :meth:`apply_sparse` on a copy of the rows
        (``copy``: a variable ``[None, dim]`` for the rows and one per slot),
        its "rest" runs it on the whole variables and puts the rows back:
        the same rule on the same elements, so the bits of one step."""
        if part == "whole" or not self.moves_every_row:
            return self.apply_sparse(var, slots, indices, values, step)
        import tensorflow as tf
        names = self.slot_names
        if part == "ahead":
            copy_var, copy_slots = copy
            copy_var.assign(tf.gather(var, rows))
            for s in names:
                copy_slots[s].assign(tf.gather(slots[s], rows))
            self.apply_sparse(copy_var, copy_slots, tf.searchsorted(rows, indices), values, step)
            kept = [copy_var] + [copy_slots[s] for s in names]
            for target, done in zip([var] + [slots[s] for s in names], kept):
                target.scatter_update(tf.IndexedSlices(done.read_value(), rows))
            empty = tf.zeros([0, int(var.shape[1])], var.dtype)
            for done in kept:                # nothing holds the copy between steps
                done.assign(empty)
        elif part == "rest":
            targets = [var] + [slots[s] for s in names]
            kept = [tf.gather(t, rows) for t in targets]
            self.apply_sparse(var, slots, indices, values, step)
            for target, rows_done in zip(targets, kept):
                target.scatter_update(tf.IndexedSlices(rows_done, rows))
        else:
            raise ValueError("part %r: give whole, ahead or rest" % (part,))

    def apply_dense(self, var, slots, grad, step):
        """Keras's dense update of ``var`` by ``grad``."""
        import tensorflow as tf
        lr = self._lr(var.dtype)
        if self.kind == "sgd":
            var.assign_add(-grad * lr)
        elif self.kind == "adagrad":
            acc = slots["accumulator"]
            acc.assign_add(grad * grad)
            var.assign_sub(lr * grad / tf.sqrt(acc + self.epsilon))
        else:
            m, v, alpha = slots["m"], slots["v"], self._alpha(lr, step, var.dtype)
            m.assign_add((grad - m) * (1 - self.beta_1))
            v.assign_add((tf.square(grad) - v) * (1 - self.beta_2))
            var.assign_sub((m * alpha) / (tf.sqrt(v) + self.epsilon))

    def _alpha(self, lr, step, dtype):
        import tensorflow as tf
        local_step = tf.cast(step + 1, dtype)
        beta_1_power = tf.pow(tf.cast(self.beta_1, dtype), local_step)
        beta_2_power = tf.pow(tf.cast(self.beta_2, dtype), local_step)
        return lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)


def dedupe(ids, values):
    """Keras's ``_deduplicate_sparse_grad``: unique ids in order of first
    occurrence, their values summed in order of occurrence."""
    import tensorflow as tf
    unique, positions = tf.unique(ids)
    return unique, tf.math.unsorted_segment_sum(values, positions, tf.shape(unique)[0])


class TableSpec(collections.namedtuple("TableSpec", "rows dim initializer")):
    """A table a shard initialises itself: ``initializer(shape, dtype)`` (a
    Keras initializer) gives the rows this shard owns; nobody holds the whole
    table."""


class Shard:
    """One parameter-server shard: for each table (name -> its full initial
    rows, or a :class:`TableSpec`) the rows this shard owns, their optimizer
    slots and the shard's step counter."""

    def __init__(self, index, num_shards, tables, optimizer, sharding="mod", dtype=np.float32):
        import tensorflow as tf
        if not 0 <= index < num_shards:
            raise ValueError("shard index %r: give 0..%d" % (index, num_shards - 1))
        self.index, self.num_shards, self.optimizer = index, num_shards, optimizer
        self.sharding, self.tables, self.slots, self.shardings = sharding, {}, {}, {}
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="heter_ps_step")
        for name, initial in tables.items():
            if isinstance(initial, TableSpec):
                sh = Sharding(int(initial.rows), num_shards, sharding)
                own = initial.initializer((len(sh.global_ids(index)), int(initial.dim)),
                                          dtype=tf.as_dtype(dtype))
            else:
                initial = np.asarray(initial, dtype)
                if initial.ndim != 2:
                    raise ValueError("table %r: initial rows of shape %s, give (rows, dim)"
                                     % (name, initial.shape))
                sh = Sharding(initial.shape[0], num_shards, sharding)
                own = initial[sh.global_ids(index)]
            self.shardings[name] = sh
            self.tables[name] = tf.Variable(own, name="heter_%s_shard%d" % (name, index))
            self.slots[name] = {s: tf.Variable(optimizer.initial_slot(s, tuple(own.shape), dtype),
                                               name="heter_%s_%s_shard%d" % (name, s, index))
                                for s in optimizer.slot_names}
        optimizer._lr(tf.as_dtype(dtype))   # its variable, before any graph: traced once each
        self._gather = self._rows_fns = None
        #: graph calls of the applies: gradients at the shard's step (None),
        #: and the parts of a step that moves every row ("ahead", "rest")
        self._apply, self._apply_parts_fns = {}, {}
        #: one-part and two-part applies: "whole", "ahead" (the rows the next
        #: step reads, of a split push), "rest" (the other rows, at
        #: :meth:`flush`), "rest_late" (a rest the next apply or pull had to
        #: apply first because nobody flushed it)
        self.apply_parts = collections.Counter()
        self._rest = self._marks = None
        self._splits = np.array([optimizer.splits(int(v.shape[1]), v.dtype.size)
                                 for v in self.tables.values()], bool)
        #: per table whose step splits and moves every row (Adam): variables
        #: for a copy of the rows the next step reads (Optimizer.apply_part)
        self._copies = {}
        if optimizer.moves_every_row:
            for (name, var), split in zip(self.tables.items(), self._splits):
                if split:
                    shape = tf.TensorShape([None, int(var.shape[1])])
                    empty = np.zeros([0, int(var.shape[1])], var.dtype.as_numpy_dtype)
                    self._copies[name] = (
                        tf.Variable(empty, shape=shape, trainable=False),
                        {s: tf.Variable(empty, shape=shape, trainable=False)
                         for s in optimizer.slot_names})
        dims = {int(v.shape[1]) for v in self.tables.values()}
        #: the tables' one row width, or None: :meth:`gather_keys` and
        #: :meth:`apply_keys` take the keys of every table as one array
        self.dim = dims.pop() if len(dims) == 1 else None
        shs = list(self.shardings.values())
        self._rows = np.array([sh.rows for sh in shs], np.int64)
        self._block = np.array([sh.block for sh in shs], np.int64)

    def check_ids(self, table, ids):
        """ValueError naming the table for ids this shard does not own."""
        ids = np.asarray(ids, np.int64)
        sh = self.shardings[table]
        bad = ids[(ids < 0) | (ids >= sh.rows) | (sh.owner(np.clip(ids, 0, None)) != self.index)]
        if bad.size:
            raise ValueError("table %r: ids %s are not rows of shard %d of %d (table rows 0-%d)"
                             % (table, bad[:5].tolist(), self.index, self.num_shards, sh.rows - 1))
        return sh.local(ids)

    def pull(self, table, ids):
        """Rows of ``ids`` (table ids this shard owns)."""
        import tensorflow as tf
        self.flush("rest_late")
        return tf.gather(self.tables[table], self.check_ids(table, ids))

    def pull_all(self, ids):
        """Rows of every table at once: ``ids``, one array of table ids per
        table in the shard's table order -> one (len, dim) tensor each (a
        single graph call, whatever the number of tables)."""
        names = list(self.tables)
        if len(ids) != len(names):
            raise ValueError("pull_all: ids for %d tables, the shard holds %d"
                             % (len(ids), len(names)))
        return self.gather_local([self.check_ids(n, i) for n, i in zip(names, ids)])

    def gather_local(self, local, ahead=False):
        """:meth:`pull_all` of local row indices already checked (``check_ids``).
        ``ahead``: these are the rows the last apply was told the next step
        reads (its ``next_keys``), so its rest need not be applied first."""
        import tensorflow as tf
        if not ahead:
            self.flush("rest_late")
        names = list(self.tables)
        if self._gather is None:
            variables = [self.tables[n] for n in names]

            @tf.function(input_signature=[[tf.TensorSpec([None], tf.int64) for _ in names]])
            def gather(local):
                return [tf.gather(v, i) for v, i in zip(variables, local)]
            self._gather = gather
        return self._gather([tf.constant(i, tf.int64) for i in local])

    def check_keys(self, table_of, ids):
        """:meth:`check_ids` of the ids of several tables at once (``table_of``:
        each id's table, an index in the shard's table order) -> local rows."""
        ids = np.asarray(ids, np.int64)
        table_of = np.asarray(table_of, np.int64)
        if self.sharding == "mod":
            owner, local = ids % self.num_shards, ids // self.num_shards
        else:
            block = self._block[table_of]
            owner = ids // block
            local = ids - owner * block
        bad = (ids < 0) | (ids >= self._rows[table_of]) | (owner != self.index)
        if bad.any():
            t = int(table_of[np.argmax(bad)])
            name = list(self.tables)[t]
            self.check_ids(name, ids[table_of == t])       # raises, naming the table
        return local

    def gather_keys(self, table_of, local, ahead=False):
        """Rows of the tables' one width (:attr:`dim`) for ids of several
        tables, in their order, in one graph call: ``table_of`` (each id's
        table index), ``local`` (its local row, :meth:`check_keys`) -> (n, dim).
        ``ahead`` as for :meth:`gather_local`."""
        import tensorflow as tf
        if not ahead:
            self.flush("rest_late")
        return self._keys_fns()[0](tf.constant(table_of, tf.int32), tf.constant(local, tf.int64))

    def apply_keys(self, table_of, local, values, next_keys=None):
        """:meth:`push` of row gradients ``values`` (n, :attr:`dim`) of ids of
        several tables (as :meth:`gather_keys`). Each table gets its ids and
        gradients in their order here, which is what :meth:`apply_local` gets
        from a stable sort by table: the same update, bit for bit.

        ``next_keys``: ``(table_of, local)`` of the rows the next step reads.
        Then the rows of tables whose update splits exactly
        (:meth:`Optimizer.splits`) that the next step does not read are kept
        for :meth:`flush` (call it after the next rows are sent); the others
        are applied now (for Adam: all the rows the next step reads, touched
        or not; the rest is every other row). A row's gradients all go to one
        part, in their order, so each part sums them as the whole would; both
        parts take this step's count (Adam's bias correction)."""
        self.flush("rest_late")
        table_of = np.asarray(table_of, np.int64)
        local = np.asarray(local, np.int64)
        values = np.asarray(values)
        plan = self._plan([table_of], [local], next_keys)
        if plan is None:
            if self._whole_as_rest():
                self._apply_keys("rest", table_of, local, values, self._no_rows(),
                                 self._step_now())
            else:
                self._apply_keys(None, table_of, local, values)
            self.apply_parts["whole"] += 1
        else:
            (rest,), rows = plan
            now = ~rest
            args = [(table_of[m], local[m], values[m]) for m in (now, rest)]
            if rows is not None:         # Adam: parts of rows, with this step's count
                step = self._step_now()
                args = [a + (rows, step) for a in args]
            if rows is not None or now.any():
                self._apply_keys("ahead" if rows is not None else None, *args[0])
            self._rest = ("keys", ("rest" if rows is not None else None,) + args[1])
            self.apply_parts["ahead"] += 1
        self.step.assign_add(1)

    def _whole_as_rest(self):
        """Adam: a whole push is the "rest" part with no rows kept back (the
        same rule on every row), so one graph fewer is traced -- none at a
        push that comes without the next keys after split pushes (a fit's
        last), where a trace of a many-table graph would cost a few hundred
        pushes' Python time."""
        return self.optimizer.moves_every_row and bool(self._splits.all())

    def _step_now(self):
        import tensorflow as tf
        return tf.constant(int(self.step.numpy()), tf.int64)

    def _apply_keys(self, part, table_of, local, values, rows=None, step=None):
        """One graph call: ``part`` None applies gradients (the whole step, or
        the gradients of some rows where only touched rows move: SGD,
        Adagrad), "ahead"/"rest" a part of a step that moves every row."""
        import tensorflow as tf
        dtype = next(iter(self.tables.values())).dtype
        args = (tf.constant(table_of, tf.int32), tf.constant(local, tf.int64),
                tf.convert_to_tensor(values, dtype))
        if part is None:
            self._keys_fns()[1](*args)
        else:
            self._keys_fns(part)(*args, self._rows_args(rows), step)

    def _no_rows(self):
        return [np.zeros([0], np.int64)] * len(self.tables)

    def _rows_args(self, rows):
        import tensorflow as tf
        return [tf.constant(r, tf.int64) for r in rows]

    def _apply_table(self, part, t, name, rows, indices, values, step):
        """Table ``t``'s share of a part of a step (in a graph): a table whose
        step does not split takes it whole in the first part."""
        if not self._splits[t] and part != "whole":
            if part == "rest":
                return
            part = "whole"
        self.optimizer.apply_part(part, self.tables[name], self.slots[name], rows, indices,
                                  values, step, self._copies.get(name))

    def _plan(self, table_of, local, next_keys):
        """How to apply a push given the next step's keys: None (whole, now),
        or ``(masks, rows)``: per array of keys (``table_of[i]``,
        ``local[i]``) which to apply after the next rows are sent; ``rows``:
        per table the sorted local rows the next step reads, for an optimizer
        that moves every row (else None): its first part is those rows'
        share of the step, its rest every other row's."""
        if next_keys is None or not self._splits.any():
            return None
        if self._marks is None:     # one flag per row of this shard, all tables end to end
            self._first = np.concatenate(
                [[0], np.cumsum([int(v.shape[0]) for v in self.tables.values()])]).astype(np.int64)
            self._marks = np.zeros(int(self._first[-1]), bool)
        nt, nl = (np.asarray(a, np.int64) for a in next_keys)
        wanted = self._first[nt] + nl
        self._marks[wanted] = True
        masks = [self._splits[t] & ~self._marks[self._first[t] + l]
                 for t, l in zip(table_of, local)]
        self._marks[wanted] = False
        rows = None
        if self.optimizer.moves_every_row:
            # the trainer sends them sorted and unique (by table, then row)
            if wanted.size > 1 and not (wanted[1:] > wanted[:-1]).all():
                wanted = np.unique(wanted)
            cut = np.searchsorted(wanted, self._first)
            rows = [wanted[cut[t]:cut[t + 1]] - self._first[t] if self._splits[t]
                    else np.zeros([0], np.int64) for t in range(len(self.tables))]
        if rows is None and not any(m.any() for m in masks):
            return None
        return masks, rows

    def flush(self, part="rest"):
        """Apply the rows a split push kept back (no step of its own: it is
        the rest of the last one). Returns whether there were any."""
        if self._rest is None:
            return False
        how, args = self._rest
        self._rest = None
        if how == "keys":
            self._apply_keys(*args)
        else:
            self._apply_local(*args)
        self.apply_parts[part] += 1
        return True

    def _keys_fns(self, part=None):
        """The one-width graph calls: ``(gather, apply)`` (apply: the
        gradients, at the shard's step), or with ``part`` the apply of that
        part of a step that moves every row (``"ahead"``, ``"rest"``; rows
        and step as arguments)."""
        import tensorflow as tf
        if self.dim is None:
            raise ValueError("gather_keys/apply_keys: the shard's tables have several row "
                             "widths %s; use gather_local/apply_local"
                             % sorted({int(v.shape[1]) for v in self.tables.values()}))
        names = list(self.tables)
        variables = [self.tables[n] for n in names]
        count = len(names)
        dtype = variables[0].dtype
        by, ids = tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int64)
        grads = tf.TensorSpec([None, self.dim], dtype)
        if self._rows_fns is None:
            @tf.function(input_signature=[by, ids])
            def gather(table_of, local):
                parts = tf.dynamic_partition(local, table_of, count)
                where = tf.dynamic_partition(tf.range(tf.size(local)), table_of, count)
                return tf.dynamic_stitch(where, [tf.gather(v, i) for v, i in zip(variables, parts)])

            @tf.function(input_signature=[by, ids, grads])
            def apply(table_of, local, values):
                parts = tf.dynamic_partition(local, table_of, count)
                vals = tf.dynamic_partition(values, table_of, count)
                for name, i, v in zip(names, parts, vals):
                    unique, summed = dedupe(i, v)
                    self.optimizer.apply_sparse(self.tables[name], self.slots[name], unique,
                                                summed, self.step)
            self._rows_fns = (gather, apply)
        if part is None:
            return self._rows_fns
        if part not in self._apply_parts_fns:
            @tf.function(input_signature=[by, ids, grads, [ids] * count,
                                          tf.TensorSpec([], tf.int64)])
            def apply_part(table_of, local, values, rows, step):
                parts = tf.dynamic_partition(local, table_of, count)
                vals = tf.dynamic_partition(values, table_of, count)
                for t, (name, i, v, r) in enumerate(zip(names, parts, vals, rows)):
                    unique, summed = dedupe(i, v)
                    self._apply_table(part, t, name, r, unique, summed, step)
            self._apply_parts_fns[part] = apply_part
        return self._apply_parts_fns[part]

    def push(self, grads):
        """Apply one step: ``grads`` = {table: (ids, row gradients)} (ids may
        repeat; their gradients are summed as Keras does). Tables not in
        ``grads`` still take the step (Adam decays their moments as Keras
        does for a variable whose IndexedSlices gradient is empty). Every
        table is updated in one graph call."""
        local, values = [], []
        for name, var in self.tables.items():
            dim = int(var.shape[1])
            ids, v = grads.get(name, (np.zeros([0], np.int64), np.zeros([0, dim], np.float32)))
            local.append(self.check_ids(name, ids))
            values.append(v)
        self.apply_local(local, values)

    def apply_local(self, local, values, next_keys=None):
        """:meth:`push` of local row indices already checked (``check_ids``),
        one array per table in the shard's table order; ``next_keys`` as for
        :meth:`apply_keys`."""
        self.flush("rest_late")
        local = [np.asarray(i, np.int64) for i in local]
        values = [np.asarray(v) for v in values]
        plan = self._plan([np.full(len(i), t, np.int64) for t, i in enumerate(local)],
                          local, next_keys)
        if plan is None:
            if self._whole_as_rest():
                self._apply_local("rest", local, values, self._no_rows(), self._step_now())
            else:
                self._apply_local(None, local, values)
            self.apply_parts["whole"] += 1
        else:
            rest, rows = plan
            args = [([i[m] for i, m in zip(local, masks)], [v[m] for v, m in zip(values, masks)])
                    for masks in ([~m for m in rest], rest)]
            if rows is not None:         # Adam: parts of rows, with this step's count
                step = self._step_now()
                args = [a + (rows, step) for a in args]
            if rows is not None or any((~m).any() for m in rest):
                self._apply_local("ahead" if rows is not None else None, *args[0])
            self._rest = ("local", ("rest" if rows is not None else None,) + args[1])
            self.apply_parts["ahead"] += 1
        self.step.assign_add(1)

    def _apply_local(self, part, local, values, rows=None, step=None):
        """One graph call, ``part`` as for :meth:`_apply_keys`."""
        import tensorflow as tf
        args = [[tf.constant(i, tf.int64), tf.convert_to_tensor(v, var.dtype)]
                for i, v, var in zip(local, values, self.tables.values())]
        if part is None:
            self._apply_fn(None)(args)
        else:
            self._apply_fn(part)(args, self._rows_args(rows), step)

    def _apply_fn(self, part):
        """The per-table graph call: ``part`` None the gradients at the
        shard's step, else that part of a step that moves every row."""
        import tensorflow as tf
        if part not in self._apply:
            names = list(self.tables)
            spec = [[tf.TensorSpec([None], tf.int64),
                     tf.TensorSpec([None, int(self.tables[n].shape[1])], self.tables[n].dtype)]
                    for n in names]
            if part is None:
                @tf.function(input_signature=[spec])
                def apply(args):
                    for name, (local, values) in zip(names, args):
                        unique, summed = dedupe(local, values)
                        self.optimizer.apply_sparse(self.tables[name], self.slots[name], unique,
                                                    summed, self.step)
            else:
                rows_spec = [tf.TensorSpec([None], tf.int64)] * len(names)

                @tf.function(input_signature=[spec, rows_spec, tf.TensorSpec([], tf.int64)])
                def apply(args, rows, step):
                    for t, (name, (local, values), r) in enumerate(zip(names, args, rows)):
                        unique, summed = dedupe(local, values)
                        self._apply_table(part, t, name, r, unique, summed, step)
            self._apply[part] = apply
        return self._apply[part]

    def state(self):
        """name -> numpy arrays: ``{table: {"ids", "rows", <slot>...}}`` and the step."""
        self.flush()
        out = {"step": int(self.step.numpy()), "tables": {}}
        for name, var in self.tables.items():
            entry = {"ids": self.shardings[name].global_ids(self.index), "rows": var.numpy()}
            entry.update({s: v.numpy() for s, v in self.slots[name].items()})
            out["tables"][name] = entry
        return out
