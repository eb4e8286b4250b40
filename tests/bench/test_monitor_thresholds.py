"""benchmarks.monitor_thresholds on a synthetic testbed result (no root, < 1 s)."""
import json

import pytest

from benchmarks import monitor_thresholds as mt


def _results(tmp_path, calib):
    ev = [{"name": "warmup", "args": {"kind": "warmup", "seconds": 2.0}}]
    ev += [{"name": "calibrate", "args": {"kind": "calibrate", "seconds": t}} for t in calib]
    ev += [{"name": "slow", "args": {"kind": "slow", "seconds": 0.5}}]
    runs = [{"variant": "spec", "repeat": 0, "jobs": [{"trace_events": ev}, {"trace_events": []}]},
            {"variant": "hvd", "repeat": 0, "jobs": [{"steps": []}]}]
    d = tmp_path / "join-run"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"meta": {}, "runs": runs}))
    return d


def test_one_slow_calibration_step_blinded_the_old_rule_not_the_current_one(tmp_path, capsys):
    d = _results(tmp_path, [0.46, 0.30, 0.30, 0.27, 0.29])
    (r,) = mt.rows([d])
    assert (r["variant"], r["repeat"], r["job"], r["n"], r["median"]) == ("spec", 0, 0, 5, 0.30)
    assert r["before"] == pytest.approx(0.30 + 3 * 0.16 + 0.015)     # q90 = the 0.46
    assert r["now"] == pytest.approx(0.315)                          # the product's rule
    assert mt.main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "| join-run | spec | 0 | 0 | 5 | 0.300 | 0.795 (2.65x) | 0.315 (1.05x) |" in out
    assert "1 calibrations; threshold above 1.3 x the median: before 1, now 0" in out


def test_bad_input_is_named(tmp_path):
    with pytest.raises(SystemExit, match="cannot read"):
        mt.main([str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        mt.main([str(_results(tmp_path, [1.0])), "--above", "0.9"])
