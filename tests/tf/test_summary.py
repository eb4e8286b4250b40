"""What users look at while training: hvd.callbacks.PrioritySummaryCallback
writes the step times and the boost as TensorBoard scalars (rank 0) and prints
a summary at the end of fit (real horovodrun, Gloo)."""
import json
import os

import pytest

from hvdrun import HERE, check, horovodrun

pytestmark = pytest.mark.tf_stack


def test_tensorboard_scalars_and_end_of_fit_summary(tmp_path):
    out = check(horovodrun([os.path.join(HERE, "mp", "summary_worker.py"), str(tmp_path)],
                           "gloo", timeout=300))
    got = json.load(open(tmp_path / "summary.json"))
    (mon,) = got["summary"]["monitors"]
    assert mon["steps"] == 12, mon                       # 2 epochs x 6 batches, every one timed
    assert 0 < mon["min_s"] <= mon["mean_s"] <= mon["max_s"], mon
    name = mon["name"]
    tag = "horovod_prio/%s/step_seconds" % name
    assert got["tags"][tag] == 12, got["tags"]           # each step once, across two writes
    assert sorted(got["steps"][tag]) == list(range(12))
    assert got["tags"]["horovod_prio/%s/boost" % name] == 12
    sched = got["summary"]["scheduler"]
    assert sched["submitted"] > 0 and sched["submitted"] == sched["completed"], sched
    assert "horovod_prio: %s: 12 steps, step time mean" % name in out, out[-3000:]
    assert "chunks submitted %d" % sched["submitted"] in out
    assert out.count("step time mean") == 1              # rank 0 only
