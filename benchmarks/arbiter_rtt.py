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
    python -m benchmarks.arbiter_rtt --jobs 8 --profile    # where the round trip goes
    python -m benchmarks.arbiter_rtt --jobs 8 --server native --client native

``--baseline`` runs the same job structure (I/O thread + callback + Event)
against a bare ``selectors`` echo (no auth, no policy): what any Python
round trip costs on this machine right now. ``--grpc`` runs it against a
grpcio bidirectional-stream echo of raw bytes (no protobuf, no auth): a lower
bound for a gRPC arbiter. Also reported: CPU per grant of the arbiter and of
the jobs (load-independent), the 1-minute load average before and after the
run, and how busy the machine's CPUs were during it and how much of that was
not the benchmark's own processes (``host``: ``busy``, ``steal``,
``foreign_cpus`` in CPUs).

Native floor (``benchmarks/rtt_native.c``, compiled with gcc into a temporary
directory on first use and deleted at exit; never committed as a binary):
``--server native`` is a one-thread C epoll loop speaking the arbiter's
protocol 2 (handshake, HMAC-SHA256 on every frame via OpenSSL's libcrypto,
REGISTER/REQUEST/COMPLETE/PING/STATS) that grants every request at once, so
the Python jobs' unchanged ``ArbiterClient`` talks to it; ``--server
native-echo`` is the same loop echoing frames (no crypto). ``--client
native`` runs the jobs as C processes (request, blocking ``recv`` of the
grant, complete, sleep), ``--client native-io-thread`` the same with a second
thread that reads the socket and hands the grant over (the structure of
``ArbiterClient``). Any client against any server of the same protocol
(arbiter: ``python``, ``native``; echo: ``echo``, ``native-echo``), so the
round trip can be split into the Python server, the Python client and the
VM/kernel.

The product's own path (``--client sched-native`` / ``sched-python``): each
job is a scheduler (``horovod_prio.scheduler.Scheduler``, hold on, a 1 GiB
local credit, tracing on) joined to the arbiter by ``ArbiterLink.attach`` with
``arbiter_client`` = ``native`` or ``python``, exactly as the runtime joins
rank 0's scheduler; it submits one chunk at a time through the scheduler's C
API (the chunk passes the local rule and is requested at the arbiter), and
the round trip is read from the scheduler's own trace: from the chunk's
``request`` event to its ``release`` event (the grant applied in the
scheduler), both stamped inside the scheduler. The job blocks until the release
(``Scheduler.submit_notify``: the release writes the ticket to a pipe, as
the TensorFlow kernels' release callback wakes their op), completes the
chunk and sleeps ``--interval``, like the other jobs. Interleave both paths with
``benchmarks.arbiter_rtt_matrix --configs python/sched-native,python/sched-python``.

``--profile`` (Python jobs; server ``python`` or ``native``) times every stage
of each round trip (``benchmarks/rtt_probe.py``: client send, server wake-up,
recv, MAC, policy, seal, send, client I/O-thread wake-up, verify, hand-off)
and prints p50/p99/mean per stage and the mean per stage of the slowest 1 %.
``--tree DIR`` imports ``horovod_prio`` from another checkout (server and
jobs), to compare two versions of the code on the same machine state.

Target: p99 <= 300 us with 8 jobs connected.

``--grant-rate`` measures the grant policy alone (``core.Arbiter``, in
process, no sockets): ``--rate-jobs`` jobs on one link each keep
``--rate-pending`` requests pending (random priorities 0..7, one chunk of
credit, so every completion grants exactly one request), and the loop
completes the outstanding grant and re-requests ``--rate-grants`` times.
Prints grants/s per order, with starvation bound 0 (every grant by the
order) and 8 (the default; this workload then grants mostly by the bound).
"""
import argparse
import atexit
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SECRET = "benchmark-secret"
IO_PRIORITY_ENV = "HOROVOD_PRIO_ARBITER_IO_PRIORITY"    # --io-priority, read by the job processes


class _Reply:
    """Set from the receiving thread when a reply (grant / echo) arrives."""

    def __init__(self):
        self.got = threading.Event()
        self.t_ns = 0

    def __call__(self, *_):
        self.t_ns = time.perf_counter_ns()
        self.got.set()


def _round_trips(send, reply, samples, warmup, interval, after=None, t0s=None):
    """``warmup + samples`` round trips: ``send(i)``, wait for ``reply``, then
    ``after(i)`` and sleep ``interval``. Returns the measured round trips (ns),
    or ``None`` when a reply did not come within 5 s. ``t0s`` (a dict), if
    given, receives the start time of each measured round trip by ``i``."""
    rtts = []
    for i in range(warmup + samples):
        reply.got.clear()
        t0 = time.perf_counter_ns()
        send(i)
        if not reply.got.wait(5):
            return None
        if i >= warmup:
            rtts.append(reply.t_ns - t0)
            if t0s is not None:
                t0s[i] = (t0, reply.t_ns)
        if after is not None:
            after(i)
        if interval:
            time.sleep(interval)
    return rtts


def _io_kw():
    """The clients' ``io_priority`` from ``--io-priority`` (none given: nothing, so
    a ``--tree`` from before the setting runs too)."""
    v = os.environ.get(IO_PRIORITY_ENV)
    return {"io_priority": v} if v else {}


def _use_tree(tree):
    """Import horovod_prio from ``tree`` (``--tree``) in this process."""
    if tree:
        sys.path.insert(0, tree)


def _job(idx, addr, samples, interval, warmup, q, start_evt, profile=False, tree=None):
    _use_tree(tree)
    from horovod_prio.arbiter import client as client_mod
    from horovod_prio.arbiter.client import ArbiterClient
    on_grant = _Reply()

    cl = ArbiterClient(addr, "link0", "job%d" % idx, SECRET, on_grant, timeout=0.5, **_io_kw())
    probe = None
    if profile:
        from benchmarks.rtt_probe import ClientProbe
        probe = ClientProbe()
        with cl._lock:
            probe.install(client_mod, cl)
    deadline = time.monotonic() + 10
    while not cl.connected and time.monotonic() < deadline:
        time.sleep(0.01)
    if not cl.connected:
        q.put((idx, None, "job %d could not connect" % idx))
        return
    start_evt.wait(30)
    cpu0 = time.process_time()
    t0s = {} if profile else None
    # key i: one ticket per request, as the job side's scheduler names them
    rtts = _round_trips(lambda i: cl.request(i, 100 + (i % 7), 1 << 16, "c%d" % (i % 64)), on_grant,
                        samples, warmup, interval, after=lambda i: cl.complete(i), t0s=t0s)
    if rtts is None:
        q.put((idx, None, "job %d: no grant within 5 s" % idx))
        return
    c = cl.counters
    c["cpu_seconds"] = time.process_time() - cpu0
    c["io_priority"] = getattr(cl, "io_priority", None)
    cl.close()
    if probe is not None:
        recs = []
        for i, (t0, t1) in t0s.items():
            r = dict(probe.records.get(i, {}), t0=t0, c_deliver=t1)
            recs.append((i, r))
        c["profile"] = recs
    q.put((idx, rtts, c))


def _sched_job(kind, idx, addr, samples, interval, warmup, q, start_evt, profile=False,
               tree=None):
    """A job on the product's path: scheduler + ArbiterLink (``kind``: the
    ``arbiter_client``); round trip = the scheduler's request -> release events."""
    _use_tree(tree)
    from horovod_prio.method.config import PriorityConfig
    from horovod_prio.runtime.arbiter_link import ArbiterLink
    from horovod_prio.scheduler import Scheduler
    s = Scheduler()
    s.configure(1 << 30, True)
    s.set_tracing(True)
    io = _io_kw()
    cfg = PriorityConfig.from_env({}, arbiter=addr, link="link0", job_id="job%d" % idx,
                                  arbiter_secret=SECRET, arbiter_timeout=0.5, arbiter_client=kind,
                                  **({"arbiter_io_priority": io["io_priority"]} if io else {}))
    al = ArbiterLink.attach(s, cfg)
    deadline = time.monotonic() + 10
    while not al.client.connected and time.monotonic() < deadline:
        time.sleep(0.01)
    if not al.client.connected:
        al.close()
        q.put((idx, None, "job %d could not connect" % idx))
        return
    import select
    import struct
    r, w = os.pipe()
    start_evt.wait(30)
    cpu0 = time.process_time()
    tickets = []
    for i in range(warmup + samples):
        t = s.submit_notify("c%d" % (i % 64), 100 + (i % 7), 1 << 16, w)
        if not select.select([r], [], [], 5)[0] or struct.unpack("=Q", os.read(r, 8))[0] != t:
            al.close()
            q.put((idx, None, "job %d: no release of chunk %d within 5 s" % (idx, i)))
            return
        s.complete_ticket(t)
        if i >= warmup:
            tickets.append(t)
        if interval:
            time.sleep(interval)
    cpu = time.process_time() - cpu0
    os.close(r)
    os.close(w)
    c = dict(al.counters)
    al.close()
    at = {}
    for e in s.drain_events():
        if e["kind"] in ("request", "release"):
            at[(e["ticket"], e["kind"])] = e["t_us"]
    rtts = [(at[(t, "release")] - at[(t, "request")]) * 1000 for t in tickets
            if (t, "release") in at and (t, "request") in at]
    if len(rtts) != len(tickets):
        q.put((idx, None, "job %d: %d of %d round trips missing in the trace"
               % (idx, len(tickets) - len(rtts), len(tickets))))
        return
    c["cpu_seconds"] = cpu
    c["arbiter_client"] = "native" if al.native else "python"
    c["io_priority"] = getattr(cfg, "arbiter_io_priority", None)
    q.put((idx, rtts, c))


def _sched_native_job(*a):
    _sched_job("native", *a)


def _sched_python_job(*a):
    _sched_job("python", *a)


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


def _echo_job(idx, port, samples, interval, warmup, q, start_evt, profile=False, tree=None):
    """Same structure as a job (I/O thread + callback + Event) against the echo.
    Sends one length-prefixed 48-byte frame, so it runs against the framed
    native echo as well (the Python echo sends back whatever arrives)."""
    import selectors
    import socket
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(False)
    reply = _Reply()
    stop = threading.Event()
    msg = (48).to_bytes(4, "big") + b"x" * 48

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
    cpu0 = time.process_time()
    rtts = _round_trips(lambda i: s.send(msg), reply, samples, warmup, interval)
    cpu = time.process_time() - cpu0
    stop.set()
    th.join(1)
    s.close()
    if rtts is None:
        q.put((idx, None, "job %d: no echo within 5 s" % idx))
        return
    q.put((idx, rtts, {"fallback_grants": 0, "cpu_seconds": cpu}))


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


# ---------------------------------------------------------------- native floor

_NATIVE = {}


def build_native(src=None, exe=None):
    """Compile ``benchmarks/rtt_native.c`` into a temporary directory (removed at
    exit). Returns ``(path, hmac)``: ``hmac`` is ``"openssl"`` when linked with
    libcrypto (both protocols), ``"none"`` when only the echo could be built.
    Raises RuntimeError when gcc fails altogether."""
    if exe:                                 # --native-exe: built already (by the matrix driver)
        r = subprocess.run([exe, "features"], capture_output=True, text=True, timeout=30)
        return exe, "openssl" if "hmac openssl" in r.stdout else "none"
    src = src or os.path.join(ROOT, "benchmarks", "rtt_native.c")
    if src in _NATIVE:
        return _NATIVE[src]
    d = tempfile.mkdtemp(prefix="rtt_native-")
    atexit.register(shutil.rmtree, d, True)
    exe = os.path.join(d, "rtt_native")
    errs = []
    for flags, kind in ((["-lcrypto", "-lpthread"], "openssl"), (["-DNO_OPENSSL", "-lpthread"], "none")):
        cmd = ["gcc", "-O2", "-Wall", "-o", exe, src] + flags
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except OSError as e:
            raise RuntimeError("cannot run gcc: %s" % e) from None
        if r.returncode == 0:
            _NATIVE[src] = (exe, kind)
            return exe, kind
        errs.append("%s: %s" % (" ".join(cmd), r.stderr.strip()[-400:]))
    raise RuntimeError("cannot build %s:\n%s" % (src, "\n".join(errs)))


# ---------------------------------------------------------------- load

def host_cpu():
    """(busy, steal, total) jiffies of all CPUs from /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    steal = v[7] if len(v) > 7 else 0
    total = sum(v[:8])
    return total - idle - steal, steal, total


def host_load(before, after, own_cpu_seconds):
    """How busy the machine was between two :func:`host_cpu` snapshots: ``busy``
    and ``steal`` as fractions of all CPUs, and ``foreign_cpus``: CPUs' worth of
    work that was not the benchmark's own processes (``own_cpu_seconds``)."""
    if before is None or after is None:
        return None
    busy, steal, total = (a - b for a, b in zip(after, before))
    if total <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    ncpu = os.cpu_count() or 1
    wall = total / hz / ncpu
    foreign = (busy / hz - own_cpu_seconds) / wall if own_cpu_seconds is not None else None
    return {"busy": round(busy / total, 3), "steal": round(steal / total, 3),
            "foreign_cpus": round(max(0.0, foreign), 2) if foreign is not None else None,
            "seconds": round(wall, 2)}


# ---------------------------------------------------------------- servers

SERVERS = ("python", "native", "echo", "native-echo", "grpc")
CLIENTS = ("python", "native", "native-io-thread", "sched-native", "sched-python")
_SCHED_JOBS = {"sched-native": _sched_native_job, "sched-python": _sched_python_job}
_ARBITER_PROTO = ("python", "native")


class _Server:
    """A server process; ``addr`` "host:port", ``stop()`` -> extra result fields."""

    def __init__(self, args, tree=None):
        self.args, self.proc, self.mp_proc, self.profile_path = args, None, None, None
        self.kind = args.server
        self.cpu0 = None
        tree = tree or args.tree or ROOT
        env = dict(os.environ, HOROVOD_PRIO_ARBITER_SECRET=SECRET,
                   PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
        if self.kind == "python":
            if args.profile:
                fd, self.profile_path = tempfile.mkstemp(prefix="rtt_profile-", suffix=".json")
                os.close(fd)
                # a script, not -m: horovod_prio comes from PYTHONPATH (--tree), the probe from here
                cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "rtt_probe.py"), "serve",
                       self.profile_path]
            else:
                # = python -m horovod_prio.cli arbiter ..., with horovod_prio from `tree`
                cmd = [sys.executable, "-c", "import sys; sys.path.insert(0, %r); "
                       "from horovod_prio.cli import main; sys.exit(main())" % tree,
                       "arbiter", "--bind", "127.0.0.1:0", "--credit-bytes", "1GiB",
                       "--log-level", "WARNING"] + args.arbiter_args.split()
            self._popen(args.arbiter_prefix.split() + cmd, env, r"listening on ([\d.]+):(\d+)")
        elif self.kind in ("native", "native-echo"):
            exe, self.hmac = build_native(exe=args.native_exe)
            if self.kind == "native" and self.hmac != "openssl":
                raise SystemExit("--server native needs OpenSSL's libcrypto (gcc -lcrypto failed)")
            proto = "arbiter" if self.kind == "native" else "echo"
            self._popen(args.arbiter_prefix.split() + [exe, "server", "--proto", proto,
                                                       "--secret", SECRET], env,
                        r"listening on ([\d.]+):(\d+)")
        else:
            ctx = mp.get_context("spawn")
            port_q, self.stop_evt = ctx.Queue(), ctx.Event()
            self.mp_proc = ctx.Process(target=_grpc_server if self.kind == "grpc" else _echo_server,
                                       args=(port_q, self.stop_evt))
            self.mp_proc.start()
            self.addr = "127.0.0.1:%d" % port_q.get(timeout=30)
            self.pid = self.mp_proc.pid

    def _popen(self, cmd, env, pattern):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
        self.pid = self.proc.pid
        line = self.proc.stdout.readline()
        m = re.search(pattern, line)
        if not m:
            self.proc.kill()
            raise SystemExit("server did not start: %r" % line)
        self.addr = "%s:%s" % (m.group(1), m.group(2))

    @property
    def port(self):
        return int(self.addr.rpartition(":")[2])

    def mark(self):
        self.cpu0 = _proc_cpu_seconds(self.pid)

    def stop(self):
        """Stop it; returns ``(extra fields, server CPU seconds since mark(), profile records)``."""
        extra, records = {}, None
        cpu1 = _proc_cpu_seconds(self.pid)
        cpu = cpu1 - self.cpu0 if cpu1 is not None and self.cpu0 is not None else None
        if self.kind == "python" and not self.args.profile:
            try:
                from horovod_prio.arbiter.client import fetch_stats
                stats = fetch_stats(self.addr, SECRET)
                extra["arbiter_grants"] = stats["links"].get("link0", {}).get("grants")
            except Exception as e:   # noqa: BLE001 (reported, not fatal)
                extra["arbiter_grants"] = None
                extra["stats_error"] = str(e)
        if self.proc is not None:
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=30)
            if self.kind in ("native", "native-echo"):
                try:
                    counters = json.loads(out.strip().splitlines()[-1])
                    extra["arbiter_grants" if self.kind == "native" else "echoed_frames"] = \
                        counters["grants" if self.kind == "native" else "frames"]
                except (ValueError, IndexError, KeyError):
                    pass
            if self.profile_path:
                try:
                    with open(self.profile_path) as f:
                        records = {(j, t): r for j, t, r in json.load(f)}
                finally:
                    os.unlink(self.profile_path)
        else:
            self.stop_evt.set()
            self.mp_proc.join(10)
        return extra, cpu, records


# ---------------------------------------------------------------- clients

def _job_side(args, servers, i):
    """(server, tree) of job ``i``: with ``--ab-tree`` the odd jobs run the B code
    (and talk to the B server when there is one), the even ones the A code."""
    b = bool(args.ab_tree) and i % 2 == 1
    return servers[i % len(servers)] if b else servers[0], args.ab_tree if b else args.tree


def _python_clients(args, servers):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start_evt = ctx.Event()
    job = _job if args.server in _ARBITER_PROTO else _grpc_job if args.server == "grpc" else _echo_job
    job = _SCHED_JOBS.get(args.client, job)
    procs = []
    for i in range(args.jobs):
        srv, tree = _job_side(args, servers, i)
        target = srv.addr if job is _job or args.client in _SCHED_JOBS else srv.port
        procs.append(ctx.Process(target=job, args=(i, target, args.samples, args.interval,
                                                   args.warmup, q, start_evt)
                                 + ((args.profile, tree) if job is not _grpc_job else ())))
    for p in procs:
        p.start()
    time.sleep(0.5)
    for srv in servers:
        srv.mark()
    h0 = host_cpu()
    start_evt.set()
    all_rtts, errors, counters = [], [], {}
    for _ in procs:
        idx, rtts, extra = q.get(timeout=600)
        if rtts is None:
            errors.append(extra)
        else:
            all_rtts += rtts
            extra["rtts"] = rtts
            counters[idx] = extra
    h1 = host_cpu()
    for p in procs:
        p.join(30)
    cpu = [c["cpu_seconds"] for c in counters.values() if "cpu_seconds" in c]
    return all_rtts, errors, counters, (h0, h1), (sum(cpu) if len(cpu) == len(counters) else None)


def _native_clients(args, servers):
    srv = servers[0]
    exe, kind = build_native(exe=args.native_exe)
    proto = "arbiter" if args.server in _ARBITER_PROTO else "echo"
    if proto == "arbiter" and kind != "openssl":
        raise SystemExit("--client native against an arbiter needs OpenSSL's libcrypto")
    cmd = [exe, "client", "--proto", proto, "--port", str(srv.port), "--jobs", str(args.jobs),
           "--samples", str(args.samples), "--warmup", str(args.warmup),
           "--interval-us", str(int(round(args.interval * 1e6))), "--secret", SECRET]
    if args.client == "native-io-thread":
        cmd.append("--io-thread")
    # the server's CPU is counted from here: the jobs connect (handshake) first, ~ms
    srv.mark()
    h0 = host_cpu()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    h1 = host_cpu()
    try:
        d = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [], ["native client failed (rc %d): %s" % (r.returncode, r.stderr.strip()[-400:])], \
            {}, (h0, h1), None
    counters = {i: {"cpu_seconds": c, "fallback_grants": 0} for i, c in enumerate(d["cpu_s"])}
    return d["rtt_ns"], d["errors"], counters, (h0, h1), sum(d["cpu_s"])


def _profile_samples(counters, server_records):
    out = []
    for idx, c in counters.items():
        for i, r in c.get("profile", ()):
            if server_records is not None:
                r = dict(r, **server_records.get(("job%d" % idx, i), {}))
            out.append(r)
    return out


def _summary(args, all_rtts, errors, extra):
    all_rtts.sort()
    us = lambda ns: round(ns / 1000.0, 1)  # noqa: E731
    res = {
        "jobs": args.jobs, "samples": len(all_rtts), "interval_s": args.interval,
        "server": args.server, "client": args.client,
        "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "rtt_us": {"p50": us(pct(all_rtts, 50)), "p90": us(pct(all_rtts, 90)),
                   "p99": us(pct(all_rtts, 99)), "max": us(all_rtts[-1]) if all_rtts else None},
        "errors": errors,
    }
    res.update(extra)
    if not args.json:
        what = {"python": "arbiter grant", "native": "native arbiter grant",
                "echo": "baseline echo", "native-echo": "native echo",
                "grpc": "grpc bidi-stream echo"}[args.server]
        print("%s round trip, %s client, %d jobs, %d samples, interval %.4fs, %s CPUs, "
              "load %.2f before / %.2f after:"
              % (what, args.client, args.jobs, len(all_rtts), args.interval, os.cpu_count(),
                 res.get("loadavg_1m_before", float("nan")), res["loadavg_1m"]))
        print("  p50 %.1f us  p90 %.1f us  p99 %.1f us  max %.1f us" % (
            res["rtt_us"]["p50"], res["rtt_us"]["p90"], res["rtt_us"]["p99"], res["rtt_us"]["max"]))
        for half, d in sorted((res.get("ab") or {}).items()):
            print("  %s (%d jobs, %s): p50 %.1f us  p90 %.1f us  p99 %.1f us  client CPU %s us/grant%s"
                  % (half.upper(), d["jobs"], d["tree"] or "this checkout", d["rtt_us"]["p50"],
                     d["rtt_us"]["p90"], d["rtt_us"]["p99"], d["client_cpu_us_per_grant"],
                     ("  server CPU %s us/grant" % d["server_cpu_us_per_grant"])
                     if "server_cpu_us_per_grant" in d else ""))
        prof = res.get("profile")
        if prof:
            print("  per stage (us): p50 / p99 / mean / mean of the slowest %g%% (%d round trips, "
                  "p99 %.1f us)" % (100 - prof["tail_pct"], prof["tail_round_trips"],
                                    prof["rtt_p99_us"]))
            for r in prof["stages"]:
                print("    %-52s %7.1f %7.1f %7.1f %7.1f" % (r["stage"], r["p50_us"], r["p99_us"],
                                                          r["mean_us"], r["tail_mean_us"]))
            for r in prof["syscalls"]:
                print("    (%-50s %7.1f %7.1f %7.1f %7.1f)" % (r["stage"], r["p50_us"],
                                                            r["p99_us"], r["mean_us"],
                                                            r["tail_mean_us"]))
    print(json.dumps(res, sort_keys=True))
    return 1 if errors else 0


def _ab_summary(args, counters, server_cpu):
    """Per half of an ``--ab-tree`` run: round trips and CPU of the A and the B jobs."""
    us = lambda ns: round(ns / 1000.0, 1)  # noqa: E731
    out = {}
    for half, odd in (("a", 0), ("b", 1)):
        cs = [c for i, c in counters.items() if i % 2 == odd]
        rtts = sorted(r for c in cs for r in c["rtts"])
        n = sum(1 for i in range(args.jobs) if i % 2 == odd) * (args.samples + args.warmup)
        out[half] = {"tree": args.ab_tree if odd else args.tree, "jobs": len(cs),
                     "samples": len(rtts),
                     "rtt_us": {"p50": us(pct(rtts, 50)), "p90": us(pct(rtts, 90)),
                                "p99": us(pct(rtts, 99))},
                     "client_cpu_us_per_grant": round(sum(c["cpu_seconds"] for c in cs) / n * 1e6, 1)
                     if n else None}
        if len(server_cpu) == 2 and server_cpu[odd] is not None:
            out[half]["server_cpu_us_per_grant"] = round(server_cpu[odd] / n * 1e6, 1)
    return out


def run(args):
    """One measurement as the command line describes it; returns the exit code."""
    load0 = round(os.getloadavg()[0], 2)
    servers = [_Server(args)]
    try:
        if args.ab_tree and args.server == "python":
            servers.append(_Server(args, tree=args.ab_tree))
        if args.client == "python" or args.client in _SCHED_JOBS:
            all_rtts, errors, counters, (h0, h1), client_cpu = _python_clients(args, servers)
        else:
            all_rtts, errors, counters, (h0, h1), client_cpu = _native_clients(args, servers)
    finally:
        stopped = [s.stop() for s in servers]
    srv = servers[0]
    extra, _, records = stopped[0]
    cpus = [c for _, c, _ in stopped]
    srv_cpu = sum(cpus) if None not in cpus else None
    n_grants = args.jobs * (args.samples + args.warmup)
    if args.ab_tree:
        extra["ab"] = _ab_summary(args, counters, cpus)
    kinds = sorted({c["arbiter_client"] for c in counters.values() if "arbiter_client" in c})
    if kinds:                                   # --client sched-*: the client the jobs ran
        extra["arbiter_client"] = kinds
    # what the jobs' clients were given (None: default priority)
    extra["jobs_io_priority"] = sorted({"%s=%d" % c["io_priority"] if c.get("io_priority")
                                        else None for c in counters.values()}, key=str)
    for c in counters.values():
        c.pop("rtts", None)
    extra.update({
        "loadavg_1m_before": load0,
        "host": host_load(h0, h1, (srv_cpu or 0.0) + client_cpu if client_cpu is not None else None),
        "fallback_grants": sum(c.get("fallback_grants", 0) for c in counters.values()),
        "arbiter_prefix": args.arbiter_prefix,
        "arbiter_args": args.arbiter_args,
        "io_priority": args.io_priority,
        "tree": args.tree,
        # CPU per round trip (request + grant + complete), from the start signal on:
        # load-independent cost
        "server_cpu_us_per_grant": round(srv_cpu / n_grants * 1e6, 1) if srv_cpu is not None else None,
        "client_cpu_us_per_grant": round(client_cpu / n_grants * 1e6, 1)
        if client_cpu is not None else None})
    if srv.kind.startswith("native") or args.client.startswith("native"):
        # the native side MACs every frame (libcrypto) when it speaks the arbiter's protocol
        extra["native_hmac"] = "openssl" if srv.kind in _ARBITER_PROTO else "none"
    if args.profile:
        from benchmarks.rtt_probe import breakdown
        extra["profile"] = breakdown(_profile_samples(counters, records))
    return _summary(args, all_rtts, errors, extra)


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


def parse_args(argv=None):
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
    ap.add_argument("--arbiter-args", default="", metavar="ARGS",
                    help="more options for the Python arbiter (horovod-prio arbiter), e.g. "
                         "'--priority realtime --cpu 1': the product's own placement knobs")
    ap.add_argument("--io-priority", metavar="P",
                    help="the jobs' arbiter client I/O thread priority (HOROVOD_PRIO_ARBITER_"
                         "IO_PRIORITY: realtime[=N] or nice=N); Python and sched-* jobs")
    ap.add_argument("--server", choices=SERVERS, default="python",
                    help="python: the arbiter (horovod-prio arbiter); native: C epoll loop, same "
                         "protocol incl. HMAC, grants at once; echo: bare Python selectors echo; "
                         "native-echo: C echo of frames; grpc: grpcio bidi-stream echo")
    ap.add_argument("--client", choices=CLIENTS, default="python",
                    help="python: ArbiterClient (echo job against an echo); native: C job "
                         "processes; native-io-thread: C jobs with an I/O thread; "
                         "sched-native / sched-python: the product's path, a scheduler joined "
                         "by ArbiterLink with arbiter_client native / python (request -> "
                         "release in the scheduler's trace)")
    ap.add_argument("--grpc", action="store_true",
                    help="= --server grpc (the transport not chosen; raw bytes, no auth/policy)")
    ap.add_argument("--baseline", action="store_true",
                    help="= --server echo: the machine's floor for a Python round trip, same job "
                         "structure (I/O thread + callback), no auth/policy")
    ap.add_argument("--profile", action="store_true",
                    help="time every stage of each round trip (Python jobs; server python or "
                         "native); see benchmarks/rtt_probe.py")
    ap.add_argument("--native-exe", metavar="PATH",
                    help="use this build of benchmarks/rtt_native.c instead of compiling it")
    ap.add_argument("--tree", metavar="DIR",
                    help="import horovod_prio from this checkout (server and jobs)")
    ap.add_argument("--ab-tree", metavar="DIR",
                    help="paired A/B: the odd jobs import horovod_prio from DIR (and, with "
                         "--server python, talk to a second arbiter running DIR's code), the even "
                         "ones from --tree (or this checkout); both halves run at the same time, "
                         "so they see the same machine load; 'ab' in the result has each half")
    ap.add_argument("--grant-rate", action="store_true",
                    help="measure the grant policy alone (in process): grants/s with --rate-jobs "
                         "jobs x --rate-pending pending requests")
    ap.add_argument("--rate-jobs", type=int, default=64)
    ap.add_argument("--rate-pending", type=int, default=64)
    ap.add_argument("--rate-grants", type=int, default=20000)
    args = ap.parse_args(argv)
    if args.grpc and args.baseline:
        ap.error("--grpc and --baseline exclude each other")
    if args.grpc or args.baseline:
        if args.server != "python":
            ap.error("--grpc/--baseline set the server; do not combine them with --server")
        args.server = "grpc" if args.grpc else "echo"
    if args.jobs < 1 or args.samples < 1 or args.warmup < 0 or args.interval < 0:
        ap.error("--jobs and --samples must be >= 1, --warmup and --interval >= 0")
    if args.server == "grpc" and args.client != "python":
        ap.error("--server grpc takes only --client python")
    if args.client in _SCHED_JOBS and (args.server not in _ARBITER_PROTO or args.ab_tree
                                       or args.profile):
        ap.error("--client %s (the scheduler's path) needs --server python or native, and "
                 "takes no --ab-tree or --profile" % args.client)
    if args.io_priority is not None:
        from horovod_prio.method import units
        try:
            units.parse_sched_priority(args.io_priority)
        except units.BadValue as e:
            ap.error("--io-priority: %s" % e)
        if args.client.startswith("native") or args.server not in _ARBITER_PROTO:
            ap.error("--io-priority sets the arbiter clients' I/O thread: --client python or "
                     "sched-*, --server python or native")
    if args.arbiter_args and (args.server != "python" or args.profile):
        ap.error("--arbiter-args are options of the Python arbiter: --server python, no --profile")
    if args.profile and (args.client != "python" or args.server not in _ARBITER_PROTO):
        ap.error("--profile times the Python ArbiterClient: --client python with --server "
                 "python or native")
    for opt in ("tree", "ab_tree"):
        d = getattr(args, opt)
        if d is not None:
            d = os.path.abspath(d)
            if not os.path.isfile(os.path.join(d, "horovod_prio", "arbiter", "client.py")):
                ap.error("--%s %s has no horovod_prio/arbiter/client.py" % (opt.replace("_", "-"), d))
            setattr(args, opt, d)
    if args.ab_tree and (args.client != "python" or args.server not in _ARBITER_PROTO
                         or args.profile or args.jobs < 2):
        ap.error("--ab-tree compares Python job code: --client python, --server python or native, "
                 "--jobs >= 2, no --profile")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.grant_rate:
        return _grant_rate_main(args)
    if args.io_priority is None:
        return run(args)
    before = os.environ.get(IO_PRIORITY_ENV)
    os.environ[IO_PRIORITY_ENV] = args.io_priority          # the spawned jobs inherit it
    try:
        return run(args)
    finally:                     # the caller's environment as it was (a test runs main in-process)
        if before is None:
            os.environ.pop(IO_PRIORITY_ENV, None)
        else:
            os.environ[IO_PRIORITY_ENV] = before


if __name__ == "__main__":
    sys.exit(main())
