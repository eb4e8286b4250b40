"""horovod_prio.method.units: the one parser per kind of input (pure Python),
and that every entry point uses it."""
import argparse

import pytest

from horovod_prio.method import units


@pytest.mark.parametrize("raw,value", [
    (0, 0), ("0", 0), ("10", 10), ("10B", 10), ("1K", 1024), ("1k", 1024), ("1KB", 1000),
    ("2 MiB", 2 << 20), ("1G", 1 << 30), ("1GB", 10 ** 9), ("0.5MiB", 1 << 19), (".5KiB", 512),
])
def test_parse_bytes(raw, value):
    assert units.parse_bytes(raw) == value


@pytest.mark.parametrize("raw", [-1, "-1", "1.2.3", "MiB", "1 XiB", "0.3B", 1.5, None, True])
def test_parse_bytes_errors(raw):
    """The error says what a byte size is and names the value it got."""
    with pytest.raises(units.BadValue) as e:
        units.parse_bytes(raw)
    assert str(e.value) == f"expected {units.bytes_rule(0)}, got {raw!r}"


def test_minimums_and_rules_in_messages():
    with pytest.raises(units.BadValue, match=">= 1024"):
        units.parse_bytes("1KB", 1024)
    assert units.parse_int("7", 1) == 7
    with pytest.raises(units.BadValue, match="integer >= 1"):
        units.parse_int("0", 1)
    with pytest.raises(units.BadValue, match=r"integer in 0\.\.3"):
        units.parse_int(4, 0, 3)
    assert units.parse_float("0.5", 0.0, strict=True) == 0.5
    with pytest.raises(units.BadValue, match="> 0"):
        units.parse_float(0, 0.0, strict=True)
    assert units.parse_bool("ON") is True and units.parse_bool(0) is False
    with pytest.raises(ValueError, match="PriorityConfig.x must be an integer >= 1, got 'z'"):
        units.check("PriorityConfig.x", units.parse_int, "z", 1)


def test_argparse_adapter(capsys):
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=units.arg(units.parse_bytes, 1))
    assert p.parse_args(["--size", "4MiB"]).size == 4 << 20
    with pytest.raises(SystemExit) as ei:
        p.parse_args(["--size", "4XB"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "--size" in err and "4XB" in err and "byte size" in err


def test_the_same_rules_on_the_command_lines_and_in_env_vars():
    """A byte size means the same in HOROVOD_PRIO_* variables, the arbiter's and
    the simulator's command lines and the benchmark harness."""
    from horovod_prio.arbiter import cli as arbiter_cli
    from horovod_prio.method.config import PriorityConfig
    from horovod_prio.sim import cli as sim_cli
    for text, value in (("1.5MiB", 3 << 19), ("2MB", 2000000), ("8K", 8192)):
        assert PriorityConfig.from_env({"HOROVOD_PRIO_CREDIT_BYTES": text}).credit_bytes == value
        assert arbiter_cli.build_parser().parse_args(
            ["--bind", "127.0.0.1:0", "--credit-bytes", text]).credit_bytes == value
        assert sim_cli.build_parser().parse_args(["--arbiter-credit", text]).arbiter_credit == value
