"""Control groups for the emulated hosts of the testbed (and for ranks).

    from benchmarks.cgroups import Cgroup, parse_host_kind

    host, limits = parse_host_kind("b1=large-memory,memory=3GiB")
    with Cgroup("b1", limits) as cg:            # root; created now, removed on exit
        subprocess.run(cg.wrap(["python", "train.py"]))   # runs inside it

A host's **kind** is a named set of limits (:data:`KINDS`: ``large-memory``,
``more-cores``; ``custom`` has none of its own), each overridable per host:

==========  ===============================================================
``cpu``     cores of CPU time (quota / period), e.g. ``0.45``
``period``  the quota's period, e.g. ``10ms`` (default 100ms)
``weight``  relative CPU share 1..10000 (cgroup v2 ``cpu.weight``; v1
            ``cpu.shares`` = weight x 1024 / 100)
``cpuset``  the cores it may run on, e.g. ``1`` or ``0-1``
``memory``  memory limit, e.g. ``64MiB`` (swap off: over it, the kernel's
            OOM killer kills a process of the group)
==========  ===============================================================

Both cgroup layouts work: v2 (one ``cgroup2`` hierarchy at /sys/fs/cgroup:
``cpu.max``, ``cpu.weight``, ``cpuset.cpus``, ``memory.max``,
``memory.swap.max``; groups are made under the root, where the controllers are
enabled in ``cgroup.subtree_control`` -- v2 forbids enabling them in a group
that holds processes, as the harness's own does) and v1 (one hierarchy per
controller: ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, ``cpu.shares``,
``cpuset.cpus``/``cpuset.mems``, ``memory.limit_in_bytes``,
``memory.memsw.limit_in_bytes``; groups are made below the harness's own group
of each controller, so any limit the harness itself runs under still holds).

A process joins a group by writing its pid to the group's ``cgroup.procs``
files (inside ``ip netns exec``, whose /sys has no cgroups, through
``/proc/<harness pid>/root``) right before it execs the command (:meth:`Cgroup.wrap`: a tiny ``sh``;
``python -m benchmarks.cgroups enter`` picks the group by the Horovod rank).
Groups are named ``hprio-cg-<creator pid>-<n>-<name>``; :meth:`Cgroup.remove`
(also at exit, and on SIGINT/SIGTERM with ``netns.install_signal_handlers()``)
SIGKILLs what is left inside and removes the directories, and
:func:`cleanup_stale` removes the groups of creators that are gone.
"""
from __future__ import annotations

import argparse
import atexit
import itertools
import os
import re
import shlex
import signal
import sys
import time
import weakref
from dataclasses import dataclass, fields, replace
from pathlib import Path

from horovod_prio.method import units

from horovod_prio.method.units import parse_duration_s

from .netns import HarnessError, pid_alive, require_root

PREFIX = "hprio-cg-"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "cpuset", "memory")
_MIB = 1 << 20
_counter = itertools.count()
_live: "weakref.WeakSet[Cgroup]" = weakref.WeakSet()
_CPUSET_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$")


# ---------------------------------------------------------------- limits (pure)
@dataclass(frozen=True)
class Limits:
    """What a group may use; None = not limited."""
    cpu: float | None = None          # cores (quota = cpu x period)
    period_us: int = 100_000
    weight: int | None = None         # 1..10000
    cpuset: str | None = None         # e.g. "0-1"
    memory: int | None = None         # bytes

    def controllers(self) -> list[str]:
        out = []
        if self.cpu is not None or self.weight is not None:
            out.append("cpu")
        if self.cpuset is not None:
            out.append("cpuset")
        if self.memory is not None:
            out.append("memory")
        return out

    def describe(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: host kinds: a large-memory host (much memory, half a core) and a host with
#: more cores (and less memory); every value can be overridden per host
KINDS = {
    "large-memory": Limits(cpu=0.5, memory=8 << 30),
    "more-cores": Limits(cpu=2.0, memory=2 << 30),
    "custom": Limits(),
}


def _check_limits(lim: Limits, what: str) -> Limits:
    if lim.cpu is not None:
        units.check(f"{what} cpu", units.parse_float, lim.cpu, 0.0, strict=True,
                    unit=" (cores)")
        if lim.cpu * lim.period_us < 1000:
            raise ValueError(f"{what} cpu must give a quota >= 1ms per period "
                             f"(cpu x period), got cpu={lim.cpu:g} with period "
                             f"{lim.period_us} us")
    if not 1000 <= lim.period_us <= 1_000_000:
        raise ValueError(f"{what} period must be 1ms..1s, got {lim.period_us} us")
    if lim.weight is not None:
        units.check(f"{what} weight", units.parse_int, lim.weight, 1, 10000)
    if lim.cpuset is not None and not _CPUSET_RE.match(str(lim.cpuset)):
        raise ValueError(f"{what} cpuset must be a CPU list such as 0, 1 or 0-1, "
                         f"got {lim.cpuset!r}")
    if lim.memory is not None:
        units.check(f"{what} memory", units.parse_bytes, lim.memory, 4 * _MIB)
    return lim


def limits_from(kind: str, overrides: dict[str, str] | None = None,
                what: str = "host kind") -> Limits:
    """The limits of ``kind`` with ``overrides`` (key -> text) applied; a bad kind,
    key or value raises ``ValueError`` naming it."""
    if kind not in KINDS:
        raise ValueError(f"{what}: unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    lim = KINDS[kind]
    vals = {}
    for key, text in (overrides or {}).items():
        field = f"{what} {key}"
        if key == "cpu":
            vals["cpu"] = units.check(field, units.parse_float, text, 0.0, strict=True,
                                      unit=" (cores)")
        elif key == "period":
            vals["period_us"] = round(units.check(field, parse_duration_s, text, True) * 1e6)
        elif key == "weight":
            vals["weight"] = units.check(field, units.parse_int, text, 1, 10000)
        elif key == "cpuset":
            vals["cpuset"] = str(text)
        elif key == "memory":
            vals["memory"] = units.check(field, units.parse_bytes, text, 4 * _MIB)
        else:
            raise ValueError(f"{what}: unknown key {key!r} "
                             "(keys: cpu, period, weight, cpuset, memory)")
    lim = replace(lim, **vals)
    if not lim.controllers():
        raise ValueError(f"{what}: kind {kind!r} sets no limit: give at least one of "
                         "cpu, weight, cpuset, memory")
    return _check_limits(lim, what)


def parse_kind(text: str, what: str = "kind") -> tuple[str, Limits]:
    """``KIND[,key=value...]`` -> (kind, limits); errors name ``what`` and the key."""
    parts = [p.strip() for p in str(text).split(",")]
    kind, overrides = parts[0], {}
    for p in parts[1:]:
        if "=" not in p:
            raise ValueError(f"{what}: expected key=value after the kind, got {p!r}")
        k, v = p.split("=", 1)
        if k.strip() in overrides:
            raise ValueError(f"{what}: key {k.strip()!r} given twice")
        overrides[k.strip()] = v.strip()
    return kind, limits_from(kind, overrides, what=what)


def parse_host_kind(spec: str) -> tuple[str, str, Limits]:
    """``HOST=KIND[,key=value...]`` -> (host, kind, limits), e.g.
    ``b1=large-memory`` or ``a1=custom,cpu=0.45,period=10ms,memory=64MiB``."""
    text = str(spec).strip()
    what = f"host kind {spec!r}"
    if "=" not in text:
        raise ValueError(f"{what}: expected HOST=KIND[,key=value...], e.g. b1=large-memory")
    host, rest = text.split("=", 1)
    host = host.strip()
    if not host:
        raise ValueError(f"{what}: the host name is empty")
    return (host,) + parse_kind(rest, what=f"{what}: host {host}")


def host_kind_arg(spec: str) -> tuple[str, str, Limits]:
    """``argparse`` type of ``--host-kind``."""
    try:
        return parse_host_kind(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def plan_writes(lim: Limits, version: int) -> list[tuple[str, str, str | None, bool]]:
    """(controller, file, value, optional) to write, in order, for cgroup
    ``version`` (1 or 2). A value of None is the parent's memory nodes
    (``cpuset.mems``, filled in at creation); optional files are written only
    where the kernel has them."""
    w = []
    if lim.cpuset is not None:
        w += [("cpuset", "cpuset.cpus", lim.cpuset, False),
              ("cpuset", "cpuset.mems", None, False)]
    if version == 2:
        if lim.cpu is not None:
            w.append(("cpu", "cpu.max", f"{round(lim.cpu * lim.period_us)} {lim.period_us}",
                      False))
        if lim.weight is not None:
            w.append(("cpu", "cpu.weight", str(lim.weight), False))
        if lim.memory is not None:
            w += [("memory", "memory.max", str(lim.memory), False),
                  ("memory", "memory.swap.max", "0", True)]
    elif version == 1:
        if lim.cpu is not None:
            w += [("cpu", "cpu.cfs_period_us", str(lim.period_us), False),
                  ("cpu", "cpu.cfs_quota_us", str(round(lim.cpu * lim.period_us)), False)]
        if lim.weight is not None:
            w.append(("cpu", "cpu.shares", str(max(2, round(lim.weight * 1024 / 100))), False))
        if lim.memory is not None:
            w += [("memory", "memory.limit_in_bytes", str(lim.memory), False),
                  ("memory", "memory.memsw.limit_in_bytes", str(lim.memory), True)]
    else:
        raise ValueError(f"cgroup version must be 1 or 2, got {version!r}")
    return w


# ---------------------------------------------------------------- layout (pure)
@dataclass(frozen=True)
class Layout:
    """Where the groups go: ``version`` and, per controller, the parent directory."""
    version: int
    parents: dict          # controller -> Path
    mounts: dict           # controller -> mount point (the hierarchy's root)


def parse_layout(mounts_text: str, self_cgroup_text: str,
                 root: Path = CGROUP_ROOT) -> Layout:
    """The cgroup layout from ``/proc/self/mounts`` and ``/proc/self/cgroup``:
    v2 if ``root`` is a cgroup2 mount, else v1 with a hierarchy per controller."""
    v1, v2 = {}, None
    for line in mounts_text.splitlines():
        f = line.split()
        if len(f) < 4:
            continue
        point = Path(f[1].replace("\\040", " "))
        if f[2] == "cgroup2" and point == root:
            v2 = point
        elif f[2] == "cgroup":
            for c in f[3].split(","):
                if c in CONTROLLERS:
                    v1.setdefault(c, point)
    if v2 is not None:
        return Layout(2, {c: v2 for c in CONTROLLERS}, {c: v2 for c in CONTROLLERS})
    if not v1:
        raise HarnessError(f"no cgroup hierarchy found: {root} is neither a cgroup2 mount "
                           "nor has cgroup v1 controllers (cpu, cpuset, memory) mounted")
    own = {}
    for line in self_cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for c in parts[1].split(","):
                own[c] = parts[2]
    parents = {c: point / own.get(c, "/").lstrip("/") for c, point in v1.items()}
    return Layout(1, parents, dict(v1))


def detect_layout() -> Layout:
    try:
        return parse_layout(Path("/proc/self/mounts").read_text(),
                            Path("/proc/self/cgroup").read_text())
    except OSError as e:
        raise HarnessError(f"cannot read the cgroup layout: {e}") from None


# ---------------------------------------------------------------- live groups
def _read_pids(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_dir(d: Path, timeout: float = 5.0) -> bool:
    """SIGKILL every process in group ``d`` (and its subgroups), then remove them."""
    if not d.is_dir():
        return True
    for sub in sorted((p for p in d.iterdir() if p.is_dir()), reverse=True):
        remove_dir(sub, timeout)
    deadline = time.monotonic() + timeout
    while True:
        for pid in _read_pids(d):
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


class Cgroup:
    """One group (a directory per controller on v1, one on v2) with ``limits``."""

    def __init__(self, name: str, limits: Limits, layout: Layout | None = None):
        if not _NAME_RE.match(name):
            raise ValueError(f"invalid cgroup name {name!r}: letters, digits, '-', '_', '.'")
        self.limits = _check_limits(limits, f"cgroup {name}")
        self.name = name
        self.dirname = f"{PREFIX}{os.getpid()}-{next(_counter)}-{name}"
        self._layout = layout
        self.dirs: dict[str, Path] = {}      # controller -> directory
        self._made: list[Path] = []

    @property
    def layout(self) -> Layout:
        if self._layout is None:
            self._layout = detect_layout()
        return self._layout

    def create(self) -> "Cgroup":
        require_root()
        lay = self.layout
        need = self.limits.controllers()
        missing = [c for c in need if c not in lay.parents]
        if missing:
            raise HarnessError(f"cgroup {self.name}: controller(s) {missing} not mounted")
        _live.add(self)
        try:
            if lay.version == 2:
                self._enable_v2(need)
            for c in need:
                d = lay.parents[c] / self.dirname
                if d not in self._made:
                    d.mkdir()
                    self._made.append(d)
                self.dirs[c] = d
            for c, fname, value, optional in plan_writes(self.limits, lay.version):
                path = self.dirs[c] / fname
                if optional and not path.exists():
                    continue
                if value is None:        # cpuset.mems: the parent's memory nodes
                    value = self._parent_mems(c)
                self._write(path, value)
        except BaseException:
            self.remove()
            raise
        return self

    def _parent_mems(self, c: str) -> str:
        parent = self.layout.parents[c]
        for fname in ("cpuset.mems.effective", "cpuset.effective_mems", "cpuset.mems"):
            try:
                v = (parent / fname).read_text().strip()
            except OSError:
                continue
            if v:
                return v
        return "0"

    def _enable_v2(self, need: list[str]) -> None:
        root = self.layout.parents[need[0]] if need else CGROUP_ROOT
        have = (root / "cgroup.subtree_control").read_text().split()
        avail = (root / "cgroup.controllers").read_text().split()
        for c in need:
            if c not in avail:
                raise HarnessError(f"cgroup {self.name}: the {c} controller is not available "
                                   f"in {root} (cgroup.controllers: {' '.join(avail)})")
            if c not in have:
                self._write(root / "cgroup.subtree_control", f"+{c}")

    def _write(self, path: Path, value: str) -> None:
        try:
            path.write_text(str(value))
        except OSError as e:
            raise HarnessError(f"cgroup {self.name}: writing {value!r} to {path} failed: "
                               f"{e.strerror or e}") from None

    def __enter__(self) -> "Cgroup":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.remove()

    def procs_files(self, in_netns: bool = False) -> list[str]:
        """The ``cgroup.procs`` files to write a pid to. ``in_netns``: paths that
        also work inside ``ip netns exec`` (which mounts a sysfs of the network
        namespace over /sys, without the cgroup hierarchies): through
        ``/proc/<this process>/root``, i.e. this process's view of /sys."""
        pre = f"/proc/{os.getpid()}/root" if in_netns else ""
        return [pre + str(d / "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def read(self, fname: str) -> str:
        """A file of the group (the first directory that has it)."""
        for d in self.dirs.values():
            if (d / fname).exists():
                return (d / fname).read_text().strip()
        raise FileNotFoundError(f"no {fname} in cgroup {self.name} ({list(self.dirs.values())})")

    def add(self, pid: int) -> None:
        for f in self.procs_files():
            self._write(Path(f), str(pid))

    def pids(self) -> set[int]:
        out = set()
        for d in self.dirs.values():
            out.update(_read_pids(d))
        return out

    def oom_kills(self) -> int:
        """Processes of this group the OOM killer has killed (``oom_kill`` of
        v2 ``memory.events`` / v1 ``memory.oom_control``)."""
        for fname in ("memory.events", "memory.oom_control"):
            try:
                text = self.read(fname)
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        raise FileNotFoundError(f"cgroup {self.name}: no oom_kill counter "
                                "(memory.events / memory.oom_control)")

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this group: a ``sh`` that writes its own pid to the
        group's ``cgroup.procs`` files, then execs ``argv`` (same pid)."""
        return wrap_command(self.procs_files(), argv)

    def exists(self) -> bool:
        return any(d.exists() for d in self._made)

    def remove(self) -> None:
        """Idempotent: SIGKILL what is left inside, remove the directories."""
        left = []
        for d in reversed(self._made):
            if not remove_dir(d):
                left.append(str(d))
        self._made, self.dirs = [], {}
        _live.discard(self)
        if left:
            raise HarnessError(f"cgroup {self.name}: could not remove {', '.join(left)}")


def wrap_command(procs_files: list[str], argv: list[str]) -> list[str]:
    """``argv`` preceded by a ``sh`` that joins the groups of ``procs_files``
    (writes ``$$``) and execs ``argv``; exits 125 if a write fails."""
    if not procs_files:
        return list(argv)
    files = " ".join(shlex.quote(f) for f in procs_files)
    script = (f'for f in {files}; do echo $$ > "$f" || '
              '{ echo "cgroup: cannot join $f" >&2; exit 125; }; done; exec "$@"')
    return ["/bin/sh", "-c", script, "cgroup-enter"] + list(argv)


def cleanup_stale(layout: Layout | None = None, prefix: str = PREFIX,
                  depth: int = 4) -> list[str]:
    """Remove groups named ``<prefix><pid>-...`` (within ``depth`` levels of each
    hierarchy's root) whose creating process is gone, with what is inside them.
    Groups of live processes (concurrent harnesses) are left alone."""
    try:
        layout = layout or detect_layout()
    except HarnessError:
        return []
    live = {d for cg in list(_live) for d in cg._made}
    removed = []
    pat = re.compile(re.escape(prefix) + r"(\d+)-")
    for p in _harness_dirs(layout, prefix, depth):
        m = pat.match(p.name)
        if m:
            pid = int(m.group(1))
            if p in live or (pid != os.getpid() and pid_alive(pid)):
                continue
            if remove_dir(p):
                removed.append(str(p))
    return removed


def list_groups(prefix: str = PREFIX, layout: Layout | None = None, depth: int = 4) -> list[str]:
    """Every directory named ``<prefix>...`` within ``depth`` levels of the roots."""
    layout = layout or detect_layout()
    return sorted(str(p) for p in _harness_dirs(layout, prefix, depth))


def _harness_dirs(layout: Layout, prefix: str, depth: int):
    """Directories named ``<prefix>...`` within ``depth`` levels of every
    controller root (not descending into them)."""
    for mount in dict.fromkeys(layout.mounts.values()):
        stack = [(Path(mount), 0)]
        while stack:
            d, lvl = stack.pop()
            try:
                subs = [p for p in d.iterdir() if p.is_dir()]
            except OSError:
                continue
            for p in subs:
                if p.name.startswith(prefix):
                    yield p
                elif lvl + 1 < depth:
                    stack.append((p, lvl + 1))


@atexit.register
def _cleanup_all() -> None:
    for cg in list(_live):
        try:
            cg.remove()
        except Exception:
            pass


# ---------------------------------------------------------------- rank wrapper
RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def rank_from_env(env=None) -> int:
    env = os.environ if env is None else env
    for k in RANK_VARS:
        if env.get(k, "").strip().isdigit():
            return int(env[k])
    raise ValueError(f"no rank in the environment (looked for {', '.join(RANK_VARS)})")


def enter_main(argv=None) -> int:
    """``python -m benchmarks.cgroups enter --rank R=FILE[:FILE...] ... -- CMD...``:
    join the groups of this process's Horovod rank, then exec ``CMD``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.cgroups enter")
    p.add_argument("--rank", action="append", default=[], metavar="R=FILE[:FILE...]",
                   help="cgroup.procs files of rank R")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("no command given after --")
    table = {}
    for item in a.rank:
        r, _, files = item.partition("=")
        if not r.strip().isdigit() or not files:
            p.error(f"--rank {item!r}: expected R=FILE[:FILE...]")
        table[int(r)] = files.split(":")
    try:
        rank = rank_from_env()
    except ValueError as e:
        print(f"cgroups enter: {e}", file=sys.stderr)
        return 125
    for f in table.get(rank, []):
        try:
            Path(f).write_text(str(os.getpid()))
        except OSError as e:
            print(f"cgroups enter: rank {rank} cannot join {f}: {e}", file=sys.stderr)
            return 125
    os.execvp(cmd[0], cmd)
    return 127      # not reached


if __name__ == "__main__":
    if sys.argv[1:2] == ["enter"]:
        sys.exit(enter_main(sys.argv[2:]))
    print("usage: python -m benchmarks.cgroups enter --rank R=FILE[:FILE...] -- CMD...",
          file=sys.stderr)
    sys.exit(2)
