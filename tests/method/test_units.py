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


def test_rates_are_read_as_tc_reads_them_in_the_unit_the_name_says():
    from horovod_prio.method.units import parse_rate_bits_per_s, parse_rate_bytes_per_s
    assert parse_rate_bits_per_s("300mbit") == 3e8
    assert parse_rate_bits_per_s("2.5Gbit") == 2.5e9
    assert parse_rate_bits_per_s("1e9") == 1e9            # tc: a bare number is bits/s
    assert parse_rate_bytes_per_s("10gbit") == 10e9 / 8
    for bad in ("100mbps", "1gbit/s", "0", "-1gbit", "fast", "", 1e9):
        with pytest.raises(units.BadValue, match="bits/s"):
            parse_rate_bits_per_s(bad)


def test_durations_in_seconds_and_the_tc_form():
    from horovod_prio.method.units import parse_duration_s
    assert parse_duration_s("5us") == 5 * 1e-6
    assert parse_duration_s("0.1ms") == 0.1 * 1e-3
    assert parse_duration_s("2") == 2.0 and parse_duration_s("0") == 0.0
    assert parse_duration_s("50ms", tc=True) == 50 * 1e-3
    for bad, tc in (("5", True), ("5ns", True), ("soon", False), ("-1ms", False), ("1h", False)):
        with pytest.raises(units.BadValue, match="duration"):
            parse_duration_s(bad, tc=tc)


def test_burst_sizes_and_the_class_reserve():
    from horovod_prio.method.units import parse_burst_bytes, parse_class_reserve
    assert parse_burst_bytes("1mb") == 1 << 20 and parse_burst_bytes("256kb") == 256 << 10
    assert parse_burst_bytes("64kbit") == 8000
    with pytest.raises(units.BadValue, match="tc size"):
        parse_burst_bytes("lots")
    assert parse_class_reserve("0.25") == 0.25 and parse_class_reserve(0) == 0.0
    for bad in ("1", "-0.1", "half", "nan", True, None):
        with pytest.raises(units.BadValue, match=r"share of the credit in \[0, 1\)"):
            parse_class_reserve(bad)
