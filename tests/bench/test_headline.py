"""benchmarks/headline.py: the matrix, its interleaving, the rows beside their
bounds, the compact results file and its table, on canned runs (the
measurement itself is not run here)."""
import json
from pathlib import Path

import pytest

from benchmarks import bounds, cluster, headline as h, report, results_io, run


def _plans(args):
    plans = {}
    for s in h.selected(args):
        a = h.runner_args(s, args.quick, args.repeats, Path("/nonexistent"))
        if s.runner == "bench":
            plans[s.key] = run.plan(a, True)
        else:
            plans[s.key] = cluster.plan(cluster.variants_to_run(a.job, a.variants), args.repeats)
    return plans


def test_every_scenario_parses_with_its_runner_and_every_row_has_its_scenario():
    for quick in (False, True):
        for s in h.SCENARIOS:
            if quick and s.quick_argv is None:
                continue
            a = h.runner_args(s, quick, 3, Path("/nonexistent"))
            assert a.repeats == 3 and a.out == "/nonexistent"
    keys = {s.key for s in h.SCENARIOS}
    assert {r.scenario for r in h.ROWS} <= keys
    # every row's configs are planned by its runner
    plans = _plans(h.parse_args([]))
    for row in h.ROWS:
        cfgs = {tuple(r.get("config") or [r.get("variant")]) for r in plans[row.scenario]}
        assert row.base in cfgs and row.ours in cfgs, row.title


def test_repeats_are_interleaved_over_the_matrix_with_the_aa_control_in_each():
    args = h.parse_args([])
    scens = h.selected(args)
    plans = _plans(args)
    order = h.plan(scens, plans, 3)
    reps = [r["repeat"] for _, r in order]
    assert reps == sorted(reps)                              # repeat by repeat
    firsts = [next(k for k, r in order if r["repeat"] == rep) for rep in range(3)]
    assert firsts == [scens[0].key, scens[1].key, scens[2].key]   # rotated
    for rep in range(3):
        one = [tuple(r["config"]) for k, r in order if k == "one-job" and r["repeat"] == rep]
        assert set(one) == {("horovod",), ("prio",), (h.AA_CONTROL,)}
    assert h.parse_args([]).repeats == 3 and h.parse_args(["--quick"]).repeats == 1
    # the full matrix fits the budget; --quick is a few minutes
    assert h.estimate_s(scens, plans) <= 35 * 60
    q = h.parse_args(["--quick"])
    assert h.estimate_s(h.selected(q), _plans(q)) <= 5 * 60


def test_time_left_scales_the_estimates_by_the_runs_so_far():
    est = [30.0, 30.0, 60.0]
    assert h.time_left_s(est, 0, 0.0) == 120.0
    assert h.time_left_s(est, 1, 45.0) == pytest.approx(90.0 * 1.5)     # 1.5x slower so far
    assert h.time_left_s(est, 3, 200.0) == 0.0


@pytest.mark.parametrize("argv, needle", [
    (["--only", "nope"], "--only: unknown scenario(s) nope"),
    (["--repeats", "0"], "--repeats"),
    (["--calibrate", "results/cluster/x"], "--calibrate: only with --resim DIR"),
    (["--rebound", "results/headline/x", "--resim", "results/headline/x"],
     "--rebound: not with --resim"),
])
def test_bad_arguments_are_named(argv, needle, capsys):
    with pytest.raises(SystemExit):
        h.parse_args(argv)
    assert needle in capsys.readouterr().err


def _bench(rep, config, s, batch=1024, cpu=0.3, scen="one-job", gb=25_324_584, rate="1gbit"):
    return {"scenario": scen, "repeat": rep, "status": "ok", "error": None, "config": list(config),
            "batch": batch, "rate": rate, "s_per_step": s, "job_s": [s] * len(config),
            "job_cpu_s": [cpu] * len(config), "grad_bytes": gb, "ranks": 2, "loadavg": [1, 1]}


def _cl(rep, variant, jobs, alone, scen="classes", gb=25_324_584, rate="1gbit"):
    return {"scenario": scen, "repeat": rep, "status": "ok", "error": None, "config": [variant],
            "rate": rate, "s_per_step": sum(jobs) / len(jobs), "job_s": list(jobs),
            "job_alone_s": list(alone), "grad_bytes": gb, "ranks": 2, "loadavg": [1, 1]}


ONE, OVER, CLS_C1, CLS_C0, IDENT = (h.ROWS[0], h.ROWS[2], h.ROWS[4], h.ROWS[5], h.ROWS[8])


def test_a_row_pairs_runs_by_repeat_and_sits_beside_its_link_floor():
    runs = [_bench(0, ["horovod"], 0.80), _bench(0, ["prio"], 0.78),
            _bench(1, ["prio"], 0.82), _bench(1, ["horovod"], 0.80),
            _bench(2, ["horovod"], 0.90), _bench(2, ["prio"], 0.85),
            _bench(2, ["prio"], 0.10, batch=64)]             # another batch: not this row
    r = h.row_result(ONE, "bench", runs)
    assert r["ratios"] == pytest.approx([0.80 / 0.78, 0.80 / 0.82, 0.90 / 0.85])
    assert (r["base_s"], r["ours_s"], r["repeats"]) == (0.80, 0.82, 3)
    assert r["ratio"] == pytest.approx(0.80 / 0.78)
    # the harness's comm floor in wire bytes: frames of the shaped lo's MTU (64 KiB)
    floor = bounds.link_floor(2 * bounds.ring_allreduce_bytes(25_324_584, 2), 1e9, mtu=65536)
    assert floor == pytest.approx(2 * 25_324_584 * 65550 / 65484 * 8 / 1e9)
    assert r["bound"]["s"] == pytest.approx(floor)
    assert r["bound"]["source"] == "link floor, wire bytes at MTU 65536"
    assert r["bound"]["cells"] == list(report.bound_cells(0.80, 0.82, floor))
    # a run that recorded its link's MTU is read at that MTU
    for x in runs:
        x["mtu"] = 1500
    r = h.row_result(ONE, "bench", runs)
    assert r["bound"]["s"] == pytest.approx(2 * 25_324_584 * 1514 / 1448 * 8 / 1e9)
    assert r["bound"]["source"] == "link floor, wire bytes at MTU 1500"
    assert "testbed" in r["sim"]["reason"]


def test_two_jobs_on_the_loopback_and_on_the_testbed_have_their_own_floors():
    two = [_bench(0, ["horovod", "horovod"], 1.0, batch=512, scen="two-jobs"),
           _bench(0, ["prio", "prio"], 0.95, batch=512, scen="two-jobs")]
    r = h.row_result(h.ROWS[1], "bench", two)
    assert r["bound"]["s"] == pytest.approx(2 * 2 * 25_324_584 * 65550 / 65484 * 8 / 1e9)
    ident = [_cl(0, "hvd", [1.06, 1.05], [None, None], "identical-arbiter", gb=6_331_146 * 4,
                 rate="400mbit"),
             _cl(0, "spec", [1.05, 1.06], [None, None], "identical-arbiter", gb=6_331_146 * 4,
                 rate="400mbit")]
    r = h.row_result(IDENT, "cluster", ident)
    # once per direction, in frames of the uplink's MTU (1500): 1514 bytes per 1448
    assert r["bound"]["s"] == pytest.approx(2 * 6_331_146 * 4 * 1514 / 1448 * 8 / 400e6)
    assert r["bound"]["source"] == "link floor, wire bytes at MTU 1500"
    assert r["base_s"] == pytest.approx(1.055)
    assert r["bound"]["cells"][1].startswith("no headroom")


def test_overlap_rows_use_the_overlap_ceiling(tmp_path, monkeypatch):
    monkeypatch.setattr(h, "REPO", tmp_path)           # no measured profile
    runs = [_bench(0, ["horovod"], 0.62, batch=128, cpu=0.45, scen="overlap-mnv2",
                   gb=3_500_000, rate="300mbit"),
            _bench(0, ["overlap"], 0.51, batch=128, cpu=0.47, scen="overlap-mnv2",
                   gb=3_500_000, rate="300mbit")]
    r = h.row_result(OVER, "bench", runs)
    floor = 2 * 3_500_000 * 8 / 300e6
    assert r["bound"]["s"] == pytest.approx(max(0.45, floor)) == pytest.approx(0.45)
    assert r["bound"]["source"].startswith("overlap ceiling")
    assert r["bound"]["cells"] == list(report.bound_cells(0.62, 0.51, 0.45))
    runs[0]["job_cpu_s"] = [None]
    assert "no job CPU" in h.row_result(OVER, "bench", runs)["bound"]["reason"]


def test_overlap_rows_use_the_per_layer_bound_of_a_measured_profile(tmp_path, monkeypatch):
    from horovod_prio.sim.profiles import Layer, Profile, save_profile
    monkeypatch.setattr(h, "REPO", tmp_path)
    runs = [_bench(0, ["horovod"], 0.62, batch=128, cpu=0.30, scen="overlap-mnv2",
                   gb=9_000_000, rate="300mbit"),
            _bench(0, ["overlap"], 0.55, batch=128, cpu=0.31, scen="overlap-mnv2",
                   gb=9_000_000, rate="300mbit")]
    floor = h.link_floor_s(runs[0], "bench")
    assert floor == pytest.approx(0.48, rel=2e-3)      # 64 KiB frames
    assert h.row_result(OVER, "bench", runs)["bound"]["s"] == pytest.approx(floor)
    prof = tmp_path / "results" / "sim" / "profile_mobilenetv2_b128.json"
    prof.parent.mkdir(parents=True)
    # forward/backward times add up to 0.12 s -> x 2.5 = the job's 0.30 s of CPU; the output
    # layer holds 9/10 of the bytes: all of the link + its own 0.05 + 0.15 s of compute
    save_profile(Profile("m", (Layer("in", 100, 0.01, 0.01), Layer("act", 0, 0.01, 0.01),
                               Layer("out", 900, 0.02, 0.06)), 128), str(prof))
    r = h.row_result(OVER, "bench", runs)
    assert r["bound"]["s"] == pytest.approx(floor + 0.2)
    assert r["bound"]["overlap_ceiling_s"] == pytest.approx(floor)
    assert r["bound"]["source"].startswith("per-layer bound")
    assert "results/sim/profile_mobilenetv2_b128.json" in r["bound"]["source"]
    assert r["bound"]["cells"] == list(report.bound_cells(0.62, 0.55, floor + 0.2))
    # the larger of the two: a profile whose input-side work has no gradient (0.08 of its
    # 0.12 s) leaves the per-layer bound (0.48 + 0.15) below a job CPU of 0.9 s
    save_profile(Profile("m", (Layer("pre", 0, 0.04, 0.04), Layer("in", 100, 0.01, 0.01),
                               Layer("out", 900, 0.01, 0.01)), 128), str(prof))
    for x in runs:
        x["job_cpu_s"] = [0.9]
    r = h.row_result(OVER, "bench", runs)
    assert r["bound"]["per_layer_s"] == pytest.approx(floor + 0.15)
    assert r["bound"]["s"] == pytest.approx(0.9) and r["bound"]["per_layer_s"] < 0.9
    assert r["bound"]["source"].startswith("overlap ceiling")


def test_class_rows_use_the_alone_time_or_say_why_there_is_no_bound():
    runs = [_cl(0, "hvd", [0.42, 0.43], [0.26, None]), _cl(0, "spec", [0.28, 1.10], [0.276, None]),
            _cl(1, "spec", [0.27, 1.00], [0.270, None]), _cl(1, "hvd", [0.40, 0.41], [0.25, None])]
    r = h.row_result(CLS_C1, "cluster", runs)
    assert r["bound"]["s"] == pytest.approx(0.273) and "alone" in r["bound"]["source"]
    assert r["ratios"] == pytest.approx([0.42 / 0.28, 0.40 / 0.27])
    r0 = h.row_result(CLS_C0, "cluster", runs)
    assert r0["bound"]["s"] is None and "yields" in r0["bound"]["reason"]
    assert h.share_text(r0).startswith("– (the class-0 job yields")
    assert h.share_text(r) == report.bound_cells(r["base_s"], r["ours_s"], 0.273)[1]


def test_the_simulators_prediction_is_taken_from_its_rows():
    check = {"rows": [
        {"variant": "hvd", "job": 0, "window": "shared", "measured_s": 0.42, "sim_s": 0.42,
         "fitted": True},
        {"variant": "spec", "job": 0, "window": "shared", "measured_s": 0.28, "sim_s": 0.30,
         "fitted": False},
        {"variant": "spec", "job": 1, "window": "shared", "measured_s": 1.1, "sim_s": 0.9,
         "fitted": False},
        {"variant": "spec", "job": 0, "window": "alone", "measured_s": 0.27, "sim_s": 0.5}]}
    s = h.sim_for(CLS_C1, check, "")
    assert s["ours"]["sim_s"] == pytest.approx(0.30)
    assert s["ours"]["error"] == pytest.approx(0.30 / 0.28 - 1)
    assert s["base"]["fitted"] is True
    both = h.sim_for(IDENT, check, "")                      # mean over the jobs
    assert both["ours"]["sim_s"] == pytest.approx(0.6)
    assert h.sim_for(CLS_C1, None, "no measured profile x") == {"reason": "no measured profile x"}
    r = h.row_result(CLS_C1, "cluster", [_cl(0, "hvd", [0.42, 0.4], [0.3, None]),
                                         _cl(0, "spec", [0.28, 1], [0.27, None])], s)
    assert h.sim_text(r) == "0.300 (+7%)"
    # horovod_prio's job without a step in the simulated window: said so, not "not checked"
    none = h.sim_for(CLS_C1, {"rows": check["rows"][:1]}, "")
    r = h.row_result(CLS_C1, "cluster", [_cl(0, "hvd", [0.42, 0.4], [0.3, None]),
                                         _cl(0, "spec", [0.28, 1], [0.27, None])], none)
    assert h.sim_text(r) == "– (the simulator gave no step of this job inside the shared window)"


def test_aa_pairs_come_from_the_one_job_control():
    runs = [_bench(0, ["horovod"], 0.80), _bench(0, [h.AA_CONTROL], 0.81),
            _bench(1, [h.AA_CONTROL], 0.79), _bench(1, ["horovod"], 0.80),
            _bench(2, ["horovod"], 0.80)]
    assert h.aa_pairs(runs) == [(0.80, 0.81), (0.80, 0.79)]


def _result(runs, scens, quick=False):
    res = {"format": h.FORMAT, "meta": {
        "command": "python -m benchmarks.headline", "date": "2026-12-07T06:00:00+00:00",
        "git": "abc1234", "machine": h.machine(), "loadavg_start": 0.5, "loadavg_end": 0.7,
        "repeats": 3, "quick": quick,
        "scenarios": {s.key: {"runner": s.runner, "argv": list(s.quick_argv if quick else s.argv)}
                      for s in scens}}, "runs": runs}
    h.summarize(res, scens, {})
    return res


def test_results_file_is_compact_and_its_table_has_every_row():
    scens = list(h.SCENARIOS)
    runs = []
    for rep in range(3):
        runs += [_bench(rep, ["horovod"], 0.73), _bench(rep, ["prio"], 0.735),
                 _bench(rep, [h.AA_CONTROL], 0.74)]
        runs += [_bench(rep, c, 1.05, batch=512, scen="two-jobs")
                 for c in (["horovod", "horovod"], ["prio", "prio"])]
        runs += [_bench(rep, c, 0.6, batch=b, scen="overlap-mnv2")
                 for b in (128, 256) for c in (["horovod"], ["overlap"])]
        runs += [_cl(rep, v, [0.4, 0.5], [0.27, None], scen=k)
                 for k in ("classes", "join", "identical-arbiter") for v in ("hvd", "spec")]
    res = _result(runs, scens)
    assert len(res["rows"]) == len(h.ROWS)
    text = json.dumps(res, indent=1)
    assert len(text.encode()) < 200_000
    assert "steps" not in {k for r in res["runs"] for k in r}
    md = h.markdown(res)
    assert "| share of the bound |" in md
    for row in h.ROWS:
        assert f"| {row.title} |" in md
    assert "A/A resolution over 3 pair(s)" in md and "same sweep" in md
    assert "Wall time" not in md                         # recorded before runs had one
    for r in res["runs"]:
        r["wall_s"] = 60.0 if r["scenario"] == "overlap-mnv2" else 30.0
    md = h.markdown(res)
    # 12 MobileNetV2 runs of a minute; 9 + 6 + 3 x 6 runs of 30 s
    assert "overlap-mnv2 12.0 min" in md and "one-job 4.5 min" in md
    assert "; 28.5 min in all." in md


def test_compact_keeps_a_runs_values_not_its_series():
    steps = [{"step": i, "warmup": i < 1, "t_start": 10.0 + i, "t_end": 10.5 + i,
              "cpu_start": 1.0 * i, "cpu_end": 1.0 * i + 0.2} for i in range(6)]
    rec = {"scenario": "s", "config": ["horovod"], "rate": "1gbit", "batch": 1024, "repeat": 1,
           "status": "ok", "error": None, "loadavg_before": 1.0, "loadavg_after": 2.0,
           "link_samples": [[0, 0]] * 500,
           "jobs": [{"name": "job0", "impl": "horovod", "steps": steps,
                     "meta": {"grad_bytes": 1000, "size": 2}}]}
    c = h.compact("one-job", "bench", rec)
    assert c["s_per_step"] == pytest.approx(report.run_stats(rec)["mean_of_jobs"])
    assert (c["grad_bytes"], c["ranks"], c["repeat"], c["batch"]) == (1000, 2, 1, 1024)
    assert c["mtu"] == 65536                             # the shaped lo's, for its link floor
    from benchmarks import results_index                 # the index reads the load from runs
    assert results_index._loads([c]) == [1.0, 2.0]
    assert "jobs" not in c and "link_samples" not in c
    pair = dict(rec, variant="spec", arbiter_waits={"job0": {"allreduce_union_s": 0.6}},
                jobs=[_job("job0", 0.4, n=20), _job("job1", 0.4, n=20, t0=100.1)])
    from benchmarks import sim_check
    c = h.compact("identical-arbiter", "cluster", pair)
    assert c["phase"] == sim_check.phase_fractions(pair) and c["phase"][1] == pytest.approx(0.25)
    assert c["comm_s"] == pytest.approx(0.6 / 18)                # per measured step of job 0
    assert c["mtu"] == 1500                                      # the testbed uplink's
    # each job's measured steps, for the simulator's compute noise
    assert c["job_steps_s"] == [[0.4] * 17 + [0.399]] * 2          # the last: to its end
    failed = h.compact("classes", "cluster", dict(rec, status="failed", error="boom\ntail",
                                                  variant="spec"))
    assert (failed["status"], failed["error"], failed["config"]) == ("failed", "boom", ["spec"])


def test_rebound_recomputes_a_folders_bounds_from_its_runs_and_keeps_the_rest(
        tmp_path, capsys):
    """--rebound: the bounds and shares of a recorded folder again, with this
    checkout's arithmetic (here: a folder whose floors counted payload only);
    runs, ratios and the simulator's check as recorded; nothing else run."""
    runs = []
    for rep in range(3):
        runs += [_bench(rep, ["horovod"], 0.73), _bench(rep, ["prio"], 0.735),
                 _bench(rep, [h.AA_CONTROL], 0.74)]
        runs += [_cl(rep, v, [1.06, 1.05], [None, None], "identical-arbiter",
                     gb=6_331_146 * 4, rate="400mbit") for v in ("hvd", "spec")]
    scens = [s for s in h.SCENARIOS if s.key in ("one-job", "identical-arbiter")]
    res = _result(runs, scens)
    old = {r["title"]: r for r in res["rows"]}
    payload = 2 * 6_331_146 * 4 * 8 / 400e6
    for r in res["rows"]:                                  # as recorded before: payload only
        if r["bound"].get("source", "").startswith("link floor"):
            f = payload if r["scenario"] == "identical-arbiter" else 2 * 25_324_584 * 8 / 1e9
            r["bound"] = {"s": f, "source": "link floor",
                          "cells": list(report.bound_cells(r["base_s"], r["ours_s"], f))}
    res["rows"][-1]["sim"] = {"ours": {"sim_s": 1.0, "error": 0.01, "fitted": False}}
    folder = tmp_path / "headline-x"
    h.write(res, folder)
    assert h.main(["--rebound", str(folder)]) == 0
    again = results_io.load(folder)
    ident = [r for r in again["rows"] if r["scenario"] == "identical-arbiter"][0]
    assert ident["bound"]["s"] == pytest.approx(payload * 1514 / 1448)
    assert ident["bound"]["source"] == "link floor, wire bytes at MTU 1500"
    assert ident["bound"]["cells"] == list(report.bound_cells(1.055, 1.055, payload * 1514 / 1448))
    assert ident["sim"] == {"ours": {"sim_s": 1.0, "error": 0.01, "fitted": False}}
    for r in again["rows"]:
        assert {k: r[k] for k in ("base_s", "ours_s", "ratios", "ratio")} == \
            {k: old[r["title"]][k] for k in ("base_s", "ours_s", "ratios", "ratio")}
    assert again["runs"] == res["runs"] and again["aa"] == res["aa"]
    assert again["meta"]["rebound"]["what"] == h.REBOUND_WHAT
    assert h.REBOUND_WHAT.startswith("link floor in wire bytes at each link's MTU")
    md = (folder / "results.md").read_text()
    assert md == h.markdown(again) and "Bounds and shares re-rendered at git" in md
    assert "1514 per 1448 at MTU 1500" in md and "(link floor, wire bytes at MTU 1500)" in md
    capsys.readouterr()
    assert h.main(["--rebound", str(tmp_path / "nope")]) == 2
    assert "argument --rebound: cannot re-render" in capsys.readouterr().err
    assert again["meta"]["rebound"]["kept"] == []
    # a row this checkout no longer has (a dropped batch): kept as recorded, and named
    gone = dict(again["rows"][0], title="a row this checkout does not have",
                bound={"s": 0.123, "source": "as recorded", "cells": ["x", "y"]})
    again["rows"].append(gone)
    h.write(again, folder)
    assert h.main(["--rebound", str(folder)]) == 0
    third = results_io.load(folder)
    assert third["rows"][-1] == gone and len(third["rows"]) == len(again["rows"])
    assert third["meta"]["rebound"]["kept"] == ["a row this checkout does not have"]
    assert ("kept as recorded, not rows of that checkout: a row this checkout does not have."
            in (folder / "results.md").read_text())


def test_rows_of_batches_not_run_are_left_out_and_rows_without_a_pair_say_so():
    q = h.parse_args(["--quick"])
    res = _result([_bench(0, ["horovod"], 0.73)], h.selected(q), quick=True)
    titles = [r["title"] for r in res["rows"]]
    assert OVER.title in titles and h.ROWS[3].title not in titles     # b256 not in --quick
    assert h.ROWS[1].title not in titles                              # two-jobs not in --quick
    one = res["rows"][0]
    assert one["bound"] == {"s": None, "reason": "no repeat with both runs ok"}


def _job(name, dt, n=8, t0=100.0, grad_bytes=25_324_584):
    steps = [{"step": i, "warmup": i < 2, "t_start": t0 + i * dt, "t_end": t0 + (i + 1) * dt - 1e-3,
              "cpu_start": 0.3 * i, "cpu_end": 0.3 * i + 0.2} for i in range(n)]
    return {"name": name, "impl": "horovod", "steps": steps,
            "meta": {"grad_bytes": grad_bytes, "size": 2}}


def test_main_runs_the_matrix_through_the_runners_and_writes_one_folder(tmp_path, monkeypatch):
    """The whole command with the runners' execute_run replaced by canned runs:
    every planned run reaches its runner once, results.json/.md are written."""
    calls = []

    def bench_exec(r, args, workroot, progress):
        calls.append(("bench", tuple(r["config"]), r["batch"], r["repeat"]))
        assert workroot.name == "one-job" or workroot.name == "overlap-mnv2"   # own folder
        dt = {"horovod": 0.80, "prio": 0.79, h.AA_CONTROL: 0.81, "overlap": 0.5}[r["config"][0]]
        return dict(r, label="x", status="ok", error=None, loadavg_before=1.0, loadavg_after=1.0,
                    jobs=[_job(f"job{i}", dt) for i in range(len(r["config"]))])

    def cluster_exec(r, args, workroot, secret_file, progress):
        calls.append(("cluster", r["variant"], r["repeat"]))
        assert workroot.name in ("classes", h.CALIBRATION)
        assert secret_file.exists()
        dt = 0.4 if r["variant"] == "hvd" else 0.3
        jobs = [_job("job0", dt, n=20)]
        if workroot.name == "classes":
            jobs.append(_job("job1", 0.5, t0=103.0))
        return dict(r, label="x", status="ok", error=None, rate=args.rate, loadavg_before=1.0,
                    loadavg_after=1.0, jobs=jobs)

    monkeypatch.setattr(h, "preflight", lambda tag: True)
    monkeypatch.setattr(h, "check_prio_available", lambda: (True, ""))
    from benchmarks import cgroups, testbed
    for mod in (h.netns, testbed, cgroups):
        monkeypatch.setattr(mod, "cleanup_stale", lambda *a, **k: [])
    monkeypatch.setattr(run, "execute_run", bench_exec)
    monkeypatch.setattr(cluster, "execute_run", cluster_exec)
    out = tmp_path / "headline-x"
    assert h.main(["--quick", "--out", str(out)]) == 0
    q = h.parse_args(["--quick"])
    assert len(calls) == sum(len(p) for p in _plans(q).values())
    res = results_io.load(out)
    assert res["format"] == h.FORMAT and res["meta"]["git"] is not None
    assert res["meta"]["command"] == f"python -m benchmarks.headline --quick --out {out}"
    assert [r["title"] for r in res["rows"]] == [ONE.title, OVER.title, CLS_C1.title, CLS_C0.title]
    one = res["rows"][0]
    assert one["ratio"] == pytest.approx(0.80 / 0.79, rel=1e-3)
    assert one["bound"]["source"] == "link floor, wire bytes at MTU 65536"
    assert res["aa"]["pairs"] == [[pytest.approx(0.80, rel=1e-2), pytest.approx(0.81, rel=1e-2)]]
    assert res["rows"][2]["bound"]["s"] == pytest.approx(0.3, rel=1e-2)   # alone, ours
    # testbed rows carry the simulator's prediction (the measured MLP b64 profile)
    assert set(res["rows"][2]["sim"]) == {"base", "ours"}
    assert "testbed" in res["rows"][0]["sim"]["reason"]
    md = (out / "results.md").read_text()
    assert md.startswith("Command: `python -m benchmarks.headline --quick")
    assert "A/A resolution over 1 pair(s)" in md
    assert not (out / "raw").exists()


def _simulated_cluster_run(r, meta, overhead):
    """A benchmarks.cluster run record of one job alone made by the simulator (the
    measured MLP b64 profile, collectives costing ``overhead`` beyond their bytes),
    with the rank-0 trace's time in flight over the measured steps."""
    from benchmarks import sim_check
    from horovod_prio.sim.engine import JobSpec, simulate
    from horovod_prio.sim.profiles import load_profile
    prof = sim_check._scaled(load_profile(str(h.REPO / "results/sim/profile_mlp_b64.json")), 0.8)
    warmup, steps = meta["warmup"], meta["jobs"][0]["steps"]
    mode = {"hvd": "fifo", "prio": "priority", "spec": "adaptive"}[r["variant"]]
    # the gradient order the check models the recorded run in (one inter-op thread)
    res = simulate([JobSpec(prof, 2, steps + warmup, grad_order=sim_check.grad_order(meta))],
                   mode, sim_check._link(meta, overhead=overhead),
                   sim_check.PriorityConfig.from_env({}))
    st = [{"step": k, "t_start": s.start, "t_end": s.end, "warmup": k < warmup,
           "cpu_start": 0.0, "cpu_end": 0.1} for k, s in enumerate(res.steps[0])]
    lo, hi = st[warmup]["t_start"], st[-1]["t_end"]
    waits = {} if mode == "fifo" else {"job0": {"allreduce_union_s": sum(
        max(0.0, min(b, hi) - max(a, lo)) for a, b in res.comm_spans[0])}}
    return dict(r, label="x", status="ok", error=None, rate=meta["rate"], loadavg_before=1.0,
                loadavg_after=1.0, arbiter_waits=waits,
                jobs=[{"name": "job0", "impl": "prio", "steps": st, "meta": {}}])


def test_the_sweeps_calibration_gives_the_simulator_its_job_side_costs(tmp_path, monkeypatch,
                                                                        capsys):
    """The sim-calibration scenario (one job alone, hvd/prio/spec) measures the
    per-collective overhead on its trace's time in flight; the class scenario's
    simulator check runs with it (recorded beside the table), and --resim rebuilds
    the same check from the compact folder alone."""
    ov = 0.004
    meta = h.cluster_meta({"argv": list(next(s for s in h.SCENARIOS
                                             if s.key == h.CALIBRATION).quick_argv)}, 1)

    def cluster_exec(r, args, workroot, secret_file, progress):
        if workroot.name == h.CALIBRATION:
            return _simulated_cluster_run(r, meta, ov)
        dt = 0.4 if r["variant"] == "hvd" else 0.3
        return dict(r, label="x", status="ok", error=None, rate=args.rate, loadavg_before=1.0,
                    loadavg_after=1.0, jobs=[_job("job0", dt, n=20), _job("job1", 0.9, t0=103.0)])

    monkeypatch.setattr(h, "preflight", lambda tag: True)
    monkeypatch.setattr(h, "check_prio_available", lambda: (True, ""))
    from benchmarks import cgroups, testbed
    for mod in (h.netns, testbed, cgroups):
        monkeypatch.setattr(mod, "cleanup_stale", lambda *a, **k: [])
    monkeypatch.setattr(cluster, "execute_run", cluster_exec)
    out = tmp_path / "headline-cal"
    assert h.main(["--quick", "--only", f"classes,{h.CALIBRATION}", "--out", str(out),
                   "--replicas", "2", "--seed", "5"]) == 0
    res = results_io.load(out)
    assert [r["title"] for r in res["rows"]] == [CLS_C1.title, CLS_C0.title]
    cal = res["sim"]["classes"]
    assert cal["collective_overhead_s"] == pytest.approx(ov, rel=0.15)
    assert cal["costs"].startswith(f"measured on the {h.CALIBRATION} runs")
    # the calibration runs' step times are kept, and their variation is the noise
    kept = [r["job_steps_s"][0] for r in res["runs"]
            if r["scenario"] == h.CALIBRATION and r["config"] == ["hvd"]]
    assert kept and len(kept[0]) == meta["jobs"][0]["steps"]
    assert cal["noise"]["n"] == sum(map(len, kept))
    assert (cal["noise"]["replicas"], cal["noise"]["seed"]) == (2, 5)
    assert "Simulator: classes: compute scale" in (out / "results.md").read_text()
    assert "median of 2 seeded replicas (seed 5)" in (out / "results.md").read_text()
    # the runner's settings as the sweep ran them
    assert res["meta"]["scenarios"]["classes"]["cluster_meta"]["jobs"][0]["class"] == 1
    again = h.resim(out, replicas=2, seed=5)
    assert again["sim"]["classes"] == cal
    for row in again["rows"]:
        assert row["now"]["sim_s"] == pytest.approx(row["recorded"]["sim_s"], rel=1e-9)
    # no replicas: the deterministic model
    assert "noise" not in h.resim(out, replicas=0)["sim"]["classes"]
    # without the calibration runs: no costs, and the check says why
    bare = json.loads(json.dumps(res))
    bare["meta"]["scenarios"].pop(h.CALIBRATION)
    results_io.save(tmp_path / "bare", bare, raw=False)
    e = h.resim(tmp_path / "bare")["sim"]["classes"]
    assert e["collective_overhead_s"] == 0.0 and "not calibrated" in e["costs"]
    assert h.main(["--resim", str(out)]) == 0
    assert "| simulator now (error) |" in capsys.readouterr().out
    assert h.main(["--resim", str(tmp_path / "nope")]) == 2
    assert "argument --resim: cannot re-check" in capsys.readouterr().err


def test_a_calibration_run_of_another_sweep_applies_only_on_a_box_at_the_same_speed(
        monkeypatch):
    """The job-side costs are CPU time: a calibration run whose plain Horovod alone
    stepped 32 % slower (or 10 % faster) than the folder's (another boot of the box)
    is refused with both numbers named; within 5 % (or with no alone time to compare)
    it applies."""
    from benchmarks import sim_check
    meta = {"rate": "1gbit", "model": "mlp", "batch": 64, "transport": "gloo", "pin": "job"}
    alone = {"meta": dict(meta), "runs": []}
    monkeypatch.setattr(sim_check, "calibrate", lambda *a, **k: {
        "collective_overhead": 0.011, "arbiter_rtt": 0.0, "step_cost": 0.0,
        "measured": {"hvd": 0.360, "prio": 0.37, "spec": 0.38}})
    costs, why = h.calibration_for(meta, alone, hvd_alone_s=0.272)
    assert costs == {} and why == (
        "not calibrated: plain Horovod alone took 0.360 s/step in the calibration run, "
        "+32% off this run's 0.272 (a box at another speed; its job-side costs apply "
        "within 5%)")
    assert h.calibration_for(meta, alone, hvd_alone_s=0.40)[1].startswith(
        "not calibrated: plain Horovod alone took 0.360 s/step in the calibration run, -10% off")
    for same in (0.35, None):
        costs, why = h.calibration_for(meta, alone, hvd_alone_s=same)
        assert why == "" and costs == {"overhead": 0.011, "rtt": 0.0, "step": 0.0,
                                       "noise": None}


def test_a_calibration_run_applies_only_to_its_own_link_model_batch_and_pinning():
    meta = {"rate": "1gbit", "model": "mlp", "batch": 64, "transport": "gloo", "pin": "job"}
    alone = {"meta": dict(meta, rate="400mbit", pin="rack"), "runs": []}
    costs, why = h.calibration_for(meta, alone)
    assert costs == {} and why == ("not calibrated: the calibration run differs in "
                                   "rate (400mbit vs 1gbit), pin (rack vs job)")
    assert h.calibration_for(meta, None)[1].startswith("not calibrated: no run")


def _full_result():
    scens = list(h.SCENARIOS)
    runs = []
    for rep in range(3):
        runs += [_bench(rep, ["horovod"], 0.73), _bench(rep, ["prio"], 0.70 + 0.01 * rep),
                 _bench(rep, [h.AA_CONTROL], 0.74)]
        runs += [_bench(rep, c, 0.6, batch=b, scen="overlap-mnv2")
                 for b in (128, 256) for c in (["horovod"], ["overlap"])]
        runs += [_cl(rep, v, [0.4, 0.5], [0.27, None], scen=k)
                 for k in ("classes", "join", "identical-arbiter") for v in ("hvd", "spec")]
    return _result(runs, scens)


def test_the_plot_draws_the_rows_that_have_a_ratio(tmp_path):
    res = _full_result()
    pts = h.plot_points(res)
    assert [p[0] for p in pts] == [r["title"] for r in res["rows"] if r["ratio"] is not None]
    one = pts[0]
    assert one[1:4] == pytest.approx((0.73 / 0.71, 0.73 / 0.72, 0.73 / 0.70))
    row = res["rows"][0]
    assert one[4] == pytest.approx(row["base_s"] / row["bound"]["s"]) and one[4] > 1
    assert any(p[4] is None for p in pts)          # the rows that yield by design: no bound
    path = h.plot_rows(res, tmp_path / h.PLOT)
    assert path == tmp_path / h.PLOT and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for r in res["rows"]:
        r["ratio"] = None
    assert h.plot_rows(res, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_a_full_sweep_regenerates_the_readme_table_and_a_partial_one_does_not(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("readme_table_t", h.REPO / "tools" / "readme_table.py")
    readme_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(readme_table)
    repo = tmp_path / "repo"
    out = repo / "results" / "headline" / "2026-12-07-x"
    res = _full_result()
    h.write(res, out, plot=True)
    assert (out / h.PLOT).is_file()
    readme = repo / "README.md"
    before = readme_table.README.read_text()
    readme.write_text(before)
    for meta, needle in ((dict(quick=True), "partial matrix"), (dict(only=["classes"]), "partial"),
                         (dict(interrupted=True), "not every run")):
        r2 = dict(res, meta=dict(res["meta"], **meta))
        assert needle in h.update_readme(r2, out, readme, repo=repo)
        assert readme.read_text() == before
    assert "not inside" in h.update_readme(res, tmp_path / "elsewhere", readme, repo=repo)
    assert "not a folder of results/headline" in h.update_readme(res, repo / "results" / "x",
                                                                 readme, repo=repo)
    assert readme.read_text() == before
    assert "regenerated from results/headline/2026-12-07-x" in h.update_readme(
        res, out, readme, repo=repo)
    text = readme.read_text()
    assert readme_table.source_of(text) == "results/headline/2026-12-07-x"
    title = h.ROWS[0].title
    line = next(ln for ln in readme_table.current(text).splitlines() if ln.startswith(f"| {title} |"))
    assert "| 0.730 | 0.710 |" in line and "2026-12-07, git abc1234" in line
    assert "(results/headline/2026-12-07-x/ratios.png)" in readme_table.current(text)
    res["runs"][0]["status"] = "failed"
    readme.write_text(before)
    assert "not every run" in h.update_readme(res, out, readme, repo=repo)
    assert readme.read_text() == before


def test_resim_rebuilds_a_scenario_with_the_settings_its_sweep_ran(tmp_path, monkeypatch):
    """A sweep records each cluster scenario's runner meta and --resim uses it; a
    folder recorded without it is rebuilt from its arguments with the arbiter's class
    reserve of its checkout: 0 for a checkout without the commit that made 0.875 the
    default (asked of git), by the sweep's date where git does not know the checkout."""
    import subprocess
    repo = tmp_path / "repo"
    repo.mkdir()
    def git(*a):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo,
                              check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "base")
    base = git("rev-parse", "--short", "HEAD")
    git("commit", "-q", "--allow-empty", "-m", "reserve on by default")
    on = git("rev-parse", "--short", "HEAD")
    git("commit", "-q", "--allow-empty", "-m", "later")
    later = git("rev-parse", "--short", "HEAD")
    monkeypatch.setattr(h, "REPO", repo)
    monkeypatch.setattr(h, "CLASS_RESERVE_DEFAULT", (on, "2026-12-07T20:52:07+00:00"))
    argv = ["--job", "arb,class=1,steps=30", "--job", "arb,class=0,start=4,steps=12",
            "--variants", "hvd,spec", "--pin", "job", "--batch", "64"]
    sc = {"runner": "cluster", "argv": argv}
    today = h.cluster_meta(sc, 3)["arbiter_class_reserve"]
    assert today > 0
    after, before = "2026-12-07T21:00:00+00:00", "2026-12-07T20:00:00+00:00"
    assert h.cluster_meta(sc, 3, base, after)["arbiter_class_reserve"] == 0.0   # git decides
    assert h.cluster_meta(sc, 3, later + "-dirty", before)["arbiter_class_reserve"] == today
    assert h.cluster_meta(sc, 3, "0123abc", before)["arbiter_class_reserve"] == 0.0  # unknown
    assert h.cluster_meta(sc, 3, "0123abc", after)["arbiter_class_reserve"] == today
    given = ["--arbiter-class-reserve", "0.5"]
    assert h.cluster_meta(dict(sc, argv=argv + given), 3, base)["arbiter_class_reserve"] == 0.5
    rec = dict(h.cluster_meta(sc, 3), arbiter_class_reserve=0.25)
    assert h.cluster_meta(dict(sc, cluster_meta=rec), 3, base) is rec
