"""Grant round-trip benchmark of the link arbiter (loopback only).

Starts ``horovod-prio arbiter`` as a subprocess on 127.0.0.1 (ephemeral port),
connects ``--jobs`` jobs (one process each, as real jobs are), all on one
link with a credit large enough that every request is granted at once, and
measures in every job the time from ``ArbiterClient.request()`` to its
``on_grant`` callback; each job then completes the chunk and sleeps
``--interval`` seconds before the next request (0 = closed loop). Prints
p50/p90/p99/max over all jobs' samples and the arbiter's counters as JSON.

    python -m benchmarks.arbiter_rtt --jobs 8 --samples 2000 --interval 0.001
    python -m benchmarks.arbiter_rtt --jobs 8 --baseline   # the machine's floor
    python -m benchmarks.arbiter_rtt --jobs 8 --grpc       # the transport not chosen
    python -m benchmarks.arbiter_rtt --grant-rate          # grant policy alone, grants/s

``--baseline`` runs the same job structure (I/O thread + callback + Event)
against a bare ``selectors`` echo (no auth, no policy): what any Python
round trip costs on this machine right now. ``--grpc`` runs it against a
grpcio bidirectional-stream echo of raw bytes (no protobuf, no auth): a lower
bound for a gRPC arbiter. Also reported: CPU per grant of the arbiter and of
the jobs (load-independent), and the 1-minute load average.

Target (issue 5): p99 <= 300 us with 8 jobs connected.

``--grant-rate`` measures the grant policy alone (``core.Arbiter``, in
process, no sockets): ``--rate-jobs`` jobs on one link each keep
``--rate-pending`` requests pending (random priorities 0..7, one chunk of
credit, so every completion grants exactly one request), and the loop
completes the outstanding grant and re-requests ``--rate-grants`` times.
Prints grants/s per order, with starvation bound 0 (every grant by the
order) and 8 (the default; this workload then grants mostly by the bound).
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


class _Reply:
    """Set from the receiving thread when a reply (grant / echo) arrives."""

    def __init__(self):
        self.got = threading.Event()
        self.t_ns = 0

    def __call__(self, *_):
        self.t_ns = time.perf_counter_ns()
        self.got.set()


def _round_trips(send, reply, samples, warmup, interval, after=None):
    """``warmup + samples`` round trips: ``send(i)``, wait for ``reply``, then
    ``after(i)`` and sleep ``interval``. Returns the measured round trips (ns),
    or ``None`` when a reply did not come within 5 s."""
    rtts = []
    for i in range(warmup + samples):
        reply.got.clear()
        t0 = time.perf_counter_ns()
        send(i)
        if not reply.got.wait(5):
            return None
        if i >= warmup:
            rtts.append(reply.t_ns - t0)
        if after is not None:
            after(i)
        if interval:
            time.sleep(interval)
    return rtts


def _job(idx, addr, samples, interval, warmup, q, start_evt):
    from horovod_prio.arbiter.client import ArbiterClient
    on_grant = _Reply()

    cl = ArbiterClient(addr, "link0", "job%d" % idx, SECRET, on_grant, timeout=0.5)
    deadline = time.monotonic() + 10
    while not cl.connected and time.monotonic() < deadline:
        time.sleep(0.01)
    if not cl.connected:
        q.put((idx, None, "job %d could not connect" % idx))
        return
    start_evt.wait(30)
    cpu0 = time.process_time()
    # key i: one ticket per request, as the job side's scheduler names them
    rtts = _round_trips(lambda i: cl.request(i, 100 + (i % 7), 1 << 16, "c%d" % (i % 64)), on_grant,
                        samples, warmup, interval, after=lambda i: cl.complete(i))
    if rtts is None:
        q.put((idx, None, "job %d: no grant within 5 s" % idx))
        return
    c = cl.counters
    c["cpu_seconds"] = time.process_time() - cpu0
    cl.close()
    q.put((idx, rtts, c))


def _echo_server(port_q, stop_evt):
    """Floor: bare selectors echo (no auth, no policy, no framing)."""
    import selectors
    import socket
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    ls.setblocking(False)
    port_q.put(ls.getsockname()[1])
    sel = selectors.DefaultSelector()
    sel.register(ls, selectors.EVENT_READ)
    while not stop_evt.is_set():
        for key, _ in sel.select(0.2):
            if key.fileobj is ls:
                c, _ = ls.accept()
                c.setblocking(False)
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sel.register(c, selectors.EVENT_READ)
            else:
                try:
                    d = key.fileobj.recv(65536)
                except OSError:
                    d = b""
                if not d:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                else:
                    key.fileobj.send(d)


def _echo_job(idx, port, samples, interval, warmup, q, start_evt):
    """Same structure as a job (I/O thread + callback + Event) against the echo."""
    import selectors
    import socket
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(False)
    reply = _Reply()
    stop = threading.Event()

    def io():
        sel = selectors.DefaultSelector()
        sel.register(s, selectors.EVENT_READ)
        while not stop.is_set():
            for _ in sel.select(0.025):
                try:
                    if s.recv(65536):
                        reply()
                except BlockingIOError:
                    pass
    th = threading.Thread(target=io, daemon=True)
    th.start()
    start_evt.wait(30)
    rtts = _round_trips(lambda i: s.send(b"x" * 48), reply, samples, warmup, interval)
    stop.set()
    if rtts is None:
        q.put((idx, None, "job %d: no echo within 5 s" % idx))
        return
    q.put((idx, rtts, {"fallback_grants": 0}))


def _grpc_server(port_q, stop_evt):
    """The transport we did not pick: a grpcio bidirectional stream echoing raw
    bytes (no protobuf, no auth), i.e. a lower bound for a gRPC arbiter."""
    from concurrent import futures
    import grpc

    def handler(req_iter, ctx):
        for r in req_iter:
            yield r
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "arb", {"S": grpc.stream_stream_rpc_method_handler(handler)}),))
    port_q.put(srv.add_insecure_port("127.0.0.1:0"))
    srv.start()
    stop_evt.wait()
    srv.stop(0)


def _grpc_job(idx, port, samples, interval, warmup, q, start_evt):
    import queue
    import grpc
    ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    outq = queue.Queue()

    def gen():
        while True:
            x = outq.get()
            if x is None:
                return
            yield x
    resp = ch.stream_stream("/arb/S")(gen())
    reply = _Reply()

    def reader():
        for _ in resp:
            reply()
    threading.Thread(target=reader, daemon=True).start()
    start_evt.wait(30)
    rtts = _round_trips(lambda i: outq.put(b"x" * 48), reply, samples, warmup, interval)
    outq.put(None)
    ch.close()
    if rtts is None:
        q.put((idx, None, "job %d: no echo within 5 s" % idx))
        return
    q.put((idx, rtts, {}))


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


def _proc_cpu_seconds(pid):
    """utime + stime of a process (Linux /proc), or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _summary(args, all_rtts, errors, extra):
    all_rtts.sort()
    us = lambda ns: round(ns / 1000.0, 1)  # noqa: E731
    res = {
        "jobs": args.jobs, "samples": len(all_rtts), "interval_s": args.interval,
        "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "rtt_us": {"p50": us(pct(all_rtts, 50)), "p90": us(pct(all_rtts, 90)),
                   "p99": us(pct(all_rtts, 99)), "max": us(all_rtts[-1]) if all_rtts else None},
        "errors": errors,
    }
    res.update(extra)
    if not args.json:
        print("%s round trip, %d jobs, %d samples, interval %.4fs, %s CPUs, load %.2f:"
              % ("grpc bidi-stream echo" if args.grpc else "baseline echo" if args.baseline
                 else "arbiter grant", args.jobs, len(all_rtts),
                 args.interval, os.cpu_count(), res["loadavg_1m"]))
        print("  p50 %.1f us  p90 %.1f us  p99 %.1f us  max %.1f us" % (
            res["rtt_us"]["p50"], res["rtt_us"]["p90"], res["rtt_us"]["p99"], res["rtt_us"]["max"]))
    print(json.dumps(res, sort_keys=True))
    return 1 if errors else 0


def _baseline(args):
    ctx = mp.get_context("spawn")
    port_q, q = ctx.Queue(), ctx.Queue()
    stop_evt, start_evt = ctx.Event(), ctx.Event()
    srv = ctx.Process(target=_grpc_server if args.grpc else _echo_server, args=(port_q, stop_evt))
    srv.start()
    try:
        port = port_q.get(timeout=30)
        job = _grpc_job if args.grpc else _echo_job
        procs = [ctx.Process(target=job, args=(i, port, args.samples, args.interval, args.warmup,
                                               q, start_evt)) for i in range(args.jobs)]
        for p in procs:
            p.start()
        time.sleep(0.5)
        start_evt.set()
        all_rtts, errors = [], []
        for _ in procs:
            _, rtts, extra = q.get(timeout=600)
            if rtts is None:
                errors.append(extra)
            else:
                all_rtts += rtts
        for p in procs:
            p.join(30)
    finally:
        stop_evt.set()
        srv.join(10)
    return _summary(args, all_rtts, errors, {"baseline": "grpc" if args.grpc else "echo"})


def grant_rate(arbiter_cls, jobs=64, pending=64, grants=20000, order="burst", bound=8, seed=1):
    """Grants per second of ``arbiter_cls`` (the grant policy alone) with ``jobs``
    jobs x ``pending`` pending requests on one link; also returns the grant
    sequence (job index, priority) so two implementations can be compared."""
    import random
    rng = random.Random(seed)
    arb = arbiter_cls(credit_bytes=1, lease_seconds=1e9, starvation_bound=bound, order=order)
    handles = [arb.register("job%d" % j, "link0") for j in range(jobs)]
    tokens = [0] * jobs
    seq = []

    def ask(j):
        tokens[j] += 1
        return arb.request(handles[j], tokens[j], rng.randrange(8), 1)

    out = []
    for _ in range(pending):
        for j in range(jobs):
            out += ask(j)
    (cur,) = out
    t0 = time.perf_counter()
    for _ in range(grants):
        j = int(cur.job.job_id[3:])
        seq.append((j, cur.priority))
        (cur,) = arb.complete(cur.job, cur.token) + ask(j)
    dt = time.perf_counter() - t0
    return grants / dt, seq


def _grant_rate_main(args):
    from horovod_prio.arbiter.core import Arbiter
    res = {"jobs": args.rate_jobs, "pending_per_job": args.rate_pending, "grants": args.rate_grants,
           "python": sys.version.split()[0], "loadavg_1m": round(os.getloadavg()[0], 2)}
    for bound in (0, 8):
        for order in Arbiter.ORDERS:
            rate, _ = grant_rate(Arbiter, args.rate_jobs, args.rate_pending, args.rate_grants, order,
                                 bound)
            res["grants_per_s_%s_K%d" % (order, bound)] = round(rate)
            if not args.json:
                print("%s order, starvation bound %d: %d grants/s (%d jobs x %d pending)"
                      % (order, bound, rate, args.rate_jobs, args.rate_pending))
    print(json.dumps(res, sort_keys=True))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--samples", type=int, default=2000, help="measured round trips per job")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--interval", type=float, default=0.001,
                    help="seconds each job sleeps between chunks (0 = closed loop)")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--arbiter-prefix", default="", metavar="CMD",
                    help="prefix for the arbiter's command line, e.g. 'chrt -f 10' or 'nice -n -10' "
                         "(scheduling priority of the arbiter on a shared box)")
    ap.add_argument("--grpc", action="store_true",
                    help="measure a grpcio bidirectional-stream echo instead (the transport "
                         "not chosen; raw bytes, no auth/policy)")
    ap.add_argument("--baseline", action="store_true",
                    help="measure the machine's floor instead: bare selectors echo server, same "
                         "job structure (I/O thread + callback), no auth/policy")
    ap.add_argument("--grant-rate", action="store_true",
                    help="measure the grant policy alone (in process): grants/s with --rate-jobs "
                         "jobs x --rate-pending pending requests")
    ap.add_argument("--rate-jobs", type=int, default=64)
    ap.add_argument("--rate-pending", type=int, default=64)
    ap.add_argument("--rate-grants", type=int, default=20000)
    args = ap.parse_args(argv)

    if args.grant_rate:
        return _grant_rate_main(args)
    if args.baseline or args.grpc:
        return _baseline(args)
    env = dict(os.environ, HOROVOD_PRIO_ARBITER_SECRET=SECRET,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    srv = subprocess.Popen(args.arbiter_prefix.split() + [
                           sys.executable, "-m", "horovod_prio.cli", "arbiter", "--bind", "127.0.0.1:0",
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
        srv_cpu = _proc_cpu_seconds(srv.pid)
    finally:
        srv.terminate()
        srv.wait(10)
    return _summary(args, all_rtts, errors, {
        "fallback_grants": sum(c["fallback_grants"] for c in counters.values()),
        "arbiter_grants": stats["links"].get("link0", {}).get("grants"),
        "arbiter_prefix": args.arbiter_prefix,
        # CPU per grant (request + grant + complete): load-independent cost
        "server_cpu_us_per_grant": round(srv_cpu / max(1, stats["links"]["link0"]["grants"]) * 1e6, 1)
        if srv_cpu is not None else None,
        "client_cpu_us_per_grant": round(sum(c["cpu_seconds"] for c in counters.values())
                                         / max(1, len(all_rtts) + args.jobs * args.warmup) * 1e6, 1)})


if __name__ == "__main__":
    sys.exit(main())
