"""The heterogeneous example's model and data (in process; the example itself
launches horovodrun: `python -m horovod_prio.examples.heter_dlrm`)."""
import numpy as np
import pytest

from stack_required import import_stack_module

tf = import_stack_module("tensorflow")

from horovod_prio.examples import heter_dlrm  # noqa: E402
from horovod_prio.heter import placement  # noqa: E402


def test_example_tables_are_sparse_and_mlps_dense():
    a = heter_dlrm.parse(["--fields", "3", "--rows", "50", "--dim", "4", "--steps", "2"])
    plan = placement.place(heter_dlrm.build_model(a))
    assert plan.names("sparse") == ["table0", "table1", "table2"]
    assert {"bottom", "top1", "top2"} <= set(plan.names("dense"))
    batches = list(heter_dlrm.batches(a))
    assert len(batches) == 2
    inputs, labels = batches[0]
    assert set(inputs) == {"c0", "c1", "c2", "dense"} and labels.shape == (64, 1)
    for i in range(3):
        ids = inputs["c%d" % i]
        assert ids.min() >= 0 and ids.max() < 50 and len(np.unique(ids)) < len(ids)  # Zipf repeats


def test_example_rejects_bad_sizes():
    with pytest.raises(SystemExit):
        heter_dlrm.parse(["--rows", "0"])
