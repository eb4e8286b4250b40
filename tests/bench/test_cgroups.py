"""benchmarks/cgroups.py and the testbed's host kinds: a cgroup per emulated host.

Without root: host-kind specs and their errors, the files written per cgroup
version, the layout detection, the join-then-exec wrappers (on plain files).
With root: a process over the memory cap is OOM-killed, the CPU cap is in
place (read back, not timed), testbed hosts run in their own cgroups, and
neither teardown, nor a SIGTERM mid-run, nor a SIGKILL followed by the stale
sweep leaves a namespace or a cgroup behind.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import cgroups, cluster, testbed
from benchmarks.cgroups import Cgroup, Limits, parse_host_kind, plan_writes
from benchmarks.testbed import plan_topology
from stack_required import needs

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def _cgroups_usable():
    if os.geteuid() != 0:
        return False
    try:
        lay = cgroups.detect_layout()
    except Exception:
        return False
    return all(c in lay.parents and os.access(lay.parents[c], os.W_OK)
               for c in ("cpu", "memory"))


def _netns_usable():
    import shutil
    return _cgroups_usable() and all(shutil.which(t) for t in ("ip", "tc", "unshare")) and \
        subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


needs_cgroups = needs(_cgroups_usable(), "needs root and writable cgroup cpu/memory controllers")
needs_testbed = needs(_netns_usable(), "needs root, cgroups, ip netns, tc and unshare")


# ------------------------------------------------------------------ specs (no root)
def test_host_kinds_and_overrides():
    host, kind, lim = parse_host_kind("b1=large-memory")
    assert (host, kind) == ("b1", "large-memory") and lim == cgroups.KINDS["large-memory"]
    assert lim.memory > cgroups.KINDS["more-cores"].memory
    assert cgroups.KINDS["more-cores"].cpu > lim.cpu
    _, _, lim = parse_host_kind("a1=more-cores,memory=3GiB,cpuset=0-1")
    assert lim.memory == 3 << 30 and lim.cpuset == "0-1" and lim.cpu == 2.0
    _, kind, lim = parse_host_kind("a2=custom,cpu=0.45,period=10ms,weight=50,memory=64MiB")
    assert kind == "custom"
    assert (lim.cpu, lim.period_us, lim.weight, lim.memory) == (0.45, 10000, 50, 64 * MIB)
    assert lim.controllers() == ["cpu", "memory"]


@pytest.mark.parametrize("spec, needle", [
    ("b1", "HOST=KIND"),
    ("=large-memory", "host name is empty"),
    ("b1=huge", "unknown kind 'huge'"),
    ("b1=custom", "sets no limit"),
    ("b1=custom,cpu=0", "cpu must be a finite number > 0"),
    ("b1=custom,cpu=lots", "cpu must be"),
    ("b1=custom,cpu=0.05,period=10ms", "quota >= 1ms"),
    ("b1=custom,cpu=1,period=5s", "period must be 1ms..1s"),
    ("b1=custom,cpu=1,period=fast", "period"),
    ("b1=custom,weight=0", "weight must be an integer in 1..10000"),
    ("b1=custom,cpuset=one", "cpuset must be a CPU list"),
    ("b1=custom,memory=1MiB", "memory must be a byte size >= 4194304"),
    ("b1=custom,memory=lots", "memory must be"),
    ("b1=large-memory,colour=red", "unknown key 'colour'"),
    ("b1=large-memory,memory", "key=value"),
    ("b1=custom,cpu=1,cpu=2", "given twice"),
])
def test_bad_host_kinds_name_the_field(spec, needle):
    with pytest.raises(ValueError, match=needle) as e:
        parse_host_kind(spec)
    assert repr(spec) in str(e.value)          # the whole spec is named too


def test_files_written_per_cgroup_version():
    lim = Limits(cpu=0.45, period_us=10000, weight=200, cpuset="1", memory=64 * MIB)
    v2 = {(c, f): v for c, f, v, _ in plan_writes(lim, 2)}
    assert v2 == {("cpuset", "cpuset.cpus"): "1", ("cpuset", "cpuset.mems"): None,
                  ("cpu", "cpu.max"): "4500 10000", ("cpu", "cpu.weight"): "200",
                  ("memory", "memory.max"): str(64 * MIB), ("memory", "memory.swap.max"): "0"}
    w1 = plan_writes(lim, 1)
    v1 = {(c, f): v for c, f, v, _ in w1}
    assert v1 == {("cpuset", "cpuset.cpus"): "1", ("cpuset", "cpuset.mems"): None,
                  ("cpu", "cpu.cfs_period_us"): "10000", ("cpu", "cpu.cfs_quota_us"): "4500",
                  ("cpu", "cpu.shares"): "2048",
                  ("memory", "memory.limit_in_bytes"): str(64 * MIB),
                  ("memory", "memory.memsw.limit_in_bytes"): str(64 * MIB)}
    names = [f for _, f, _, _ in w1]           # order the kernel needs
    assert names.index("cpu.cfs_period_us") < names.index("cpu.cfs_quota_us")
    assert names.index("memory.limit_in_bytes") < names.index("memory.memsw.limit_in_bytes")
    assert names.index("cpuset.cpus") < names.index("cpuset.mems")
    assert plan_writes(Limits(memory=8 * MIB), 1) == [
        ("memory", "memory.limit_in_bytes", str(8 * MIB), False),
        ("memory", "memory.memsw.limit_in_bytes", str(8 * MIB), True)]
    with pytest.raises(ValueError, match="version"):
        plan_writes(lim, 3)


V1_MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V1_SELF = "4:memory:/jobs/x\n3:cpuset:/\n1:cpu,cpuacct:/user.slice\n0::/\n"


def test_layout_detection_v1_and_v2():
    lay = cgroups.parse_layout(V1_MOUNTS, V1_SELF)
    assert lay.version == 1
    # below the harness's own group of each controller (its limits still hold)
    assert lay.parents == {"cpu": Path("/sys/fs/cgroup/cpu,cpuacct/user.slice"),
                           "cpuset": Path("/sys/fs/cgroup/cpuset"),
                           "memory": Path("/sys/fs/cgroup/memory/jobs/x")}
    lay = cgroups.parse_layout("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n", "0::/a/b\n")
    assert lay.version == 2
    assert set(lay.parents.values()) == {Path("/sys/fs/cgroup")}   # v2: under the root
    with pytest.raises(cgroups.HarnessError, match="no cgroup hierarchy"):
        cgroups.parse_layout("proc /proc proc rw 0 0\n", "")


def test_wrapper_joins_with_the_pid_that_then_runs_the_command(tmp_path):
    f1, f2 = tmp_path / "procs1", tmp_path / "procs2"
    f1.touch(), f2.touch()
    r = subprocess.run(cgroups.wrap_command([str(f1), str(f2)], ["sh", "-c", "echo $$"]),
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0
    assert f1.read_text().strip() == f2.read_text().strip() == r.stdout.strip()
    r = subprocess.run(cgroups.wrap_command([str(tmp_path / "no" / "procs")], ["true"]),
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 125 and "cannot join" in r.stderr


def test_rank_wrapper_joins_the_ranks_group(tmp_path):
    f0, f1 = tmp_path / "r0", tmp_path / "r1"
    cmd = [sys.executable, "-m", "benchmarks.cgroups", "enter", "--rank", f"0={f0}",
           "--rank", f"1={f1}", "--", "sh", "-c", "echo $$"]
    env = dict(os.environ, PYTHONPATH=str(REPO), HOROVOD_RANK="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    assert f1.read_text() == r.stdout.strip() and not f0.exists()
    env.pop("HOROVOD_RANK")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 125 and "no rank" in r.stderr


def test_topology_host_kinds_and_shim_joins_the_hosts_cgroup(tmp_path):
    t = plan_topology(["a1"], ["b1"], tag="k1",
                      kinds={"a1": "large-memory", "b1": ("more-cores", Limits(cpu=1.5))})
    assert (t.host("a1").kind, t.host("a1").limits) == ("large-memory",
                                                        cgroups.KINDS["large-memory"])
    assert t.host("b1").limits == Limits(cpu=1.5) and t.host("head").limits is None
    with pytest.raises(ValueError, match="unknown host 'c1'"):
        plan_topology(["a1"], ["b1"], kinds={"c1": "large-memory"})
    with pytest.raises(ValueError, match="host b1.*memory must be"):
        plan_topology(["a1"], ["b1"], kinds={"b1": "large-memory,memory=x"})
    # the shim writes its own pid (= the command's, it execs) to b1's files
    procs = tmp_path / "b1.procs"
    procs.touch()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ip").write_text("#!/bin/sh\necho $$ > \"$FAKE_IP_PID\"\n")
    (fake / "ip").chmod(0o755)
    shim = tmp_path / "ssh"
    shim.write_text(t.shim_script(tmp_path / "log", cgroups={"b1": [str(procs)]}))
    shim.chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "FAKE_IP_PID": str(tmp_path / "ip.pid")}
    r = subprocess.run([str(shim), "b1", "true"], capture_output=True, text=True, env=env,
                       timeout=10)
    assert r.returncode == 0, r.stderr
    assert procs.read_text().strip() == (tmp_path / "ip.pid").read_text().strip()
    procs.write_text("")
    r = subprocess.run([str(shim), "a1", "true"], capture_output=True, text=True, env=env,
                       timeout=10)
    assert r.returncode == 0 and procs.read_text() == ""      # a1 has no files given
    shim.write_text(t.shim_script(tmp_path / "log",
                                  cgroups={"b1": [str(tmp_path / "gone" / "cgroup.procs")]}))
    r = subprocess.run([str(shim), "b1", "true"], capture_output=True, text=True, env=env,
                       timeout=10)
    assert r.returncode == 255 and "cannot join the cgroup of b1" in r.stderr


def test_cluster_host_kind_flag(capsys):
    a = cluster.parse_args(["--job", "prio", "--job", "prio", "--host-kind", "b2=large-memory",
                            "--host-kind", "a1=custom,cpu=0.5"])
    topo = cluster.make_topology(2, a, tag="k2")
    assert topo.host("b2").kind == "large-memory" and topo.host("a1").limits.cpu == 0.5
    assert cluster.topology_record(topo)["hosts"][-1]["kind"] == "large-memory"
    for bad, needle in (("b3=large-memory", "no host 'b3' with 2 jobs"),
                        ("b1=large-memory,memory=x", "memory must be")):
        with pytest.raises(SystemExit):
            cluster.parse_args(["--job", "prio", "--job", "prio", "--host-kind", bad])
        assert needle in capsys.readouterr().err


# ------------------------------------------------------------------ real cgroups (root)
def _in_group(pid: int, cg: Cgroup) -> bool:
    text = Path(f"/proc/{pid}/cgroup").read_text()
    return text.count(f"/{cg.dirname}\n") == len(set(cg.dirs.values()))


@needs_cgroups
@pytest.mark.timeout(60)
def test_a_process_over_the_memory_cap_is_oom_killed():
    cg = Cgroup("oomtest", Limits(memory=64 * MIB)).create()
    try:
        assert int(cg.read("memory.max" if cg.layout.version == 2
                           else "memory.limit_in_bytes")) == 64 * MIB
        small = subprocess.run(cg.wrap([sys.executable, "-c",
                                        "x = b'1' * (16 << 20); print('ok')"]),
                               capture_output=True, text=True, timeout=30)
        assert small.returncode == 0 and small.stdout.strip() == "ok"
        assert cg.oom_kills() == 0
        big = subprocess.run(cg.wrap([sys.executable, "-c",
                                      "x = b'1' * (200 << 20); print('survived')"]),
                             capture_output=True, text=True, timeout=30)
        assert big.returncode == -signal.SIGKILL and "survived" not in big.stdout
        assert cg.oom_kills() == 1
        dirs = list(cg.dirs.values())
    finally:
        cg.remove()
    assert not any(d.exists() for d in dirs)


@needs_cgroups
@pytest.mark.timeout(60)
def test_the_cpu_cap_is_in_place_and_the_group_is_removed_with_its_processes():
    lim = Limits(cpu=0.45, period_us=10000, weight=50, cpuset="0")
    with Cgroup("cputest", lim) as cg:
        if cg.layout.version == 2:
            assert cg.read("cpu.max") == "4500 10000" and cg.read("cpu.weight") == "50"
        else:
            assert (cg.read("cpu.cfs_quota_us"), cg.read("cpu.cfs_period_us")) == ("4500",
                                                                                   "10000")
            assert cg.read("cpu.shares") == "512"
        assert cg.read("cpuset.cpus") == "0"
        p = subprocess.Popen(cg.wrap(["sleep", "300"]))
        deadline = time.monotonic() + 10
        while not _in_group(p.pid, cg) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p.pid in cg.pids() and _in_group(p.pid, cg)
        assert os.sched_getaffinity(p.pid) == {0}
        dirs = list(cg.dirs.values())
        assert all(d.is_dir() for d in dirs)
    assert p.wait(timeout=10) == -signal.SIGKILL        # removal kills what is left
    assert not any(d.exists() for d in dirs)


@needs_testbed
@pytest.mark.timeout(60)
def test_a_rank_inside_a_shaped_link_joins_its_ranks_cgroup():
    """The A/A probe's path: horovodrun runs inside ``ip netns exec`` (whose /sys
    has no cgroup hierarchies); each rank's wrapper joins its rank's group."""
    from benchmarks import aa, netns
    groups = [Cgroup(f"rank{r}", Limits(cpu=0.9)).create() for r in range(2)]
    try:
        with netns.ShapedLink("1gbit") as link:
            cmd = aa.enter_command(groups) + ["cat", "/proc/self/cgroup"]
            env = dict(os.environ, PYTHONPATH=str(REPO), HOROVOD_RANK="1")
            p = link.popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, cwd=str(REPO))
            out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        assert f"/{groups[1].dirname}\n" in out and groups[0].dirname not in out
    finally:
        for g in groups:
            g.remove()


@needs_testbed
@pytest.mark.timeout(60)
def test_testbed_hosts_run_in_their_cgroups_and_teardown_removes_them():
    t = plan_topology(["a1"], ["b1"], kinds={"a1": "large-memory,memory=3GiB",
                                              "b1": "custom,cpu=0.5,memory=256MiB"})
    tb = testbed.Testbed(t)
    try:
        tb.create()
        a1, b1 = tb.cgroups["a1"], tb.cgroups["b1"]
        assert set(tb.cgroups) == {"a1", "b1"}
        assert int(a1.read("memory.limit_in_bytes" if a1.layout.version == 1
                           else "memory.max")) == 3 << 30
        # a command on a host (Testbed.run) and one through the ssh shim (horovodrun's path)
        r = tb.run("a1", ["cat", "/proc/self/cgroup"])
        assert r.returncode == 0 and f"/{a1.dirname}\n" in r.stdout, r.stdout
        r = tb.run("head", ["ssh", "b1", "cat /proc/self/cgroup"], env=tb.launch_env())
        assert r.returncode == 0 and f"/{b1.dirname}\n" in r.stdout, r.stderr
        assert "hprio-cg-" not in tb.run("head", ["cat", "/proc/self/cgroup"]).stdout
        p = tb.popen("b1", ["sleep", "300"])
        dirs = [d for cg in (a1, b1) for d in cg.dirs.values()]
    finally:
        tb.cleanup()
    assert not any(d.exists() for d in dirs)
    assert p.wait(timeout=10) != 0
    assert not set(testbed.list_namespaces(testbed.PREFIX)) & set(t.namespaces())


_CHILD = """
import subprocess, sys, time
from benchmarks.netns import install_signal_handlers
from benchmarks.testbed import Testbed, plan_topology
install_signal_handlers()
with Testbed(plan_topology(["a1"], ["b1"], kinds={"b1": "custom,cpu=0.5,memory=128MiB"})) as tb:
    p = tb.popen("b1", ["sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; "
                                    "sleep 300"], stdout=subprocess.PIPE, text=True)
    print(" ".join(tb.topology.namespaces()), p.stdout.readline().strip(), flush=True)
    time.sleep(60)
"""


def _child_leftovers(child_pid: int, names):
    groups = [g for g in cgroups.list_groups() if f"{cgroups.PREFIX}{child_pid}-" in g]
    return set(names) & set(testbed.list_namespaces(testbed.PREFIX)), groups


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@needs_testbed
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_killed_harness_leaves_no_namespace_or_cgroup(sig):
    """SIGTERM: the harness tears down itself. SIGKILL (nothing runs): its
    leftovers are there, and the stale sweep of the next run removes them."""
    p = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=str(REPO), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        *names, pid = p.stdout.readline().split()
        ns, groups = _child_leftovers(p.pid, names)
        assert ns == set(names) and len(groups) == 2          # b1's cpu + memory groups
        cgroups.cleanup_stale()                 # a live harness's groups are not stale
        assert _child_leftovers(p.pid, names) == (ns, groups)
        p.send_signal(getattr(signal, sig))
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if sig == "SIGKILL":
        assert _child_leftovers(p.pid, names) == (set(names), groups)
        assert _alive(int(pid))
        with testbed.Testbed(plan_topology(["a1"], ["b1"])):    # the next run sweeps them
            pass
    assert _child_leftovers(p.pid, names) == (set(), [])
    time.sleep(0.2)
    assert not _alive(int(pid))
