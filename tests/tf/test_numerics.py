"""Numerics: Horovod's optimizer/tape vs ours, same model, data and seed ->
same weights on every rank (rtol 1e-5), for fit, Adam, tape,
backward_passes_per_step, fp16 compression, an eager tape loop, predivide, Sum, sparse_as_dense and
the sparse fallback. Real horovodrun, 2 ranks, Gloo and MPI."""
import os

import numpy as np
import pytest

from hvdrun import CONTROLLERS, HERE, check, have_tf_stack, horovodrun

pytestmark = pytest.mark.skipif(have_tf_stack() is not None, reason="TF stack: %s" % have_tf_stack())
MODES = ["fit", "fit_adam", "tape", "tape_eager", "bpps", "fp16", "predivide", "sum", "sparse_as_dense", "sparse"]


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
