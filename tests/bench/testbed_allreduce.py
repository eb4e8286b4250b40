"""A tiny Horovod job for the testbed tests: one allreduce (Sum) of N float32
values, each rank contributing rank + 1; prints one line per rank."""
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

hvd.init()
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
x = tf.constant(np.full(n, hvd.rank() + 1.0, np.float32))
y = hvd.allreduce(x, op=hvd.Sum).numpy()
print(f"RESULT rank {hvd.rank()}/{hvd.size()} host {socket.gethostname()} "
      f"sum {float(y.min())} {float(y.max())} n {y.size} "
      f"yield {os.environ.get('OMPI_MCA_mpi_yield_when_idle')}", flush=True)
