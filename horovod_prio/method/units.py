"""One parser per kind of input, used by every entry point (PriorityConfig and
its ``HOROVOD_PRIO_*`` variables, the ``horovod-prio`` commands, the
benchmark harness), so a byte size or a count means the same everywhere.

Each parser takes the raw value (a Python value, or the text of an
environment variable or a command-line argument) and returns the parsed
value, or raises :class:`BadValue` (a ``ValueError``) whose ``rule`` says what
was expected. :func:`check` turns that into a message naming the field;
:func:`arg` adapts a parser for ``argparse``.

Every parser names the unit it returns: ``parse_bytes``,
``parse_rate_bits_per_s`` / ``parse_rate_bytes_per_s``, ``parse_duration_s``,
``parse_burst_bytes``, ``parse_class_reserve`` (a share).

Byte sizes: an ``int``, or a string with an optional suffix, case-insensitive:
``B``; ``K``/``KiB``, ``M``/``MiB``, ``G``/``GiB`` (powers of 1024); ``KB``,
``MB``, ``GB`` (powers of 1000). ``"4MiB"`` -> 4194304, ``"1MB"`` -> 1000000,
``"1.5MiB"`` -> 1572864; a fraction of a byte is an error.

Link rates are written as ``tc`` reads them, so that the text the shaped-link
harness hands to ``tc`` and the number the simulator and the reports compute
with agree: a number (``1e9`` too) in bits/s, or with ``kbit``/``mbit``/
``gbit``/``tbit`` (powers of 1000), case-insensitive. ``bps``-style suffixes
are refused: ``tc`` reads ``mbps`` as megabytes/s where most people mean
megabits.

Durations: a number with ``s``, ``ms``, ``us`` or ``ns`` (a bare number is
seconds); for ``tc`` (``tc=True``) the unit is required and is ``s``, ``ms``
or ``us``, since ``tc`` reads a bare number as microseconds.
"""
from __future__ import annotations

import argparse
import math
import numbers
import re
from fractions import Fraction

__all__ = ["BadValue", "parse_bytes", "parse_int", "parse_float", "parse_bool", "check", "arg",
           "bytes_rule", "parse_rate_bits_per_s", "parse_rate_bytes_per_s", "parse_duration_s",
           "parse_burst_bytes", "parse_class_reserve", "parse_sched_priority"]


class BadValue(ValueError):
    """``rule``: what was expected, e.g. ``"an integer >= 1"``."""

    def __init__(self, rule: str, value=None):
        super().__init__(f"expected {rule}, got {value!r}")
        self.rule = rule
        self.value = value


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "m": 1024 ** 2, "mib": 1024 ** 2, "g": 1024 ** 3, "gib": 1024 ** 3,
    "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


def bytes_rule(minimum: int = 0) -> str:
    return f"a byte size >= {minimum} (int or e.g. '4MiB', '512KiB', '1MB')"


def parse_bytes(value, minimum: int = 0) -> int:
    """Byte size (see the module docstring) ``>= minimum``."""
    rule = bytes_rule(minimum)
    n = None
    if isinstance(value, bool):
        raise BadValue(rule, value)
    if isinstance(value, numbers.Integral):
        n = int(value)
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            total = Fraction(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
            if total.denominator == 1:
                n = int(total)
    if n is None or n < minimum:
        raise BadValue(rule, value)
    return n


def parse_int(value, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (``int``, an integral float, or decimal text) in range."""
    if minimum is not None and maximum is not None:
        rule = f"an integer in {minimum}..{maximum}"
    elif minimum is not None:
        rule = f"an integer >= {minimum}"
    else:
        rule = "an integer"
    v = value
    if isinstance(v, bool):
        raise BadValue(rule, value)
    if isinstance(v, str):
        try:
            v = int(v.strip(), 10)
        except ValueError:
            raise BadValue(rule, value) from None
    elif isinstance(v, numbers.Integral):
        v = int(v)
    elif isinstance(v, numbers.Real) and math.isfinite(v) and float(v).is_integer():
        v = int(v)
    else:
        raise BadValue(rule, value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise BadValue(rule, value)
    return v


def parse_float(value, minimum: float | None = None, strict: bool = False, unit: str = "") -> float:
    """A finite number ``>= minimum`` (``> minimum`` if ``strict``)."""
    if minimum is None:
        rule = f"a finite number{unit}"
    else:
        rule = f"a finite number {'>' if strict else '>='} {minimum:g}{unit}"
    v = value
    if isinstance(v, bool):
        raise BadValue(rule, value)
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise BadValue(rule, value) from None
    elif not isinstance(v, numbers.Real):
        raise BadValue(rule, value)
    v = float(v)
    if not math.isfinite(v) or (minimum is not None and (v < minimum or (strict and v == minimum))):
        raise BadValue(rule, value)
    return v


def parse_bool(value) -> bool:
    """``True``/``False``, 1/0, or text 1/0/true/false/yes/no/on/off (any case)."""
    rule = "a boolean (1/0/true/false/yes/no/on/off)"
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        s = value.strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
    raise BadValue(rule, value)


_NUMBER = r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"
_RATE_RE = re.compile(r"^\s*" + _NUMBER + r"\s*([kmgt]?bit)?\s*$", re.I)
_RATE_UNITS = {"": 1.0, "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_DURATION_RE = re.compile(r"^\s*" + _NUMBER + r"\s*([a-z]*)\s*$", re.I)
_DURATION_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_BURST_RE = re.compile(r"^\s*" + _NUMBER + r"\s*([a-z]*)\s*$", re.I)
# tc's sizes: k/kb = 1024 bytes (not 1000), kbit = 1000 bits
_BURST_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024 ** 2, "mb": 1024 ** 2,
                "g": 1024 ** 3, "gb": 1024 ** 3, "kbit": 1e3 / 8, "mbit": 1e6 / 8,
                "gbit": 1e9 / 8}


def parse_rate_bits_per_s(value) -> float:
    """A link rate > 0 (see the module docstring) in bits per second:
    ``"300mbit"`` -> 3e8, ``"1e9"`` -> 1e9."""
    rule = "a rate > 0 in bits/s, e.g. 300mbit, 2.5gbit or 1e9 (tc's kbit/mbit/gbit/tbit)"
    m = _RATE_RE.match(value) if isinstance(value, str) else None
    if m is None:
        raise BadValue(rule, value)
    v = float(m.group(1)) * _RATE_UNITS[(m.group(2) or "").lower()]
    if not math.isfinite(v) or v <= 0:
        raise BadValue(rule, value)
    return v


def parse_rate_bytes_per_s(value) -> float:
    """:func:`parse_rate_bits_per_s` in bytes per second."""
    return parse_rate_bits_per_s(value) / 8.0


def parse_duration_s(value, tc: bool = False) -> float:
    """A duration >= 0 in seconds: ``"5us"`` -> 5e-6, ``"0.1ms"``, ``"0"``,
    ``"1e-6"``; ``tc``: as ``tc`` reads it (unit required, one of s/ms/us)."""
    if tc:
        rule = "a duration with a unit (s, ms, us), e.g. 1ms, 200us, 0.5s"
        allowed = ("s", "ms", "us")
    else:
        rule, allowed = ("a duration >= 0 like 5us, 0.1ms, 0.002s or 1e-6 (seconds)",
                         ("", "s", "ms", "us", "ns"))
    m = _DURATION_RE.match(value) if isinstance(value, str) else None
    if m is None or m.group(2).lower() not in allowed:
        raise BadValue(rule, value)
    v = float(m.group(1)) * _DURATION_UNITS.get(m.group(2).lower(), 1.0)
    if not math.isfinite(v):
        raise BadValue(rule, value)
    return v


def parse_burst_bytes(value) -> float:
    """A ``tc`` size (a token bucket's burst) in bytes: ``"1mb"`` -> 1048576
    (``tc``'s k/kb/m/mb/g/gb are powers of 1024), ``"256kbit"`` -> 32000."""
    rule = "a tc size such as 1mb, 256kb or 64kbit"
    m = _BURST_RE.match(value) if isinstance(value, str) else None
    if m is None or m.group(2).lower() not in _BURST_UNITS:
        raise BadValue(rule, value)
    return float(m.group(1)) * _BURST_UNITS[m.group(2).lower()]


def parse_class_reserve(value) -> float:
    """The arbiter's class reserve: a share of a link's credit in [0, 1)."""
    rule = "a share of the credit in [0, 1)"
    try:
        v = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise BadValue(rule, value) from None
    if isinstance(value, bool) or not 0 <= v < 1:
        raise BadValue(rule, value)
    return v


REALTIME_DEFAULT = 10


def parse_sched_priority(value):
    """A thread's scheduling priority (the arbiter's ``--priority``, its
    clients' I/O thread): ``realtime`` (SCHED_FIFO at priority 10),
    ``realtime=N`` (N in 1..99) or ``nice=N`` (N in -20..19) -> ``(kind, N)``."""
    rule = "realtime, realtime=N (N in 1..99) or nice=N (N in -20..19)"
    kind, sep, val = (value.strip() if isinstance(value, str) else "").partition("=")
    if kind == "realtime" and not sep:
        return "realtime", REALTIME_DEFAULT
    if kind not in ("realtime", "nice") or not sep:
        raise BadValue(rule, value)
    try:
        n = int(val)
    except ValueError:
        raise BadValue(rule, value) from None
    if not (1 <= n <= 99 if kind == "realtime" else -20 <= n <= 19):
        raise BadValue(rule, value)
    return kind, n


def check(what: str, parser, value, *args, **kwargs):
    """``parser(value, ...)`` with a ``ValueError`` naming ``what`` on failure:
    ``"<what> must be <rule>, got <value>"``."""
    try:
        return parser(value, *args, **kwargs)
    except BadValue as e:
        raise ValueError(f"{what} must be {e.rule}, got {value!r}") from None


def arg(parser, *args, **kwargs):
    """An ``argparse`` ``type=`` callable running ``parser(text, ...)``."""
    def parse(text):
        try:
            return parser(text, *args, **kwargs)
        except BadValue as e:
            raise argparse.ArgumentTypeError(f"expected {e.rule}, got {text!r}") from None
    parse.__name__ = getattr(parser, "__name__", "value").replace("parse_", "")
    return parse
