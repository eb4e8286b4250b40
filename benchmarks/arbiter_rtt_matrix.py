"""Interleaved, repeated runs of ``benchmarks.arbiter_rtt``: medians per configuration.

    python -m benchmarks.arbiter_rtt_matrix --configs python/python,native/python,python/native,native/native \
        --repeats 5 --out rtt.jsonl
    python -m benchmarks.arbiter_rtt_matrix --tree before=/tmp/base --configs python/python@before,python/python

A configuration is ``SERVER/CLIENT`` (``arbiter_rtt --server``/``--client``),
optionally ``@NAME`` to import ``horovod_prio`` from the checkout given by
``--tree NAME=DIR`` (two versions of the code, measured on the same machine
state), or ``@NAME~OTHER`` for a paired run (``arbiter_rtt --ab-tree``): half
the jobs (and their arbiter) run NAME's code, the other half OTHER's, at the
same time; ``@~OTHER`` pairs this checkout with OTHER. For paired runs the
summary also compares the two versions run by run (``pairs``): medians of
each version's p50/p90/p99 and CPU, and the median of the per-run
differences. List both orders (``@a~b,@b~a``) so neither version always gets
the odd jobs. Repeat k runs every configuration once, in an order rotated by k, each
in a fresh process, so slow drifts of the shared machine's load hit every
configuration alike. Every run's JSON (plus configuration, repeat, start time,
git commit of this checkout) is appended to ``--out``; at the end one line per
configuration: medians of p50/p90/p99 over the repeats, the p99 range, the
median 1-minute load before the runs and the median ``foreign_cpus`` (CPUs'
worth of other processes' work during the runs).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.arbiter_rtt import CLIENTS, SERVERS, host_cpu, build_native  # noqa: E402
from benchmarks.harness import git_rev  # noqa: E402


def parse_config(text, trees):
    """``SERVER/CLIENT[@TREE]`` -> ``(name, argv)``; ValueError naming the rule."""
    spec, _, tree = text.partition("@")
    tree, _, ab = tree.partition("~")
    server, _, client = spec.partition("/")
    client = client or "python"
    if server not in SERVERS:
        raise ValueError("server %r in %r: choose from %s" % (server, text, ", ".join(SERVERS)))
    if client not in CLIENTS:
        raise ValueError("client %r in %r: choose from %s" % (client, text, ", ".join(CLIENTS)))
    argv = ["--server", server, "--client", client]
    for opt, name in (("--tree", tree), ("--ab-tree", ab)):
        if name:
            if name not in trees:
                raise ValueError("%r: no --tree %s=DIR given" % (text, name))
            argv += [opt, trees[name]]
    if "~" in text and not ab:
        raise ValueError("%r: '~' needs the other version's name" % text)
    return text, argv


def plan(configs, repeats):
    """Run order: repeat k runs the configurations rotated by k."""
    n = len(configs)
    return [(k, configs[(k + i) % n]) for k in range(repeats) for i in range(n)]


def _median(v):
    v = sorted(x for x in v if x is not None)
    if not v:
        return None
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2.0


def summarize(results):
    """Per configuration (in first-seen order): medians over its runs."""
    by = {}
    for r in results:
        by.setdefault(r["config"], []).append(r)
    rows = []
    for name, rs in by.items():
        ok = [r for r in rs if not r.get("errors")]
        p99 = [r["rtt_us"]["p99"] for r in ok]
        rows.append({
            "config": name, "runs": len(rs), "failed": len(rs) - len(ok),
            "p50": _median([r["rtt_us"]["p50"] for r in ok]),
            "p90": _median([r["rtt_us"]["p90"] for r in ok]),
            "p99": _median(p99), "p99_min": min(p99) if p99 else None,
            "p99_max": max(p99) if p99 else None,
            "load_before": _median([r.get("loadavg_1m_before") for r in ok]),
            "foreign_cpus": _median([(r.get("host") or {}).get("foreign_cpus") for r in ok]),
            "server_cpu_us": _median([r.get("server_cpu_us_per_grant") for r in ok]),
            "client_cpu_us": _median([r.get("client_cpu_us_per_grant") for r in ok]),
        })
    return rows


def wait_quiet(max_busy, max_wait, probe=1.0, sleep=time.sleep):
    """Wait until the machine's CPUs were at most ``max_busy`` (fraction) busy
    over ``probe`` seconds, or ``max_wait`` seconds passed. Returns the last
    busy fraction seen (None if /proc/stat is unreadable) and the seconds waited."""
    waited = 0.0
    while True:
        a = host_cpu()
        sleep(probe)
        b = host_cpu()
        if a is None or b is None or b[2] <= a[2]:
            return None, waited
        busy = (b[0] - a[0]) / float(b[2] - a[2])
        waited += probe
        if busy <= max_busy or waited >= max_wait:
            return round(busy, 3), round(waited, 1)
        sleep(probe)
        waited += probe


def compare_pairs(results, trees):
    """Paired runs (``ab`` in the result): per version, the medians of its
    half's p50/p90/p99 and client CPU over all runs, and per pair of versions
    the median of the per-run differences (second minus first, in the order
    the versions are first seen) and how many runs the second was lower."""
    names = {os.path.abspath(d): n for n, d in trees.items()}
    per = {}            # version -> list of half results
    diffs = {}          # (x, y) -> list of per-run dicts of differences
    for r in results:
        ab = r.get("ab")
        if not ab or r.get("errors"):
            continue
        ha, hb = ab["a"], ab["b"]
        na, nb = (names.get(h["tree"], h["tree"] or "this checkout") for h in (ha, hb))
        for n, h in ((na, ha), (nb, hb)):
            per.setdefault(n, []).append(h)
        (x, hx), (y, hy) = sorted(((na, ha), (nb, hb)), key=lambda t: list(per).index(t[0]))
        diffs.setdefault((x, y), []).append(
            {k: hy["rtt_us"][k] - hx["rtt_us"][k] for k in ("p50", "p90", "p99")})
        diffs[(x, y)][-1]["client_cpu"] = (hy.get("client_cpu_us_per_grant") or 0) - \
            (hx.get("client_cpu_us_per_grant") or 0)
    out = {"versions": {}, "differences": []}
    for n, hs in per.items():
        out["versions"][n] = {"runs": len(hs),
                              **{k: _median([h["rtt_us"][k] for h in hs]) for k in ("p50", "p90", "p99")},
                              "client_cpu_us": _median([h.get("client_cpu_us_per_grant") for h in hs]),
                              "server_cpu_us": _median([h.get("server_cpu_us_per_grant") for h in hs])}
    for (x, y), ds in diffs.items():
        out["differences"].append({
            "first": x, "second": y, "runs": len(ds),
            **{"median_%s_diff" % k: _median([d[k] for d in ds])
               for k in ("p50", "p90", "p99", "client_cpu")},
            **{"second_lower_%s" % k: sum(1 for d in ds if d[k] < 0) for k in ("p50", "p99")}})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="python/python,native/python,python/native,native/native",
                    help="comma-separated SERVER/CLIENT[@TREE]")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="a checkout to import horovod_prio from, for configs ending in @NAME")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="append every run's JSON to this file (JSON lines)")
    ap.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    ap.add_argument("--wait-quiet", type=float, metavar="BUSY",
                    help="before each run wait until the CPUs were at most this busy (0..1) "
                         "over a second, for at most --max-wait seconds (recorded as pre_busy)")
    ap.add_argument("--max-wait", type=float, default=120.0)
    ap.add_argument("rtt_args", nargs=argparse.REMAINDER,
                    help="after --: passed to every arbiter_rtt run (e.g. -- --jobs 8 --samples 2000)")
    args = ap.parse_args(argv)
    trees = {}
    for t in args.tree:
        name, sep, d = t.partition("=")
        if not sep or not name or not d:
            ap.error("--tree takes NAME=DIR, got %r" % t)
        trees[name] = os.path.abspath(d)
    try:
        configs = [parse_config(c.strip(), trees) for c in args.configs.split(",") if c.strip()]
    except ValueError as e:
        ap.error(str(e))
    if not configs or args.repeats < 1:
        ap.error("need at least one config and --repeats >= 1")
    extra = [a for a in args.rtt_args if a != "--"]
    if any(c[1][1].startswith("native") or c[1][3].startswith("native") for c in configs):
        extra += ["--native-exe", build_native()[0]]     # one build, outside the measurements
    commit = git_rev()
    results = []
    for k, (name, cargv) in plan(configs, args.repeats):
        cmd = [sys.executable, "-m", "benchmarks.arbiter_rtt", "--json"] + cargv + extra
        pre_busy = waited = None
        if args.wait_quiet is not None:
            pre_busy, waited = wait_quiet(args.wait_quiet, args.max_wait)
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
        try:
            res = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res = {"errors": ["run failed (rc %d): %s" % (r.returncode, r.stderr.strip()[-300:])],
                   "rtt_us": {}}
        if "--profile" not in extra:
            res.pop("profile", None)
        res.update({"config": name, "repeat": k, "started": time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.localtime(t0)), "commit": commit, "argv": cmd[3:],
                    "pre_busy": pre_busy, "waited_s": waited})
        results.append(res)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(res, sort_keys=True) + "\n")
        print("repeat %d %-28s p50 %6s p99 %7s  load %s  foreign %s  pre-busy %s" % (
            k, name, res["rtt_us"].get("p50"), res["rtt_us"].get("p99"),
            res.get("loadavg_1m_before"), (res.get("host") or {}).get("foreign_cpus"), pre_busy),
            file=sys.stderr, flush=True)
        time.sleep(args.pause)
    print("%-28s %4s %7s %7s %7s %15s %6s %7s %7s %7s" % (
        "config", "runs", "p50", "p90", "p99", "p99 range", "load", "foreign", "srv cpu", "cli cpu"))
    for row in summarize(results):
        print("%-28s %4d %7s %7s %7s %15s %6s %7s %7s %7s" % (
            row["config"], row["runs"] - row["failed"], row["p50"], row["p90"], row["p99"],
            "%s-%s" % (row["p99_min"], row["p99_max"]), row["load_before"], row["foreign_cpus"],
            row["server_cpu_us"], row["client_cpu_us"]))
    pairs = compare_pairs(results, trees)
    if pairs["versions"]:
        print("paired runs, per version (medians): p50 / p90 / p99 us, client CPU us/grant")
        for n, v in pairs["versions"].items():
            print("  %-20s %3d runs  %7s %7s %7s  cpu %s" % (n, v["runs"], v["p50"], v["p90"], v["p99"],
                                                            v["client_cpu_us"]))
        for d in pairs["differences"]:
            print("  %s minus %s, median of %d runs: p50 %+.1f  p90 %+.1f  p99 %+.1f us  cpu %+.1f; "
                  "lower in %d (p50) / %d (p99) runs" % (
                      d["second"], d["first"], d["runs"], d["median_p50_diff"], d["median_p90_diff"],
                      d["median_p99_diff"], d["median_client_cpu_diff"], d["second_lower_p50"],
                      d["second_lower_p99"]))
    print(json.dumps({"commit": commit, "rows": summarize(results), "pairs": pairs}, sort_keys=True))
    return 1 if any(r.get("errors") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
