"""Numerics: Horovod's optimizer/tape vs ours, same model, data and seed ->
same weights on every rank (rtol 1e-5), for fit, Adam, tape,
backward_passes_per_step, fp16 compression, an eager tape loop, predivide,
Sum, sparse_as_dense, the sparse fallback, two tapes in one step (a GAN,
also with two optimizers of one class), two default-named optimizers of one
class, and load_model(compression=fp16). Real horovodrun, 2 ranks, Gloo and
MPI. Every mode must also show that our chunks went through the priority
scheduler: a silent fallback to Horovod's path fails the test."""
import json
import os

import numpy as np
import pytest

from hvdrun import CONTROLLERS, HERE, check, horovodrun

pytestmark = pytest.mark.tf_stack
MODES = ["fit", "fit_adam", "tape", "tape_eager", "bpps", "fp16", "predivide", "sum",
         "sparse_as_dense", "sparse", "gan", "gan_same_class", "two_optimizers", "load_model"]


def _load(path):
    with np.load(path) as z:
        return [z["arr_%d" % i] for i in range(len(z.files))]


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_same_weights_as_horovod(controller, tmp_path):
    check(horovodrun([os.path.join(HERE, "mp", "numerics_worker.py"), str(tmp_path), ",".join(MODES)],
                     controller=controller, timeout=600))
    for mode in MODES:
        ref = _load(tmp_path / ("%s_hvd_rank0.npz" % mode))
        paths = [str(tmp_path / ("%s_%s_rank%d.npz" % (mode, impl, r))) for impl in ("hvd", "prio") for r in (0, 1)]
        for path in paths:
            got = _load(path)
            assert len(got) == len(ref)
            for a, b in zip(ref, got):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, err_msg="%s vs %s_hvd_rank0" % (path, mode))
        # Training really moved the weights (the comparison is not vacuous).
        init = _load(tmp_path / ("%s_init_rank0.npz" % mode))
        assert any(not np.allclose(a, b) for a, b in zip(init, ref)), mode
        # ... and our run really went through the priority path, on both ranks;
        # Horovod's run never touched our scheduler.
        for r in (0, 1):
            ours = json.load(open(tmp_path / ("%s_prio_rank%d.json" % (mode, r))))
            theirs = json.load(open(tmp_path / ("%s_hvd_rank%d.json" % (mode, r))))
            assert ours["submitted"] >= 12 and ours["submitted"] == ours["released"] \
                == ours["completed"], (mode, r, ours)
            assert ours["inflight_bytes"] == 0 and ours["abandoned"] == 0, (mode, r, ours)
            assert theirs["submitted"] == 0, (mode, r, theirs)
