"""benchmarks.sim_check: rebuilding a testbed run in the simulator. A
"testbed" result made by the simulator itself (profile scaled by 3) must be
matched with a fitted scale of 3 and no error; the horovod_prio variant is
predicted, not fitted."""
from dataclasses import replace
import statistics

import pytest

from benchmarks import sim_check, testbed
from horovod_prio.method.config import PriorityConfig
from horovod_prio.sim.engine import JobSpec, LinkConfig, simulate
from horovod_prio.sim.profiles import Layer, Profile

pytestmark = pytest.mark.scheduler_lib


def fake_run(variant, res, warmup):
    """A benchmarks.cluster run record from a simulation (horovod_prio variants with
    the trace's time in flight over the measured steps, as the runner records it)."""
    jobs, waits = [], {}
    for i, steps in enumerate(res.steps):
        st = [{"step": k, "t_start": s.start, "t_end": s.end, "warmup": k < warmup}
              for k, s in enumerate(steps)]
        jobs.append({"name": "job%d" % i, "steps": st, "meta": {}, "events": []})
        lo, hi = steps[warmup].start, steps[-1].end
        if variant != "hvd":
            waits["job%d" % i] = {"chunks": 0, "allreduce_union_s": sum(
                max(0.0, min(b, hi) - max(a, lo)) for a, b in res.comm_spans[i])}
    return {"variant": variant, "repeat": 0, "status": "ok", "rate": "1gbit", "jobs": jobs,
            "arbiter_waits": waits}


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
            "starvation_bound": 8, "mtu": 0,     # the fake testbed: payload only
            "jobs": [{"impl": "arb", "class": None, "start": 0.0, "steps": steps, "env": {}}] * 2}
    runs = [fake_run("hvd", simulate(specs, "fifo", link), warmup),
            fake_run("spec", simulate(specs, "adaptive", link, pcfg), warmup)]
    res = sim_check.check({"meta": meta, "runs": runs}, prof, pcfg)
    assert res["compute_scale"] == pytest.approx(k, rel=0.02)
    assert {r["variant"] for r in res["rows"]} == {"hvd", "spec"}
    assert all(abs(r["error"]) < 0.02 for r in res["rows"]), res["rows"]
    assert [r["fitted"] for r in res["rows"] if r["variant"] == "spec"] == [False, False]
    assert "| spec | 0 | shared |" in sim_check.markdown(res)
    # a record without step series (a headline folder): the medians and phases given
    given = sim_check.check({"meta": meta, "runs": []}, prof, pcfg,
                            measured=sim_check.measured_medians({"meta": meta, "runs": runs}),
                            phases=res["phases"])
    assert given["phases"] == res["phases"] and given["phases"]
    assert [r["sim_s"] for r in given["rows"]] == pytest.approx([r["sim_s"] for r in res["rows"]])


def _toy(backward=0.02):
    return Profile("toy", tuple(Layer("l%d" % i, p, 0.01, backward)
                                for i, p in enumerate((400000, 2000000, 1000000))))


def _meta(jobs, variants, warmup, steps):
    return {"command": "test", "git": None, "date": None, "rate": "1gbit", "warmup": warmup,
            "variants": variants, "arbiter_credit": 8 << 20, "arbiter_order": "burst",
            "starvation_bound": 8, "mtu": 0,     # the fake testbed: payload only
            "jobs": [{"impl": "arb", "class": None, "start": 0.0, "steps": steps, "env": {}}]
            * jobs}


def test_calibrate_measures_the_collective_overhead_on_the_time_in_flight():
    """A 'testbed' whose collectives cost 6 ms each (plain Horovod's too): the
    step times alone cannot tell that from compute, the chunks' time in flight
    can; the compute scale, the overhead, the per-step cost and the round trip
    all come back. Not asked to fit: none; asked without the record: a clear error."""
    prof, k, ov, st, rtt = _toy(backward=0.02), 2.5, 0.006, 0.010, 0.003
    slow = sim_check._scaled(prof, k)
    costly = _costly(st, rtt, overhead=ov)
    warmup, steps = 3, 12
    pcfg = PriorityConfig.from_env({})
    alone = _alone_run(slow, costly, pcfg, warmup, steps)
    cal = sim_check.calibrate(alone, prof, pcfg, overhead=None)
    assert cal["collective_overhead_fitted"] and cal["comm_variant"] == "spec"
    assert cal["collective_overhead"] == pytest.approx(ov, rel=0.05)
    assert cal["compute_scale"] == pytest.approx(k, rel=0.02)
    assert cal["step_cost"] == pytest.approx(st, rel=0.05)
    assert cal["arbiter_rtt"] == pytest.approx(rtt, rel=0.1)
    assert ("per-collective overhead %.1f ms, fitted in turn with the compute scale on spec's"
            % (1e3 * cal["collective_overhead"])) in sim_check.markdown(
        {**sim_check.check(alone, prof, pcfg, overhead=ov), "calibration": cal})
    blind = sim_check.calibrate(alone, prof, pcfg)      # the default: none
    assert not blind["collective_overhead_fitted"] and blind["collective_overhead"] == 0.0
    assert blind["compute_scale"] > k * 1.02
    for r in alone["runs"]:
        r.pop("arbiter_waits")
    with pytest.raises(ValueError, match="collective-overhead fit.*time in flight"):
        sim_check.calibrate(alone, prof, pcfg, overhead=None)


def _alone_run(prof, link, pcfg, warmup, steps):
    """A 'testbed' calibration run: one job alone, variants hvd / prio / spec
    simulated on ``link(mode)``."""
    one = [JobSpec(prof, 2, steps + warmup, name="job0")]
    return {"meta": _meta(1, ["hvd", "prio", "spec"], warmup, steps),
            "runs": [fake_run(v, simulate(one, m, link(m), pcfg), warmup)
                     for v, m in (("hvd", "fifo"), ("prio", "priority"), ("spec", "adaptive"))]}


def _costly(step=0.0, rtt=0.0, overhead=0.0):
    """The link of a 'testbed' whose horovod_prio step costs ``step`` more than plain
    Horovod's (``fifo`` runs without it), and whose arbiter answers in ``rtt``."""
    base = LinkConfig(bandwidth=1e9 / 8, topology="nic", collective_overhead=overhead)

    def link(mode):
        return base if mode == "fifo" else replace(base, step_overhead=step, arbiter_rtt=rtt)
    return link


def test_calibrate_measures_the_job_side_costs_alone_and_predicts_two_jobs():
    """A 'testbed' whose horovod_prio step costs 20 ms more than plain Horovod's and
    whose arbiter answers in 3 ms: one job alone yields both costs (and the compute
    scale); with them the two-job arbiter run is predicted; without them it is not.
    (Gradients all ready at once: every grant is on the step's critical path, so
    the alone step times pin both costs down.)"""
    prof, k, st, rtt = _toy(backward=0.0), 2.5, 0.020, 0.003
    slow = sim_check._scaled(prof, k)
    costly = _costly(st, rtt)
    warmup, steps = 3, 12
    pcfg = PriorityConfig.from_env({})
    alone = _alone_run(slow, costly, pcfg, warmup, steps)
    cal = sim_check.calibrate(alone, prof, pcfg)
    assert cal["compute_scale"] == pytest.approx(k, rel=0.02)
    assert cal["step_cost"] == pytest.approx(st, rel=0.05)
    assert cal["arbiter_rtt"] == pytest.approx(rtt, rel=0.05)

    two = [JobSpec(slow, 2, steps + warmup, start=0.0005 * i, name="job%d" % i, seed=i)
           for i in range(2)]
    shared = {"meta": _meta(2, ["hvd", "spec"], warmup, steps),
              "runs": [fake_run(v, simulate(two, m, costly(m), pcfg), warmup)
                       for v, m in (("hvd", "fifo"), ("spec", "adaptive"))]}
    res = sim_check.check(shared, prof, pcfg, step=cal["step_cost"], rtt=cal["arbiter_rtt"])
    assert [r for r in res["rows"] if r["variant"] == "hvd"]
    assert all(abs(r["error"]) < 0.02 for r in res["rows"]), res["rows"]
    blind = sim_check.check(shared, prof, pcfg)
    assert all(r["error"] < -0.02 for r in blind["rows"] if r["variant"] == "spec"), blind
    res["calibration"] = cal
    md = sim_check.markdown(res)
    assert "per-step cost 20.0 ms" in md and "arbiter round trip 3.0 ms" in md
    # the compute scale taken from the run alone: nothing fitted, the hvd rows predicted too
    kw = dict(step=cal["step_cost"], rtt=cal["arbiter_rtt"])
    pred = sim_check.check(shared, prof, pcfg, compute_scale=cal["compute_scale"], **kw)
    assert {r["variant"] for r in pred["rows"]} == {"hvd", "spec"}
    assert all(not r["fitted"] and abs(r["error"]) < 0.02 for r in pred["rows"]), pred
    assert "given, not fitted" in sim_check.markdown(pred)
    half = sim_check.check(shared, prof, pcfg, compute_scale=k / 2, **kw)
    assert half["compute_scale"] == k / 2
    assert all(r["error"] < -0.02 for r in half["rows"] if r["variant"] == "hvd"), half


def test_calibrate_keeps_a_given_collective_overhead_and_finds_no_step_cost():
    """horovod_prio no slower than plain Horovod alone: no per-step cost (never a
    negative one); a per-collective overhead given by hand is the testbed's, paid
    by every variant, so the fit does not mistake it for compute."""
    prof, k, ov = _toy(backward=0.0), 2.5, 0.004
    slow = sim_check._scaled(prof, k)
    costly = _costly(overhead=ov)
    warmup, steps = 3, 12
    pcfg = PriorityConfig.from_env({})
    alone = _alone_run(slow, costly, pcfg, warmup, steps)
    cal = sim_check.calibrate(alone, prof, pcfg, overhead=ov)
    assert cal["compute_scale"] == pytest.approx(k, rel=0.02)
    assert cal["step_cost"] < 1e-4 and cal["arbiter_rtt"] < 1e-4, cal
    assert not cal["collective_overhead_fitted"] and cal["collective_overhead"] == ov
    # not given: measured on the time in flight, the same
    fit = sim_check.calibrate(alone, prof, pcfg, overhead=None)
    assert fit["collective_overhead_fitted"]
    assert fit["collective_overhead"] == pytest.approx(ov, rel=0.05)
    assert fit["compute_scale"] == pytest.approx(k, rel=0.02)
    faster = dict(alone, runs=[dict(r, jobs=[dict(j, steps=[dict(s, t_end=s["t_start"] + 0.9 * (
        s["t_end"] - s["t_start"])) for s in j["steps"]]) for j in r["jobs"]])
        if r["variant"] == "prio" else r for r in alone["runs"]])
    assert 0.0 <= sim_check.calibrate(faster, prof, pcfg, overhead=ov)["step_cost"] < 1e-6


def test_calibrate_refuses_a_run_it_cannot_use():
    prof, warmup, steps = _toy(), 3, 4
    one = [JobSpec(prof, 2, steps + warmup, name="job0")]
    link = LinkConfig(bandwidth=1e9 / 8, topology="nic")
    run = fake_run("hvd", simulate(one, "fifo", link), warmup)
    with pytest.raises(ValueError, match="one job, got 2"):
        sim_check.calibrate({"meta": _meta(2, ["hvd"], warmup, steps), "runs": [run]}, prof)
    with pytest.raises(ValueError, match="lacks variant.*prio, spec"):
        sim_check.calibrate({"meta": _meta(1, ["hvd"], warmup, steps), "runs": [run]}, prof)


def test_cli_refuses_bad_costs(tmp_path, capsys):
    for argv, flag in ((["--arbiter-rtt", "-1"], "--arbiter-rtt"),
                       (["--collective-overhead", "soon"], "--collective-overhead"),
                       (["--step-cost", "-2ms"], "--step-cost"),
                       (["--collective-overhead", "fit"], "--collective-overhead"),
                       (["--calibrate", str(tmp_path), "--step-cost", "1ms"], "--calibrate"),
                       (["--calibrate", str(tmp_path), "--arbiter-rtt", "0.001"], "--calibrate"),
                       (["--compute-scale", "calibrated"], "--compute-scale"),
                       (["--compute-scale", "0"], "--compute-scale"),
                       (["--compute-scale", "fast"], "--compute-scale"),
                       (["--replicas", "4"], "--replicas: needs --calibrate"),
                       (["--replicas", "-1"], "--replicas: expected an integer >= 0"),
                       ([], "argument dir")):
        with pytest.raises(SystemExit):
            sim_check.main([str(tmp_path), "--profile", "x.json"] + argv)
        assert flag in capsys.readouterr().err


def test_cli_calibrates_and_writes_unless_told_not_to(tmp_path, capsys):
    import json
    from horovod_prio.sim.profiles import save_profile
    prof, warmup, steps = _toy(backward=0.0), 3, 6
    save_profile(prof, str(tmp_path / "p.json"))
    link = _costly(0.020, 0.003)
    pcfg = PriorityConfig.from_env({})
    alone = _alone_run(prof, link, pcfg, warmup, steps)
    two = [JobSpec(prof, 2, steps + warmup, start=0.0005 * i, name="job%d" % i, seed=i)
           for i in range(2)]
    shared = {"meta": _meta(2, ["hvd", "spec"], warmup, steps),
              "runs": [fake_run(v, simulate(two, m, link(m), pcfg), warmup)
                       for v, m in (("hvd", "fifo"), ("spec", "adaptive"))]}
    for name, res in (("alone", alone), ("shared", shared)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(res))
    argv = [str(tmp_path / "shared"), "--profile", str(tmp_path / "p.json"),
            "--calibrate", str(tmp_path / "alone")]
    assert sim_check.main(argv + ["--no-write"]) == 0
    assert "Job-side costs calibrated on one job alone" in capsys.readouterr().out
    assert not (tmp_path / "shared" / "sim_check.md").exists()
    assert sim_check.main(argv) == 0
    md = (tmp_path / "shared" / "sim_check.md").read_text()
    assert "Job-side costs calibrated on one job alone" in md and "| spec | 1 | shared |" in md
    assert "at git " in md and "sim_check %s --profile" % (tmp_path / "shared") in md
    assert sim_check.main(argv + ["--no-write", "--compute-scale", "calibrated"]) == 0
    out = capsys.readouterr().out
    assert "given, not fitted" in out and "| hvd | 0 | shared |" in out
    # ALONE's plain-Horovod step variation as compute noise over seeded replicas
    assert sim_check.main(argv + ["--no-write", "--replicas", "3", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 replicas seeded from 2" in out and "| spec | 1 | shared |" in out
    with pytest.raises(SystemExit):
        sim_check.main([str(tmp_path / "shared"), "--profile", str(tmp_path / "nope.json")])
    assert "--profile" in capsys.readouterr().err


def test_a_join_run_fits_the_compute_scale_on_the_first_job_alone():
    """Job 1 joins later; the testbed's shared steps are 30 % slower than the
    model's. The scale still comes out of job 0's steps alone (2.0), and the
    shared error shows in the rows instead of being fitted away."""
    prof, k, warmup = _toy(), 2.0, 3
    slow = sim_check._scaled(prof, k)
    link = LinkConfig(bandwidth=1e9 / 8, topology="nic")
    specs = [JobSpec(slow, 2, 40 + warmup, name="job0"),
             JobSpec(slow, 2, 10 + warmup, start=3.0, name="job1", seed=1)]
    sim = simulate(specs, "fifo", link)
    run = fake_run("hvd", sim, warmup)
    lo = max(j["steps"][warmup]["t_start"] for j in run["jobs"])
    hi = min(j["steps"][-1]["t_end"] for j in run["jobs"])
    def stretch(t):             # the shared window lasts 30 % longer, later times shift
        return t if t <= lo else lo + 1.3 * (t - lo) if t <= hi else t + 0.3 * (hi - lo)
    for j in run["jobs"]:
        for st in j["steps"]:
            st["t_start"], st["t_end"] = stretch(st["t_start"]), stretch(st["t_end"])
    meta = _meta(2, ["hvd"], warmup, 40)
    meta["jobs"] = [dict(meta["jobs"][0], steps=40), dict(meta["jobs"][0], steps=10, start=3.0)]
    res = sim_check.check({"meta": meta, "runs": [run]}, prof, PriorityConfig.from_env({}))
    assert res["compute_scale"] == pytest.approx(k, rel=0.03)
    shared = [r for r in res["rows"] if r["window"] == "shared"]
    assert shared and all(r["error"] < -0.1 for r in shared), shared


def test_the_grant_waits_of_a_class0_job_are_compared_with_the_testbeds():
    """A class-1 job and a class-0 job joining it, the "testbed" made by the simulator
    with its grant waits recorded as the runner's trace summary does (request ->
    grant spans inside the job's measured steps: union per step, longest). The check
    puts the model's waits beside them, measured the same way: they agree, the
    class-0 job waits far longer than the class-1 job, and the markdown has the
    table. A run that recorded no waits gets none."""
    from benchmarks.traces import union_length
    prof, warmup = _toy(), 2
    link = LinkConfig(bandwidth=1e9 / 8, topology="nic")
    specs = [JobSpec(prof, 2, 30 + warmup, name="job0", job_class=1),
             JobSpec(prof, 2, 6 + warmup, start=0.5, name="job1", seed=1, job_class=0)]
    pcfg = PriorityConfig.from_env({})
    runs = [fake_run("hvd", simulate(specs, "fifo", link), warmup)]
    sim = simulate(specs, "adaptive", link, pcfg)
    runs.append(fake_run("spec", sim, warmup))
    for i, j in enumerate(runs[1]["jobs"]):
        lo, hi = j["steps"][warmup]["t_start"], j["steps"][-1]["t_end"] + 0.01
        sp = [(a, b) for a, b, _ in sim.grant_waits[i] if a >= lo and b <= hi]
        runs[1]["arbiter_waits"][j["name"]].update(
            chunks=len(sp), wait_union_s=union_length(sp),
            wait_max_ms=1e3 * max(b - a for a, b in sp))
    meta = _meta(2, ["hvd", "spec"], warmup, 30)
    meta["jobs"] = [dict(meta["jobs"][0], steps=30, **{"class": 1}),
                    dict(meta["jobs"][0], steps=6, start=0.5, **{"class": 0})]
    res = sim_check.check({"meta": meta, "runs": runs}, prof, pcfg)
    assert [(w["variant"], w["job"]) for w in res["waits"]] == [("spec", 0), ("spec", 1)]
    for w in res["waits"]:
        assert w["sim_s"] == pytest.approx(w["measured_s"], rel=0.02)
        assert w["max_sim_s"] == pytest.approx(w["max_measured_s"], rel=0.02)
    hi, lo = res["waits"]
    assert lo["measured_s"] > 2 * hi["measured_s"] and lo["max_measured_s"] > 2 * hi[
        "max_measured_s"], res["waits"]
    assert "| spec | 1 | %.3f | %.3f |" % (lo["measured_s"], lo["sim_s"]) in \
        sim_check.markdown(res)
    for r in runs:
        r["arbiter_waits"] = {k: dict(v, chunks=0) for k, v in r["arbiter_waits"].items()}
    assert sim_check.check({"meta": meta, "runs": runs}, prof, pcfg)["waits"] == []


def _steps_run(starts_per_job, period, start_attr=None):
    jobs = []
    for i, t0 in enumerate(starts_per_job):
        st = [{"step": k, "t_start": t0 + k * period, "t_end": t0 + (k + 1) * period,
               "warmup": k < 2} for k in range(12)]
        jobs.append({"name": "job%d" % i, "steps": st, "start": start_attr if i else 0.0})
    return {"variant": "hvd", "repeat": 0, "status": "ok", "jobs": jobs}


def test_phase_fractions_of_a_testbed_run():
    assert sim_check.phase_fractions(_steps_run([0.0, 0.3], 1.0)) == pytest.approx([0.0, 0.3])
    assert sim_check.phase_fractions(_steps_run([0.0, 1.75], 1.0)) == pytest.approx([0.0, 0.75])
    assert sim_check.phase_fractions(_steps_run([0.0, 0.3], 1.0, start_attr=2.0)) is None
    assert sim_check.phase_fractions(_steps_run([0.0], 1.0)) is None


def test_two_jobs_start_at_the_phase_they_had_on_the_testbed():
    """A 'testbed' whose two plain-Horovod jobs run about half a step apart (one
    computes while the other communicates), at compute ~ comm. The model does
    not move two jobs' phase here, so started 0.5 ms apart they stay in
    lock-step and the prediction is pessimistic; started at the measured phase
    the run is predicted."""
    prof, k, warmup, steps = _toy(), 1.2, 3, 12
    slow = sim_check._scaled(prof, k)
    link = LinkConfig(bandwidth=1e9 / 8, topology="nic")
    lockstep = simulate([JobSpec(slow, 2, steps + warmup, start=0.0005 * i, name="job%d" % i)
                         for i in range(2)], "fifo", link)
    # job 1 released 0.25 s after job 0: it settles about half a step behind
    apart = simulate([JobSpec(slow, 2, steps + warmup, start=0.25 * i, name="job%d" % i)
                      for i in range(2)], "fifo", link)
    assert apart.steps[0][-1].seconds < 0.9 * lockstep.steps[0][-1].seconds  # phase matters
    run = fake_run("hvd", apart, warmup)
    ph = sim_check.phase_fractions(run)
    assert 0.3 < ph[1] < 0.7
    meta = _meta(2, ["hvd"], warmup, steps)
    pcfg = PriorityConfig.from_env({})
    res = sim_check.check({"meta": meta, "runs": [run]}, prof, pcfg, compute_scale=k)
    assert res["phases"]["hvd"] == [pytest.approx(ph)]             # one repeat
    assert res["sim_phases"]["hvd"][1][0] == pytest.approx(ph[1], abs=0.03)
    assert all(abs(r["error"]) < 0.03 for r in res["rows"]), res["rows"]
    md = sim_check.markdown(res)
    assert "at the phase they had on the testbed" in md and "(simulated 0.4" in md
    fitted = sim_check.check({"meta": meta, "runs": [run]}, prof, pcfg)
    assert all(abs(r["error"]) < 0.03 for r in fitted["rows"]), fitted["rows"]
    blind = sim_check.check({"meta": meta, "runs": [run]}, prof, pcfg, compute_scale=k,
                            phase=False)
    assert blind["phases"] == {}
    assert all(r["error"] > 0.1 for r in blind["rows"]), blind["rows"]


def test_each_repeat_is_simulated_at_its_own_phase():
    """Two repeats: one with the jobs half a step apart, one in lock-step. The
    measured step (median of the two repeats) is predicted only if each repeat
    is simulated at its own phase, not at one phase for both."""
    prof, k, warmup, steps = _toy(), 1.2, 3, 12
    slow = sim_check._scaled(prof, k)
    link = LinkConfig(bandwidth=1e9 / 8, topology="nic")
    runs = []
    for rep, off in enumerate((0.25, 0.0005)):
        r = fake_run("hvd", simulate([JobSpec(slow, 2, steps + warmup, start=off * i,
                                              name="job%d" % i) for i in range(2)],
                                     "fifo", link), warmup)
        runs.append(dict(r, repeat=rep))
    phases = [sim_check.phase_fractions(r)[1] for r in runs]
    assert phases[0] > 0.3 and min(phases[1], 1 - phases[1]) < 0.05
    meta = _meta(2, ["hvd"], warmup, steps)
    res = sim_check.check({"meta": meta, "runs": runs}, prof, PriorityConfig.from_env({}),
                          compute_scale=k)
    assert len(res["phases"]["hvd"]) == 2 and len(res["sim_phases"]["hvd"][1]) == 2
    assert all(abs(r["error"]) < 0.03 for r in res["rows"]), res["rows"]


def test_the_testbed_uplink_carries_its_frames_headers():
    """The model of a testbed run carries TCP over Ethernet at the testbed's MTU
    (runs recorded before the runner recorded it ran on the same veths); a record
    that says otherwise is followed. The runner records its MTU."""
    meta = _meta(2, ["hvd"], 3, 10)
    assert sim_check._link({k: v for k, v in meta.items() if k != "mtu"}).mtu == testbed.MTU
    assert sim_check._link(meta).mtu == 0
    assert sim_check._link(dict(meta, mtu=9000)).wire_factor() == pytest.approx(9014 / 8948)
    from benchmarks import cluster
    a = cluster.parse_args(["--job", "arb", "--repeats", "1"])
    assert cluster.results_meta(a, ["hvd"], "x")["mtu"] == testbed.MTU == 1500


def test_one_inter_op_thread_gives_the_inline_gradient_order():
    """The testbed's jobs run one TensorFlow inter-op thread (the runner's default),
    which produces the input side's gradients first (docs/sim.md): the model of a run
    follows the record's thread count; a record without one keeps layer order."""
    meta = _meta(2, ["hvd", "spec"], 3, 10)
    assert sim_check.grad_order(meta) == "backprop"
    assert sim_check.grad_order(dict(meta, threads=1, inter_threads=1)) == "inline"
    assert sim_check.grad_order(dict(meta, threads=1)) == "inline"
    assert sim_check.grad_order(dict(meta, threads=1, inter_threads=2)) == "backprop"
    for variant in ("hvd", "spec"):
        jobs, _ = sim_check._sim_jobs({"meta": dict(meta, inter_threads=1)}, variant, _toy())
        assert [j.grad_order for j in jobs] == ["inline", "inline"]
    from benchmarks import cluster
    a = cluster.parse_args(["--job", "arb", "--repeats", "1"])
    assert sim_check.grad_order(cluster.results_meta(a, ["hvd"], "x")) == "inline"
    a = cluster.parse_args(["--job", "arb", "--repeats", "1", "--inter-threads", "2"])
    assert sim_check.grad_order(cluster.results_meta(a, ["hvd"], "x")) == "backprop"


# ---------------------------------------------------------------- measured compute noise
def test_step_deviations_pool_each_runs_steps_minus_its_own_median():
    """A run's own level is not variation: [1, 2, 4] and [10, 10, 13] give the
    deviations from 2 and 10; a run of one step gives none; from a cluster record,
    job 0's measured steps of plain Horovod only."""
    assert sim_check.step_deviations([[1.0, 2.0, 4.0], [10.0, 10.0, 13.0], [5.0], None]) == \
        (-1.0, 0.0, 2.0, 0.0, 0.0, 3.0)
    prof, warmup = _toy(), 2
    link = LinkConfig(bandwidth=1e9 / 8, topology="nic")
    res = simulate([JobSpec(prof, 2, 8 + warmup, compute_noise=(0.0, 0.01), seed=1)], "fifo",
                   link)
    steps = [s.seconds for s in res.steps[0][warmup:]]
    rec = {"runs": [fake_run("hvd", res, warmup), dict(fake_run("spec", res, warmup),
                                                         variant="spec")]}
    rec["runs"][1]["jobs"][0]["steps"][warmup]["t_end"] += 5.0      # not read: not hvd
    med = statistics.median(steps)
    assert sim_check.noise_draws(rec) == pytest.approx([x - med for x in steps])
    assert sim_check.make_noise((), 8) is None and sim_check.make_noise((0.01,), 0) is None
    with pytest.raises(ValueError, match="replicas must be an integer >= 0, got -1"):
        sim_check.make_noise((0.01,), -1)
    with pytest.raises(ValueError, match="seed must be an integer, got '1'"):
        sim_check.make_noise((0.01,), 2, "1")


def _class_check(noise):
    """A class-1 job joined by a class-0 job (the headline's class scenario on the toy
    model), "measured" by the deterministic simulator at compute scale 2."""
    prof, k, warmup = _toy(), 2.0, 3
    slow = sim_check._scaled(prof, k)
    link = LinkConfig(bandwidth=1e9 / 8, topology="nic")
    meta = _meta(2, ["hvd", "spec"], warmup, 30)
    meta["jobs"] = [dict(meta["jobs"][0], steps=30, **{"class": 1}),
                    dict(meta["jobs"][0], steps=10, start=1.0, **{"class": 0})]
    runs = []
    for v, mode in (("hvd", "fifo"), ("spec", "adaptive")):
        specs = [JobSpec(slow, 2, 30 + warmup, name="job0", job_class=1 if v == "spec" else 0),
                 JobSpec(slow, 2, 10 + warmup, start=1.0, name="job1", seed=1)]
        runs.append(fake_run(v, simulate(specs, mode, link, PriorityConfig.from_env({})), warmup))
    return sim_check.check({"meta": meta, "runs": runs}, prof, PriorityConfig.from_env({}),
                           noise=noise)


def test_noise_replicas_are_seeded_and_a_zero_spread_reproduces_the_deterministic_check():
    """With measured noise every row is the median of its seeded replicas (one value
    per replica), the same seed gives the same rows, another seed other replicas;
    a sample of zeros (no spread) gives exactly the deterministic check's numbers,
    the fitted compute scale included."""
    det = _class_check(None)
    zero = _class_check(sim_check.make_noise((0.0,) * 6, 3))
    assert zero["compute_scale"] == det["compute_scale"]
    assert [r["sim_s"] for r in zero["rows"]] == [r["sim_s"] for r in det["rows"]]
    assert all(r["sim_replicas"] == [r["sim_s"]] * 3 for r in zero["rows"])
    draws = (-0.02, -0.01, 0.0, 0.015, 0.03)
    a = _class_check(sim_check.make_noise(draws, 5, seed=7))
    b = _class_check(sim_check.make_noise(draws, 5, seed=7))
    c = _class_check(sim_check.make_noise(draws, 5, seed=8))
    assert a["rows"] == b["rows"] and a["compute_scale"] == b["compute_scale"]
    assert [r["sim_replicas"] for r in c["rows"]] != [r["sim_replicas"] for r in a["rows"]]
    for r in a["rows"]:
        assert len(r["sim_replicas"]) == 5
        assert r["sim_s"] == statistics.median(x for x in r["sim_replicas"] if x is not None)
    # the replicas differ from each other (each draws its own steps)
    assert any(len(set(r["sim_replicas"])) > 1 for r in a["rows"])
    assert a["noise"]["replicas"] == 5 and a["noise"]["n"] == 5 and a["noise"]["seed"] == 7
    assert "5 replicas seeded from 7" in sim_check.markdown(a)
