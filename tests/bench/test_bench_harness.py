"""Behaviour of the emulated-link benchmark harness (benchmarks/), never speed."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import harness, netns, report, results_io, run, workload
from benchmarks.netns import HarnessError, ShapedLink
from stack_required import needs, stack_missing

REPO = Path(__file__).resolve().parents[2]


def _ip_netns_usable():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


needs_netns = needs(_ip_netns_usable(), "needs root and a working `ip netns` + tc")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------ no root
def test_clear_error_without_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(HarnessError, match="needs root"):
        netns.require_root()
    with pytest.raises(HarnessError, match="needs root"):
        ShapedLink("1gbit").create()
    assert run.main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert "needs root" in err and "ip netns" in err


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize("argv, flag", [
    (["--rate", "fast"], "--rate"),
    (["--rate", "0gbit"], "--rate"),
    (["--repeats", "0"], "--repeats"),
    (["--scenario", "z"], "--scenario"),
    (["--batches", "8,0"], "--batches"),
    (["--rates", "1gbit,x"], "--rates"),
    (["--delay", "5"], "--delay"),
    (["--prio-env", "FOO=1"], "--prio-env"),
    (["--steps", "-3"], "--steps"),
    (["--priority", "high"], "--priority"),
    (["--priority", "3"], "--priority"),
    (["--impls", "horovod,mpi"], "--impls"),
    (["--pin", "core"], "--pin"),
    (["--control", "prio"], "--control"),
    (["--control", "a b"], "--control"),
    (["--variant", "off=HOROVOD_PRIO_ENABLED=0", "--control", "off"], "--control"),
])
def test_bad_arguments_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        run.parse_args(argv)
    assert e.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_workload_arguments(capsys):
    with pytest.raises(SystemExit):
        workload.parse_args(["--impl", "horovod", "--out", "x", "--priority", '{"num_groups": 2}'])
    assert "argument --priority" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        workload.parse_args(["--impl", "tf", "--out", "x"])
    assert "argument --impl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        workload.parse_args(["--impl", "prio", "--out", "x", "--batch", "0"])
    assert "argument --batch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        workload.parse_args(["--impl", "prio", "--out", "x", "--priority", "2"])
    assert "argument --priority" in capsys.readouterr().err
    a = workload.parse_args(["--impl", "prio", "--out", "x", "--priority", '{"num_groups": 2}'])
    assert a.priority == {"num_groups": 2}
    with pytest.raises(SystemExit):
        workload.parse_args(["--impl", "horovod", "--out", "x", "--nice", "20"])
    assert "argument --nice" in capsys.readouterr().err
    assert workload.parse_args(["--impl", "horovod", "--out", "x", "--nice", "10"]).nice == 10


def test_shaped_link_validates_values():
    with pytest.raises(ValueError, match="rate"):
        ShapedLink("fast")
    with pytest.raises(ValueError, match="delay"):
        ShapedLink("1gbit", delay="soon")
    with pytest.raises(ValueError, match="burst"):
        ShapedLink("1gbit", burst="lots")


def test_defaults_and_plan_interleave():
    a = run.parse_args(["--quick"])
    assert (a.scenario, a.repeats) == ("ab", 1)
    a = run.parse_args(["--scenario", "b", "--repeats", "3"])
    runs = run.plan(a, prio_ok=True)
    assert [r["repeat"] for r in runs] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert runs[0]["config"] != runs[3]["config"]        # order rotates per repeat
    skipped = [r for r in run.plan(a, prio_ok=False) if r["skip"]]
    assert skipped and all("prio" in r["config"] for r in skipped)


def test_a_control_is_plain_horovod_under_another_name(tmp_path, monkeypatch):
    a = run.parse_args(["--scenario", "c", "--rates", "1gbit", "--batches", "32",
                        "--impls", "horovod,aa,prio", "--control", "aa", "--priority",
                        '{"num_groups": 2}', "--prio-env", "HOROVOD_PRIO_NUM_GROUPS=3"])
    runs = run.plan(a, prio_ok=False)             # no horovod_prio: the control still runs
    by_cfg = {tuple(r["config"]): r["skip"] for r in runs}
    assert by_cfg == {("horovod", "horovod"): None, ("aa", "aa"): None,
                      ("prio", "prio"): "prio-unavailable"}
    seen = {}

    def fake_run_jobs(link, jobs, workdir, *args, **kw):
        seen[workdir.name] = jobs
        return {}

    class Link:
        def __init__(self, *a, **kw): pass
        def create(self): pass
        def qdisc(self): return ""
        def cleanup(self): pass

    monkeypatch.setattr(run, "run_jobs", fake_run_jobs)
    monkeypatch.setattr(run, "ShapedLink", Link)
    for r in run.plan(a, prio_ok=True):
        run.execute_run(r, a, tmp_path, None)
    jobs = {name.split("-")[1]: js for name, js in seen.items()}
    assert set(jobs) == {"hvd+hvd", "aa+aa", "prio+prio"}
    for j in jobs["aa+aa"] + jobs["hvd+hvd"]:
        assert (j.impl, j.priority, j.env) == ("horovod", None, {})
    for j in jobs["prio+prio"]:
        assert j.impl == "prio" and j.priority == '{"num_groups": 2}'
        assert j.env == {"HOROVOD_PRIO_NUM_GROUPS": "3"}


def _fake_sweep(monkeypatch, executed):
    """run.main with the machine parts replaced: every run 'executes' instantly."""
    monkeypatch.setattr(run, "preflight", lambda tag: True)
    monkeypatch.setattr(run, "check_prio_available", lambda: (True, None))
    monkeypatch.setattr(netns, "cleanup_stale", lambda: [])

    template = _fixture_results()["runs"][0]              # one job, ok, with steps

    def execute(r, args, workroot, progress):
        executed.append(run.run_key(r))
        rec = {k: v for k, v in template.items() if k != "_stats"}
        return dict(rec, **r, label=str(run.run_key(r)), status="ok", error=None)
    monkeypatch.setattr(run, "execute_run", execute)


def test_resume_runs_only_what_an_interrupted_sweep_left(tmp_path, monkeypatch, capsys):
    argv = ["--scenario", "s", "--batches", "32,64", "--rates", "1gbit", "--repeats", "2",
            "--steps", "3", "--out", str(tmp_path)]
    executed = []
    _fake_sweep(monkeypatch, executed)
    assert run.main(argv) == 0
    first = results_io.load(tmp_path)
    assert len(executed) == 8
    # interrupted after 5 runs, the last of them failed
    first["runs"] = first["runs"][:5]
    first["runs"][4]["status"] = "failed"
    results_io.save(tmp_path, first)
    executed.clear()
    assert run.main(argv + ["--resume"]) == 0
    keys = [run.run_key(r) for r in run.plan(run.parse_args(argv), prio_ok=True)]
    assert executed == keys[4:]                  # the failed run and the three never run
    done = results_io.load(tmp_path)
    assert [run.run_key(r) for r in done["runs"]] == keys
    assert all(r["status"] == "ok" for r in done["runs"])
    meta = done["meta"]
    assert (meta["date"], meta["git"], meta["command"]) == (
        first["meta"]["date"], first["meta"]["git"], first["meta"]["command"])
    assert [x["runs_kept"] for x in meta["resumed"]] == [4]
    assert "resumed with --resume" in report.markdown(done)


@pytest.mark.parametrize("change, why", [
    (None, "does not exist"),
    (["--repeats", "3"], "different command"),
    ("garbage", "not a benchmarks.run results file"),
])
def test_resume_refuses_what_it_cannot_finish(tmp_path, monkeypatch, capsys, change, why):
    argv = ["--scenario", "s", "--batches", "32", "--rates", "1gbit", "--repeats", "2",
            "--steps", "3", "--out", str(tmp_path)]
    executed = []
    _fake_sweep(monkeypatch, executed)
    if change == "garbage":
        (tmp_path / "results.json").write_text("{")
    elif change is not None:
        assert run.main(argv) == 0
        argv = argv[:-2] + change + argv[-2:]
    executed.clear()
    assert run.main(argv + ["--resume"]) == 2
    assert why in capsys.readouterr().err and executed == []


def test_job_command_uses_gloo_on_lo(tmp_path):
    if shutil.which("horovodrun") is None and not (Path(sys.executable).parent / "horovodrun").exists():
        stack_missing("horovodrun not installed")
    cmd = harness.job_command(harness.JobSpec(name="job0", impl="prio", priority='{"step": 2}'),
                              tmp_path)
    s = " ".join(cmd)
    assert "--gloo --network-interface lo -np 2 -H localhost:2" in s
    assert "--impl prio" in s and '--priority {"step": 2}' in s
    cmd = harness.job_command(harness.JobSpec(name="job0", impl="horovod",
                                              priority='{"step": 2}'), tmp_path)
    assert "--priority" not in cmd


# ------------------------------------------------------------------ namespaces
@needs_netns
@pytest.mark.timeout(30)
def test_netns_create_shape_and_cleanup(tmp_path):
    link = ShapedLink("250mbit")
    try:
        link.create()
        assert link.exists()
        q = link.qdisc()
        assert "tbf" in q and "250Mbit" in q
        pidfile = tmp_path / "pid"
        # a child that escapes our process group (like horovodrun's workers)
        link.popen(["sh", "-c", f"setsid sleep 300 </dev/null >/dev/null 2>&1 & "
                                f"echo $! > {pidfile}; sleep 300"])
        deadline = time.time() + 5
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.time() < deadline:
            time.sleep(0.05)
        escaped = int(pidfile.read_text())
        assert escaped in netns.namespace_pids(link.name)
    finally:
        link.cleanup()
    assert not link.exists()
    assert link.name not in netns.list_namespaces()
    time.sleep(0.2)
    assert not _alive(escaped)
    link.cleanup()  # idempotent


@needs_netns
@pytest.mark.timeout(30)
def test_stale_namespace_with_our_prefix_is_removed():
    name = f"{netns.PREFIX}999999999-0"           # creator pid can never be alive
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in netns.cleanup_stale()
        assert name not in netns.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@needs_netns
@pytest.mark.timeout(30)
def test_cleanup_after_failing_job(tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    # a "job" that leaves an escaped child behind and then fails
    monkeypatch.setattr(harness, "job_command", lambda job, wd: [
        "sh", "-c", f"setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > {pidfile}; "
                    "echo boom-from-job; sleep 0.3; exit 3"])
    link = ShapedLink("1gbit")
    try:
        link.create()
        with pytest.raises(harness.RunFailed, match="status 3") as e:
            harness.run_jobs(link, [harness.JobSpec(name="job0", impl="horovod")],
                             tmp_path / "w", 20)
        assert "boom-from-job" in str(e.value)
    finally:
        link.cleanup()
    assert link.name not in netns.list_namespaces()
    time.sleep(0.2)
    assert not _alive(int(pidfile.read_text()))


@needs_netns
@pytest.mark.timeout(30)
def test_job_that_does_not_exit_after_its_steps_is_killed(tmp_path, monkeypatch):
    w = tmp_path / "w"

    def fake(job, wd):
        p = wd / job.name
        return ["sh", "-c", f"echo '{{\"step\": 0, \"t_start\": 1, \"t_end\": 2, \"warmup\": true}}' "
                            f"> {p}.steps.jsonl; touch {p}.ready; "
                            f"while [ ! -e {wd}/go ]; do sleep 0.05; done; "
                            f"echo '{{\"step\": 1, \"t_start\": 3, \"t_end\": 4}}' >> {p}.steps.jsonl; "
                            "sleep 300"]
    monkeypatch.setattr(harness, "job_command", fake)
    link = ShapedLink("1gbit")
    try:
        link.create()
        res = harness.run_jobs(link, [harness.JobSpec(name="job0", impl="horovod", steps=1,
                                                      warmup=1)], w, 20, exit_grace=1.0)
        assert res["notes"] and "did not exit" in res["notes"][0]
        assert [s["step"] for s in res["jobs"][0]["steps"]] == [0, 1]
        assert netns.namespace_pids(link.name) == []
    finally:
        link.cleanup()


_CHILD = """
import sys, time
from benchmarks.netns import ShapedLink, install_signal_handlers
install_signal_handlers()
link = ShapedLink('1gbit')
try:
    link.create()
    p = link.popen(['sh', '-c', 'setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; sleep 300'],
                   stdout=__import__('subprocess').PIPE, text=True)
    print(link.name, p.stdout.readline().strip(), flush=True)
    time.sleep(60)
finally:
    link.cleanup()
"""


@needs_netns
@pytest.mark.timeout(40)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_cleans_up(sig):
    p = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=str(REPO), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        name, pid = p.stdout.readline().split()
        assert name in netns.list_namespaces()
        p.send_signal(sig)
        p.wait(timeout=20)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert name not in netns.list_namespaces()
    time.sleep(0.2)
    assert not _alive(int(pid))


def _horovod_ready():
    hr = Path(sys.executable).parent / "horovodrun"
    if not hr.exists():
        return False
    return subprocess.run([sys.executable, "-c", "import horovod.tensorflow.keras"],
                          capture_output=True, timeout=120).returncode == 0


@needs_netns
@pytest.mark.timeout(150)
def test_real_horovod_job_failure_is_reported_and_cleaned(tmp_path):
    if not _horovod_ready():
        stack_missing("horovod with TensorFlow not installed in this interpreter's venv")
    link = ShapedLink("1gbit")
    job = harness.JobSpec(name="job0", impl="horovod", batch=8, steps=3, warmup=1, cpus="0",
                      extra_args=["--fail-at-step", "1"])
    try:
        link.create()
        with pytest.raises(harness.RunFailed, match="exited with status"):
            harness.run_jobs(link, [job], tmp_path, timeout=120)
    finally:
        link.cleanup()
    assert link.name not in netns.list_namespaces()


# ------------------------------------------------------------------ report
def _fixture_results():
    def job(name, impl, step_s, t0, n=10, events=(), trace=()):
        steps = [{"step": i, "t_start": t0 + i * step_s, "t_end": t0 + (i + 1) * step_s,
                  "warmup": i < 2} for i in range(n)]
        return {"name": name, "impl": impl, "model": "mlp", "batch": 32, "steps": steps,
                "meta": {"model": "mlp", "grad_bytes": 25_324_584, "size": 2,
                         "t_process_start": t0 - 5},
                "events": [{"t": t0 + t, "msg": m} for t, m in events],
                "trace_events": [{"ts_us": ts, "name": k, "cat": "policy", "args": {"boost": b}}
                                 for ts, k, b in trace]}

    def log(batch, kind, boost):
        return (f"horovod_prio: DistributedSGD batch {batch} {kind}: time 0.8000s min 0.6000s "
                f"threshold 0.6600s count 1 boost {boost} priorities [0, 1, 2, 3]")

    def link(t0, secs, rate_bps, busy):
        return [[t0 + s, int(s * rate_bps * busy / 8)] for s in range(int(secs) + 2)]

    t = 1_700_000_000.0
    runs = []
    for rep in range(2):
        runs += [
            {"scenario": "a", "config": ["horovod"], "rate": "1gbit", "batch": 32, "repeat": rep,
             "status": "ok", "t_go": t, "jobs": [job("job0", "horovod", 0.45, t)],
             "link_samples": link(t, 6, 1e9, 0.9)},
            {"scenario": "a", "config": ["prio"], "rate": "1gbit", "batch": 32, "repeat": rep,
             "status": "ok", "t_go": t, "jobs": [job("job0", "prio", 0.45 + 0.05 * rep, t)],
             "link_samples": link(t, 6, 1e9, 0.9)},
            {"scenario": "b", "config": ["horovod", "horovod"], "rate": "1gbit", "batch": 32,
             "repeat": rep, "status": "ok", "t_go": t,
             "jobs": [job("job0", "horovod", 0.8, t), job("job1", "horovod", 0.8, t + 0.1)],
             "link_samples": link(t, 10, 1e9, 0.95)},
            {"scenario": "b", "config": ["prio", "prio"], "rate": "1gbit", "batch": 32,
             "repeat": rep, "status": "ok", "t_go": t,
             "jobs": [job("job0", "prio", 0.6, t, n=14,
                          events=[(1.0, log(3, "within", 0)), (2.0, log(4, "slow", 1)),
                                  (3.0, log(6, "within", 1)), (4.0, log(8, "decay", 0))]),
                      # trace clock relative to the process start (t - 5)
                      job("job1", "prio", 0.7, t, n=14,
                          trace=[(6.0e6, "slow", 0), (7.0e6, "slow", 1), (8.5e6, "decay", 0)])],
             "link_samples": link(t, 10, 1e9, 0.97)},
        ]
    runs.append({"scenario": "b", "config": ["horovod", "prio"], "rate": "1gbit", "batch": 32,
                 "repeat": 0, "status": "failed", "error": "job job1 (prio) exited with status 1\n.."})
    return {"meta": {"command": "python -m benchmarks.run --quick", "date": "2026-01-01",
                     "ncpu": 2, "pin": "job", "threads": 1, "model": "mlp", "steps": 8,
                     "warmup": 2, "repeats": 2, "prio_available": True}, "runs": runs}


def test_report_from_fixture_json(tmp_path):
    src = tmp_path / "results.json"
    src.write_text(json.dumps(_fixture_results()))
    out = tmp_path / "out"
    assert report.main([str(src), "--out", str(out)]) == 0
    md = (out / "results.md").read_text()
    assert "| scen | link |" in md
    assert "| a | 1gbit | mlp, 32 | hvd |" in md
    assert "| b | 1gbit | mlp, 32 | prio+prio | 0.600 | 0.700 | 0.650 |" in md
    assert "1.23×" in md                       # 0.8 / 0.65 within the same repeat
    # the spread of the per-repeat ratios beside their median: 0.45/0.45 and 0.45/0.50
    assert "| a | 1gbit | mlp, 32 | prio | 0.475 | – | 0.475 | 0.406 | 0.95× (0.90–1.00) |" in md
    assert "| a | 1gbit | mlp, 32 | hvd | 0.450 | – | 0.450 | 0.406 | 1.00× |" in md
    assert "failed: job job1 (prio) exited with status 1" in md
    # the comm floor in wire bytes at lo's MTU: 2 * 25.3 MB * 65550/65484 * 8 / 1 Gbit/s
    assert "| comm floor s/step (wire bytes at MTU 65536) |" in md
    png = (out / "steps.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 300_000


def test_report_stats_window_and_events():
    res = _fixture_results()
    r = [x for x in res["runs"] if x["config"] == ["prio", "prio"]][0]
    st = report.run_stats(r)
    lo, hi = st["window"]
    assert lo == pytest.approx(r["jobs"][1]["steps"][2]["t_start"])  # job1 starts measuring last
    assert hi == pytest.approx(r["jobs"][0]["steps"][-1]["t_end"])     # job0 ends first
    assert st["link_busy"] == pytest.approx(0.97, abs=0.01)
    t = r["t_go"]
    ev = report.job_events(r["jobs"][0])                               # from logger records
    assert [(round(x - t, 3), k) for x, k in ev] == [(2.0, "raise"), (4.0, "decay")]
    ev = report.job_events(r["jobs"][1])                               # from the Chrome trace
    assert [(round(x - t, 3), k) for x, k in ev] == [(2.0, "raise"), (3.5, "decay")]


def test_shaped_links_and_testbeds_left_live_are_cleaned_up_at_exit(tmp_path):
    """The one exit clean-up of netns and testbed: at interpreter exit every
    live object's cleanup() runs once, one failing does not stop the others."""
    code = f"""
import pathlib
from benchmarks import netns, testbed
out = pathlib.Path({str(tmp_path)!r})
class Obj:
    def __init__(self, name, fail=False):
        self.name, self.fail = name, fail
    def cleanup(self):
        (out / self.name).write_text("x")
        if self.fail:
            raise RuntimeError("boom")
objs = [Obj("link", fail=True), Obj("bed")]
netns._live_links.add(objs[0])
testbed._live.add(objs[1])
extra = netns.cleaned_up_at_exit()
objs.append(Obj("extra", fail=True))
objs.append(Obj("extra2"))
extra.add(objs[2]); extra.add(objs[3])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=str(Path(netns.__file__).parents[1]))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bed", "extra", "extra2", "link"]
