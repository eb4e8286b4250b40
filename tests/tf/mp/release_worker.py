"""A chunk granted while TensorFlow's only inter-op thread is busy (run under
horovodrun -np 2).

argv: MODE OUT_DIR. MODE ``one_op`` reduces the chunk with
``ops.allreduce`` (HvdPrioAllreduce), ``three_ops`` with gate ->
hvd.allreduce -> done (the path GPU tensors keep); ``twice`` only reduces the
same chunk twice in one graph; ``inline`` / ``inline_three_ops`` check that
the chunk's op runs inline, before a chain of cheap ops ready at the same time
ends (below).

With one inter-op thread: call 1 (a background Python thread) runs the
chunk's op; rank 0 holds it (external grant mode) until it is requested.
Then call 2 occupies the only inter-op thread with a py_function that waits
for the chunk to complete, while a plain Python thread (as the arbiter
client's) grants it. Written to OUT_DIR/rank<r>.json: whether the chunk
completed while call 2 held the thread, and the reduced values.
"""
import json
import os
import sys
import threading
import time

import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)

import horovod.tensorflow as hvd  # noqa: E402

from horovod_prio.scheduler import UNLIMITED, Scheduler  # noqa: E402
from horovod_prio.tensorflow import ops  # noqa: E402

MODE, OUT = sys.argv[1], sys.argv[2]

hvd.init()
rank = hvd.rank()
sched = Scheduler.process()
sched.reset()
sched.set_tracing(True)

if MODE == "twice":
    # One graph holding the same chunk twice: two collectives, two Horovod names.
    sched.configure(credit_bytes=UNLIMITED, hold=False)
    t = tf.constant([float(rank + 1)] * 1024)
    a, b = tf.function(lambda t: (ops.allreduce(t, 5, "chunk0", hvd.Sum),
                                  ops.allreduce(2 * t, 5, "chunk0", hvd.Sum)))(t)
    with open(os.path.join(OUT, "rank%d.json" % rank), "w") as f:
        json.dump({"a": a.numpy().tolist()[:4], "b": b.numpy().tolist()[:4],
                   "stats": sched.stats()}, f)
    sys.exit(0)

if MODE in ("inline", "inline_three_ops"):
    # The chunk's input and a chain of cheap ops become ready together; a
    # py_function after the chain holds the only inter-op thread until the
    # chunk completes (or 5 s). HvdPrioAllreduce is cheap to start, so the
    # executor runs it inline before the chain ends; Horovod's own allreduce
    # op (three-op path) is queued on the pool behind the chain and cannot
    # run before the py_function returns. Every rank releases at once.
    sched.configure(credit_bytes=UNLIMITED, hold=False)
    calls = []

    def poll_completion(_):
        deadline = time.time() + 5.0
        while time.time() < deadline:
            if sched.stats()["completed"] >= len(calls) + 1:
                return True
            time.sleep(0.005)
        return False

    @tf.function
    def step(t):
        m = t * 1.0
        if MODE == "inline":
            y = ops.allreduce(m, 5, "chunk0", hvd.Sum)
        else:
            y = ops.gate(m, 5, "chunk0")
            y = ops.done(hvd.allreduce(y, op=hvd.Sum, name="chunk0", ignore_name_scope=True),
                         "chunk0")
        z = tf.reduce_sum(m)
        for _ in range(200):
            z = z * 1.0001 + 1.0
        return y, tf.py_function(poll_completion, [z], tf.bool)

    x = tf.constant([float(rank + 1)] * 1024)
    for _ in range(3):   # the executor learns which kernels are cheap in the first calls
        y, during = step(x)
        calls.append(bool(during.numpy()))
    with open(os.path.join(OUT, "rank%d.json" % rank), "w") as f:
        json.dump({"completed_during_chain": calls, "y": y.numpy().tolist()[:4],
                   "stats": sched.stats()}, f)
    sys.exit(0)

BUSY_SECONDS = {"one_op": 60.0, "three_ops": 3.0}[MODE]
if rank == 0:
    sched.configure(credit_bytes=0, hold=True)
    sched.set_external_grant(True)          # requests queue for take_requests()
else:
    sched.configure(credit_bytes=UNLIMITED, hold=False)

x = tf.constant([float(rank + 1)] * 1024)


@tf.function
def reduce_chunk(t):
    if MODE == "one_op":
        return ops.allreduce(t, 5, "chunk0", hvd.Sum)
    y = ops.gate(t, 5, "chunk0")
    y = hvd.allreduce(y, op=hvd.Sum, name="chunk0", ignore_name_scope=True)
    return ops.done(y, "chunk0")


busy_started = threading.Event()


def wait_for_completion(_):
    busy_started.set()
    deadline = time.time() + BUSY_SECONDS
    while time.time() < deadline:
        if sched.stats()["completed"] >= 1:
            return True
        time.sleep(0.005)
    return False


@tf.function
def busy():
    return tf.py_function(wait_for_completion, [tf.constant(0)], tf.bool)


box = {}
call1 = threading.Thread(target=lambda: box.setdefault("y", reduce_chunk(x)), daemon=True)
call1.start()
deadline = time.time() + 60
key = "requested" if rank == 0 else "released"
while sched.stats()[key] < 1:
    assert time.time() < deadline, sched.stats()
    time.sleep(0.005)


def grant():
    busy_started.wait(60)
    time.sleep(0.2)                         # well inside call 2
    if rank == 0:
        ((ticket, _, _),) = sched.take_requests()
        assert sched.grant(ticket)


granter = threading.Thread(target=grant, daemon=True)
granter.start()
during_busy = bool(busy().numpy())
call1.join(60)
assert not call1.is_alive(), sched.stats()
granter.join(10)
with open(os.path.join(OUT, "rank%d.json" % rank), "w") as f:
    json.dump({"completed_while_busy": during_busy, "y": box["y"].numpy().tolist()[:4],
               "stats": sched.stats()}, f)
