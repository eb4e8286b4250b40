"""The credit tuner in a real job (horovodrun, Gloo and MPI): rank 0 tries and
keeps credits while training goes on, every choice is in the trace and the
log, the other rank never holds or tunes, nothing hangs or is lost."""
import json
import os

import pytest

from hvdrun import CONTROLLERS, HERE, check, horovodrun
from horovod_prio.runtime.trace import load_trace

pytestmark = pytest.mark.tf_stack
WORKER = os.path.join(HERE, "mp", "autotune_worker.py")


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_rank0_tunes_its_credit_during_training(controller, tmp_path):
    trace = tmp_path / "trace.json"
    out = check(horovodrun([WORKER, str(tmp_path)], controller, timeout=300,
                           env={"HOROVOD_PRIO_TRACE": str(trace)}))
    r0, r1 = (json.load(open(tmp_path / ("rank%d.json" % r))) for r in (0, 1))
    assert r0["hold"] is True and r1["hold"] is False
    for st in (r0, r1):
        assert st["submitted"] == st["released"] == st["completed"] > 0, st
        assert st["inflight_bytes"] == 0 and st["abandoned"] == 0, st
    # every choice reached rank 0's scheduler, and the tries changed it
    assert r0["in_force"] and all(have == chosen for have, chosen in r0["in_force"]), r0
    assert len({chosen for _, chosen in r0["in_force"]}) >= 2, r0["in_force"]
    assert r1["in_force"] == []                            # only rank 0 tunes
    choices = [e for e in load_trace(str(trace)) if e.get("cat") == "autotune"]
    assert len(choices) >= 3, choices                      # start, tries, keep
    assert any(e["args"]["why"].startswith("keep") for e in choices)
    assert out.count("autotune: credit") == len(choices)
    assert not [e for e in load_trace(str(tmp_path / "trace.rank1.json"))
                if e.get("cat") == "autotune"]
