"""benchmarks/aa.py, the A/A probe: its arguments, its plan and its statistics on
canned numbers (the measurement itself is not run here)."""
import re
import sys
from pathlib import Path

import pytest

from benchmarks import aa
from benchmarks.cgroups import Limits


def test_arguments_and_defaults():
    a = aa.parse_args([])
    assert (a.pairs, a.rate, a.model, a.batch, a.threads, a.inter_threads, a.pin,
            a.rank_cgroup) == (5, "1gbit", "mlp", 256, 1, None, "none", None)
    a = aa.parse_args(["--pairs", "7", "--threads", "2", "--inter-threads", "3", "--pin", "rank",
                       "--rank-cgroup", "custom,cpu=0.45,period=10ms", "--steps", "2"])
    assert (a.pairs, a.threads, a.inter_threads, a.pin, a.steps) == (7, 2, 3, "rank", 2)
    assert a.rank_cgroup == ("custom", Limits(cpu=0.45, period_us=10000))
    spec = aa.job_spec(a)
    assert (spec.impl, spec.threads, spec.inter_threads, spec.pin_rank, spec.cpus) == (
        "horovod", 2, 3, True, None)
    assert aa.job_spec(aa.parse_args(["--pin", "job"])).cpus == "0"
    assert aa.job_spec(aa.parse_args([])).pin_rank is False


@pytest.mark.parametrize("argv, needle", [
    (["--pairs", "0"], "--pairs: expected an integer >= 1"),
    (["--threads", "x"], "--threads"),
    (["--pin", "core"], "--pin: invalid choice"),
    (["--rate", "fast"], "--rate: rate must be a rate"),
    (["--rank-cgroup", "huge"], "--rank-cgroup: rank cgroup 'huge': unknown kind"),
    (["--rank-cgroup", "custom,cpu=0"], "cpu must be a finite number > 0"),
    (["--rank-cgroup", "custom"], "sets no limit"),
    (["--pin", "rank", "--rank-cgroup", "custom,cpuset=1"], "cpuset and --pin rank"),
    (["--pair-warmup", "-1"], "--pair-warmup: expected an integer >= 0, got -1"),
])
def test_bad_arguments_are_named(argv, needle, capsys):
    with pytest.raises(SystemExit):
        aa.parse_args(argv)
    assert needle in capsys.readouterr().err


def test_orders_are_balanced_drawn_and_not_a_fixed_pattern():
    for pairs in (2, 5, 6):
        runs = aa.plan(pairs, seed=3)
        firsts = [runs[2 * i]["label"] for i in range(pairs)]
        assert [r["pair"] for r in runs] == [i for i in range(pairs) for _ in range(2)]
        assert all({runs[2 * i]["label"], runs[2 * i + 1]["label"]} == {"A", "A'"}
                   for i in range(pairs))
        assert all(r["first"] == runs[2 * r["pair"]]["label"] for r in runs)
        assert abs(firsts.count("A") - firsts.count("A'")) <= pairs % 2
    assert aa.plan(6, seed=3) == aa.plan(6, seed=3)             # recorded seed: reproducible
    patterns = {tuple(r["label"] for r in aa.plan(6, seed=s)) for s in range(20)}
    assert len(patterns) > 3                                    # the seed draws the orders
    # position mod 4 no longer decides the label for every seed (A A' A' A ... did)
    abba = tuple(("A", "A'")[(n % 4) in (1, 2)] for n in range(12))
    assert any(p != abba for p in patterns)


def test_work_folders_are_named_by_position_never_by_label():
    runs = aa.plan(4, seed=1, warmup_runs=1)
    assert runs[0]["pair"] is None and runs[0]["label"] == "warm-up"
    dirs = [r["dir"] for r in runs]
    assert dirs == [f"run{n:02d}" for n in range(9)]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", d) for d in dirs)


def test_a_warm_up_run_before_each_pair():
    runs = aa.plan(3, seed=2, warmup_runs=1, pair_warmup=1)
    assert [r["pair"] for r in runs] == [None, None, 0, 0, None, 1, 1, None, 2, 2]
    assert all(r["label"] == "warm-up" for r in runs if r["pair"] is None)
    # the measured runs are the plan without warm-ups, in the same drawn order
    assert [r["label"] for r in runs if r["pair"] is not None] == \
        [r["label"] for r in aa.plan(3, seed=2)]
    assert [r["dir"] for r in runs] == [f"run{n:02d}" for n in range(10)]


def test_each_run_works_in_its_safe_folder(tmp_path, monkeypatch):
    seen = []

    class Link:
        def __init__(self, rate):
            pass

        def create(self):
            return self

        def cleanup(self):
            pass

    def fake_run_jobs(link, jobs, workdir, *a, **k):
        seen.append(workdir)
        return {"jobs": [{"steps": [{"step": 0, "t_start": 0.0, "t_end": 0.5}]}], "notes": []}

    monkeypatch.setattr(aa.netns, "ShapedLink", Link)
    monkeypatch.setattr("benchmarks.harness.run_jobs", fake_run_jobs)
    args = aa.parse_args(["--pairs", "1"])
    for r in aa.plan(1, warmup_runs=1):
        rec = aa.execute(r, args, tmp_path, None, None)
        assert rec["status"] == "ok" and rec["s_per_step"] == 0.5
    assert seen == [tmp_path / "run00", tmp_path / "run01", tmp_path / "run02"]
    assert all("'" not in str(p) for p in seen)


def _rec(pair, label, value, status="ok", error=None, first=None):
    return {"pair": pair, "label": label, "status": status, "s_per_step": value, "error": error,
            "first": first}


def test_order_effect_is_reported_beside_the_label_effect():
    # the second run of every pair is 4 % slower; the labels alternate in first place
    recs = [_rec(None, "warm-up", 0.9),
            _rec(0, "A", 0.50, first="A"), _rec(0, "A'", 0.52, first="A"),
            _rec(1, "A'", 0.50, first="A'"), _rec(1, "A", 0.52, first="A'"),
            _rec(2, "A", 0.50, first="A"), _rec(2, "A'", 0.52, first="A")]
    o = aa.order_effect(recs)
    assert o["pairs"] == 3 and o["second_slower"] == 3
    assert o["median"] == pytest.approx(0.04)
    assert aa.pair_values(recs) == [(0.50, 0.52), (0.52, 0.50), (0.50, 0.52)]   # warm-up left out
    text = aa.summary(recs)
    assert "order effect (second run of a pair vs the first) over 3 pair(s): median +4.0%, " \
           "second slower in 3/3" in text
    assert "| 2 | A' A | 0.5200 | 0.5000 | -3.8% |" in text
    assert aa.order_effect([_rec(0, "A", 0.5, first="A")]) is None


def test_statistics_on_canned_runs():
    recs = [_rec(0, "A", 0.50), _rec(0, "A'", 0.51),
            _rec(1, "A'", 0.48), _rec(1, "A", 0.50),
            _rec(2, "A", 0.50), _rec(2, "A'", None, "failed", "job job0 exited with status 1\nx")]
    assert aa.pair_values(recs) == [(0.50, 0.51), (0.50, 0.48)]       # pair 2 incomplete
    text = aa.summary(recs)
    assert "| 1 | A A' | 0.5000 | 0.5100 | +2.0% |" in text
    assert "| 2 | A' A | 0.5000 | 0.4800 | -4.0% |" in text
    assert "| 3 | A A' | – | – | job job0 exited with status 1 |" in text
    assert "A/A resolution over 2 pair(s): median 3.0%, max 4.0%" in text
    assert aa.summary([_rec(0, "A", None, "failed", "boom")]).endswith(
        "A/A resolution: no complete pair\n\norder effect: no complete pair")


def test_a_runs_value_is_the_median_of_its_measured_steps():
    steps = [{"step": 0, "warmup": True, "t_start": 0.0, "t_end": 5.0}] + [
        {"step": i, "t_start": t, "t_end": t + 0.4} for i, t in
        enumerate([5.0, 5.5, 6.1, 6.6, 7.3], start=1)]
    # cycles (to the next start): 0.5, 0.6, 0.5, 0.7 and the last step's own 0.4
    assert aa.step_time({"steps": steps}) == pytest.approx(0.5)
    assert aa.step_time({"steps": steps[:1]}) is None


def test_ranks_join_their_cgroups_through_the_wrapper(tmp_path):
    class FakeGroup:
        def __init__(self, files):
            self.files = files

        def procs_files(self, in_netns=False):
            assert in_netns                   # horovodrun runs inside ip netns exec
            return self.files

    enter = aa.enter_command([FakeGroup(["/c/r0/cgroup.procs", "/m/r0/cgroup.procs"]),
                              FakeGroup(["/c/r1/cgroup.procs"])])
    assert enter == [sys.executable, "-m", "benchmarks.cgroups", "enter",
                     "--rank", "0=/c/r0/cgroup.procs:/m/r0/cgroup.procs",
                     "--rank", "1=/c/r1/cgroup.procs", "--"]
    job = aa.job_spec(aa.parse_args(["--steps", "2"]))
    cmd = aa.rank_command(enter)(job, tmp_path)
    i = cmd.index("benchmarks.cgroups")
    assert "horovodrun" in Path(cmd[0]).name and "-np" in cmd[:i]
    assert cmd[i + len(enter) - 2:][:3] == [sys.executable, "-m", "benchmarks.workload"]
