"""Static checks of the Docker image / test matrix files (issue 6).

Cheap: reads files only, never runs docker. The host-leak check collects this
machine's package-mirror settings at test time, so none is written here.
"""
import configparser
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from stack_required import import_stack_module

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKER_MK = ROOT / "docker" / "docker.mk"
CI = ROOT / ".github" / "workflows" / "ci.yml"
MATRIX_TFS = {"2.15.1", "2.16.2", "2.17.1", "2.18.1", "2.19.1", "2.21.0"}
CONTROLLERS = {"gloo", "mpi"}


def _read(p):
    return p.read_text(encoding="utf-8")


def _instructions(text):
    """Dockerfile instructions with line continuations joined, comments dropped."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and line.lstrip().startswith("#"):
            continue
        cur += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            if cur.strip():
                out.append(cur.strip())
            cur = ""
    return out


def test_dockerfile_base_image_arg_defaults_to_public_python_slim():
    ins = _instructions(_read(DOCKERFILE))
    first_from = next(i for i, s in enumerate(ins) if s.upper().startswith("FROM "))
    args = [s for s in ins[:first_from] if s.upper().startswith("ARG BASE_IMAGE")]
    assert args == ["ARG BASE_IMAGE=python:3.11-slim"], args
    assert ins[first_from].split()[1] in ("${BASE_IMAGE}", "$BASE_IMAGE")


def test_dockerfile_reuses_the_project_installer_and_checks_horovod_build():
    text = _read(DOCKERFILE)
    assert "tools/install.sh" in text and "make install" in text
    # horovod must come out with all three of TensorFlow, MPI and Gloo.
    assert "horovodrun --check-build" in text
    assert re.search(r"for fw in TensorFlow MPI Gloo", text)
    ins = _instructions(text)
    # The dependency layer (installer) comes before the full source copy, so a
    # source change does not rebuild horovod.
    dep = next(i for i, s in enumerate(ins) if "tools/install.sh" in s and s.startswith("RUN"))
    src = next(i for i, s in enumerate(ins) if s in ("COPY . .", "COPY . /opt/horovod_prio"))
    assert dep < src
    assert "ARG TF=" in text


def test_dockerfile_bakes_no_package_settings():
    ins = _instructions(_read(DOCKERFILE))
    for s in ins:
        if s.upper().startswith(("ARG ", "ENV ")):
            assert not re.search(r"PIP_(INDEX_URL|EXTRA_INDEX_URL|FIND_LINKS|CERT|TRUSTED_HOST)|APT_CONFIG|https?://", s), s
    assert "type=secret" in _read(DOCKERFILE)


def test_dockerignore_keeps_venvs_out_of_the_context():
    ignore = (ROOT / "docker" / "Dockerfile.dockerignore").read_text().split()
    assert ".venv*" in ignore and ".git" in ignore


def _make_var(name):
    m = re.search(r"^%s \?= (.*)$" % re.escape(name), _read(DOCKER_MK), re.M)
    assert m, name
    return set(m.group(1).split())


def test_make_targets_and_default_matrix():
    assert re.search(r"^include docker/docker\.mk$", _read(ROOT / "Makefile"), re.M)
    mk = _read(DOCKER_MK)
    for target in ("docker-base", "docker-test", "docker-run"):
        assert re.search(r"^%s:" % target, mk, re.M), target
    assert _make_var("DOCKER_TFS") == MATRIX_TFS
    assert _make_var("DOCKER_CONTROLLERS") == CONTROLLERS
    assert _make_var("BASE_IMAGE") == {"python:3.11-slim"}
    for tf in MATRIX_TFS:
        assert (ROOT / "requirements" / ("tf-%s.txt" % tf)).is_file(), tf


def test_matrix_script_builds_niced_with_host_network_and_sets_controller():
    sh = _read(ROOT / "docker" / "matrix.sh")
    assert re.search(r"nice_io \$DOCKER build --network host", sh)
    assert "HOROVOD_PRIO_TEST_CONTROLLERS=" in sh
    assert "docker/make-base.sh" in sh
    base = _read(ROOT / "docker" / "make-base.sh")
    assert "debootstrap" in base and "import" in base and "bookworm" in base


def test_ci_workflow_runs_the_same_matrix_with_make():
    yaml = import_stack_module("yaml")
    wf = yaml.safe_load(_read(CI))
    job = wf["jobs"]["docker-test"]
    matrix = job["strategy"]["matrix"]
    assert set(map(str, matrix["tf"])) == MATRIX_TFS
    assert set(matrix["controller"]) == CONTROLLERS
    runs = [s.get("run", "") for s in job["steps"]]
    assert any(r.startswith("make docker-test") and "${{ matrix.tf }}" in r
               and "${{ matrix.controller }}" in r for r in runs), runs
    assert any(r.startswith("make docker-run") for r in runs), runs


# --- no host name or mirror path of this machine in the files we ship --------

def _host_values():
    """Mirror hosts/paths this machine's pip and apt are set up with."""
    vals = set()
    raw = []
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, timeout=60).stdout
        raw += [line.split("=", 1)[1].strip("'\"") for line in out.splitlines() if "=" in line]
    except Exception:
        pass
    raw += [v for k, v in os.environ.items() if k.startswith("PIP_")]
    for conf in ("/etc/pip.conf", os.path.expanduser("~/.config/pip/pip.conf")):
        cp = configparser.ConfigParser()
        try:
            cp.read(conf)
        except Exception:
            continue
        for sec in cp.sections():
            raw += list(cp[sec].values())
    try:
        out = subprocess.run(["apt-get", "indextargets", "--format", "$(REPO_URI)"],
                             capture_output=True, text=True, timeout=60).stdout
        raw += out.split()
    except Exception:
        pass
    for value in raw:
        for tok in value.split():
            u = urlparse(tok)
            if u.scheme in ("http", "https") and u.hostname:
                vals.add(u.hostname)
            elif u.scheme == "file" and u.path:
                vals.add(u.path.rstrip("/"))
            elif tok.startswith("/") and not tok.startswith(("/etc/ssl/", "/usr/share/")):
                vals.add(tok.rstrip("/"))   # find-links, constraint files, ...
    try:
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            if line.startswith("nameserver"):
                vals.add(line.split()[1])
    except Exception:
        pass
    host = socket.gethostname()
    if len(host) >= 4 and host not in ("localhost",):
        vals.add(host)
    return {v for v in vals if len(v) >= 4}


def _shipped_files():
    for top in ("docker", ".github"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file():
                yield p
    yield ROOT / "docs" / "docker.md"
    yield Path(__file__)


def test_no_host_name_or_mirror_path_leaked():
    values = _host_values()
    leaks = []
    for p in _shipped_files():
        if not p.is_file():
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        for v in values:
            if re.search(r"(?<![\w.-])%s(?![\w-])" % re.escape(v), text):
                leaks.append("%s: %s" % (p.relative_to(ROOT), v))
        if p == Path(__file__):
            continue
        # Whatever the machine: no local mirrors or private addresses at all.
        for pat in (r"file://", r"\b(?:10\.\d+|172\.(?:1[6-9]|2\d|3[01])|192\.168)\.\d+\.\d+\b",
                    r"find-links\s*=\s*/"):
            for m in re.finditer(pat, text):
                leaks.append("%s: %s" % (p.relative_to(ROOT), m.group(0)))
    assert not leaks, leaks
