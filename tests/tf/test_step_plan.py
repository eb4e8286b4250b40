"""The simulator sends exactly the chunks the product sends: for one Keras
model, the binding's plan (``fusion.plan_step`` over the model's variables,
what ``PriorityAllreduce`` and ``hvd.overlap`` build their graphs from) and the
simulator's (``engine._Job`` over ``benchmarks.profile_model``'s profile of
the same model) are the same plan, chunk for chunk, with the same chunk size
and credit. One process, no Horovod job: both sides are built directly."""
import pytest

pytestmark = [pytest.mark.tf_stack, pytest.mark.timeout(300)]

from stack_required import import_stack_module  # noqa: E402

tf = import_stack_module("tensorflow")

from benchmarks.profile_model import profile_model  # noqa: E402
from horovod_prio.method.config import PriorityConfig  # noqa: E402
from horovod_prio.sim import engine  # noqa: E402
from horovod_prio.sim.engine import JobSpec, LinkConfig  # noqa: E402
from horovod_prio.tensorflow.fusion import plan_step  # noqa: E402

MIB = 1 << 20


def model():
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([
        tf.keras.Input((1024,)),
        tf.keras.layers.Dense(1024, name="wide"),             # 4 MiB kernel + bias
        tf.keras.layers.BatchNormalization(name="norm"),      # gamma, beta
        tf.keras.layers.Dense(700, name="mid"),               # cut off the 64-byte grid
        tf.keras.layers.Dense(300, use_bias=False, name="narrow"),
        tf.keras.layers.Dense(10, name="out"),
    ], name="parity")


@pytest.fixture(scope="module")
def keras_model():
    m = model()
    return m, profile_model(m, 2, warmup=0, repeats=1)


CASES = [
    (dict(), False, None),                                   # defaults: whole gradients
    (dict(credit_bytes="2MiB"), False, None),                # a credit: gradients cut
    (dict(partition_bytes="300KiB", num_groups=3), False, None),
    (dict(), True, None),                                    # hvd.overlap: one-chunk credit
    (dict(autotune=True, num_groups=2, scene="tail"), True, None),
    (dict(partition_bytes="1MiB", arbiter="127.0.0.1:1", link="eth0", arbiter_secret="s"),
     False, object()),                                       # an arbiter holds chunks back
]


@pytest.mark.parametrize("given, overlap, arbiter", CASES)
def test_simulator_and_binding_send_the_same_plan(keras_model, given, overlap, arbiter):
    m, prof = keras_model
    cfg = PriorityConfig.from_env({}, **given)
    flats = [tf.zeros([int(tf.size(v))], v.dtype) for v in m.trainable_variables]
    product = plan_step(m.trainable_variables, flats, cfg, overlap=overlap)
    job = engine._Job(0, JobSpec(prof, 2, 1, overlap=overlap), engine._Sim(), None,
                      LinkConfig(bandwidth=64 * MIB), cfg,
                      "arbiter" if arbiter is not None else "priority", [], arbiter=arbiter)
    assert job.plan == product.plan("job0")
    assert len(job.plan.chunks) > 1 and len(job.plan.groups) > 1
    assert job.sched.stats()["credit_bytes"] == (
        engine.UNLIMITED if product.credit_bytes is None else product.credit_bytes)


def test_the_cases_cover_cut_and_whole_gradients(keras_model):
    """The parity above is only worth something if the plans differ between
    the cases: some cut a gradient, some keep every gradient whole."""
    m, _ = keras_model
    flats = [tf.zeros([int(tf.size(v))], v.dtype) for v in m.trainable_variables]
    plans = [plan_step(m.trainable_variables, flats, PriorityConfig.from_env({}, **g),
                       overlap=o).plan() for g, o, _ in CASES]
    cut = [any(s.length < flats[s.tensor].shape[0] for c in p.chunks for s in c.segments)
           for p in plans]
    assert cut == [False, True, False, True, True, True]
