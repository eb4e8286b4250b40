"""benchmarks.sim_check: rebuilding a testbed run in the simulator. A
"testbed" result made by the simulator itself (profile scaled by 3) must be
matched with a fitted scale of 3 and no error; the horovod_prio variant is
predicted, not fitted."""
from dataclasses import replace

import pytest

from benchmarks import sim_check
from horovod_prio.method.config import PriorityConfig
from horovod_prio.sim.engine import JobSpec, LinkConfig, simulate
from horovod_prio.sim.profiles import Layer, Profile

pytestmark = pytest.mark.scheduler_lib


def fake_run(variant, res, warmup):
    """A benchmarks.cluster run record from a simulation."""
    jobs = []
    for i, steps in enumerate(res.steps):
        st = [{"step": k, "t_start": s.start, "t_end": s.end, "warmup": k < warmup}
              for k, s in enumerate(steps)]
        jobs.append({"name": "job%d" % i, "steps": st, "meta": {}, "events": []})
    return {"variant": variant, "repeat": 0, "status": "ok", "rate": "1gbit", "jobs": jobs}


def test_recovers_the_compute_scale_and_predicts_the_other_variants():
    prof = Profile("toy", tuple(Layer("l%d" % i, p, 0.01, 0.02)
                                for i, p in enumerate((400000, 2000000, 1000000))))
    k = 3.0
    slow = sim_check._scaled(prof, k)
    link = LinkConfig(bandwidth=1e9 / 8, topology="nic")
    warmup, steps = 3, 12
    specs = [JobSpec(slow, 2, steps + warmup, start=0.0005 * i, name="job%d" % i, seed=i)
             for i in range(2)]
    pcfg = PriorityConfig.from_env({})
    meta = {"command": "test", "git": None, "date": None, "rate": "1gbit", "warmup": warmup,
            "variants": ["hvd", "spec"], "arbiter_credit": 8 << 20, "arbiter_order": "burst",
            "starvation_bound": 8,
            "jobs": [{"impl": "arb", "class": None, "start": 0.0, "steps": steps, "env": {}}] * 2}
    runs = [fake_run("hvd", simulate(specs, "fifo", link), warmup),
            fake_run("spec", simulate(specs, "adaptive", link, pcfg), warmup)]
    res = sim_check.check({"meta": meta, "runs": runs}, prof, pcfg)
    assert res["compute_scale"] == pytest.approx(k, rel=0.02)
    assert {r["variant"] for r in res["rows"]} == {"hvd", "spec"}
    assert all(abs(r["error"]) < 0.02 for r in res["rows"]), res["rows"]
    assert [r["fitted"] for r in res["rows"] if r["variant"] == "spec"] == [False, False]
    assert "| spec | 0 | shared |" in sim_check.markdown(res)
