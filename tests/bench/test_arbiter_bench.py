"""benchmarks.arbiter_bench: argument validation, plan, trace parsing and the
report from a fixture. No network, no processes (behaviour only, < 10 s)."""
import json

import pytest

from benchmarks import arbiter_bench as ab
from benchmarks import results_io, traces


def _err(capsys, argv):
    with pytest.raises(SystemExit) as e:
        ab.parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_defaults():
    a = ab.parse_args([])
    assert a.configs == ["hvd", "prio", "arb", "burst"]
    assert (a.rate, a.batch, a.repeats, a.arbiter_credit) == ("2gbit", 512, 3, 8 << 20)
    assert str(a.host_addr) == "169.254.77.1/30" and str(a.ns_addr) == "169.254.77.2/30"


@pytest.mark.parametrize("argv, needle", [
    (["--configs", "hvd,foo"], "hvd, prio, arb"),
    (["--configs", "hvd,hvd"], "duplicate"),
    (["--host-addr", "10.0.0.1/30"], "link-local"),
    (["--host-addr", "169.254.77.1"], "prefix"),
    (["--ns-addr", "169.254.78.2/30"], "same subnet"),
    (["--ns-addr", "169.254.77.1/30"], "same subnet"),
    (["--arbiter-credit", "lots"], "4MiB"),
    (["--rate", "fast"], "rate must be a rate > 0 in bits/s"),
    (["--repeats", "0"], "integer >= 1"),
    (["--prio-env", "FOO=1"], "HOROVOD_PRIO_"),
    (["--starvation-bound", "-1"], "--starvation-bound"),
    (["--arbiter-timeout", "0"], "--arbiter-timeout"),
    (["--arbiter-cpus", "one"], "--arbiter-cpus"),
])
def test_bad_arguments_named(capsys, argv, needle):
    assert needle in _err(capsys, argv)


def test_plan_interleaved_and_rotated():
    runs = ab.plan(["hvd", "prio", "arb"], 3)
    assert [r["repeat"] for r in runs] == [0] * 3 + [1] * 3 + [2] * 3
    orders = [[r["config_name"] for r in runs if r["repeat"] == k] for k in range(3)]
    assert orders == [["hvd", "prio", "arb"], ["prio", "arb", "hvd"], ["arb", "hvd", "prio"]]


def test_union_length():
    assert traces.union_length([]) == 0
    assert traces.union_length([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)


def _trace(tmp_path, name, spans):
    evs = [{"name": "process_name", "ph": "M", "pid": 0, "args": {}}]
    for cat, tid, t0, t1 in spans:
        evs.append({"name": f"{tid} c", "ph": "X", "pid": 0, "tid": tid, "cat": cat,
                    "ts": t0 * 1e6, "dur": (t1 - t0) * 1e6})
    p = tmp_path / name
    p.write_text(json.dumps(evs))
    return p


def test_trace_summary_and_inflight(tmp_path):
    t = 1_700_000_000.0
    p0 = _trace(tmp_path, "job0.trace.json", [
        ("arbiter", "arbiter", t + 0.0, t + 0.010), ("arbiter", "arbiter", t + 1.0, t + 1.030),
        ("arbiter", "arbiter", t + 9.0, t + 9.5),            # outside the window
        ("chunk", "allreduce", t + 1.0, t + 2.0), ("chunk", "wait", t + 0, t + 5)])
    p1 = _trace(tmp_path, "job1.trace.json", [("chunk", "allreduce", t + 1.5, t + 3.0)])
    s = traces.trace_summary(p0, (t - 1, t + 5))
    assert s["chunks"] == 2 and s["wait_total_s"] == pytest.approx(0.040)
    assert s["wait_max_ms"] == pytest.approx(30.0) and s["wait_union_s"] == pytest.approx(0.040)
    # the time a released chunk was in flight (allreduce spans, not the gate's waits)
    assert s["allreduce_chunks"] == 1 and s["allreduce_union_s"] == pytest.approx(1.0)
    s1 = traces.trace_summary(p1, (t, t + 4))
    assert s1["chunks"] == 0 and s1["allreduce_union_s"] == pytest.approx(1.5)
    assert traces.inflight_fraction([p0, p1], (t, t + 4)) == pytest.approx(0.5)
    assert traces.trace_summary(tmp_path / "missing.json", None) is None


def _run(cfg, rep, meds, busy_bytes, arbiter=False):
    t0 = 1_700_000_000.0 + 100 * rep
    jobs = []
    for i, m in enumerate(meds):
        steps = [{"step": k, "t_start": t0 + k * m, "t_end": t0 + (k + 1) * m, "warmup": k < 1}
                 for k in range(12)]
        jobs.append({"name": f"job{i}", "impl": "horovod" if cfg == "hvd" else "prio",
                     "steps": steps, "meta": {"grad_bytes": 25_324_584, "size": 2, "model": "mlp"},
                     "events": [], "trace_events": []})
    r = {"config_name": cfg, "repeat": rep, "label": f"{cfg}-r{rep}", "scenario": "arb",
         "rate": "2gbit", "batch": 512, "config": [j["impl"] for j in jobs], "arbiter": arbiter,
         "status": "ok", "error": None, "jobs": jobs, "t_go": t0, "notes": [],
         "link_samples": [[t0, 0], [t0 + 20, busy_bytes]],
         "loadavg_before": 4.0, "loadavg_after": 5.0}
    if arbiter:
        r["arbiter_waits"] = {"job0": {"chunks": 10, "wait_total_s": 0.5, "wait_union_s": 0.2, "wait_median_ms": 2.0,
                                       "wait_max_ms": 9.0},
                              "job1": {"chunks": 10, "wait_total_s": 0.3, "wait_median_ms": 1.0,
                                       "wait_max_ms": 5.0}}
        r["arbiter_stats"] = {"links": {"shared": {"grants": 200, "waits": 40}}}
        r["chunks_inflight"] = 0.8
    return r


def test_summary_and_markdown_from_fixture(tmp_path, monkeypatch):
    plotted = []
    monkeypatch.setattr(ab.report, "plot", lambda res, path: plotted.append(res))  # no matplotlib
    runs = []
    for rep in range(3):
        runs.append(_run("hvd", rep, [0.45, 0.45], 4e9))
        runs.append(_run("prio", rep, [0.5, 0.5], 4e9))
        runs.append(_run("arb", rep, [0.36, 0.4], 4.5e9, arbiter=True))
    runs.append(dict(_run("arb", 3, [1, 1], 0, True), status="failed",
                     error="job job0 (prio) exited with status 1: boom\nlog"))
    res = {"meta": {"command": "python -m benchmarks.arbiter_bench", "configs": ["hvd", "prio", "arb"],
                    "ncpu": 2, "rate": "2gbit", "batch": 512, "model": "mlp", "repeats": 3},
           "runs": runs}
    rows = {r["config"]: r for r in ab.summarize(res)}
    assert rows["hvd"]["speedup"] == pytest.approx(1.0)
    assert rows["arb"]["speedup"] == pytest.approx(0.45 / 0.38, rel=1e-5)
    assert rows["arb"]["worst_job_change"] == pytest.approx(0.4 / 0.45 - 1, abs=1e-5)
    assert rows["prio"]["worst_job_change"] == pytest.approx(0.5 / 0.45 - 1, abs=1e-5)
    assert rows["arb"]["runs_ok"] == 3 and rows["arb"]["runs"] == 4
    assert rows["arb"]["link_busy"] == pytest.approx(4.5e9 * 8 / (2e9 * 20))
    md = ab.markdown(res)
    assert "| prio+prio + arbiter | 0.360 | 0.400 | 0.380 |" in md
    assert "| comm floor s/step (wire bytes at MTU 65536) |" in md     # the shaped lo's frames
    assert "1.18×" in md and "40/200" in md and "80%" in md
    assert "Failed (arb-r3): job job0 (prio) exited with status 1: boom" in md
    ab.write_report(res, tmp_path)
    assert results_io.load(tmp_path)["runs"][0]["config_name"] == "hvd"
    assert (tmp_path / "results.md").read_text().startswith("Command:")
    # the plot gets repeat 0 of each config, the arbiter named in the title's config
    assert [r["config"] for r in plotted[0]["runs"]] == [
        ["horovod", "horovod"], ["prio", "prio"], ["prio", "prio + arbiter"]]


def test_step_breakdown(tmp_path):
    t = 1_700_000_000.0
    evs = []
    for k in range(3):
        s = t + k
        evs.append({"name": f"step {k}", "ph": "X", "cat": "step", "tid": "steps",
                    "ts": s * 1e6, "dur": 0.9e6})
        for kind, dt in (("ready", 0.5), ("ready", 0.55), ("done", 0.7), ("done", 0.8)):
            evs.append({"name": f"{kind} c", "ph": "i", "cat": "chunk", "tid": "chunks",
                        "ts": (s + dt) * 1e6, "args": {"kind": kind}})
    p = tmp_path / "job0.trace.json"
    p.write_text(json.dumps(evs))
    b = traces.step_breakdown(p, (t + 0.5, t + 3))          # step 0 starts before the window
    assert b["steps"] == 2
    assert b["compute_s"] == pytest.approx(0.5) and b["comm_s"] == pytest.approx(0.3)


def test_report_only_needs_no_root(tmp_path, monkeypatch):
    monkeypatch.setattr(ab.report, "plot", lambda res, path: None)
    res = {"meta": {"configs": ["hvd", "arb"], "ncpu": 2}, "runs": [
        _run("hvd", 0, [0.45, 0.45], 4e9), _run("arb", 0, [0.4, 0.4], 4e9, arbiter=True)]}
    (tmp_path / "results.json").write_text(json.dumps(res))
    monkeypatch.setattr(ab.os, "geteuid", lambda: 1000)
    assert ab.main(["--report-only", "--out", str(tmp_path)]) == 0
    assert "| prio+prio + arbiter | 0.400 | 0.400 | 0.400 |" in (tmp_path / "results.md").read_text()
