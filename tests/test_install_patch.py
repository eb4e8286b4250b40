"""Which Horovod patch `tools/install.sh` applies for a TensorFlow version
(`tools/install.sh --horovod-patch TF`, the same function the build uses), and
that every patch reaches the Docker image's installer layer. Runs bash only."""
import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "tools" / "install.sh"
PATCH_219 = ROOT / "tools" / "horovod-0.28.1-tf2.19.patch"


def patch_for(tf):
    return subprocess.run(["bash", str(INSTALL), "--horovod-patch", tf], capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize("tf", ["2.19.0", "2.19.1", "2.20.0", "2.21.0", "2.30.1"])
def test_tf_2_19_and_later_take_the_xla_patch(tf):
    r = patch_for(tf)
    assert r.returncode == 0 and r.stdout.strip() == str(PATCH_219), r


@pytest.mark.parametrize("tf", ["2.15.1", "2.16.2", "2.17.1", "2.18.1", "2.1.9", "1.19.1"])
def test_the_other_stacks_build_unpatched(tf):
    r = patch_for(tf)
    assert r.returncode == 0 and r.stdout == "", r


@pytest.mark.parametrize("tf", ["2.19", "", "2.19.1rc0", "v2.19.1"])
def test_a_malformed_version_is_named(tf):
    r = patch_for(tf)
    assert r.returncode == 2 and r.stdout == ""
    assert "bad TF version '%s'" % tf in r.stderr


def test_the_patch_only_narrows_the_xla_guard():
    text = PATCH_219.read_text()
    assert "+++ b/horovod/tensorflow/xla_mpi_ops.cc" in text
    added = [l for l in text.splitlines() if l.startswith("+") and not l.startswith("+++")]
    assert added == ["+#if TENSORFLOW_VERSION >= 2006000000 && TENSORFLOW_VERSION < 2019000000"]


def test_every_patch_belongs_to_a_pinned_stack_and_reaches_the_docker_installer():
    patches = sorted((ROOT / "tools").glob("horovod-*.patch"))
    assert patches
    stacks = [p.name[3:-4] for p in (ROOT / "requirements").glob("tf-*.txt")]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    copies = [l.split()[1:-1] for l in dockerfile.splitlines() if l.startswith("COPY tools/")]
    for p in patches:
        mm = re.fullmatch(r"horovod-0\.28\.1-tf(\d+\.\d+)\.patch", p.name).group(1)
        assert any(s.startswith(mm + ".") for s in stacks), (p.name, stacks)
        rel = str(p.relative_to(ROOT))
        assert any(fnmatch.fnmatchcase(rel, g) for c in copies for g in c), (rel, copies)
