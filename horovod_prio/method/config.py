"""Validated configuration: every knob of the method and of the scheduler.

Pure Python; imports no TensorFlow.

``PriorityConfig(**kwargs)`` takes each field from the keyword argument if
given, else from the environment variable ``HOROVOD_PRIO_<FIELD_UPPER>``
(``trace_path`` reads ``HOROVOD_PRIO_TRACE``), else the default. The
environment is read once, at construction; an empty (or all-blank) variable
counts as unset. ``PriorityConfig.from_env(environ, **overrides)`` does the
same against an explicit mapping (for tests).

Every bad value raises ``ValueError`` naming the field and its environment
variable, e.g.::

    PriorityConfig.num_groups must be an integer >= 1, got 'abc' (from env HOROVOD_PRIO_NUM_GROUPS)

Unknown ``HOROVOD_PRIO_*`` variables are reported with a warning on the
``horovod_prio`` logger (they are usually typos). Components that legitimately
read another ``HOROVOD_PRIO_*`` variable can declare it with
:func:`register_env_var`; ``HOROVOD_PRIO_CACHE`` (installer),
``HOROVOD_PRIO_REQUIRE_STACK`` and every ``HOROVOD_PRIO_TEST_*`` (test suite)
are pre-declared.

==================== ============================= ========= =========================
field                env var                       default   rule
==================== ============================= ========= =========================
enabled              HOROVOD_PRIO_ENABLED          True      1/0/true/false/yes/no/on/off
num_groups           HOROVOD_PRIO_NUM_GROUPS       4         int >= 1 (binding clamps to #layers)
ratio_threshold      HOROVOD_PRIO_RATIO_THRESHOLD  2.0       float > 0
scene                HOROVOD_PRIO_SCENE            "first"   "first" | "tail"
coefficient          HOROVOD_PRIO_COEFFICIENT      None      seconds, >= 0
relative_coefficient HOROVOD_PRIO_RELATIVE_...     None      >= 0 (neither given: measured)
calibration_batches  HOROVOD_PRIO_CALIBRATION_...  20        int >= 1: steps that measure the slack
count_threshold      HOROVOD_PRIO_COUNT_THRESHOLD  20        int >= 0
adjust_groups        HOROVOD_PRIO_ADJUST_GROUPS    1         int >= 1, <= num_groups
step                 HOROVOD_PRIO_STEP             1         int >= 1
max_boost            HOROVOD_PRIO_MAX_BOOST        4         int >= 0
warmup_batches       HOROVOD_PRIO_WARMUP_BATCHES   2         int >= 0
partition_bytes      HOROVOD_PRIO_PARTITION_BYTES  auto      bytes >= 1024, or "auto" (None):
                                                             below
credit_bytes         HOROVOD_PRIO_CREDIT_BYTES     auto      bytes >= 1024, or "auto" (None)
                                                             (overlap: below)
autotune             HOROVOD_PRIO_AUTOTUNE         False     bool: tune an auto credit online
monitor              HOROVOD_PRIO_MONITOR          True      bool: time steps, adapt priorities
trace_path           HOROVOD_PRIO_TRACE            None      path
arbiter              HOROVOD_PRIO_ARBITER          None      "host:port", port 1..65535
link                 HOROVOD_PRIO_LINK             None      non-empty string
job_id               HOROVOD_PRIO_JOB_ID           None      non-empty string
arbiter_secret       HOROVOD_PRIO_ARBITER_SECRET   None      non-empty string (hidden in repr)
arbiter_secret_file  HOROVOD_PRIO_ARBITER_SECRET_FILE None   path of a file holding the secret
job_priority         HOROVOD_PRIO_JOB_PRIORITY     0         int: the job's class at the arbiter
arbiter_timeout      HOROVOD_PRIO_ARBITER_TIMEOUT  0.05      seconds, > 0
overlap              HOROVOD_PRIO_OVERLAP          None      1/0/true/false/... or unset
==================== ============================= ========= =========================

Notes:

* ``coefficient`` / ``relative_coefficient`` are one choice (the slack of the
  time threshold, claim 1). If either is given as a (non-``None``) keyword
  argument, the keyword arguments decide the pair and the environment is not
  consulted for it; otherwise the environment decides. Both given in the same
  place is an error naming both fields; neither given anywhere means the
  slack is measured from the spread of the first ``calibration_batches``
  steps after the warm-up (see :mod:`horovod_prio.method.policy`).
* Values are parsed by :mod:`horovod_prio.method.units`, the same rules as the
  ``horovod-prio`` commands. Byte sizes accept an ``int`` or a string with an
  optional suffix: ``B``; ``KB``/``MB``/``GB`` (powers of 1000); ``K``/``M``/``G``
  and ``KiB``/``MiB``/``GiB`` (powers of 1024). Case-insensitive. ``"4MiB"`` ->
  4194304, ``"1MB"`` -> 1000000.
* ``overlap`` (barrier crossing, ``docs/overlap.md``): unset, models and
  optimizers passed to ``hvd.overlap(...)`` overlap the next step's forward
  pass with this step's allreduces and the rest train synchronously; ``False``
  turns ``hvd.overlap(...)`` into a logged no-op (synchronous training, same
  math: an A/B switch); ``True`` requires it: an optimizer or tape with
  ``overlap=True`` that reaches a training step without ``hvd.overlap`` raises.
* ``credit_bytes`` is the most gradient bytes the scheduler lets be in flight
  on rank 0. ``None`` / ``"auto"`` (the default) means no byte limit - chunks
  leave as soon as they are ready, highest priority first among the chunks
  ready at the same time - unless ``autotune`` is on, which then tries a few
  credits online and keeps the fastest (:mod:`horovod_prio.runtime.autotune`).
  An explicit value always wins over the tuner.
  It need not be >= ``partition_bytes``: a chunk bigger than the credit still
  goes out, alone, when nothing else is in flight.
* ``partition_bytes`` ``None`` / ``"auto"`` (the default): each optimizer's
  chunks hold an eighth of the gradient bytes it reduces per step, within
  [1 MiB, 4 MiB] (:meth:`PriorityConfig.partition_bytes_for`). A gradient
  is cut into chunks only where a chunk can be held back (a credit,
  ``autotune`` or an arbiter; :meth:`PriorityConfig.splits_tensors`);
  otherwise a gradient is never cut (its pieces would leave together and
  joining them costs a copy), one of at least half a chunk is a chunk of its
  own (a fused chunk waits for its last gradient) and smaller ones are fused
  up to the chunk size. A chunk is
  ready only when its last gradient is, and TensorFlow does not compute the
  gradients in layer order (with one inter-op thread the weight gradients run
  after the whole input-gradient chain, input side first): a chunk of a
  fixed 4 MiB over MobileNetV2's 9 MB made Horovod wait for most of backprop
  (docs/bench.md).
* Under ``hvd.overlap`` ``credit_bytes`` defaults to one chunk for the
  process once an optimizer overlaps (unless ``autotune`` is on). A value
  given (keyword or env, ``auto`` included) always wins.
"""
from __future__ import annotations

import difflib
import logging
import numbers
import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from . import units
from .policy import AdaptivePriorityPolicy
from .sequence import SCENES, base_priorities, partition_groups

__all__ = ["PriorityConfig", "ENV_PREFIX", "register_env_var", "CHUNKS_PER_STEP",
           "MIN_PARTITION_BYTES", "MAX_PARTITION_BYTES"]

logger = logging.getLogger("horovod_prio")

ENV_PREFIX = "HOROVOD_PRIO_"

#: Unless given: a step's gradients cut into about CHUNKS_PER_STEP chunks
#: (clamped to [MIN_PARTITION_BYTES, MAX_PARTITION_BYTES]), so that the first
#: chunks leave early in backprop and input-side chunks can overtake
#: output-side ones, at a bounded number of allreduces per step
#: (docs/overlap.md, "Chunk size and credit under overlap"; docs/bench.md).
#: Under ``hvd.overlap`` also a credit of one chunk: without a credit every
#: chunk goes to Horovod as soon as it is ready and the priority order never acts.
CHUNKS_PER_STEP = 8
MIN_PARTITION_BYTES = 1024 * 1024
MAX_PARTITION_BYTES = 4 * 1024 * 1024
_ENV_OVERRIDES = {"trace_path": "HOROVOD_PRIO_TRACE"}
# HOROVOD_PRIO_* variables read elsewhere (not config knobs): never "unknown".
# tools/install.sh wheel cache; the test suite's "a missing stack fails" switch
_EXTRA_ENV_VARS = {"HOROVOD_PRIO_CACHE", "HOROVOD_PRIO_REQUIRE_STACK"}
_EXTRA_ENV_PREFIXES = ("HOROVOD_PRIO_TEST_",)     # test-suite switches
_COEFF_PAIR = ("coefficient", "relative_coefficient")


def register_env_var(name: str) -> None:
    """Declare a ``HOROVOD_PRIO_*`` variable read outside ``PriorityConfig``
    so that it is not reported as unknown."""
    _EXTRA_ENV_VARS.add(str(name))


class _Bad(Exception):
    """Raised by a parser with the rule text; turned into a ValueError."""


def _unit(parser, *args, **kwargs):
    """A field parser from a :mod:`.units` parser (one rule per kind of input)."""
    def parse(v):
        try:
            return parser(v, *args, **kwargs)
        except units.BadValue as e:
            raise _Bad(e.rule) from None
    return parse


def _p_auto_bytes(v):
    if isinstance(v, str) and v.strip().lower() == "auto":
        return None
    try:
        return units.parse_bytes(v, 1024)
    except units.BadValue as e:
        raise _Bad(e.rule + ", or 'auto'") from None


def _p_scene(v):
    rule = "one of 'first', 'tail'"
    if isinstance(v, str) and v.strip().lower() in SCENES:
        return v.strip().lower()
    raise _Bad(rule)


def _opt_str(v):
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    if isinstance(v, str) and v.strip():
        return v.strip()
    raise _Bad("a non-empty string")


def _p_path(v):
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    if isinstance(v, str) and v.strip():
        return v.strip()
    raise _Bad("a non-empty path string")


def _p_arbiter(v):
    rule = "'host:port' with port 1..65535"
    if not isinstance(v, str):
        raise _Bad(rule)
    s = v.strip()
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise _Bad(rule)
    if host.startswith("[") != host.endswith("]") or host in ("[]",):
        raise _Bad(rule)
    if not 1 <= int(port) <= 65535:
        raise _Bad(rule)
    return s


# field name -> parser for non-None values
_PARSERS: Dict[str, Callable[[Any], Any]] = {
    "enabled": _unit(units.parse_bool),
    "num_groups": _unit(units.parse_int, 1),
    "ratio_threshold": _unit(units.parse_float, 0.0, strict=True),
    "scene": _p_scene,
    "coefficient": _unit(units.parse_float, 0.0, unit=" (seconds)"),
    "relative_coefficient": _unit(units.parse_float, 0.0),
    "count_threshold": _unit(units.parse_int, 0),
    "adjust_groups": _unit(units.parse_int, 1),
    "step": _unit(units.parse_int, 1),
    "max_boost": _unit(units.parse_int, 0),
    "warmup_batches": _unit(units.parse_int, 0),
    "calibration_batches": _unit(units.parse_int, 1),
    "partition_bytes": _p_auto_bytes,
    "credit_bytes": _p_auto_bytes,
    "autotune": _unit(units.parse_bool),
    "monitor": _unit(units.parse_bool),
    "trace_path": _p_path,
    "arbiter": _p_arbiter,
    "link": _opt_str,
    "job_id": _opt_str,
    "arbiter_secret": _opt_str,
    "arbiter_secret_file": _p_path,
    "job_priority": _unit(units.parse_int, -(1 << 31), (1 << 31) - 1),
    "arbiter_timeout": _unit(units.parse_float, 0.0, strict=True, unit=" (seconds)"),
    "overlap": _unit(units.parse_bool),
}
# fields whose value may be None
_OPTIONAL = {"partition_bytes", "credit_bytes", "coefficient", "relative_coefficient",
             "trace_path", "arbiter", "link", "job_id",
             "arbiter_secret", "arbiter_secret_file", "overlap"}


@dataclass(frozen=True, init=False)
class PriorityConfig:
    """All knobs, validated; see the module docstring for fields, env vars, rules.

    Construct with keyword arguments only: ``PriorityConfig(num_groups=3)``;
    fields not given come from ``HOROVOD_PRIO_*`` (read once, now) or defaults.
    Unknown keyword arguments raise ``TypeError`` naming them.
    """

    enabled: bool = True
    num_groups: int = 4
    ratio_threshold: float = 2.0
    scene: str = "first"
    coefficient: Optional[float] = None
    relative_coefficient: Optional[float] = None
    count_threshold: int = 20
    adjust_groups: int = 1
    step: int = 1
    max_boost: int = 4
    warmup_batches: int = 2
    calibration_batches: int = 20
    partition_bytes: Optional[int] = None
    credit_bytes: Optional[int] = None
    autotune: bool = False
    monitor: bool = True
    trace_path: Optional[str] = None
    arbiter: Optional[str] = None
    link: Optional[str] = None
    job_id: Optional[str] = None
    arbiter_secret: Optional[str] = field(default=None, repr=False)
    arbiter_secret_file: Optional[str] = None
    job_priority: int = 0
    arbiter_timeout: float = 0.05
    overlap: Optional[bool] = None

    def __init__(self, **kwargs: Any) -> None:
        self._build(kwargs, os.environ)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None,
                 **overrides: Any) -> "PriorityConfig":
        """Build from ``environ`` (default ``os.environ``) plus keyword ``overrides``."""
        obj = cls.__new__(cls)
        obj._build(overrides, os.environ if environ is None else environ)
        return obj

    # ---------------------------------------------------------------- helpers
    @staticmethod
    def env_var(field_name: str) -> str:
        """The environment variable of ``field_name`` (``ValueError`` if unknown)."""
        if field_name not in _PARSERS:
            raise ValueError(f"PriorityConfig has no field {field_name!r}")
        return _ENV_OVERRIDES.get(field_name, ENV_PREFIX + field_name.upper())

    @classmethod
    def field_names(cls) -> Tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def as_dict(self, redact_secrets: bool = False) -> Dict[str, Any]:
        """``{field: value}``; ``redact_secrets=True`` replaces a set
        ``arbiter_secret`` with ``'***'``."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if redact_secrets and d["arbiter_secret"] is not None:
            d["arbiter_secret"] = "***"
        return d

    def make_policy(self, num_groups: int, **overrides: Any) -> AdaptivePriorityPolicy:
        """An :class:`AdaptivePriorityPolicy` over ``base_priorities(num_groups)``
        with this config's knobs; ``adjust_groups`` is clamped to ``num_groups``
        (``num_groups`` is the effective count, e.g. clamped to the layers).
        ``overrides`` go to the policy constructor (e.g. ``max_events``)."""
        base = base_priorities(num_groups)
        kwargs = dict(
            coefficient=self.coefficient,
            relative_coefficient=self.relative_coefficient,
            count_threshold=self.count_threshold,
            adjust_groups=min(self.adjust_groups, len(base)),
            step=self.step,
            max_boost=self.max_boost,
            warmup_batches=self.warmup_batches,
            calibration_batches=self.calibration_batches,
        )
        kwargs.update(overrides)
        return AdaptivePriorityPolicy(base, **kwargs)

    def effective_num_groups(self, num_tasks: int) -> int:
        """``min(num_groups, num_tasks)`` - the clamp the binding applies."""
        if isinstance(num_tasks, bool) or not isinstance(num_tasks, numbers.Integral) \
                or num_tasks < 1:
            raise ValueError(f"num_tasks must be an integer >= 1, got {num_tasks!r}")
        return min(self.num_groups, int(num_tasks))

    def make_groups(self, num_tasks: int):
        """:func:`partition_groups` of ``num_tasks`` tasks with this config
        (``num_groups`` clamped to ``num_tasks``)."""
        return partition_groups(num_tasks, self.effective_num_groups(num_tasks),
                                self.ratio_threshold, self.scene)

    # ----------------------------------------------------------------- build
    def _build(self, kwargs: Dict[str, Any], environ: Mapping[str, str]) -> None:
        names = self.field_names()
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            raise TypeError(
                f"PriorityConfig got unexpected keyword argument(s): {', '.join(unknown)} "
                f"(fields: {', '.join(names)})")
        defaults = {f.name: f.default for f in fields(self)}
        env_vars = {n: self.env_var(n) for n in names}

        def env_value(name):
            raw = environ.get(env_vars[name])
            if raw is None or not str(raw).strip():
                return None
            return raw

        known_env = set(env_vars.values()) | _EXTRA_ENV_VARS
        stray = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known_env
                       and not k.startswith(_EXTRA_ENV_PREFIXES))
        if stray:
            hints = []
            for k in stray:
                close = difflib.get_close_matches(k, sorted(known_env), n=1)
                hints.append(f"{k} (did you mean {close[0]}?)" if close else k)
            logger.warning("unknown HOROVOD_PRIO_* environment variable(s) ignored: %s",
                           ", ".join(hints))

        values: Dict[str, Any] = {}
        sources: Dict[str, str] = {}

        def take(name, raw, source):
            if raw is None and name in _OPTIONAL:
                values[name] = None
            else:
                try:
                    values[name] = _PARSERS[name](raw)
                except _Bad as exc:
                    raise ValueError(
                        f"PriorityConfig.{name} must be {exc}, got {raw!r} "
                        f"({self._where(name, source)})") from None
            sources[name] = source

        for name in names:
            if name in _COEFF_PAIR:
                continue
            if name in kwargs:
                take(name, kwargs[name], "kwarg")
            elif env_value(name) is not None:
                take(name, env_value(name), "env")
            else:
                values[name] = defaults[name]
                sources[name] = "default"

        # the threshold slack pair
        if any(kwargs.get(n) is not None for n in _COEFF_PAIR):
            pair_src, raw = "kwarg", {n: kwargs.get(n) for n in _COEFF_PAIR}
        else:
            pair_src, raw = "env", {n: env_value(n) for n in _COEFF_PAIR}
        for n in _COEFF_PAIR:
            take(n, raw[n], pair_src if raw[n] is not None else "default")
        if values["coefficient"] is not None and values["relative_coefficient"] is not None:
            raise ValueError(
                "PriorityConfig.coefficient and PriorityConfig.relative_coefficient are "
                "mutually exclusive; give only one, got coefficient="
                f"{raw['coefficient']!r}, relative_coefficient={raw['relative_coefficient']!r} "
                f"({self._where('coefficient', pair_src)}; "
                f"{self._where('relative_coefficient', pair_src)})")

        # cross-field rules
        if values["adjust_groups"] > values["num_groups"]:
            raise ValueError(
                f"PriorityConfig.adjust_groups must be <= PriorityConfig.num_groups "
                f"({values['num_groups']}, {self._where('num_groups', sources['num_groups'])}), "
                f"got {values['adjust_groups']!r} "
                f"({self._where('adjust_groups', sources['adjust_groups'])})")

        if values["arbiter"] is not None:
            where = self._where("arbiter", sources["arbiter"])
            if values["link"] is None:
                raise ValueError(f"PriorityConfig.link is required when PriorityConfig.arbiter is "
                                 f"set ({where}); set env {self.env_var('link')}")
            if values["arbiter_secret"] is None and values["arbiter_secret_file"] is None:
                raise ValueError(
                    f"PriorityConfig.arbiter_secret or PriorityConfig.arbiter_secret_file is "
                    f"required when PriorityConfig.arbiter is set ({where}); set env "
                    f"{self.env_var('arbiter_secret')} or {self.env_var('arbiter_secret_file')}")

        for name in names:
            object.__setattr__(self, name, values[name])
        # not a field: equality and as_dict stay about values
        object.__setattr__(self, "_explicit",
                           frozenset(n for n, src in sources.items() if src != "default"))

    def is_set(self, field_name: str) -> bool:
        """Whether ``field_name`` was given (keyword argument or env var), as
        opposed to left at its default. ``dataclasses.replace`` passes every
        field, so a replaced config has every field given."""
        if field_name not in _PARSERS:
            raise ValueError(f"PriorityConfig has no field {field_name!r}")
        return field_name in self._explicit

    # ------------------------------------------------------- chunk size
    def partition_bytes_for(self, step_bytes: int) -> int:
        """The chunk size of an optimizer whose step reduces ``step_bytes`` of
        gradients: ``partition_bytes`` if given, else ``step_bytes /
        CHUNKS_PER_STEP`` clamped to [``MIN_PARTITION_BYTES``,
        ``MAX_PARTITION_BYTES``]."""
        if isinstance(step_bytes, bool) or not isinstance(step_bytes, numbers.Integral) \
                or step_bytes < 0:
            raise ValueError(f"step_bytes must be an integer >= 0, got {step_bytes!r}")
        if self.partition_bytes is not None:
            return self.partition_bytes
        return max(MIN_PARTITION_BYTES, min(MAX_PARTITION_BYTES, int(step_bytes) // CHUNKS_PER_STEP))

    def splits_tensors(self, credit_bytes: Optional[int], arbiter: bool) -> bool:
        """Whether chunks cut a gradient bigger than ``partition_bytes``
        (:func:`horovod_prio.method.plan.make_plan`'s ``split_tensors``), for a
        process whose scheduler credit is ``credit_bytes`` (``None``: no limit)
        and that asks an arbiter (``arbiter``) or not.

        Only a chunk that can be held back - by a credit (given, or tuned
        online under ``autotune``) or by an arbiter's grant - lets a later,
        higher-priority chunk overtake the rest of a big gradient. Chunks that
        leave as soon as they are ready gain nothing from a cut (the pieces
        leave together) and joining the pieces costs a copy; there, a
        gradient of at least half a chunk also goes alone, since a fused
        chunk waits for its last gradient (docs/bench.md)."""
        return credit_bytes is not None or bool(self.autotune) or bool(arbiter)

    # ------------------------------------------------------- barrier crossing
    def overlap_credit_bytes(self, partition_bytes: int) -> Optional[int]:
        """``credit_bytes`` for a process that overlaps with chunks of
        ``partition_bytes``: the value given, else ``None`` under ``autotune``
        (the tuner decides), else one chunk."""
        if self.is_set("credit_bytes") or self.autotune:
            return self.credit_bytes
        return int(partition_bytes)

    @classmethod
    def _where(cls, name: str, source: str) -> str:
        var = cls.env_var(name)
        if source == "env":
            return f"from env {var}"
        if source == "kwarg":
            return f"from keyword argument; env var {var}"
        return f"default; env var {var}"
