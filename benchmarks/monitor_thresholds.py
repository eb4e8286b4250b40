"""How far above a job's ordinary step the rank-0 monitor's slow threshold sat.

With neither coefficient given, the monitor measures its slack on the first
``calibration_batches`` steps after the warm-up
(:mod:`horovod_prio.method.policy`). This reads the calibration steps each
prio/arb job recorded in a testbed run (the ``calibrate`` events of its
rank-0 trace, ``benchmarks.cluster`` ``results.json``) and prints, per job and
repeat, the threshold the monitor's rule gives on them — the product's
current rule (``AdaptivePriorityPolicy`` fed the same steps) beside the rule
until 2026-12-05 (changed in git 4922ebd and c269dd8: the nearest-rank q90,
which below ten batches is the maximum, and no cap) — as a multiple of the calibration's
median. A threshold far above the median hides a slowdown of that size from
the monitor: the boost never rises. A calibration the run ended before
(fewer steps than ``calibration_batches``: the monitor never judged a step)
is listed as not applied and left out of the counts.

    python -m benchmarks.monitor_thresholds results/cluster/join-* [--above 1.3] [--json]
"""
import argparse
import json
import math
import sys
from pathlib import Path

from horovod_prio.method.policy import AdaptivePriorityPolicy

from . import results_io


def threshold_before(xs):
    """The measured threshold until git 4922ebd (q90 by nearest rank, no cap)."""
    s = sorted(xs)
    n = len(s)
    med = s[n // 2]
    q90 = s[min(n - 1, int(math.ceil(0.9 * n)) - 1)]
    return med + 3.0 * (q90 - med) + 0.05 * med


def threshold_now(xs):
    """The product's measured threshold on the same calibration steps."""
    p = AdaptivePriorityPolicy([0, 1], count_threshold=1, max_boost=1, warmup_batches=0,
                               calibration_batches=len(xs))
    for x in xs:
        p.after_batch(x)
    return p.threshold


def calibrations(results):
    """``[(variant, repeat, job index, [calibration seconds], applied)]`` of one
    run file; ``applied``: the calibration finished (its last event carries the
    threshold it set), so the monitor judged the later steps by it."""
    out = []
    for r in results.get("runs", []):
        for i, job in enumerate(r.get("jobs") or []):
            cal = [e["args"] for e in job.get("trace_events") or []
                   if (e.get("args") or {}).get("kind") == "calibrate"]
            if cal:
                out.append((r.get("variant"), r.get("repeat"), i, [a["seconds"] for a in cal],
                            cal[-1].get("threshold") is not None))
    return out


def rows(dirs):
    out = []
    for d in dirs:
        f = Path(d) / "results.json(.gz)"
        try:
            f = results_io.results_path(d)
            results = results_io.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"monitor_thresholds: cannot read {f}: {e}")
        for variant, rep, job, xs, applied in calibrations(results):
            med = sorted(xs)[len(xs) // 2]
            out.append({"run": Path(d).name, "variant": variant, "repeat": rep, "job": job,
                        "n": len(xs), "applied": applied, "median": med,
                        "before": threshold_before(xs), "now": threshold_now(xs)})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.monitor_thresholds",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", help="benchmarks.cluster output folders")
    ap.add_argument("--above", type=float, default=1.3,
                    help="count thresholds above this multiple of the median (default 1.3)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    if not a.above > 1:
        ap.error(f"--above must be > 1, got {a.above}")
    rs = rows(a.dirs)
    if a.json:
        print(json.dumps(rs, indent=1))
        return 0
    print("| run | variant | repeat | job | steps | applied | median s | threshold before | now |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rs:
        m = r["median"]
        print(f"| {r['run']} | {r['variant']} | {r['repeat']} | {r['job']} | {r['n']} | "
              f"{'yes' if r['applied'] else 'no'} | {m:.3f} | "
              f"{r['before']:.3f} ({r['before'] / m:.2f}x) | {r['now']:.3f} ({r['now'] / m:.2f}x) |")
    done = [r for r in rs if r["applied"]]
    nb = sum(r["before"] > a.above * r["median"] for r in done)
    nn = sum(r["now"] > a.above * r["median"] for r in done)
    print(f"\n{len(done)} applied calibrations ({len(rs) - len(done)} not finished in the run); "
          f"threshold above {a.above:g} x the median: before {nb}, now {nn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
