"""benchmarks/harness.py: the pieces run.py, arbiter_bench.py and cluster.py share.

No root, no network namespaces: the arbiter process runs on 127.0.0.1."""
import ast
import os
import secrets
import time
from pathlib import Path

import pytest

from benchmarks import harness

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SIBLINGS = {p.stem for p in BENCH.glob("*.py")}


def _private_uses(path: Path) -> list[str]:
    """``from .x import _y`` / ``from benchmarks.x import _y`` and ``x._y`` where x is
    a benchmarks module imported by name."""
    tree = ast.parse(path.read_text())
    imported_modules = set()
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            ours = node.level > 0 or mod == "benchmarks" or mod.startswith("benchmarks.")
            if not ours:
                continue
            for a in node.names:
                if node.level > 0 and not mod or mod == "benchmarks":
                    if a.name in SIBLINGS:
                        imported_modules.add(a.asname or a.name)
                        continue
                if a.name.startswith("_"):
                    bad.append(f"{path.name}:{node.lineno}: from {'.' * node.level}{mod} "
                               f"import {a.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in imported_modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            bad.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return bad


def test_benchmark_modules_use_only_public_names_of_each_other():
    bad = [b for p in sorted(BENCH.glob("*.py")) for b in _private_uses(p)]
    assert bad == []


def test_the_arbiter_launcher_is_not_called_arbiter():
    tree = ast.parse((BENCH / "arbiter_bench.py").read_text())
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert "Arbiter" not in classes
    assert isinstance(harness.ArbiterProcess, type)


@pytest.mark.timeout(60)
def test_arbiter_process_starts_answers_stats_and_stops(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_urlsafe(16))
    os.chmod(secret, 0o600)
    arb = harness.ArbiterProcess("127.0.0.1", secret, "8MiB", 8, tmp_path / "arbiter.log")
    try:
        addr = arb.start()
        assert addr.startswith("127.0.0.1:") and int(addr.rsplit(":", 1)[1]) > 0
        st = arb.stats()
        assert isinstance(st, dict) and "links" in st
        pid = arb.proc.pid
    finally:
        arb.stop()
    assert arb.proc.poll() is not None
    time.sleep(0.1)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


class _LocalLauncher:
    """run_jobs' launcher interface without a namespace (processes run here)."""

    def __init__(self):
        self.procs = []

    def popen(self, argv, cpus=None, **kw):
        import subprocess
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(argv, **kw)
        self.procs.append(p)
        return p

    def bytes_sent(self):
        return 0

    def kill_processes(self):
        import signal
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _fake_job(job, wd):
    p = wd / job.name
    go = harness.go_file(job, wd)
    return ["sh", "-c",
            f"echo '{{\"step\": 0, \"t_start\": 1, \"t_end\": 2, \"warmup\": true}}' "
            f"> {p}.steps.jsonl; touch {p}.ready; "
            f"while [ ! -e {go} ]; do sleep 0.02; done; t=$(date +%s.%N); "
            f"echo \"{{\\\"step\\\": 1, \\\"t_start\\\": $t, \\\"t_end\\\": $t}}\" "
            f">> {p}.steps.jsonl"]


@pytest.mark.timeout(60)
def test_run_jobs_releases_a_job_with_start_later(tmp_path):
    jobs = [harness.JobSpec(name="job0", impl="horovod", steps=1, warmup=1),
            harness.JobSpec(name="job1", impl="horovod", steps=1, warmup=1, start=1.0)]
    assert harness.go_file(jobs[0], tmp_path) != harness.go_file(jobs[1], tmp_path)
    gone = []
    res = harness.run_jobs(_LocalLauncher(), jobs, tmp_path / "w", 30, command=_fake_job,
                           env=lambda job, wd: dict(os.environ), on_go=gone.append)
    assert gone == [res["t_go"]]
    first = {j["name"]: j["steps"][1]["t_start"] for j in res["jobs"]}
    assert res["released"]["job1"] >= res["t_go"] + 1.0
    assert first["job1"] >= res["t_go"] + 1.0
    assert first["job0"] < first["job1"]
