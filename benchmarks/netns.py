"""A network namespace whose loopback is a shaped bottleneck, and cleanup.

Everything a benchmark starts runs inside the namespace, in its own process
group. Cleanup (idempotent, run from ``finally``/``atexit``/signal handlers):

1. SIGTERM to every process group we started, then SIGKILL after a grace time;
2. SIGKILL to every process still inside the namespace (``ip netns pids``) --
   this catches Horovod workers, which ``horovodrun``'s ``safe_shell_exec``
   moves into sessions of their own;
3. ``ip netns del``.

Namespace names are ``hprio-bench-<creator pid>-<n>``; at start, namespaces
with our prefix whose creator is no longer alive are removed (stale runs
killed with SIGKILL), while those of concurrent live runs are left alone.
"""
from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
import weakref

from horovod_prio.method import units

PREFIX = "hprio-bench-"
#: MTU of the shaped ``lo``: it is left at the kernel's default for a loopback
#: (64 KiB), so its frames' headers add 0.1 % to the payload (the link floor
#: counts them: ``benchmarks.bounds``)
MTU = 65536


_counter = itertools.count()


def cleaned_up_at_exit() -> weakref.WeakSet:
    """A weak set of live objects whose ``cleanup()`` (idempotent) runs at
    interpreter exit, each once, an error in one not stopping the others:
    the shaped links here, the testbeds in :mod:`benchmarks.testbed`."""
    live: weakref.WeakSet = weakref.WeakSet()

    @atexit.register
    def _cleanup_all() -> None:
        for obj in list(live):
            try:
                obj.cleanup()
            except Exception:
                pass
    return live


_live_links: "weakref.WeakSet[ShapedLink]" = cleaned_up_at_exit()


class HarnessError(RuntimeError):
    """A benchmark precondition failed (root, tools, bad value)."""


def check_shaping(rate, burst, latency, delay=None) -> None:
    """``ValueError`` naming the first of a tbf (+netem) link's values that
    ``tc`` would not read (:mod:`horovod_prio.method.units`, ``tc`` forms)."""
    units.check("rate", units.parse_rate_bits_per_s, rate)
    units.check("burst", units.parse_burst_bytes, burst)
    units.check("latency", units.parse_duration_s, latency, tc=True)
    if delay is not None:
        units.check("delay", units.parse_duration_s, delay, tc=True)


def require_root() -> None:
    if os.geteuid() != 0:
        raise HarnessError(
            "the benchmark harness needs root: it creates a network namespace "
            "(ip netns add) and shapes its loopback with tc. Run it as root, "
            "e.g. `sudo make bench` or `sudo .venv/bin/python -m benchmarks.run`.")


def require_tools() -> None:
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise HarnessError(f"missing {', '.join(missing)}: install iproute2 "
                           "(apt-get install iproute2)")


def run_cmd(argv, check=True, timeout=30):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise HarnessError(f"command failed ({p.returncode}): {' '.join(argv)}\n"
                           f"{p.stderr.strip()}")
    return p


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    p = run_cmd(["ip", "netns", "list"], check=False)
    names = []
    for line in p.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(prefix):
            names.append(name)
    return names


def namespace_pids(name: str) -> list[int]:
    p = run_cmd(["ip", "netns", "pids", name], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owned_by_another_live_process(name: str, prefix: str = PREFIX) -> bool:
    """Whether ``name`` (``<prefix><pid>-...``: a namespace or its /etc/netns
    dir) belongs to a live process other than this one (a concurrent
    benchmark): stale clean-ups leave it alone."""
    m = re.match(re.escape(prefix) + r"(\d+)-", name)
    return bool(m) and int(m.group(1)) != os.getpid() and pid_alive(int(m.group(1)))


def kill_namespace_processes(name: str, grace: float = 2.0) -> int:
    """SIGTERM, then SIGKILL, every process inside namespace ``name``."""
    pids = namespace_pids(name)
    own = os.getpid()
    pids = [p for p in pids if p != own]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            pids = [p for p in namespace_pids(name) if p != own]
            if not pids:
                return 0
            time.sleep(0.05)
    return len(pids)


def delete_namespace(name: str) -> None:
    kill_namespace_processes(name)
    run_cmd(["ip", "netns", "del", name], check=False)


def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces with our prefix whose creating process is gone."""
    removed = []
    for name in list_namespaces(prefix):
        if owned_by_another_live_process(name, prefix):
            continue  # a concurrent, live benchmark owns it
        if any(l.name == name for l in _live_links):
            continue
        delete_namespace(name)
        removed.append(name)
    return removed


def qdisc_bytes_sent(ns: str) -> int:
    """Bytes the root qdisc of ``lo`` in ``ns`` has sent so far."""
    p = run_cmd(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", "lo"], check=False)
    m = re.search(r"Sent (\d+) bytes", p.stdout)
    return int(m.group(1)) if m else 0


def stop_process_groups(procs, grace: float = 3.0) -> None:
    """SIGTERM the process groups of ``procs`` (started with ``start_new_session``),
    wait up to ``grace`` s in all, then SIGKILL what is left and reap it."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class ShapedLink:
    """Context manager: a namespace whose ``lo`` is a tbf (+netem) bottleneck.

    >>> with ShapedLink("1gbit", delay="1ms") as link:
    ...     proc = link.popen(["horovodrun", ...])
    """

    def __init__(self, rate: str = "1gbit", delay: str | None = None,
                 burst: str = "1mb", latency: str = "50ms", name: str | None = None):
        if delay in (None, "", "0", "0ms"):
            delay = None
        check_shaping(rate, burst, latency, delay)
        self.rate, self.delay, self.burst, self.latency = rate, delay, burst, latency
        self.name = name or f"{PREFIX}{os.getpid()}-{next(_counter)}"
        if not self.name.startswith(PREFIX):
            raise ValueError(f"namespace name must start with {PREFIX!r}")
        self._procs: list[subprocess.Popen] = []
        self._created = False

    # -- lifecycle ---------------------------------------------------------
    def create(self) -> "ShapedLink":
        require_root()
        require_tools()
        cleanup_stale()
        _live_links.add(self)
        run_cmd(["ip", "netns", "add", self.name])
        self._created = True
        try:
            ex = ["ip", "netns", "exec", self.name]
            run_cmd(ex + ["ip", "link", "set", "lo", "up"])
            tbf = ["tbf", "rate", self.rate, "burst", self.burst, "latency", self.latency]
            if self.delay:
                p = run_cmd(ex + ["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:",
                               "netem", "delay", self.delay, "limit", "100000"], check=False)
                if p.returncode != 0:
                    raise HarnessError(
                        f"--delay {self.delay}: tc netem failed ({p.stderr.strip()}); "
                        "this kernel lacks sch_netem (modprobe sch_netem) -- run without --delay")
                run_cmd(ex + ["tc", "qdisc", "add", "dev", "lo", "parent", "1:1",
                           "handle", "10:"] + tbf)
            else:
                run_cmd(ex + ["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:"] + tbf)
        except BaseException:
            self.cleanup()
            raise
        return self

    def __enter__(self) -> "ShapedLink":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def exists(self) -> bool:
        return self.name in list_namespaces()

    def qdisc(self) -> str:
        return run_cmd(["ip", "netns", "exec", self.name, "tc", "qdisc", "show", "dev", "lo"]).stdout

    def bytes_sent(self) -> int:
        return qdisc_bytes_sent(self.name)

    # -- processes ---------------------------------------------------------
    def command(self, argv: list[str], cpus: str | None = None) -> list[str]:
        pre = ["ip", "netns", "exec", self.name]
        if cpus is not None:
            pre += ["taskset", "-c", str(cpus)]
        return pre + list(argv)

    def popen(self, argv: list[str], cpus: str | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` inside the namespace, in a new process group."""
        if not self._created:
            raise HarnessError("ShapedLink.popen() before create()")
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(argv, cpus), **kw)
        self._procs.append(p)
        return p

    def kill_processes(self, grace: float = 3.0) -> None:
        live = [p for p in self._procs if p.poll() is None]
        stop_process_groups(live, grace)
        if self._created:
            kill_namespace_processes(self.name, grace=1.0)

    def cleanup(self) -> None:
        """Idempotent: kill everything we started and delete the namespace."""
        try:
            self.kill_processes()
        finally:
            if self._created:
                run_cmd(["ip", "netns", "del", self.name], check=False)
                self._created = False
            _live_links.discard(self)


def install_signal_handlers() -> None:
    """SIGINT -> KeyboardInterrupt (even if the parent shell ignored it, as
    non-interactive shells do for background jobs), SIGTERM/SIGHUP ->
    SystemExit, so ``finally`` blocks run and clean up."""
    def _handler(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _handler)
