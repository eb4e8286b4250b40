"""A testbed that looks like a small cluster: hosts as network namespaces,
two racks joined by one shaped uplink.

    from benchmarks.testbed import plan_topology, Testbed

    topo = plan_topology(["a1", "a2"], ["b1", "b2"], rate="1gbit")
    with Testbed(topo) as tb:
        p = tb.popen("head", ["horovodrun", "--gloo", "-np", "2", "-H", "a1:1,b1:1",
                              "--network-interface", "eth0", "python", "train.py"],
                     env=tb.launch_env())

Layout (everything in namespaces of our own; nothing is attached to the
machine's root namespace, so no test traffic can leave them)::

    rack A                                          rack B
    head  arbiter  a1  a2 ...                       b1  b2 ...
      |      |      |   |                            |   |
    +-eth0---eth0---eth0-eth0-+                    +-eth0-eth0-+
    |        bridge brA       |== upA ~~~~ upB ==|  bridge brB  |
    +-------------------------+   (veth pair,     +------------+
            namespace <prefix>fab: both bridges and the uplink

* every host is a namespace ``<prefix><host>`` with its own ``lo`` and one
  ``eth0`` (a veth whose peer sits in the fabric namespace, enslaved to its
  rack's bridge), one address in ``subnet`` (one L2 domain, no routing);
* the two rack bridges are joined by ONE veth pair, the uplink ``upA``
  (on brA) -- ``upB`` (on brB), shaped by ``tc tbf`` on the egress of both
  ends: ``upA`` carries rack A -> B, ``upB`` rack B -> A;
* ``head`` (where the launchers run) and ``arbiter`` are hosts on rack A;
* names resolve like on a cluster: ``/etc/netns/<ns>/hosts`` (bind-mounted
  over ``/etc/hosts`` by ``ip netns exec``) lists every host;
* an ``ssh`` shim in a private directory (``Testbed.shim_dir``, put first on
  PATH by ``launch_env()``; Open MPI's ``plm_rsh_agent`` points at it) turns
  ``ssh [options] <host> <command>`` -- what ``horovodrun`` and ``mpirun``
  run for a remote host -- into ``ip netns exec <host ns> env -i <login env>
  [taskset -c <host cpus>] unshare --uts sh -c 'hostname <host>; <command>'``:
  the command runs on that host, with its own host name and only the
  environment the launcher passed on the command line (as with real ssh).
  Every invocation is appended to ``shim_dir/ssh.log`` (secrets redacted).

``Testbed.create()`` needs root (``ip netns``, ``tc``) and removes, first,
testbeds left behind by dead processes. ``cleanup()`` (also on ``__exit__``,
``atexit`` and -- with ``netns.install_signal_handlers()`` -- SIGINT/SIGTERM)
kills every process inside our namespaces, deletes them (which deletes every
veth and bridge, all of which live in them) and removes the
``/etc/netns/<ns>`` directories and the shim directory.
"""
from __future__ import annotations

import ipaddress
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from horovod_prio.method import units
from horovod_prio.sim.wire import ETHERNET_MTU

from . import cgroups
from .cgroups import Cgroup, Limits
from .netns import (HarnessError, check_shaping, cleaned_up_at_exit, kill_namespace_processes,
                    list_namespaces, owned_by_another_live_process, require_root,
                    require_tools, run_cmd, stop_process_groups)

PREFIX = "hprio-tb-"
#: MTU of every veth of the testbed, the uplink's included: they are created
#: without one, so the kernel's default, Ethernet's. The uplink's shaper counts
#: each frame's headers (horovod_prio.sim.wire's rule: benchmarks.sim_check
#: models them with LinkConfig.mtu, benchmarks.bounds' link floor counts them)
MTU = ETHERNET_MTU
ETC_NETNS = Path("/etc/netns")
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HOST_RE = re.compile(r"^[a-z][a-z0-9-]{0,14}$")
_counter = itertools.count()
_live: "weakref.WeakSet[Testbed]" = cleaned_up_at_exit()


# ---------------------------------------------------------------- topology (pure)
@dataclass(frozen=True)
class Host:
    name: str            # host name (resolvable inside the testbed, used in -H)
    rack: str            # "A" or "B"
    address: str         # IPv4 address of its eth0
    netns: str           # its network namespace
    peer: str            # its veth peer's name in the fabric namespace
    cpus: str | None = None   # taskset CPU list for commands run on it via the shim
    kind: str | None = None   # host kind (benchmarks.cgroups.KINDS): its own cgroup
    limits: Limits | None = None   # that cgroup's limits


@dataclass(frozen=True)
class Topology:
    """What a testbed consists of: no side effects, so it can be planned and
    checked without root."""
    tag: str
    rate: str
    burst: str
    latency: str
    prefixlen: int
    hosts: tuple[Host, ...]
    fabric: str
    bridges: tuple[str, str] = ("brA", "brB")
    uplink: tuple[str, str] = ("upA", "upB")

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name or h.address == name:
                return h
        raise KeyError(f"no host {name!r} in this testbed "
                       f"(hosts: {', '.join(h.name for h in self.hosts)})")

    def rack(self, rack: str) -> list[Host]:
        return [h for h in self.hosts if h.rack == rack]

    def namespaces(self) -> list[str]:
        return [self.fabric] + [h.netns for h in self.hosts]

    def uplink_dev(self, direction: str) -> str:
        """The veth whose egress carries ``direction`` ("AB" = rack A -> B, "BA")."""
        return {"AB": self.uplink[0], "BA": self.uplink[1]}[direction]

    def rate_bps(self) -> float:
        return units.parse_rate_bits_per_s(self.rate)

    def hosts_file(self) -> str:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{h.address}\t{h.name}" for h in self.hosts]
        return "\n".join(lines) + "\n"

    def setup_commands(self) -> list[list[str]]:
        """The ``ip``/``tc`` commands that build the topology, in order (the
        namespaces themselves are added first by ``Testbed.create``)."""
        f = self.fabric
        br_a, br_b = self.bridges
        up_a, up_b = self.uplink
        cmds = [["ip", "-n", f, "link", "set", "lo", "up"]]
        for br in (br_a, br_b):
            cmds += [["ip", "-n", f, "link", "add", br, "type", "bridge", "stp_state", "0",
                      "forward_delay", "0"],
                     ["ip", "-n", f, "link", "set", br, "up"]]
        cmds += [["ip", "-n", f, "link", "add", up_a, "type", "veth", "peer", "name", up_b],
                 ["ip", "-n", f, "link", "set", up_a, "master", br_a],
                 ["ip", "-n", f, "link", "set", up_b, "master", br_b],
                 ["ip", "-n", f, "link", "set", up_a, "up"],
                 ["ip", "-n", f, "link", "set", up_b, "up"]]
        for up in (up_a, up_b):
            cmds.append(["tc", "-n", f, "qdisc", "add", "dev", up, "root", "handle", "1:",
                         "tbf", "rate", self.rate, "burst", self.burst, "latency", self.latency])
        for h in self.hosts:
            br = br_a if h.rack == "A" else br_b
            cmds += [["ip", "link", "add", "eth0", "netns", h.netns, "type", "veth",
                      "peer", "name", h.peer, "netns", f],
                     ["ip", "-n", f, "link", "set", h.peer, "master", br],
                     ["ip", "-n", f, "link", "set", h.peer, "up"],
                     ["ip", "-n", h.netns, "link", "set", "lo", "up"],
                     ["ip", "-n", h.netns, "addr", "add", f"{h.address}/{self.prefixlen}",
                      "dev", "eth0"],
                     ["ip", "-n", h.netns, "link", "set", "eth0", "up"]]
        return cmds

    def shim_script(self, log_path: Path, home: str = "/root",
                    cgroups: dict[str, list[str]] | None = None) -> str:
        """The ``ssh`` shim (POSIX sh) for this topology; ``cgroups``: host ->
        the ``cgroup.procs`` files a command on that host joins before it runs."""
        cases = []
        for h in self.hosts:
            cpus = shlex.quote(h.cpus) if h.cpus else "''"
            cg = shlex.quote(" ".join((cgroups or {}).get(h.name, []))) or "''"
            cases.append(f"  {h.name}|{h.address}) ns={shlex.quote(h.netns)}; "
                         f"name={h.name}; cpus={cpus}; cg={cg} ;;")
        return _SHIM.format(tag=self.tag, log=shlex.quote(str(log_path)),
                            cases="\n".join(cases), path=LOGIN_PATH, home=shlex.quote(home))


_SHIM = r"""#!/bin/sh
# ssh shim of the horovod_prio testbed {tag} (generated by benchmarks/testbed.py).
# "ssh [options] HOST [options] COMMAND..." runs COMMAND on HOST: in HOST's
# network namespace, with HOST's name (own UTS namespace) and a fresh login
# environment, so only what the caller passes on the command line arrives.
host=
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift; shift ;;
    -[BbcDEeFIiJLlmOoPpQRSWw]*) shift ;;
    -*) shift ;;
    *) if [ -z "$host" ]; then host=$1; shift; else break; fi ;;
  esac
done
host=${{host#*@}}
case "$host" in
{cases}
  *) echo "ssh: Could not resolve hostname $host: Name or service not known" >&2; exit 255 ;;
esac
if [ $# -eq 0 ]; then
  echo "ssh shim: no command given (interactive sessions are not supported)" >&2; exit 255
fi
cmd="$*"
printf '%s %s %s\n' "$(date +%s.%N)" "$name" \
  "$(printf '%s' "$cmd" | sed 's/\(SECRET[A-Za-z0-9_]*=\)[^ ]*/\1<hidden>/g' | cut -c1-400)" \
  >> {log}
pin=
[ -n "$cpus" ] && pin="taskset -c $cpus"
for f in $cg; do
  echo $$ > "$f" || {{ echo "ssh shim: cannot join the cgroup of $name ($f)" >&2; exit 255; }}
done
exec ip netns exec "$ns" env -i HOME={home} USER=root LOGNAME=root SHELL=/bin/sh \
  LANG=C.UTF-8 PATH={path} $pin unshare --uts /bin/sh -c 'hostname "$1" && exec /bin/sh -c "$2"' \
  ssh-shim "$name" "$cmd"
"""


def plan_topology(rack_a: list[str], rack_b: list[str], *, rate: str = "1gbit",
                  burst: str = "1mb", latency: str = "50ms", subnet: str = "10.77.0.0/16",
                  cpus: dict[str, str] | None = None, tag: str | None = None,
                  extra_hosts: tuple[str, ...] = ("head", "arbiter"),
                  kinds: dict | None = None) -> Topology:
    """Hosts ``extra_hosts`` + ``rack_a`` on rack A, ``rack_b`` on rack B.

    Addresses: rack A hosts ``x.y.1.1, .2, ...`` (the extra hosts first), rack B
    ``x.y.2.1, ...`` of ``subnet`` (a /16 or larger, private). ``cpus``: host
    name -> taskset CPU list for what the shim runs on that host. ``kinds``:
    host name -> its kind, as ``"KIND[,key=value...]"`` text (see
    ``benchmarks.cgroups``) or a ``(kind, Limits)`` pair: the host gets a
    cgroup of its own with those limits."""
    check_shaping(rate, burst, latency)
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError:
        raise ValueError(f"invalid subnet {subnet!r}: expected e.g. 10.77.0.0/16") from None
    if net.version != 4 or net.prefixlen > 16 or not net.is_private:
        raise ValueError(f"invalid subnet {subnet!r}: expected a private IPv4 /16 or larger "
                         "(the testbed's own addresses; nothing outside our namespaces "
                         "can reach them)")
    a_names = list(extra_hosts) + list(rack_a)
    names = a_names + list(rack_b)
    if not rack_a or not rack_b:
        raise ValueError("a testbed needs at least one host in each rack")
    bad = [n for n in names if not _HOST_RE.match(n)]
    if bad:
        raise ValueError(f"invalid host name(s) {bad}: lowercase letters, digits and '-', "
                         "starting with a letter, at most 15 characters")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate host name(s) {dup}")
    if len(a_names) > 250 or len(rack_b) > 250:
        raise ValueError("at most 250 hosts per rack")
    cpus = dict(cpus or {})
    unknown = sorted(set(cpus) - set(names))
    if unknown:
        raise ValueError(f"cpus given for unknown host(s) {unknown}")
    for n, c in cpus.items():
        if c is not None and not re.fullmatch(r"\d+([-,]\d+)*", str(c)):
            raise ValueError(f"invalid CPU list {c!r} for host {n}: expected e.g. 0 or 0,1")
    kind_of = {}
    for n, k in (kinds or {}).items():
        if n not in names:
            raise ValueError(f"host kind given for unknown host {n!r} (hosts: {', '.join(names)})")
        kind_of[n] = (cgroups.parse_host_kind(f"{n}={k}")[1:] if isinstance(k, str)
                      else (k[0], k[1]))
    tag = tag or f"{os.getpid()}-{next(_counter)}"
    if not re.fullmatch(r"[A-Za-z0-9-]{1,24}", tag):
        raise ValueError(f"invalid tag {tag!r}")
    base = int(net.network_address)
    hosts = []
    for rack, third, members in (("A", 1, a_names), ("B", 2, list(rack_b))):
        for i, n in enumerate(members):
            hosts.append(Host(name=n, rack=rack,
                              address=str(ipaddress.IPv4Address(base + third * 256 + i + 1)),
                              netns=f"{PREFIX}{tag}-{n}", peer=f"p{len(hosts)}",
                              cpus=cpus.get(n), kind=kind_of.get(n, (None, None))[0],
                              limits=kind_of.get(n, (None, None))[1]))
    return Topology(tag=tag, rate=rate, burst=burst, latency=latency, prefixlen=net.prefixlen,
                    hosts=tuple(hosts), fabric=f"{PREFIX}{tag}-fab")


def host_command(host: Host, argv: list[str], cpus: str | None = None,
                 procs_files: list[str] | None = None) -> list[str]:
    """``argv`` on ``host``; with ``procs_files`` it joins those cgroups first."""
    pre = ["ip", "netns", "exec", host.netns]
    if procs_files:
        pre = cgroups.wrap_command(procs_files, pre)
    if cpus is not None:
        pre += ["taskset", "-c", str(cpus)]
    return pre + ["unshare", "--uts", "/bin/sh", "-c", 'hostname "$0" && exec "$@"',
                  host.name] + list(argv)


# ---------------------------------------------------------------- live testbed
def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Delete testbed namespaces (and their /etc/netns dirs) whose creating
    process (the pid in ``<prefix><pid>-<n>-<host>``) is gone."""
    removed = []
    live_ns = {ns for tb in list(_live) for ns in tb.topology.namespaces()}
    for name in list_namespaces(prefix):
        if name in live_ns or owned_by_another_live_process(name, prefix):
            continue
        kill_namespace_processes(name, grace=1.0)
        run_cmd(["ip", "netns", "del", name], check=False)
        shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
        removed.append(name)
    if ETC_NETNS.is_dir():          # /etc/netns dirs whose namespace is already gone
        for d in ETC_NETNS.glob(f"{prefix}*"):
            if d.name in live_ns or owned_by_another_live_process(d.name, prefix):
                continue
            if d.name not in list_namespaces(prefix):
                shutil.rmtree(d, ignore_errors=True)
    return removed


class Testbed:
    """Context manager: build ``topology``, run commands on its hosts, tear it down."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.shim_dir: Path | None = None
        self._procs: list[subprocess.Popen] = []
        self._created: list[str] = []
        self._holder: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.cgroups: dict[str, Cgroup] = {}     # host -> its cgroup (hosts with a kind)

    # -- lifecycle ---------------------------------------------------------
    def create(self) -> "Testbed":
        require_root()
        require_tools()
        for tool in ("unshare", "taskset", "hostname"):
            if shutil.which(tool) is None:
                raise HarnessError(f"missing {tool}: install util-linux / hostname")
        cleanup_stale()
        cgroups.cleanup_stale()      # groups of testbeds whose process is gone
        _live.add(self)
        try:
            topo = self.topology
            for h in topo.hosts:
                if h.limits is not None:
                    self.cgroups[h.name] = Cgroup(f"{topo.tag}-{h.name}", h.limits).create()
            for ns in topo.namespaces():
                run_cmd(["ip", "netns", "add", ns])
                self._created.append(ns)
            for cmd in topo.setup_commands():
                run_cmd(cmd)
            hosts = topo.hosts_file()
            for ns in topo.namespaces():
                d = ETC_NETNS / ns
                d.mkdir(parents=True, exist_ok=True)
                (d / "hosts").write_text(hosts)
            self.shim_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{topo.tag}-shim-"))
            shim = self.shim_dir / "ssh"
            shim.write_text(topo.shim_script(self.shim_dir / "ssh.log",
                                             home=os.environ.get("HOME", "/root"),
                                             cgroups=self.cgroup_files()))
            shim.chmod(0o755)
            (self.shim_dir / "ssh.log").touch()
            # a process inside the fabric namespace, so its counters can be read
            # from /proc/<pid>/net/dev without starting a process per sample
            self._holder = subprocess.Popen(["ip", "netns", "exec", topo.fabric, "sleep",
                                             "1000000"], start_new_session=True,
                                            stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while self._holder.pid not in self._fabric_pids():
                if time.monotonic() > deadline or self._holder.poll() is not None:
                    raise HarnessError("could not start a process in the fabric namespace")
                time.sleep(0.01)
        except BaseException:
            self.cleanup()
            raise
        return self

    def _fabric_pids(self) -> list[int]:
        p = run_cmd(["ip", "netns", "pids", self.topology.fabric], check=False)
        return [int(x) for x in p.stdout.split() if x.isdigit()]

    def __enter__(self) -> "Testbed":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def cgroup_files(self) -> dict[str, list[str]]:
        """host -> the ``cgroup.procs`` files of its cgroup (hosts with a kind), as
        the ssh shim sees them: it runs inside a host's ``ip netns exec``."""
        return {h: cg.procs_files(in_netns=True) for h, cg in self.cgroups.items()}

    def exists(self) -> bool:
        have = set(list_namespaces(PREFIX))
        return any(ns in have for ns in self.topology.namespaces())

    # -- commands on hosts -------------------------------------------------
    def command(self, host: str, argv: list[str], cpus: str | None = None) -> list[str]:
        """``argv`` on ``host``: in its namespace, with its host name (own UTS
        namespace), pinned to ``cpus`` if given, in its cgroup if it has one (the
        environment is the caller's)."""
        h = self.topology.host(host)
        cg = self.cgroups.get(h.name)
        return host_command(h, argv, cpus, cg.procs_files() if cg else None)

    def popen(self, host: str, argv: list[str], cpus: str | None = None,
              **kw) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (its namespace), in a new session."""
        if not self._created:
            raise HarnessError("Testbed.popen() before create()")
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(host, argv, cpus), **kw)
        with self._lock:
            self._procs.append(p)
        return p

    def run(self, host: str, argv: list[str], timeout: float = 30, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.command(host, argv), timeout=timeout, **kw)

    def launch_env(self, base: dict | None = None) -> dict:
        """Environment for a launcher (``horovodrun``/``mpirun``) on a host: the
        ssh shim first on PATH, Open MPI's rsh agent = the shim, OOB/BTL on eth0,
        and MPI ranks that yield the core while they wait: the runner pins a
        job's two ranks (on two hosts) to one core, an oversubscription Open MPI
        cannot see across namespaces, and its default busy-polling then takes
        the core from the other rank (one plain Horovod job, 1 Gbit/s, b64:
        0.59-0.62 s/step busy-polling, 0.46 s yielding, 0.40-0.42 s under Gloo).
        A value in ``base`` wins."""
        env = dict(os.environ if base is None else base)
        venv = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([str(self.shim_dir), venv, env.get("PATH") or LOGIN_PATH])
        env["OMPI_MCA_plm_rsh_agent"] = str(self.shim_dir / "ssh")
        env["OMPI_MCA_oob_tcp_if_include"] = "eth0"
        env["OMPI_MCA_btl_tcp_if_include"] = "eth0"
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        return env

    def shim_log(self) -> list[tuple[float, str, str]]:
        """(time, host, redacted command) of every ssh shim invocation so far."""
        out = []
        try:
            text = (self.shim_dir / "ssh.log").read_text(errors="replace")
        except (OSError, TypeError):
            return out
        for line in text.splitlines():
            parts = line.split(" ", 2)
            if len(parts) >= 2:
                try:
                    out.append((float(parts[0]), parts[1], parts[2] if len(parts) > 2 else ""))
                except ValueError:
                    pass
        return out

    # -- counters ----------------------------------------------------------
    def uplink_bytes(self) -> dict[str, int]:
        """Bytes the tbf qdisc of each uplink end has sent: ``{"AB": n, "BA": n}``."""
        p = run_cmd(["tc", "-n", self.topology.fabric, "-s", "-j", "qdisc", "show"],
                    check=False)
        return parse_tc_json(p.stdout, self.topology)

    def host_bytes(self) -> dict[str, tuple[int, int]]:
        """``{host: (bytes it sent into the fabric, bytes the fabric delivered to it)}``,
        from its veth peer's counters in the fabric namespace."""
        if self._holder is None or self._holder.poll() is not None:
            return {}
        try:
            text = Path(f"/proc/{self._holder.pid}/net/dev").read_text()
        except OSError:
            return {}
        dev = parse_net_dev(text)
        out = {}
        for h in self.topology.hosts:
            if h.peer in dev:
                rx, tx = dev[h.peer]
                out[h.name] = (rx, tx)    # peer rx = what the host sent
        return out

    def namespace_pids(self) -> dict[str, list[int]]:
        out = {}
        for ns in self._created:
            p = run_cmd(["ip", "netns", "pids", ns], check=False)
            out[ns] = [int(x) for x in p.stdout.split() if x.isdigit()]
        return out

    # -- teardown ----------------------------------------------------------
    def kill_processes(self, grace: float = 3.0) -> None:
        """SIGTERM, then SIGKILL, our launched process groups; then every process
        still inside any of the testbed's namespaces (except the fabric holder)."""
        with self._lock:
            live = [p for p in self._procs if p.poll() is None]
        stop_process_groups(live, grace)
        for ns in self._created:
            if ns != self.topology.fabric:
                kill_namespace_processes(ns, grace=1.0)

    def cleanup(self) -> None:
        """Idempotent: kill everything in our namespaces, delete them, remove
        the /etc/netns dirs and the shim dir."""
        try:
            self.kill_processes()
        finally:
            if self._holder is not None:
                try:
                    os.killpg(self._holder.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    self._holder.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                self._holder = None
            for ns in reversed(self._created):      # hosts first, the fabric last
                kill_namespace_processes(ns, grace=1.0)
                run_cmd(["ip", "netns", "del", ns], check=False)
            for ns in self.topology.namespaces():
                shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
            try:
                if ETC_NETNS.is_dir() and not any(ETC_NETNS.iterdir()):
                    ETC_NETNS.rmdir()          # only if we left it empty
            except OSError:
                pass
            if self.shim_dir is not None:
                shutil.rmtree(self.shim_dir, ignore_errors=True)
            errors = []
            for cg in self.cgroups.values():        # after their processes are gone
                try:
                    cg.remove()
                except HarnessError as e:
                    errors.append(str(e))
            self.cgroups = {}
            self._created = []
            _live.discard(self)
            if errors:
                raise HarnessError("; ".join(errors))


# ---------------------------------------------------------------- counter parsing
def parse_tc_json(text: str, topology: Topology) -> dict[str, int]:
    """``tc -s -j qdisc show`` output -> bytes sent by the root qdisc of each
    uplink end, ``{"AB": n, "BA": n}`` (missing -> 0)."""
    try:
        qdiscs = json.loads(text or "[]")
    except ValueError:
        qdiscs = []
    by_dev = {}
    for q in qdiscs if isinstance(qdiscs, list) else []:
        if isinstance(q, dict) and q.get("root") and q.get("kind") == "tbf":
            by_dev[q.get("dev")] = int(q.get("bytes", 0))
    return {d: by_dev.get(topology.uplink_dev(d), 0) for d in ("AB", "BA")}


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/net/dev`` -> ``{iface: (rx_bytes, tx_bytes)}``."""
    out = {}
    for line in text.splitlines()[2:]:
        if ":" not in line:
            continue
        name, rest = line.split(":", 1)
        f = rest.split()
        if len(f) >= 9:
            out[name.strip()] = (int(f[0]), int(f[8]))
    return out


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def parse_proc_stat(text: str) -> dict[str, list[int]]:
    """``{"cpu0": [user, nice, system, idle, iowait, irq, softirq, steal], ...}``
    (jiffies) from the text of /proc/stat; the all-CPU line ``cpu`` is left out."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 1 + len(CPU_FIELDS) and f[0].startswith("cpu") and f[0] != "cpu":
            out[f[0]] = [int(x) for x in f[1:1 + len(CPU_FIELDS)]]
    return out


def cpu_jiffies() -> dict[str, list[int]]:
    """Per-core time counters of this machine (see :func:`parse_proc_stat`), {} if unreadable."""
    try:
        return parse_proc_stat(Path("/proc/stat").read_text())
    except OSError:
        return {}


class LinkSampler:
    """A thread sampling the uplink's tc counters, the hosts' veth counters and
    each core's time counters every ``interval`` seconds: ``samples`` = list of
    ``{"t": wall s, "AB": bytes, "BA": bytes, "hosts": {host: [sent, received]},
    "cpu": {"cpu0": [jiffies per CPU_FIELDS], ...}}``."""

    def __init__(self, testbed: Testbed, interval: float = 0.1):
        self.testbed, self.interval = testbed, interval
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict:
        t = time.time()
        up = self.testbed.uplink_bytes()
        hosts = {k: list(v) for k, v in self.testbed.host_bytes().items()}
        s = {"t": t, "AB": up["AB"], "BA": up["BA"], "hosts": hosts, "cpu": cpu_jiffies()}
        self.samples.append(s)
        return s

    def _loop(self):
        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:       # a failed sample must not kill the run
                pass
            nxt += self.interval
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def start(self) -> "LinkSampler":
        self._thread = threading.Thread(target=self._loop, name="link-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.samples
