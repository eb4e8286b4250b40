"""The pinned stacks behind `make install TF=<version>` (requirements/tf-*.txt).

tools/install.sh takes the file of the requested version as the whole stack, and
names the kernel library after the installed tensorflow-cpu: a file that pins
another TensorFlow, or a tf_keras of another minor version (tf_keras requires
its own minor of `tensorflow` and pip would install a second one), breaks the
install or the Keras 2 path. Reads files only."""
import re
from pathlib import Path

import pytest

REQ = Path(__file__).resolve().parent.parent / "requirements"
STACKS = sorted(p.name[len("tf-"):-len(".txt")] for p in REQ.glob("tf-*.txt"))


def pins(text):
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.]*)", line)
            assert m, "requirements line %r is not an exact `name==version` pin" % line
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def problems(tf, text):
    """What is wrong with the pin file of stack ``tf`` (empty: nothing)."""
    p, bad = pins(text), []
    if p.get("tensorflow-cpu") != tf:
        bad.append("tensorflow-cpu pinned %r, the file is for %s" % (p.get("tensorflow-cpu"), tf))
    if "numpy" not in p:
        bad.append("numpy is not pinned")
    minor = tuple(int(x) for x in tf.split(".")[:2])
    keras = p.get("tf-keras")
    if minor >= (2, 16):
        if keras is None or tuple(int(x) for x in keras.split(".")[:2]) != minor:
            bad.append("tf_keras pinned %r, needs %d.%d.x (Keras 2 on TF >= 2.16)" % ((keras,) + minor))
    elif keras is not None:
        bad.append("tf_keras pinned on TF %s, which has Keras 2 built in" % tf)
    return bad


def test_the_supported_stacks_are_pinned():
    assert {"2.15.1", "2.16.2", "2.17.1", "2.18.1", "2.19.1", "2.21.0"} <= set(STACKS), STACKS


@pytest.mark.parametrize("tf", STACKS)
def test_each_pin_file_pins_its_own_tensorflow_and_a_matching_tf_keras(tf):
    assert problems(tf, (REQ / ("tf-%s.txt" % tf)).read_text()) == []


@pytest.mark.parametrize("text, needle", [
    ("tensorflow-cpu==2.17.1\ntf_keras==2.18.0\nnumpy==1.26.4\n", "tf_keras pinned '2.18.0'"),
    ("tensorflow-cpu==2.17.1\nnumpy==1.26.4\n", "tf_keras pinned None"),
    ("tensorflow-cpu==2.18.1\ntf_keras==2.17.0\nnumpy==1.26.4\n", "tensorflow-cpu pinned '2.18.1'"),
    ("tensorflow-cpu==2.17.1\ntf_keras==2.17.0\n", "numpy is not pinned"),
])
def test_a_wrong_pin_file_is_named(text, needle):
    assert any(needle in b for b in problems("2.17.1", text)), problems("2.17.1", text)


def test_tf_keras_on_tf_2_15_is_refused():
    assert problems("2.15.1", "tensorflow-cpu==2.15.1\ntf_keras==2.15.0\nnumpy==1.26.4\n")
