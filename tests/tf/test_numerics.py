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
# "tape_eager" first: a fresh process whose first use of horovod_prio is eager
# (tf.function of our reduce, traced once; autograph must not touch our loader).
MODES = ["tape_eager", "fit", "fit_adam", "tape", "bpps", "fp16", "predivide", "sum",
         "sparse_as_dense", "sparse", "gan", "gan_same_class", "two_optimizers", "load_model",
         "lr_schedule", "local_vars", "local_vars_bpps", "callbacks", "partial_tape",
         "groups"]
# Horovod's own path, by design (one warning each): same weights, nothing through our scheduler.
FALLBACK = {"groups"}
# Local variables / layers: each rank keeps its own, so ranks differ; compare rank by rank.
PER_RANK = {"local_vars", "local_vars_bpps", "partial_tape"}


def modes(controller):
    # (op=Adasum: Horovod's Keras optimizer refuses it, "op currently only supports
    # Average and Sum"; its tf.compat.v1 Adasum optimizer has no gradient allreduce
    # to schedule and is returned unchanged, with a warning)
    return MODES


def _load(path):
    with np.load(path) as z:
        return [z["arr_%d" % i] for i in range(len(z.files))]


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_same_weights_as_horovod(controller, tmp_path):
    out = check(horovodrun([os.path.join(HERE, "mp", "numerics_worker.py"), str(tmp_path),
                            ",".join(modes(controller))], controller=controller, timeout=900))
    for mode in modes(controller):
        for r in (0, 1):
            ref_rank = r if mode in PER_RANK else 0
            ref = _load(tmp_path / ("%s_hvd_rank%d.npz" % (mode, ref_rank)))
            for impl in ("hvd", "prio"):
                path = str(tmp_path / ("%s_%s_rank%d.npz" % (mode, impl, r)))
                got = _load(path)
                assert len(got) == len(ref)
                for a, b in zip(ref, got):
                    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7,
                                               err_msg="%s vs %s_hvd_rank%d" % (path, mode, ref_rank))
        if mode in PER_RANK:  # the local part really stayed local: the ranks differ there
            r0, r1 = _load(tmp_path / ("%s_prio_rank0.npz" % mode)), \
                _load(tmp_path / ("%s_prio_rank1.npz" % mode))
            assert not np.allclose(r0[0], r1[0]), mode
            np.testing.assert_allclose(r1[-1], r0[-1], rtol=1e-5, atol=1e-7, err_msg=mode)
        # Training really moved the weights (the comparison is not vacuous).
        init = _load(tmp_path / ("%s_init_rank0.npz" % mode))
        assert any(not np.allclose(a, b) for a, b in zip(init, ref)), mode
        # ... and our run really went through the priority path, on both ranks;
        # Horovod's run never touched our scheduler.
        for r in (0, 1):
            ours = json.load(open(tmp_path / ("%s_prio_rank%d.json" % (mode, r))))
            theirs = json.load(open(tmp_path / ("%s_hvd_rank%d.json" % (mode, r))))
            if mode in FALLBACK:
                assert ours["submitted"] == 0 and theirs["submitted"] == 0, (mode, r, ours)
                continue
            assert ours["submitted"] >= 12 and ours["submitted"] == ours["released"] \
                == ours["completed"], (mode, r, ours)
            assert ours["inflight_bytes"] == 0 and ours["abandoned"] == 0, (mode, r, ours)
            assert theirs["submitted"] == 0, (mode, r, theirs)
    # each fallback says so, once per optimizer, and never raises
    for reason in ("explicit fusion groups",):
        assert "uses Horovod's own allreduce path: " in out and reason in out, reason
