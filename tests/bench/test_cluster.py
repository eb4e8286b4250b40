"""benchmarks/cluster.py (the runner on the multi-host testbed): job specs,
variants, the horovodrun command per job, statistics and the report from a
fixture. No root, no processes; the testbed itself: test_testbed.py."""
import json

import pytest

from benchmarks import cluster, report, results_io, testbed
from benchmarks.cluster import parse_job


# ------------------------------------------------------------------ job specs
def test_job_specs():
    assert parse_job("prio") == {"impl": "prio", "class": None, "start": 0.0, "steps": None,
                                 "batch": None, "model": None, "overlap": False, "nice": None,
                                 "env": {}}
    d = parse_job("arb,class=1,start=12.5,steps=40,batch=256,model=cnn,"
                  "HOROVOD_PRIO_CREDIT_BYTES=32MiB")
    assert (d["impl"], d["class"], d["start"], d["steps"], d["batch"], d["model"]) == (
        "arb", 1, 12.5, 40, 256, "cnn")
    assert d["env"] == {"HOROVOD_PRIO_CREDIT_BYTES": "32MiB"}
    assert parse_job("impl=horovod,start=3")["impl"] == "horovod"
    d = parse_job("arb,overlap,model=mobilenetv2")
    assert (d["overlap"], d["model"]) == (True, "mobilenetv2")


@pytest.mark.parametrize("spec, needle", [
    ("", "empty"),
    ("fast", "implementation"),
    ("class=1", "must come first"),
    ("prio,class=1", "only with arb"),
    ("arb,class=high", "class"),
    ("prio,start=-1", "start"),
    ("prio,start=9999", "start"),
    ("prio,steps=0", "steps"),
    ("prio,model=vgg", "model"),
    ("prio,colour=red", "unknown key"),
    ("arb,HOROVOD_PRIO_ARBITER=x:1", "set by the runner"),
    ("arb,HOROVOD_PRIO_JOB_PRIORITY=2", "class="),
    ("arb,HOROVOD_PRIO_CPU_NICE=5", "use nice="),
    ("arb,nice=20", "nice"),
    ("horovod,nice=low", "nice"),
    ("horovod,HOROVOD_PRIO_STEP=2", "prio or arb"),
    ("prio,2", "not key=value"),
    ("overlap", "implementation"),
    ("horovod,overlap", "needs a prio or arb job"),
])
def test_bad_job_specs_are_named(spec, needle, capsys):
    with pytest.raises(SystemExit):
        cluster.parse_args(["--job", spec])
    err = capsys.readouterr().err
    assert "argument --job" in err and needle in err


def test_defaults_and_other_bad_arguments(capsys):
    a = cluster.parse_args([])
    assert [j["impl"] for j in a.job] == ["prio", "prio"]
    assert all((j["steps"], j["batch"], j["model"]) == (20, 512, "mlp") for j in a.job)
    assert (a.transport, a.rate, a.variants, a.pin) == ("gloo", "1gbit", ["hvd", "spec"], "job")
    assert cluster.parse_args(["--mpi"]).transport == "mpi"
    assert a.arbiter_class_reserve is None      # the arbiter's own default
    assert cluster.parse_args(["--arbiter-class-reserve", "0.5"]).arbiter_class_reserve == 0.5
    for argv, needle in ((["--job", "prio,start=5"], "start at once"),
                         (["--job", "prio"] * 9, "at most 8"),
                         (["--subnet", "8.8.0.0/16"], "--subnet"),
                         (["--variants", "hvd,fast"], "--variants"),
                         (["--sample-interval", "0"], "--sample-interval"),
                         (["--gloo", "--mpi"], "not allowed"),
                         (["--rate", "fast"], "--rate"),
                         (["--arbiter-class-reserve", "1.5"], "--arbiter-class-reserve")):
        with pytest.raises(SystemExit):
            cluster.parse_args(argv)
        assert needle in capsys.readouterr().err


def test_variants():
    specs = [parse_job("arb,class=1,HOROVOD_PRIO_CREDIT_BYTES=32MiB"), parse_job("horovod,start=5")]
    hvd = cluster.variant_jobs(specs, "hvd")
    assert [(d["impl"], d["class"], d["env"], d["start"]) for d in hvd] == [
        ("horovod", None, {}, 0.0), ("horovod", None, {}, 5.0)]
    prio = cluster.variant_jobs(specs, "prio")
    assert [(d["impl"], d["class"]) for d in prio] == [("prio", None), ("horovod", None)]
    assert prio[0]["env"] == {"HOROVOD_PRIO_CREDIT_BYTES": "32MiB"}
    assert cluster.variant_jobs(specs, "spec") == specs
    assert specs[0]["class"] == 1                       # not modified in place
    assert cluster.variants_to_run(specs, ["spec"]) == ["hvd", "spec"]
    assert cluster.variants_to_run(specs, ["hvd", "prio", "spec"]) == ["hvd", "prio", "spec"]
    # without arb jobs "prio" is the same job list as "spec": run once
    assert cluster.variants_to_run([parse_job("prio")] * 2, ["prio", "spec"]) == ["hvd", "prio"]
    assert [report.cluster_job_label(d) for d in specs] == ["arb(c1)", "hvd@5s"]
    # barrier crossing stays in the prio variant, never reaches plain Horovod
    ov = [parse_job("arb,overlap")]
    assert [d["overlap"] for d in cluster.variant_jobs(ov, "hvd")] == [False]
    assert [(d["impl"], d["overlap"]) for d in cluster.variant_jobs(ov, "prio")] == [("prio", True)]
    assert report.cluster_job_label(ov[0]) == "arb+ov"


def test_plan_interleaves_and_rotates():
    runs = cluster.plan(["hvd", "prio", "spec"], 2)
    assert [(r["variant"], r["repeat"]) for r in runs] == [
        ("hvd", 0), ("prio", 0), ("spec", 0), ("prio", 1), ("spec", 1), ("hvd", 1)]


# ------------------------------------------------------------------ jobs and commands
def test_each_job_gets_its_own_pair_of_hosts_across_the_racks(tmp_path, monkeypatch):
    monkeypatch.setattr(cluster, "horovodrun_path", lambda: "/venv/bin/horovodrun")
    a = cluster.parse_args(["--job", "arb,class=1", "--job", "prio,start=10", "--warmup", "2"])
    jobs = cluster.make_jobs(a.job, a)
    assert [j.hosts for j in jobs] == [("a1", "b1"), ("a2", "b2")]
    assert [(j.arbiter, j.job_class, j.impl, j.start) for j in jobs] == [
        (True, 1, "prio", 0.0), (False, None, "prio", 10.0)]
    cmd = cluster.cluster_job_command(jobs[1], tmp_path, "gloo")
    s = " ".join(cmd)
    assert "--overlap" not in cmd
    assert s.startswith("/venv/bin/horovodrun --gloo -np 2 -H a2:1,b2:1 "
                        "--network-interface eth0")
    assert "-m benchmarks.workload --impl prio" in s and "--warmup 2" in s
    assert f"--go-file {tmp_path / 'job1.go'}" in s          # released later: own go file
    cmd = cluster.cluster_job_command(jobs[0], tmp_path, "mpi")
    assert cmd[1:6] == ["--mpi", "-np", "2", "-H", "a1:1,b1:1"]
    assert "--gloo-timeout-seconds" not in cmd and f"--go-file {tmp_path / 'go'}" in " ".join(cmd)
    t = cluster.make_topology(2, a, tag="c1")
    assert {h.name: h.rack for h in t.hosts} == {"head": "A", "arbiter": "A", "a1": "A",
                                                 "a2": "A", "b1": "B", "b2": "B"}


def test_a_niced_job_is_niced_in_every_variant_by_the_product_or_by_the_workload(
        tmp_path, monkeypatch):
    monkeypatch.setattr(cluster, "horovodrun_path", lambda: "/venv/bin/horovodrun")
    a = cluster.parse_args(["--job", "arb,class=1", "--job", "arb,class=0,nice=10"])
    assert [d["nice"] for d in cluster.variant_jobs(a.job, "hvd")] == [None, 10]
    assert report.cluster_job_label(a.job[1]) == "arb(c0) nice 10"
    for variant in ("hvd", "prio", "spec"):
        top, low = cluster.make_jobs(cluster.variant_jobs(a.job, variant), a)
        assert "HOROVOD_PRIO_CPU_NICE" not in top.env
        assert "--nice" not in cluster.cluster_job_command(top, tmp_path, "gloo")
        cmd = cluster.cluster_job_command(low, tmp_path, "gloo")
        if variant == "hvd":
            assert cmd[cmd.index("--nice") + 1] == "10" and "HOROVOD_PRIO_CPU_NICE" not in low.env
        else:
            assert low.env["HOROVOD_PRIO_CPU_NICE"] == "10" and "--nice" not in cmd


def test_overlap_job_runs_the_workload_with_overlap(tmp_path, monkeypatch):
    monkeypatch.setattr(cluster, "horovodrun_path", lambda: "/venv/bin/horovodrun")
    a = cluster.parse_args(["--job", "arb,overlap,model=mobilenetv2", "--job", "arb"])
    ov, plain = cluster.make_jobs(a.job, a)
    cmd = cluster.cluster_job_command(ov, tmp_path, "gloo")
    assert cmd[-1] == "--overlap" and cmd[cmd.index("--model") + 1] == "mobilenetv2"
    assert "--overlap" not in cluster.cluster_job_command(plain, tmp_path, "gloo")
    hvd = cluster.make_jobs(cluster.variant_jobs(a.job, "hvd"), a)
    assert all("--overlap" not in cluster.cluster_job_command(j, tmp_path, "gloo") for j in hvd)


def test_cpu_pinning_per_host():
    assert cluster.host_cpus(3, "job", ncpu=2) == {"a1": "0", "b1": "0", "a2": "1", "b2": "1",
                                                   "a3": "0", "b3": "0"}
    assert cluster.host_cpus(2, "rack", ncpu=2) == {"a1": "0", "a2": "0", "b1": "1", "b2": "1"}
    assert cluster.host_cpus(2, "none", ncpu=2) == {}


# ------------------------------------------------------------------ statistics and report
T0 = 1_700_000_000.0
RATE_B = 125e6                   # 1gbit in bytes/s


def _job(name, label, impl, hosts, step_s, start, n=10, events=()):
    steps = [{"step": 0, "t_start": T0 - 1, "t_end": T0 - 0.5, "warmup": True}]
    steps += [{"step": i + 1, "t_start": T0 + start + i * step_s,
               "t_end": T0 + start + (i + 1) * step_s, "warmup": False} for i in range(n)]
    return {"name": name, "label": label, "impl": impl, "hosts": hosts, "steps": steps,
            "meta": {"grad_bytes": 25_324_584, "size": 2, "t_process_start": T0 - 20},
            "events": [{"t": T0 + t, "msg": m} for t, m in events], "trace_events": []}


def _log(batch, kind, boost):
    return (f"horovod_prio: batch {batch} {kind}: time 0.8000s min 0.6000s threshold 0.66s "
            f"count 1 boost {boost} priorities [0, 1, 2, 3]")


def _samples():
    out = []
    for k in range(-10, 80):
        t = T0 + k * 0.1
        x = max(0.0, t - (T0 - 1))
        out.append({"t": t, "AB": int(100e6 * x), "BA": int(50e6 * x),
                    "hosts": {"a1": [int(60e6 * x), 0], "b1": [int(30e6 * x), 0],
                              "a2": [int(40e6 * x), 0], "b2": [int(20e6 * x), 0],
                              "head": [0, 0]},
                    # jiffies: cpu0 60 % user, 10 % system, 10 % softirq; cpu1 20 % user
                    "cpu": {"cpu0": [int(60 * x), 0, int(10 * x), int(20 * x), 0, 0,
                                     int(10 * x), 0],
                            "cpu1": [int(20 * x), 0, 0, int(80 * x), 0, 0, 0, 0]}})
    return out


def _run(variant, rep, s0, s1, arb=False):
    j0 = _job("job0", "arb" if arb else "hvd", "prio" if arb else "horovod", ["a1", "b1"],
              s0, 0.0, n=12, events=[(1.0, _log(3, "slow", 1)), (2.0, _log(5, "slow", 2)),
                                     (4.0, _log(9, "decay", 1))] if arb else ())
    j1 = _job("job1", "arb@2s" if arb else "hvd@2s", "prio" if arb else "horovod",
              ["a2", "b2"], s1, 2.0, n=6)
    r = {"variant": variant, "repeat": rep, "label": f"{variant}-r{rep}", "status": "ok",
         "rate": "1gbit", "transport": "gloo", "config": [j0["label"], j1["label"]],
         "t_go": T0, "jobs": [j0, j1], "uplink_samples": _samples(), "notes": [],
         "loadavg_before": 2.0, "loadavg_after": 3.0}
    if arb:
        r["arbiter_stats_go"] = {"links": {"uplink": {"grants": 10, "waits": 2}}}
        r["arbiter_stats_end"] = {"links": {"uplink": {"grants": 110, "waits": 52}}}
        r["arbiter_waits"] = {"job0": {"chunks": 20, "wait_total_s": 1.2, "wait_union_s": 0.6,
                                       "wait_median_ms": 3.0, "wait_max_ms": 9.0}}
    return r


def _results():
    runs = [_run("hvd", 0, 0.5, 0.5), _run("spec", 0, 0.4, 0.5, arb=True),
            _run("spec", 1, 0.4, 0.5, arb=True), _run("hvd", 1, 0.5, 0.5),
            dict(_run("spec", 2, 1, 1), status="failed", error="job job1 (prio) exited\nx")]
    return {"meta": {"command": "python -m benchmarks.cluster --job arb --job arb,start=2",
                     "date": "2026-12-01T00:00:00+00:00", "git": "abc1234", "ncpu": 2,
                     "transport": "gloo", "rate": "1gbit", "model": "mlp", "batch": 512,
                     "steps": 12, "warmup": 1, "repeats": 2, "pin": "job",
                     "variants": ["hvd", "spec"],
                     "jobs": [parse_job("arb"), parse_job("arb,start=2")]}, "runs": runs}


def test_worst_job_is_the_largest_slowdown_not_the_last_job():
    res = _results()
    res["runs"] = [_run("hvd", 0, 0.5, 0.5), _run("spec", 0, 0.55, 0.4, arb=True)]
    rows, _ = report.cluster_summarize(res)
    by = {r["variant"]: r for r in rows}
    assert by["spec"]["worst_job_change"] == pytest.approx(0.1)     # job0: 0.55 vs 0.5


def test_recovery_of_the_job_that_ran_alone_counts_steps_from_the_join():
    """A alone at 0.4 s/step; B joins at 2 s; A's steps then take 0.8, 0.7,
    0.43 (within 10 % of 0.4: the 3rd step), then 0.4 again; the report gives
    A's recovery per repeat, 'never' when no later step comes back, and none
    for B."""
    def run(rep, shared, tail=(0.4,) * 8):
        r = _run("spec", rep, 0.4, 0.5, arb=True)
        secs = [0.4] * 5 + shared + list(tail)
        t, steps = T0, r["jobs"][0]["steps"][:1]
        for i, sec in enumerate(secs):
            steps.append({"step": i + 1, "t_start": t, "t_end": t + sec, "warmup": False})
            t += sec
        r["jobs"][0]["steps"] = steps
        return r
    st = report.cluster_run_stats(run(0, [0.8, 0.7, 0.43]))
    assert st["jobs"][0]["median_alone"] == pytest.approx(0.4)
    assert (st["jobs"][0]["recovery"], st["jobs"][1]["recovery"]) == (3, None)
    late = run(0, [0.8, 0.7, 0.43])                 # B outlasts A: B has alone steps too,
    late["jobs"][1] = _job("job1", "arb@2s", "prio", ["a2", "b2"], 0.5, 2.0, n=30)
    st = report.cluster_run_stats(late)                    # but it did not run before the join
    assert st["jobs"][1]["n_alone"] > 0 and st["jobs"][1]["recovery"] is None
    res = _results()
    res["runs"] = [_run("hvd", 0, 0.5, 0.5), run(0, [0.8, 0.7, 0.43]),
                   _run("hvd", 1, 0.5, 0.5), run(1, [0.9] * 8, tail=())]
    _, jrows = report.cluster_summarize(res)
    by = {(j["variant"], j["job"]): j for j in jrows}
    assert by[("spec", "job0")]["recovery"] == [3, None]
    assert by[("spec", "job1")]["recovery"] is None
    md = report.cluster_markdown(res)
    assert "| recovery, per repeat |" in md and "| 3 / never |" in md


def test_jobs_started_together_have_no_recovery():
    """Two jobs released together start their first measured steps a few ms
    apart; the earlier one did not run alone, so it gets no recovery (a
    2026-12-05 identical-jobs report read 'never' for it)."""
    r = _run("spec", 0, 0.5, 0.5, arb=True)
    r["jobs"][0] = _job("job0", "arb", "prio", ["a1", "b1"], 0.5, 0.0, n=12)
    r["jobs"][1] = _job("job1", "arb", "prio", ["a2", "b2"], 0.5, 0.005, n=6)
    st = report.cluster_run_stats(r)
    assert st["window"] and st["jobs"][0]["n_alone"] > 0          # job0 outlasts job1
    assert [j["recovery"] for j in st["jobs"]] == [None, None]


def test_run_stats_shared_window_alone_steps_and_uplink_share():
    st = report.cluster_run_stats(_run("spec", 0, 0.4, 0.5, arb=True))
    # job1 joins 2 s later: the shared window starts at its first measured step
    assert st["window"] == pytest.approx((T0 + 2.0, T0 + 4.8))
    j0, j1 = st["jobs"]
    assert j0["n"] == 12 and j0["n_alone"] == 5 and j0["n_shared"] == 7
    assert j0["median_shared"] == pytest.approx(0.4) and j1["median_shared"] == pytest.approx(0.5)
    assert (j0["max_boost"], j0["raises"]) == (2, 2)
    up = st["uplink"]
    assert up["AB"] == pytest.approx(0.8, rel=1e-3) and up["BA"] == pytest.approx(0.4, rel=1e-3)
    assert up["share"]["job0"] == pytest.approx(0.6, rel=1e-3)
    assert up["share"]["job1"] == pytest.approx(0.4, rel=1e-3)
    # S per job and direction, in frames of the uplink's MTU (1514 bytes per 1448 at 1500)
    assert st["floor"] == pytest.approx(2 * 25_324_584 * 1514 / 1448 * 8 / 1e9)
    assert report.cluster_run_stats(_run("spec", 0, 0.4, 0.5, arb=True), mtu=0)["floor"] == \
        pytest.approx(2 * 25_324_584 * 8 / 1e9)
    c0, c1 = st["cores"]["cpu0"], st["cores"]["cpu1"]
    assert (c0["busy"], c0["user"], c0["system"], c0["interrupt"]) == pytest.approx(
        (0.8, 0.6, 0.1, 0.1), abs=0.01)
    assert (c1["busy"], c1["interrupt"]) == pytest.approx((0.2, 0.0), abs=0.01)
    old = _run("spec", 0, 0.4, 0.5, arb=True)       # a record from before the core counters
    for smp in old["uplink_samples"]:
        del smp["cpu"]
    assert report.cluster_run_stats(old)["cores"] is None


def test_proc_stat_per_core_counters():
    text = ("cpu  10 1 5 100 2 0 3 0 0 0\ncpu0 4 1 2 50 1 0 2 0 0 0\n"
            "cpu1 6 0 3 50 1 0 1 0 0 0\nintr 123 4\nctxt 99\n")
    assert testbed.parse_proc_stat(text) == {"cpu0": [4, 1, 2, 50, 1, 0, 2, 0],
                                             "cpu1": [6, 0, 3, 50, 1, 0, 1, 0]}
    assert set(testbed.cpu_jiffies()) >= {"cpu0"}          # this machine's /proc/stat


def test_summary_ratios_against_hvd_of_the_same_repeat_and_report(tmp_path, monkeypatch):
    res = _results()
    rows, jrows = report.cluster_summarize(res)
    by = {r["variant"]: r for r in rows}
    assert by["hvd"]["speedup"] == pytest.approx(1.0)
    assert by["spec"]["speedup"] == pytest.approx(0.5 / 0.45)
    assert by["spec"]["worst_job_change"] == pytest.approx(0.0, abs=1e-9)
    assert (by["spec"]["runs_ok"], by["spec"]["runs"]) == (2, 3)
    assert (by["spec"]["grants"], by["spec"]["grants_waited"]) == (100, 50)
    assert by["spec"]["wait_per_step_s"] == pytest.approx(0.6 / 12)
    j = {(x["variant"], x["job"]): x for x in jrows}
    assert j[("spec", "job0")]["vs_hvd"] == pytest.approx(0.5 / 0.4)
    assert j[("spec", "job0")]["median_alone"] == pytest.approx(0.4)
    md = report.cluster_markdown(res)
    assert "| spec | arb + arb@2s | 0.400 / 0.500 | 0.450 |" in md
    assert "| comm floor s/step (wire bytes at MTU 1500) |" in md       # the uplink's frames
    assert "| comm floor s/step (wire bytes at MTU 9000) |" in report.cluster_markdown(
        dict(res, meta=dict(res["meta"], mtu=9000)))                   # as the run recorded
    assert "1.11×" in md and "80% / 40%" in md and "50/100" in md and "| 60% |" in md
    assert "| 1.11× (1.11–1.11) |" in md     # median, then the per-repeat spread
    assert "| 1.00× |" in md                  # the baseline row has no spread
    assert "git abc1234" in md and "transport gloo" in md
    assert "| spec | cpu0 | 80% | 6" in md and "| hvd | cpu0 | 80% | 60% | 10% | 10% |" in md
    assert "| hvd | cpu1 | 20% | 20% | 0% | 0% |" in md
    assert "Failed (spec-r2): job job1 (prio) exited" in md
    assert "1-min load average" in md
    (tmp_path / "results.json").write_text(json.dumps(res))
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)      # no root needed
    assert cluster.main(["--report-only", "--out", str(tmp_path)]) == 0
    for name in ("results.md", "steps.png", "link.png", "boost.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert results_io.load(tmp_path) == results_io.compact(res)     # rewritten, compact


def test_arbiter_environment_of_arb_jobs_only():
    a = cluster.parse_args(["--job", "arb,class=2", "--job", "arb", "--job", "prio"])
    jobs = cluster.make_jobs(a.job, a)
    envs = [cluster.arbiter_env(j, "10.77.1.2:4000", "/tmp/x/secret") for j in jobs]
    assert envs[0] == {"HOROVOD_PRIO_ARBITER": "10.77.1.2:4000", "HOROVOD_PRIO_LINK": "uplink",
                       "HOROVOD_PRIO_ARBITER_SECRET_FILE": "/tmp/x/secret",
                       "HOROVOD_PRIO_JOB_ID": "job0", "HOROVOD_PRIO_JOB_PRIORITY": "2"}
    assert "HOROVOD_PRIO_JOB_PRIORITY" not in envs[1] and envs[1]["HOROVOD_PRIO_JOB_ID"] == "job1"
    assert envs[2] == {}
