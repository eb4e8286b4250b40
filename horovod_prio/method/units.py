"""One parser per kind of input, used by every entry point (PriorityConfig and
its ``HOROVOD_PRIO_*`` variables, the ``horovod-prio`` commands, the
benchmark harness), so a byte size or a count means the same everywhere.

Each parser takes the raw value (a Python value, or the text of an
environment variable or a command-line argument) and returns the parsed
value, or raises :class:`BadValue` (a ``ValueError``) whose ``rule`` says what
was expected. :func:`check` turns that into a message naming the field;
:func:`arg` adapts a parser for ``argparse``.

Byte sizes: an ``int``, or a string with an optional suffix, case-insensitive:
``B``; ``K``/``KiB``, ``M``/``MiB``, ``G``/``GiB`` (powers of 1024); ``KB``,
``MB``, ``GB`` (powers of 1000). ``"4MiB"`` -> 4194304, ``"1MB"`` -> 1000000,
``"1.5MiB"`` -> 1572864; a fraction of a byte is an error.
"""
from __future__ import annotations

import argparse
import math
import numbers
import re
from fractions import Fraction

__all__ = ["BadValue", "parse_bytes", "parse_int", "parse_float", "parse_bool", "check", "arg",
           "bytes_rule"]


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
