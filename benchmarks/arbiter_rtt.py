"""Grant round-trip benchmark of the link arbiter (loopback only).

Starts ``horovod-prio arbiter`` as a subprocess on 127.0.0.1 (ephemeral port),
connects ``--jobs`` jobs (one process each, as real jobs are), all on one
link with a credit large enough that every request is granted at once, and
measures in every job the time from ``ArbiterClient.request()`` to its
``on_grant`` callback; each job then completes the chunk and sleeps
``--interval`` seconds before the next request (0 = closed loop). Prints
p50/p90/p99/max over all jobs' samples and the arbiter's counters as JSON.

    python -m benchmarks.arbiter_rtt --jobs 8 --samples 2000 --interval 0.001

Target (issue 5): p99 <= 300 us with 8 jobs connected.
"""
import argparse
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SECRET = "benchmark-secret"


def _job(idx, addr, samples, interval, warmup, q, start_evt):
    from horovod_prio.arbiter.client import ArbiterClient
    got = threading.Event()
    t_grant = [0]

    def on_grant(chunk):
        t_grant[0] = time.perf_counter_ns()
        got.set()

    cl = ArbiterClient(addr, "link0", "job%d" % idx, SECRET, on_grant, timeout=0.5)
    deadline = time.monotonic() + 10
    while not cl.connected and time.monotonic() < deadline:
        time.sleep(0.01)
    if not cl.connected:
        q.put((idx, None, "job %d could not connect" % idx))
        return
    start_evt.wait(30)
    rtts = []
    for i in range(warmup + samples):
        got.clear()
        t0 = time.perf_counter_ns()
        cl.request("c%d" % (i % 64), 100 + (i % 7), 1 << 16)
        if not got.wait(5):
            q.put((idx, None, "job %d: no grant within 5 s" % idx))
            return
        if i >= warmup:
            rtts.append(t_grant[0] - t0)
        cl.complete("c%d" % (i % 64))
        if interval:
            time.sleep(interval)
    c = cl.counters
    cl.close()
    q.put((idx, rtts, c))


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--samples", type=int, default=2000, help="measured round trips per job")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--interval", type=float, default=0.001,
                    help="seconds each job sleeps between chunks (0 = closed loop)")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args(argv)

    env = dict(os.environ, HOROVOD_PRIO_ARBITER_SECRET=SECRET,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    srv = subprocess.Popen([sys.executable, "-m", "horovod_prio.cli", "arbiter", "--bind", "127.0.0.1:0",
                            "--credit-bytes", "1GiB", "--log-level", "WARNING"],
                           stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = srv.stdout.readline()
        m = re.search(r"listening on ([\d.]+):(\d+)", line)
        if not m:
            raise SystemExit("arbiter did not start: %r" % line)
        addr = "%s:%s" % (m.group(1), m.group(2))
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        start_evt = ctx.Event()
        procs = [ctx.Process(target=_job, args=(i, addr, args.samples, args.interval, args.warmup,
                                                q, start_evt)) for i in range(args.jobs)]
        for p in procs:
            p.start()
        time.sleep(0.5)
        start_evt.set()
        all_rtts, errors, counters = [], [], {}
        for _ in procs:
            idx, rtts, extra = q.get(timeout=600)
            if rtts is None:
                errors.append(extra)
            else:
                all_rtts += rtts
                counters[idx] = extra
        for p in procs:
            p.join(30)
        from horovod_prio.arbiter.client import fetch_stats
        stats = fetch_stats(addr, SECRET)
    finally:
        srv.terminate()
        srv.wait(10)
    all_rtts.sort()
    us = lambda ns: round(ns / 1000.0, 1)  # noqa: E731
    res = {
        "jobs": args.jobs, "samples": len(all_rtts), "interval_s": args.interval,
        "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "rtt_us": {"p50": us(pct(all_rtts, 50)), "p90": us(pct(all_rtts, 90)),
                   "p99": us(pct(all_rtts, 99)), "max": us(all_rtts[-1]) if all_rtts else None},
        "fallback_grants": sum(c["fallback_grants"] for c in counters.values()),
        "arbiter_grants": stats["links"].get("link0", {}).get("grants"),
        "errors": errors,
    }
    if not args.json:
        print("arbiter grant round trip, %d jobs on one link, %d samples, interval %.4fs, %s CPUs:"
              % (args.jobs, len(all_rtts), args.interval, os.cpu_count()))
        print("  p50 %.1f us  p90 %.1f us  p99 %.1f us  max %.1f us" % (
            res["rtt_us"]["p50"], res["rtt_us"]["p90"], res["rtt_us"]["p99"], res["rtt_us"]["max"]))
    print(json.dumps(res, sort_keys=True))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
