"""benchmarks/testbed.py: the multi-host testbed (racks of host namespaces, one
shaped uplink, an ssh shim for horovodrun / Open MPI).

Without root: the topology, its ip/tc commands and the ssh shim's argument
handling (with a fake ``ip`` on PATH). With root: a real 2-rack testbed --
traffic between racks crosses the shaped uplink and traffic inside a rack
does not, teardown leaves no namespace, veth, /etc/netns entry or process,
and real ``horovodrun -H a1:1,b1:1`` jobs (Gloo and MPI) run across the racks.
"""
import ipaddress
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import testbed
from benchmarks.testbed import plan_topology
from stack_required import needs, stack_missing

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _netns_usable():
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "unshare")):
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


needs_netns = needs(_netns_usable(), "needs root, ip netns, tc and unshare")


# ------------------------------------------------------------------ topology (no root)
def test_topology_hosts_addresses_and_names():
    t = plan_topology(["a1", "a2"], ["b1", "b2"], rate="1gbit", tag="t1",
                      cpus={"a1": "0", "b1": "0", "a2": "1", "b2": "1"})
    assert [(h.name, h.rack) for h in t.hosts] == [
        ("head", "A"), ("arbiter", "A"), ("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")]
    addrs = [ipaddress.ip_address(h.address) for h in t.hosts]
    assert len(set(addrs)) == len(addrs)
    assert all(a in ipaddress.ip_network("10.77.0.0/16") for a in addrs)
    assert {h.address.split(".")[2] for h in t.rack("A")} == {"1"}
    assert {h.address.split(".")[2] for h in t.rack("B")} == {"2"}
    nss = t.namespaces()
    assert len(set(nss)) == len(nss) and all(n.startswith(testbed.PREFIX + "t1-") for n in nss)
    assert len({h.peer for h in t.hosts}) == len(t.hosts)
    assert t.host("b2").cpus == "1" and t.host("head").cpus is None
    assert t.host(t.host("b1").address).name == "b1"
    hosts = t.hosts_file()
    for h in t.hosts:
        assert f"{h.address}\t{h.name}\n" in hosts
    with pytest.raises(KeyError, match="no host 'c1'"):
        t.host("c1")


def test_setup_commands_shape_both_uplink_ends_and_put_hosts_on_their_rack():
    t = plan_topology(["a1"], ["b1"], rate="250mbit", tag="t2")
    cmds = [" ".join(c) for c in t.setup_commands()]
    f = t.fabric
    assert f"ip -n {f} link add upA type veth peer name upB" in cmds
    assert f"ip -n {f} link set upA master brA" in cmds
    assert f"ip -n {f} link set upB master brB" in cmds
    for up in ("upA", "upB"):
        assert (f"tc -n {f} qdisc add dev {up} root handle 1: tbf rate 250mbit burst 1mb "
                f"latency 50ms") in cmds
    for h in t.hosts:
        br = "brA" if h.rack == "A" else "brB"
        assert (f"ip link add eth0 netns {h.netns} type veth peer name {h.peer} "
                f"netns {f}") in cmds
        assert f"ip -n {f} link set {h.peer} master {br}" in cmds
        assert f"ip -n {h.netns} addr add {h.address}/16 dev eth0" in cmds
    # every tc/ip command targets one of our namespaces (nothing in the root namespace)
    for c in t.setup_commands():
        assert ("-n" in c and c[c.index("-n") + 1] in t.namespaces()) or \
            (c[:3] == ["ip", "link", "add"] and c[c.index("netns") + 1] in t.namespaces())


@pytest.mark.parametrize("kw, needle", [
    ({"subnet": "8.8.0.0/16"}, "subnet"),
    ({"subnet": "10.77.0.0/24"}, "subnet"),
    ({"rate": "fast"}, "rate"),
    ({"latency": "5"}, "latency"),
    ({"burst": "lots"}, "burst"),
    ({"cpus": {"c9": "0"}}, "unknown host"),
    ({"cpus": {"a1": "zero"}}, "CPU list"),
])
def test_bad_topology_values_are_named(kw, needle):
    with pytest.raises(ValueError, match=needle):
        plan_topology(["a1"], ["b1"], **kw)


@pytest.mark.parametrize("a, b, needle", [
    (["a1"], ["a1"], "duplicate"),
    (["A_1"], ["b1"], "invalid host name"),
    ([], ["b1"], "each rack"),
    (["head"], ["b1"], "duplicate"),
])
def test_bad_host_lists_are_named(a, b, needle):
    with pytest.raises(ValueError, match=needle):
        plan_topology(a, b)


# ------------------------------------------------------------------ ssh shim (no root)
@pytest.fixture
def shim(tmp_path):
    """The shim of a planned topology, with a fake ``ip`` that records its argv."""
    t = plan_topology(["a1"], ["b1"], tag="t3", cpus={"b1": "1"})
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ip").write_text("#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$FAKE_IP_OUT\"\n")
    (fake / "ip").chmod(0o755)
    path = tmp_path / "ssh"
    path.write_text(t.shim_script(tmp_path / "ssh.log", home="/root"))
    path.chmod(0o755)
    out = tmp_path / "ip.args"

    def call(*args):
        env = {"PATH": f"{fake}:/usr/bin:/bin", "FAKE_IP_OUT": str(out), "SECRET_OUTSIDE": "x"}
        if out.exists():
            out.unlink()
        p = subprocess.run([str(path), *args], capture_output=True, text=True, env=env,
                           timeout=10)
        argv = out.read_text().split("\n")[:-1] if out.exists() else None
        return p, argv

    return t, call, tmp_path / "ssh.log"


def test_shim_runs_horovods_remote_command_in_the_hosts_namespace(shim):
    t, call, log = shim
    cmd = ("cd /work > /dev/null 2>&1 ; env HOROVOD_RANK=1 HOROVOD_PRIO_ARBITER_SECRET=s3cr3t "
           "python -m benchmarks.workload --impl prio")
    # horovod's get_ssh_command: options, host, more options, the command (one argument)
    p, argv = call("-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "b1",
                   "-p", "22", "-o", "ConnectTimeout=10", cmd)
    assert p.returncode == 0, p.stderr
    b1 = t.host("b1")
    assert argv[:3] == ["netns", "exec", b1.netns]
    # a fresh login environment (what it contains: the root test below)
    assert argv[3:5] == ["env", "-i"]
    assert f"PATH={testbed.LOGIN_PATH}" in argv
    i = argv.index("taskset")
    assert argv[i:i + 3] == ["taskset", "-c", "1"]
    assert argv[i + 3:i + 6] == ["unshare", "--uts", "/bin/sh"]
    assert argv[-3:] == ["ssh-shim", "b1", cmd]
    text = log.read_text()
    assert " b1 cd /work" in text and "s3cr3t" not in text and "SECRET=<hidden>" in text


def test_shim_accepts_addresses_user_at_host_and_open_mpi_style_commands(shim):
    t, call, _ = shim
    a1 = t.host("a1")
    p, argv = call(a1.address, "true")
    assert p.returncode == 0 and argv[2] == a1.netns and argv[-2:] == ["a1", "true"]
    assert "taskset" not in argv            # no CPUs given for a1
    # Open MPI's rsh agent: "ssh -x host orted -mca ..." (many words)
    p, argv = call("-x", "root@b1", "orted", "-mca", "ess", '"env"')
    assert p.returncode == 0 and argv[2] == t.host("b1").netns
    assert argv[-1] == 'orted -mca ess "env"'


def test_shim_refuses_unknown_hosts_and_interactive_sessions(shim):
    _, call, _ = shim
    p, argv = call("-o", "X=1", "nohost", "true")
    assert p.returncode == 255 and "Could not resolve hostname nohost" in p.stderr
    assert argv is None
    p, argv = call("b1")
    assert p.returncode == 255 and "no command" in p.stderr and argv is None


def test_counter_parsers():
    t = plan_topology(["a1"], ["b1"], tag="t4")
    tc = ('[{"kind":"tbf","handle":"1:","dev":"upA","root":true,"bytes":1200},'
          '{"kind":"tbf","handle":"1:","dev":"upB","root":true,"bytes":34},'
          '{"kind":"noqueue","handle":"0:","dev":"p2","root":true,"bytes":0}]')
    assert testbed.parse_tc_json(tc, t) == {"AB": 1200, "BA": 34}
    assert testbed.parse_tc_json("garbage", t) == {"AB": 0, "BA": 0}
    dev = ("Inter-|   Receive     |  Transmit\n face |bytes packets ...\n"
           "    lo:       5       1    0    0    0     0          0         0        7 "
           "      1    0    0    0     0       0          0\n"
           "    p2:  123456     10    0    0    0     0          0         0      789 "
           "      3    0    0    0     0       0          0\n")
    assert testbed.parse_net_dev(dev) == {"lo": (5, 7), "p2": (123456, 789)}


# ------------------------------------------------------------------ real testbed (root)
def _root_links():
    return set(subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                              text=True).stdout.split("\n"))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


_SINK = ("import socket,sys\ns=socket.socket();s.bind(('0.0.0.0',int(sys.argv[1])));s.listen()\n"
         "print('ready',flush=True)\nc,_=s.accept();n=0\nwhile True:\n d=c.recv(1<<20)\n"
         " if not d: break\n n+=len(d)\nprint(n,flush=True)\n")
_SEND = ("import socket,sys\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])))\n"
         "c.sendall(b'x'*int(sys.argv[3]));c.close()\n")


def _transfer(tb, src, dst, nbytes, port):
    sink = tb.popen(dst, [sys.executable, "-c", _SINK, str(port)], stdout=subprocess.PIPE,
                    text=True)
    assert sink.stdout.readline().strip() == "ready"
    before = tb.uplink_bytes()
    r = tb.run(src, [sys.executable, "-c", _SEND, dst, str(port), str(nbytes)], timeout=30)
    assert r.returncode == 0, r.stderr
    assert int(sink.communicate(timeout=30)[0].strip()) == nbytes
    after = tb.uplink_bytes()
    return {d: after[d] - before[d] for d in ("AB", "BA")}


@needs_netns
@pytest.mark.timeout(60)
def test_testbed_uplink_carries_cross_rack_traffic_and_teardown_leaves_nothing():
    links_before = _root_links()
    t = plan_topology(["a1"], ["b1"], rate="500mbit")
    tb = testbed.Testbed(t)
    try:
        tb.create()
        q = testbed.run_cmd(["tc", "-n", t.fabric, "qdisc", "show"]).stdout
        for up in ("upA", "upB"):
            assert f"qdisc tbf 1: dev {up} root" in q and "rate 500Mbit" in q
        # each host has its own address, loopback, name, and resolves the others by name
        assert tb.run("a1", ["hostname"]).stdout.strip() == "a1"
        assert t.host("b1").address in tb.run("a1", ["getent", "hosts", "b1"]).stdout
        addrs = tb.run("b1", ["ip", "-o", "-4", "addr"]).stdout
        assert f"inet {t.host('b1').address}/16" in addrs and "127.0.0.1" in addrs
        # rack A -> rack B crosses the uplink (A->B bytes; only ACKs come back)...
        d = _transfer(tb, "a1", "b1", 4 << 20, 5001)
        assert d["AB"] >= 4 << 20 and 0 < d["BA"] < 1 << 20
        # ... and B -> A the other way
        d = _transfer(tb, "b1", "a1", 2 << 20, 5002)
        assert d["BA"] >= 2 << 20 and d["AB"] < 1 << 20
        # inside rack A nothing crosses it
        d = _transfer(tb, "a1", "head", 4 << 20, 5003)
        assert d["AB"] < 64 << 10 and d["BA"] < 64 << 10
        sent = tb.host_bytes()
        assert sent["a1"][0] >= 8 << 20 and sent["b1"][0] >= 2 << 20
        # through the ssh shim a command runs on the host, with its name and a login
        # environment: nothing of the caller's environment but what it passes itself
        env = dict(tb.launch_env(), OUTSIDE_ONLY="x")
        r = tb.run("head", ["ssh", "-o", "StrictHostKeyChecking=no", "b1",
                            "hostname; ip -o -4 addr show eth0; env"], env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("b1\n") and t.host("b1").address in r.stdout
        got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line
                   and not line.startswith(" "))
        assert "OUTSIDE_ONLY" not in got and got["PATH"] == testbed.LOGIN_PATH
        assert {"HOME", "USER", "PATH"} <= set(got)
        # a process that escaped its session, on a host
        p = tb.popen("b1", ["sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & "
                                        "echo $!"], stdout=subprocess.PIPE, text=True)
        escaped = int(p.stdout.readline())
        assert escaped in tb.namespace_pids()[t.host("b1").netns]
        shim_dir = tb.shim_dir
        assert (shim_dir / "ssh").exists()
    finally:
        tb.cleanup()
    have = set(testbed.list_namespaces(testbed.PREFIX))
    assert not have & set(t.namespaces())
    assert not any((testbed.ETC_NETNS / ns).exists() for ns in t.namespaces())
    assert not shim_dir.exists()
    assert _root_links() == links_before          # no veth (or any link) left behind
    time.sleep(0.2)
    assert not _alive(escaped)
    tb.cleanup()                                  # idempotent


def _horovod_ready():
    return (Path(sys.executable).parent / "horovodrun").exists() and subprocess.run(
        [sys.executable, "-c", "import horovod.tensorflow"], capture_output=True,
        timeout=120).returncode == 0


@needs_netns
@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["gloo", "mpi"])
def test_real_horovodrun_job_runs_across_the_racks(transport):
    if not _horovod_ready():
        stack_missing("horovod with TensorFlow not installed in this interpreter's venv")
    n = 1 << 18                                   # 1 MiB of float32
    t = plan_topology(["a1"], ["b1"], rate="1gbit")
    with testbed.Testbed(t) as tb:
        env = tb.launch_env()
        env["PYTHONPATH"] = str(REPO)
        before = tb.uplink_bytes()
        r = tb.run("head", ["horovodrun", f"--{transport}", "-np", "2", "-H", "a1:1,b1:1",
                            "--network-interface", "eth0", "--start-timeout", "60",
                            sys.executable, str(HERE / "testbed_allreduce.py"), str(n)],
                   env=env, timeout=100, cwd=str(REPO))
        after = tb.uplink_bytes()
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-3000:]
        # both ranks on both hosts; under MPI each rank yields its core while it waits
        # (the testbed pins a job's ranks to one core: busy-polling would starve the other)
        want = " yield 1" if transport == "mpi" else ""
        assert f"RESULT rank 0/2 host a1 sum 3.0 3.0 n {n}{want}" in out, out[-3000:]
        assert f"RESULT rank 1/2 host b1 sum 3.0 3.0 n {n}{want}" in out, out[-3000:]
        # each rank sends its half twice (reduce-scatter + allgather): >= 4n bytes each way
        assert after["AB"] - before["AB"] >= 4 * n and after["BA"] - before["BA"] >= 4 * n
        # horovodrun (gloo) or mpirun (mpi) reached both hosts through the ssh shim
        assert {h for _, h, _ in tb.shim_log()} == {"a1", "b1"}
        pids = tb.namespace_pids()
    assert not set(testbed.list_namespaces(testbed.PREFIX)) & set(t.namespaces())
    time.sleep(0.2)
    assert not [p for ps in pids.values() for p in ps if _alive(p)]


_CHILD = """
import sys, time
from benchmarks.netns import install_signal_handlers
from benchmarks.testbed import Testbed, plan_topology
install_signal_handlers()
with Testbed(plan_topology(["a1"], ["b1"])) as tb:
    p = tb.popen("b1", ["sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; "
                                    "sleep 300"], stdout=__import__("subprocess").PIPE, text=True)
    print(" ".join(tb.topology.namespaces()), p.stdout.readline().strip(), flush=True)
    time.sleep(60)
"""


@needs_netns
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_tears_the_testbed_down(sig):
    import signal
    p = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=str(REPO), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        *names, pid = p.stdout.readline().split()
        assert set(names) <= set(testbed.list_namespaces(testbed.PREFIX))
        p.send_signal(getattr(signal, sig))
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert not set(names) & set(testbed.list_namespaces(testbed.PREFIX))
    assert not any((testbed.ETC_NETNS / ns).exists() for ns in names)
    time.sleep(0.2)
    assert not _alive(int(pid))
