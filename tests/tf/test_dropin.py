"""The one-line swap: a Horovod TF2 Keras example script runs unchanged except
its import, and then really schedules by priority. Also: the drop-in modules
expose what Horovod's expose."""
import collections
import json
import os
import types

import pytest

from hvdrun import HERE, ROOT, check, horovodrun
from horovod_prio.runtime.trace import load_trace

pytestmark = pytest.mark.tf_stack
EXAMPLE = os.path.join(ROOT, "horovod_prio", "examples", "keras_digits.py")
ORIGINAL = "import horovod.tensorflow.keras as hvd\n"
SWAPPED = "import horovod_prio.tensorflow.keras as hvd\n"


def test_example_runs_with_only_the_import_changed(tmp_path):
    text = open(EXAMPLE).read()
    assert text.count(ORIGINAL) == 1
    swapped = tmp_path / "keras_digits_prio.py"
    swapped.write_text(text.replace(ORIGINAL, SWAPPED))
    diff = [(a, b) for a, b in zip(text.splitlines(), swapped.read_text().splitlines()) if a != b]
    assert diff == [(ORIGINAL.strip(), SWAPPED.strip())]
    trace = tmp_path / "trace.json"
    out = check(horovodrun([str(swapped), str(tmp_path)], "gloo", timeout=300,
                           env={"HOROVOD_PRIO_TRACE": str(trace)}))
    assert "Epoch 4/4" in out
    assert (tmp_path / "checkpoint-4.h5").exists()
    chunks = [e for e in load_trace(trace) if e.get("cat") == "chunk"]
    assert chunks, "the swapped script must route gradients through the priority scheduler"


def test_modules_expose_horovods_surface():
    """Every public name of Horovod's modules is defined in ours (compared as
    name lists: the modules also forward unknown names with __getattr__, so
    hasattr() would always be true)."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd_keras
    import horovod.tensorflow.keras.callbacks as hvd_callbacks
    import horovod.tensorflow.keras.elastic as hvd_elastic
    import horovod_prio.tensorflow as prio_tf
    import horovod_prio.tensorflow.keras as prio_keras
    for ours, theirs in ((prio_tf, hvd_tf), (prio_keras, hvd_keras),
                         (prio_keras.callbacks, hvd_callbacks), (prio_keras.elastic, hvd_elastic)):
        # submodules appear on Horovod's modules whenever something imports them
        # (e.g. gradient_aggregation_eager): ours forward those via __getattr__
        public = sorted(n for n in dir(theirs) if not n.startswith("_") and not (
            isinstance(getattr(theirs, n), types.ModuleType)
            and getattr(theirs, n).__name__.startswith(theirs.__name__ + ".")
            and n not in ("callbacks", "elastic")))
        defined = set(vars(ours))
        missing = [n for n in public if n not in defined]
        assert not missing, (ours.__name__, missing)
        # unchanged where we do not replace them
        ours_only = {"DistributedOptimizer", "DistributedGradientTape", "load_model", "callbacks",
                     "PartialDistributedGradientTape",
                     "elastic"}
        changed = [n for n in public if n not in ours_only and vars(ours)[n] is not getattr(theirs, n)]
        assert not changed, (ours.__name__, changed)
    assert prio_keras.DistributedOptimizer is not hvd_keras.DistributedOptimizer
    assert prio_tf.DistributedGradientTape is not hvd_tf.DistributedGradientTape
    assert prio_keras.callbacks.__name__ == "horovod_prio.tensorflow.keras.callbacks"
    assert prio_keras.elastic.__name__ == "horovod_prio.tensorflow.keras.elastic"
    assert prio_keras.callbacks.BroadcastGlobalVariablesCallback is \
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback
    from horovod_prio.tensorflow.keras.callbacks import MetricAverageCallback  # noqa: F401


def test_unknown_priority_argument_is_rejected():
    import tensorflow as tf
    import horovod_prio.tensorflow.keras as hvd
    hvd.init()
    with pytest.raises(TypeError, match="priority"):
        hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.1), priority=3)
    with pytest.raises(TypeError, match="not_an_arg"):
        hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.1), not_an_arg=1)


@pytest.mark.parametrize("credit", [None, "64MiB", "overlap"],
                         ids=["default", "credit", "overlap"])
def test_default_chunk_size_follows_the_step_gradient_bytes(tmp_path, credit):
    """With the default partition the chunks hold an eighth of the step's
    gradient bytes (PriorityConfig.partition_bytes_for), not a fixed 4 MiB: a
    chunk is ready only when its last gradient is, so big chunks start the
    link late. The worker's 1100x2048 kernel (9 MB) is bigger than that: with
    a credit it is cut into chunks of that size, each cut on a 64-byte boundary
    (plan.ALIGN_BYTES); without one (the default: chunks leave as soon as they
    are ready) it is one chunk of its own (PriorityConfig.splits_tensors).
    hvd.overlap's credit of one chunk holds chunks back, so there it is cut."""
    from horovod_prio import PriorityConfig
    from horovod_prio.method.plan import ALIGN_BYTES
    trace = tmp_path / "trace.json"
    env = {"HOROVOD_PRIO_TRACE": str(trace)}
    if credit and credit != "overlap":
        env["HOROVOD_PRIO_CREDIT_BYTES"] = credit
    check(horovodrun([os.path.join(HERE, "mp", "chunk_size_worker.py"), str(tmp_path)]
                     + (["overlap"] if credit == "overlap" else []),
                     "gloo", timeout=240, env=env))
    step_bytes = json.loads((tmp_path / "rank0.json").read_text())["step_bytes"]
    expect = PriorityConfig.from_env({}).partition_bytes_for(step_bytes)
    assert 1 << 20 < expect < 2 << 20, expect
    sizes = collections.Counter(e["args"]["bytes"] for e in load_trace(trace)
                                if e.get("cat") == "chunk" and e.get("ph") == "i"
                                and e["args"]["kind"] == "ready")
    kernel = 1100 * 2048 * 4
    if credit:
        assert kernel not in sizes, sizes
        assert expect - ALIGN_BYTES < max(sizes) <= expect, sizes
    else:
        assert sizes[kernel] == 2, sizes       # one whole chunk per step
        assert sorted(sizes)[-2] <= expect, sizes
    # the worker's fit runs 2 steps (8 samples, batch 4): every byte reduced once per step
    per_step = sum(b * n for b, n in sizes.items()) / 2
    assert per_step == step_bytes, (per_step, step_bytes, sizes)

def test_our_entry_points_are_never_converted_by_autograph():
    """Users build tapes and optimizers inside their own tf.function (autograph on);
    autograph must not convert our plain-Python code (a converted copy of a function
    that sets module state sets it in autograph's namespace: Horovod's
    test_model_parallel_model failed so under Open MPI, and every first eager use
    failed so before the loader was guarded)."""
    from tensorflow.python.autograph.impl import api
    import horovod_prio.tensorflow as prio_tf
    import horovod_prio.tensorflow.keras as prio_keras
    from horovod_prio.tensorflow import ops
    for fn in (prio_tf.DistributedOptimizer, prio_tf.DistributedGradientTape,
               prio_tf.PartialDistributedGradientTape, prio_keras.DistributedOptimizer,
               prio_keras.load_model, prio_keras.overlap, prio_keras.flush, ops.load):
        assert api.is_autograph_artifact(fn), fn
