"""Result files: compact in the tree, the same report numbers as the full record."""
import copy
import gzip
import json
import random
import subprocess

import pytest

from benchmarks import report, results_io

T0 = 1_800_000_000.0


def _walk(n, seed):
    """A counter that grows unevenly (so interpolating from other samples gives other values)."""
    rnd, x, out = random.Random(seed), 0, []
    for _ in range(n):
        x += rnd.randint(0, 10_000_000)
        out.append(x)
    return out


def _job(name, hosts, start, n, dt):
    steps = [{"step": i, "t_start": T0 + start + i * dt, "t_end": T0 + start + (i + 1) * dt - 0.01,
              "warmup": i < 2} for i in range(n)]
    return {"name": name, "label": name, "impl": "horovod", "hosts": hosts, "steps": steps,
            "meta": {"grad_bytes": 1_000_000, "size": 2}, "events": [], "trace_events": []}


def cluster_run(nsamples=400):
    c = {k: _walk(nsamples, k) for k in range(8)}
    samples = [{"t": T0 - 1 + 0.1 * i, "AB": c[0][i], "BA": c[1][i],
                "hosts": {"a1": [c[2][i], 0], "b1": [c[3][i], 0], "a2": [c[4][i], 0],
                          "b2": [c[5][i], 0]},
                "cpu": {"cpu0": [c[6][i], 0, 0, c[7][i], 0, 0, 0, 0],
                        "cpu1": [c[7][i], 0, 0, c[6][i], 0, 0, 0, 0]}}
               for i in range(nsamples)]
    return {"variant": "hvd", "repeat": 0, "status": "ok", "rate": "1gbit", "t_go": T0,
            "jobs": [_job("job0", ["a1", "b1"], 0.0, 30, 0.5), _job("job1", ["a2", "b2"], 3.3, 20, 0.7)],
            "uplink_samples": samples, "_stats": {"cached": 1}}


def bench_run(nsamples=300):
    c = _walk(nsamples, 9)
    return {"scenario": "b", "config": ["horovod", "horovod"], "rate": "1gbit", "batch": 32,
            "repeat": 0, "status": "ok",
            "jobs": [_job("job0", [], 0.0, 40, 0.4), _job("job1", [], 1.1, 35, 0.4)],
            "link_samples": [[T0 - 1 + 0.1 * i, c[i]] for i in range(nsamples)]}


def test_the_report_reads_the_same_numbers_from_the_compact_record():
    raw = {"meta": {"command": "x"}, "runs": [cluster_run(), bench_run()]}
    small = results_io.compact(copy.deepcopy(raw))
    rc, sc = raw["runs"][0], small["runs"][0]
    assert len(sc["uplink_samples"]) < len(rc["uplink_samples"]) / 4
    assert "_stats" not in sc and sc[results_io.TRIMMED] is True
    a, b = report.cluster_run_stats(rc), report.cluster_run_stats(sc)
    assert a["uplink"] is not None and a["cores"] is not None
    assert (a["uplink"], a["cores"]) == (b["uplink"], b["cores"])
    rb, sb = raw["runs"][1], small["runs"][1]
    assert len(sb["link_samples"]) < len(rb["link_samples"]) / 4
    assert report.run_stats(rb)["link_busy"] is not None
    assert report.run_stats(rb)["link_busy"] == report.run_stats(sb)["link_busy"]
    # jobs that never overlap: the union of their steps
    apart = cluster_run()
    apart["jobs"][1] = _job("job1", ["a2", "b2"], 18.0, 20, 0.7)
    a = report.cluster_run_stats(apart)
    assert a["window"] is None and a["uplink"] is not None
    assert a["uplink"] == report.cluster_run_stats(results_io.compact({"runs": [apart]})["runs"][0])["uplink"]
    # one job alone (no overlap window): the span of its steps
    solo = {"runs": [dict(bench_run(), jobs=bench_run()["jobs"][:1])]}
    assert (report.run_stats(solo["runs"][0])["link_busy"]
            == report.run_stats(results_io.compact(solo)["runs"][0])["link_busy"])


def test_compacting_twice_changes_nothing_and_short_runs_stay_whole():
    raw = {"runs": [cluster_run(), bench_run(), cluster_run(nsamples=results_io.PLOT_SAMPLES)]}
    once = results_io.compact(raw)
    assert results_io.compact(once) == once
    assert once["runs"][2]["uplink_samples"] == raw["runs"][2]["uplink_samples"]
    assert results_io.TRIMMED not in once["runs"][2]


def test_trim_keeps_the_pair_around_each_time_and_the_ends():
    samples = [[float(i), i] for i in range(1000)]
    kept = results_io.trim_samples(samples, {10.5, 500.0}, lambda s: s[0], keep=10)
    ts = [s[0] for s in kept]
    assert {0.0, 999.0, 10.0, 11.0, 499.0, 500.0} <= set(ts)
    assert ts == sorted(ts) and len(ts) <= 10 + 1 + 2 + 4


def test_save_writes_compact_and_raw_and_load_reads_any_form(tmp_path):
    raw = {"meta": {"command": "x"}, "runs": [cluster_run()]}
    (tmp_path / "results.json").write_text("{}")          # a stale plain file goes
    path = results_io.save(tmp_path, raw)
    assert path == tmp_path / "results.json.gz" and not (tmp_path / "results.json").exists()
    assert results_io.load(tmp_path) == results_io.compact(raw)
    assert results_io.load(path) == results_io.load(tmp_path / "results.json")
    assert json.loads(gzip.decompress((tmp_path / results_io.RAW).read_bytes())) == raw
    other = tmp_path / "plain"
    other.mkdir()
    (other / "results.json").write_text(json.dumps({"a": 1}))
    assert results_io.load(other) == {"a": 1}
    with pytest.raises(FileNotFoundError, match="no results.json.gz or results.json in"):
        results_io.load(tmp_path / "nowhere")


def test_compact_tree_then_check(tmp_path):
    from PIL import Image
    run = tmp_path / "cluster" / "r1"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"runs": [cluster_run()]}))
    (run / "trace.rank0.json").write_text(json.dumps({"traceEvents": []}))
    (run / "steps.csv").write_text("a,b\n" + "1,2\n" * 20_000)
    (run / "small.json").write_text(json.dumps({"x": 1}))
    Image.new("RGBA", (40, 30), (10, 200, 30, 255)).save(run / "link.png")
    assert len(results_io.not_compact(tmp_path)) == 5     # results.json twice: plain, untrimmed
    assert results_io.main(["check", str(tmp_path)]) == 1
    results_io.compact_tree(tmp_path, log=lambda *_: None)
    assert sorted(p.name for p in run.iterdir()) == [
        "link.png", "results.json.gz", "small.json", "steps.csv.gz", "trace.rank0.json.gz"]
    assert results_io.not_compact(tmp_path) == [] and results_io.main(["check", str(tmp_path)]) == 0
    with Image.open(run / "link.png") as im:
        assert im.mode == "P"
    assert results_io.read_json(run / "trace.rank0.json.gz") == {"traceEvents": []}
    # a run whose samples were not trimmed is caught
    results_io.save(run, {"runs": [cluster_run()]}, raw=False)
    (run / "results.json.gz").write_bytes(gzip.compress(json.dumps({"runs": [cluster_run()]}).encode()))
    assert [b for b in results_io.not_compact(tmp_path) if "not trimmed" in b]


def test_the_tree_is_stored_compactly():
    bad = results_io.not_compact(results_io.Path(report.__file__).resolve().parent.parent / "results")
    assert bad == [], "\n".join(bad[:10])


def test_git_ignores_the_raw_record():
    root = results_io.Path(report.__file__).resolve().parent.parent
    p = subprocess.run(["git", "check-ignore", "-q", "results/bench/x/results.raw.json.gz"], cwd=root,
                       timeout=30)
    assert p.returncode == 0
