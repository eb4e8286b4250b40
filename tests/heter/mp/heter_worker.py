"""Worker for tests/heter/test_trainer.py, run under horovodrun.

    heter_worker.py OUT_DIR exact   three optimizers x 20 heterogeneous steps vs
                                    single-process training of the same model
                                    on the same global batches (every rank
                                    computes the reference, compares what it
                                    owns, writes OUT_DIR/exact_rank<r>.json);
                                    then a checkpoint round trip and a
                                    batch with an id out of range
    heter_worker.py OUT_DIR multi   Adagrad and Adam only, for several shards /
                                    trainers, Adam on the pooled model
                                    (OUT_DIR/multi_rank<r>.json)
    heter_worker.py OUT_DIR pooled  Adagrad and Adam on a model whose multi-hot
                                    field is mean-pooled (a sparse-kind layer
                                    that runs on the sparse trainer), tables of
                                    one width (OUT_DIR/pooled_rank<r>.json)
    heter_worker.py OUT_DIR split   fit() (one batch ahead) with tables whose update
                                    the shard splits around the next step's
                                    rows: Adagrad on tables 16 wide (one
                                    width) and 16 + 32 wide, Adam on tables
                                    16 wide and on the tiny model, SGD on the
                                    tiny model; vs single-process training,
                                    with the shard's apply parts
                                    (OUT_DIR/split_rank<r>.json)
    heter_worker.py OUT_DIR restore a restore while the trainer looks one batch
                                    ahead (Adagrad, 16-wide tables: a split
                                    push's rest kept back), then the announced
                                    batch, vs a fresh trainer restored from the
                                    same checkpoint (OUT_DIR/restore_rank<r>.json)
    heter_worker.py OUT_DIR memory  the model built with placeholder tables
                                    (larger tables, 2 shards): a few steps, then
                                    every rank reports the bytes of the
                                    variables it holds (OUT_DIR/memory_rank<r>.json)
    heter_worker.py OUT_DIR kill    steps until the parameter-server shard exits
                                    mid-step (after the keys of step 3 arrived)
"""
import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

from horovod_prio.heter import roles as roles_mod  # noqa: E402
from horovod_prio.heter.trainer import HeterTrainer  # noqa: E402

OUT, MODE = sys.argv[1], sys.argv[2]
STEPS, BATCH = 20, 16
ROWS_A, ROWS_B = 40, 17


def build_model(rows_a=ROWS_A, rows_b=ROWS_B):
    a = tf.keras.Input((3,), dtype="int64", name="ids_a")
    b = tf.keras.Input((1,), dtype="int64", name="ids_b")
    x = tf.keras.Input((5,), name="x")
    ea = tf.keras.layers.Embedding(rows_a, 4, name="emb_a")(a)
    eb = tf.keras.layers.Embedding(rows_b, 3, name="emb_b")(b)
    h = tf.keras.layers.Concatenate(name="cat")([tf.keras.layers.Flatten(name="fa")(ea),
                                                 tf.keras.layers.Flatten(name="fb")(eb), x])
    h = tf.keras.layers.Dense(8, activation="relu", name="hidden")(h)
    return tf.keras.Model([a, b, x], tf.keras.layers.Dense(1, name="out")(h), name="tiny_dlrm")


def build_pooled(rows_a=ROWS_A, rows_b=ROWS_B):
    """Both tables 4 wide; field a's 3 ids mean-pooled (GlobalAveragePooling1D:
    placed sparse by its ops, run by the sparse trainer, so the dense trainer
    receives 4 floats for field a instead of 12)."""
    a = tf.keras.Input((3,), dtype="int64", name="ids_a")
    b = tf.keras.Input((1,), dtype="int64", name="ids_b")
    x = tf.keras.Input((5,), name="x")
    pa = tf.keras.layers.GlobalAveragePooling1D(name="pool_a")(
        tf.keras.layers.Embedding(rows_a, 4, name="emb_a")(a))
    eb = tf.keras.layers.Embedding(rows_b, 4, name="emb_b")(b)
    h = tf.keras.layers.Concatenate(name="cat")([pa, tf.keras.layers.Flatten(name="fb")(eb), x])
    h = tf.keras.layers.Dense(8, activation="relu", name="hidden")(h)
    return tf.keras.Model([a, b, x], tf.keras.layers.Dense(1, name="out")(h), name="pooled_dlrm")


def build_wide(dim_a=16, dim_b=16):
    """The tiny model with tables 16 (and 16 or 32) floats wide: rows of a
    multiple of 64 bytes, whose Adagrad update the shard splits."""
    a = tf.keras.Input((3,), dtype="int64", name="ids_a")
    b = tf.keras.Input((1,), dtype="int64", name="ids_b")
    x = tf.keras.Input((5,), name="x")
    ea = tf.keras.layers.Embedding(ROWS_A, dim_a, name="emb_a")(a)
    eb = tf.keras.layers.Embedding(ROWS_B, dim_b, name="emb_b")(b)
    h = tf.keras.layers.Concatenate(name="cat")([tf.keras.layers.Flatten(name="fa")(ea),
                                                 tf.keras.layers.Flatten(name="fb")(eb), x])
    h = tf.keras.layers.Dense(8, activation="relu", name="hidden")(h)
    return tf.keras.Model([a, b, x], tf.keras.layers.Dense(1, name="out")(h), name="wide_dlrm")


SPLIT_CASES = {"adagrad_16": ("adagrad", build_wide),
               "adagrad_16_32": ("adagrad", lambda: build_wide(16, 32)),
               "sgd_4_3": ("sgd", build_model),
               "adam_16": ("adam", build_wide),
               "adam_4_3": ("adam", build_model)}


def builder(kind):
    """The pooled model (tables of one width: the shards' and sparse trainers'
    one-width path) in "pooled", and for Adam in "multi" (two shards)."""
    return build_pooled if MODE == "pooled" or (MODE == "multi" and kind == "adam") \
        else build_model


def batches(seed):
    rng = np.random.default_rng(seed)
    for _ in range(STEPS):
        yield ({"ids_a": np.minimum(rng.zipf(1.5, (BATCH, 3)) - 1, ROWS_A - 1).astype(np.int64),
                "ids_b": rng.integers(0, ROWS_B, (BATCH, 1)).astype(np.int64),
                "x": rng.standard_normal((BATCH, 5)).astype(np.float32)},
               (rng.random((BATCH, 1)) < 0.3).astype(np.float32))


OPTS = {"sgd": lambda: tf.keras.optimizers.SGD(0.1),
        "adagrad": lambda: tf.keras.optimizers.Adagrad(0.1),
        "adam": lambda: tf.keras.optimizers.Adam(0.01)}


def reference(init, kind, build=None):
    model = (build or builder(kind))()
    model.set_weights(init)
    opt, loss_fn = OPTS[kind](), tf.keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for x, y in batches(7):
        step({k: tf.constant(v) for k, v in x.items()}, tf.constant(y))
    slots = {}
    for layer in ("emb_a", "emb_b"):
        var = model.get_layer(layer).embeddings
        if kind == "adagrad":
            slots[layer] = {"accumulator": opt._accumulators[opt._index_dict[opt._var_key(var)]]}
        elif kind == "adam":
            i = opt._index_dict[opt._var_key(var)]
            slots[layer] = {"m": opt._momentums[i], "v": opt._velocities[i]}
    return model, slots


def compare(got, want):
    got, want = np.asarray(got), np.asarray(want)
    diff = np.abs(got.astype(np.float64) - want)
    rel = diff / np.maximum(np.abs(want), 1e-30)
    return {"equal": bool(np.array_equal(got, want)), "max_abs": float(diff.max()),
            "max_rel": float(rel[diff > 0].max()) if (diff > 0).any() else 0.0}


def weight_checks(trainer, ref, ref_slots, losses, init=None):
    """This rank's trained weights against single-process training ``ref``
    (``compare`` by name): on a shard every table's rows and ``ref_slots``'s
    slots and the step (with ``init``, the model's initial weights, also that
    every table's rows moved from them); on a dense trainer the dense weights
    and that ``losses`` are finite."""
    checks = {}
    if trainer.role == "ps":
        st = trainer.shard.state()
        for t, entry in st["tables"].items():
            full = ref.get_layer(t).embeddings.numpy()
            checks[t] = compare(entry["rows"], full[entry["ids"]])
            if init is not None:
                assert not np.array_equal(entry["rows"], np.asarray(
                    [w for w in init if w.shape == full.shape][0])[entry["ids"]])
            for s, var in ref_slots.get(t, {}).items():
                checks[t + "/" + s] = compare(entry[s], var.numpy()[entry["ids"]])
        checks["steps"] = st["step"]
    elif trainer.role == "dense":
        want = {v.name: v.numpy() for v in ref.trainable_variables}
        for name, value in trainer.dense_weights().items():
            checks[name] = compare(value, want[name])
        checks["losses_finite"] = bool(np.all(np.isfinite(losses)))
    return checks


roles = roles_mod.from_env()
hvd.init(process_sets=roles.process_sets())
rank = hvd.rank()

if MODE in ("exact", "multi", "pooled"):
    report = {"role": roles.role(rank), "sets": {k: list(v.ranks) for k, v in
                                                 zip(roles.set_ranks(), roles.process_sets())}}
    for kind in (OPTS if MODE == "exact" else ("adagrad", "adam")):
        tf.keras.utils.set_random_seed(3)
        model = builder(kind)()
        init = model.get_weights()
        trainer = HeterTrainer(model, tf.keras.losses.BinaryCrossentropy(from_logits=True),
                               OPTS[kind](), roles)
        # SGD step by step; Adagrad and Adam through fit(), which looks one
        # batch ahead (the next keys ride with the row gradients)
        if kind == "sgd" or (MODE == "multi" and kind == "adagrad"):
            losses = [trainer.step(x, y) for x, y in batches(7)]
        else:
            losses = trainer.fit(batches(7))
        report.setdefault("keys_exchanges", {})[kind] = trainer.exchange_counts["keys"]
        ref, ref_slots = reference(init, kind)
        report[kind] = weight_checks(trainer, ref, ref_slots, losses, init)
    if MODE in ("multi", "pooled"):
        report["features"] = trainer.features
        report["cut"] = [c["name"] for c in trainer.cut]
        report["sparse_side"] = trainer.side_layers
        trainer.close()
        with open(os.path.join(OUT, "%s_rank%d.json" % (MODE, rank)), "w") as f:
            json.dump(report, f, indent=1)
        hvd.shutdown()
        sys.exit(0)
    # checkpoint of the Adam run, restored into a fresh trainer: both take the
    # same next step to the same bits
    from horovod_prio.heter import checkpoint
    path = checkpoint.save(trainer, os.path.join(OUT, "ckpt"))
    tf.keras.utils.set_random_seed(4)
    fresh = HeterTrainer(build_model(), tf.keras.losses.BinaryCrossentropy(from_logits=True),
                         OPTS["adam"](), roles)
    report["restored_step"] = checkpoint.restore(fresh, os.path.join(OUT, "ckpt"))
    # two steps each; the first trainer is told a next batch that does not
    # come (it sends the next step's keys again, with a warning)
    more = batches(11)
    (x, y), (x2, y2), (xo, _) = next(more), next(more), next(more)
    trainer.step(x, y, next_inputs=xo)
    fresh.step(x, y)
    trainer.step(x2, y2)
    fresh.step(x2, y2)
    if trainer.role == "ps":
        a, b = trainer.shard.state(), fresh.shard.state()
        report["restored"] = a["step"] == b["step"] == 22 and all(
            np.array_equal(a["tables"][t][f], b["tables"][t][f])
            for t in a["tables"] for f in a["tables"][t])
    elif trainer.role == "dense":
        report["restored"] = all(np.array_equal(u, v) for u, v in zip(
            trainer.dense_weights().values(), fresh.dense_weights().values())) and all(
            np.array_equal(u.numpy(), v.numpy())
            for u, v in zip(trainer.optimizer.variables, fresh.optimizer.variables))
    else:
        report["restored"] = True
    report["checkpoint"] = sorted(os.listdir(path))
    # a batch with an id out of range: the same error on every rank, no collective
    x, y = next(batches(9))
    x["ids_a"][2, 1] = ROWS_A + 5
    try:
        trainer.step(x, y)
        report["bad_id"] = "no error"
    except ValueError as e:
        report["bad_id"] = str(e)
    # and training goes on after it; the shard lags in this last step (the
    # dense trainer is done first): close() keeps the dense trainer's
    # shutdown from failing the shard's and the sparse trainer's last push
    x, y = next(batches(9))
    if trainer.role in ("ps", "sparse"):
        import time
        real = trainer._alltoall

        def late(tensor, splits, set_name, what, *nbytes):
            if what == "row_grads":
                time.sleep(3)
            return real(tensor, splits, set_name, what, *nbytes)
        trainer._alltoall = late
    trainer.step(x, y)
    report["after_bad_id"] = "ok"
    trainer.close()
    with open(os.path.join(OUT, "exact_rank%d.json" % rank), "w") as f:
        json.dump(report, f, indent=1)
    hvd.shutdown()

elif MODE == "split":
    report = {"role": roles.role(rank)}
    for case, (kind, build) in SPLIT_CASES.items():
        tf.keras.utils.set_random_seed(3)
        model = build()
        init = model.get_weights()
        trainer = HeterTrainer(model, tf.keras.losses.BinaryCrossentropy(from_logits=True),
                               OPTS[kind](), roles)
        losses = trainer.fit(batches(7))
        ref, ref_slots = reference(init, kind, build)
        checks = {"keys_exchanges": trainer.exchange_counts["keys"]}
        if trainer.role == "ps":          # the parts before state() flushes anything
            checks["dim"] = trainer.shard.dim
            checks["parts"] = dict(trainer.shard.apply_parts)
        checks.update(weight_checks(trainer, ref, ref_slots, losses))
        report[case] = checks
    trainer.close()
    with open(os.path.join(OUT, "split_rank%d.json" % rank), "w") as f:
        json.dump(report, f, indent=1)
    hvd.shutdown()

elif MODE == "restore":
    # Adagrad on 16-wide tables (the shard splits each push around the next
    # rows): steps looking one batch ahead, a checkpoint, two more steps, the
    # last told the next batch X (the shard keeps a rest back, every rank
    # holds X's keys), a restore -- then X and one more batch, against a
    # fresh trainer restored from the same checkpoint taking the same steps
    from horovod_prio.heter import checkpoint
    ckpt, data = os.path.join(OUT, "ckpt"), list(batches(7))

    def fresh_trainer(seed):
        tf.keras.utils.set_random_seed(seed)
        return HeterTrainer(build_wide(), tf.keras.losses.BinaryCrossentropy(from_logits=True),
                            OPTS["adagrad"](), roles)

    def continue_from_checkpoint(t):
        """Restore, then X (told the batch after it), then that batch."""
        report.setdefault("restored_step", []).append(checkpoint.restore(t, ckpt))
        report.setdefault("ahead_after_restore", []).append(t._ahead is not None)
        keys = t.exchange_counts["keys"]
        losses = [t.step(*data[6], next_inputs=data[7][0]), t.step(*data[7])]
        report.setdefault("keys_after_restore", []).append(t.exchange_counts["keys"] - keys)
        return losses

    report = {"role": roles.role(rank)}
    trainer = fresh_trainer(3)
    for i in range(4):
        trainer.step(*data[i], next_inputs=data[i + 1][0])
    checkpoint.save(trainer, ckpt)
    trainer.step(*data[4], next_inputs=data[5][0])
    trainer.step(*data[5], next_inputs=data[6][0])             # X = data[6]
    if trainer.role == "ps":
        report["rest_at_restore"] = trainer.shard._rest is not None
    losses = continue_from_checkpoint(trainer)
    reference_trainer = fresh_trainer(4)
    ref_losses = continue_from_checkpoint(reference_trainer)
    if trainer.role == "ps":
        a, b = trainer.shard.state(), reference_trainer.shard.state()
        report["steps"] = [a["step"], b["step"]]
        report["parts"] = dict(trainer.shard.apply_parts)
        report["equal"] = {"%s/%s" % (t, f): bool(np.array_equal(a["tables"][t][f],
                                                                  b["tables"][t][f]))
                           for t in a["tables"] for f in a["tables"][t] if f != "ids"}
    elif trainer.role == "dense":
        report["equal"] = {"%d %s" % (i, v.name): bool(np.array_equal(v.numpy(), w.numpy()))
                           for i, (v, w) in enumerate(zip(
                               trainer.dense_vars + trainer.optimizer.variables,
                               reference_trainer.dense_vars + reference_trainer.optimizer.variables))}
        report["losses"] = [losses, ref_losses]
    trainer.close()
    reference_trainer.close()
    with open(os.path.join(OUT, "restore_rank%d.json" % rank), "w") as f:
        json.dump(report, f, indent=1)
    hvd.shutdown()

elif MODE == "memory":
    import gc
    from horovod_prio.heter import placement
    big_a, big_b = 50000, 20000
    tf.keras.utils.set_random_seed(3)
    with placement.placeholder_tables():
        model = build_model(big_a, big_b)
    trainer = HeterTrainer(model, tf.keras.losses.BinaryCrossentropy(from_logits=True),
                           OPTS["adagrad"](), roles)
    losses = [trainer.step(x, y) for x, y in batches(7)]
    gc.collect()
    held = sum(v.shape.num_elements() * v.dtype.size
               for v in {id(o): o for o in gc.get_objects() if isinstance(o, tf.Variable)}.values())
    report = {"role": trainer.role, "held_bytes": int(held),
              "table_bytes": {"emb_a": big_a * 4 * 4, "emb_b": big_b * 3 * 4},
              "losses_finite": bool(np.all(np.isfinite([l for l in losses if l is not None])))}
    if trainer.role == "ps":
        report["shard_rows"] = {n: int(v.shape[0]) for n, v in trainer.shard.tables.items()}
        report["shard_step"] = int(trainer.shard.step.numpy())
    trainer.close()
    with open(os.path.join(OUT, "memory_rank%d.json" % rank), "w") as f:
        json.dump(report, f, indent=1)
    hvd.shutdown()

elif MODE == "kill":
    tf.keras.utils.set_random_seed(3)
    trainer = HeterTrainer(build_model(), tf.keras.losses.BinaryCrossentropy(from_logits=True),
                           OPTS["sgd"](), roles)
    real = trainer._alltoall

    def dying(tensor, splits, set_name, what, *nbytes):
        out = real(tensor, splits, set_name, what, *nbytes)
        if trainer.role == "ps" and trainer.steps == 3 and what == "keys":
            print("HETER_KILL rank %d exits mid-step %d" % (rank, trainer.steps), flush=True)
            os._exit(7)
        return out

    trainer._alltoall = dying
    for x, y in batches(7):
        trainer.step(x, y)
        print("HETER_STEP rank %d step %d" % (rank, trainer.steps), flush=True)
    print("HETER_UNEXPECTED_END rank %d" % rank, flush=True)
