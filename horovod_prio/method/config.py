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

The fields - name, type, environment variable, default, meaning, and
whether the process has one value of it - are declared once, on
:class:`PriorityConfig` (``_knob``); the table at the end of this docstring,
the parsers, the fields that may be ``None``, the runtime's per-process
fields (:data:`PROCESS_FIELDS`) and the configuration table of
``docs/usage.md`` (``python tools/config_table.py --write``; a test fails
when it is stale) are all derived from them.

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
           "MIN_PARTITION_BYTES", "MAX_PARTITION_BYTES", "PROCESS_FIELDS", "markdown_table"]

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


ARBITER_CLIENTS = ("native", "python")


def _p_arbiter_client(v):
    rule = "one of 'native', 'python'"
    if isinstance(v, str) and v.strip().lower() in ARBITER_CLIENTS:
        return v.strip().lower()
    raise _Bad(rule)


def _knob(default, parse, doc, *, process=False, env=None, shown=None, secret=False):
    """One field's declaration: ``default`` (``None``: the field may be
    ``None``, and is when not given), ``parse`` (non-``None`` values; raises
    :class:`_Bad`), ``doc`` (what it means, Markdown), ``process`` (one value
    per process, checked by the runtime), ``env`` (its variable when not
    ``HOROVOD_PRIO_<FIELD>``), ``shown`` (the default as the docs say it),
    ``secret`` (hidden in repr)."""
    return field(default=default, repr=not secret, metadata=dict(
        parse=parse, doc=doc, process=process, env=env, shown=shown))


@dataclass(frozen=True, init=False)
class PriorityConfig:
    """All knobs, validated; see the module docstring for fields, env vars, rules.

    Construct with keyword arguments only: ``PriorityConfig(num_groups=3)``;
    fields not given come from ``HOROVOD_PRIO_*`` (read once, now) or defaults.
    Unknown keyword arguments raise ``TypeError`` naming them.
    """

    enabled: bool = _knob(
        True, _unit(units.parse_bool),
        "`0` = use Horovod's own allreduce path unchanged")
    num_groups: int = _knob(
        4, _unit(units.parse_int, 1),
        "groups in the group sequence (clamped to the number of layers)")
    ratio_threshold: float = _knob(
        2.0, _unit(units.parse_float, 0.0, strict=True),
        "tasks/groups above this → near-equal groups")
    scene: str = _knob(
        "first", _p_scene,
        "otherwise: `first` (first group takes the remainder) or `tail` (last N−1 groups "
        "one task each)")
    coefficient: Optional[float] = _knob(
        None, _unit(units.parse_float, 0.0, unit=" (seconds)"),
        "slow threshold = min step time + coefficient (seconds)")
    relative_coefficient: Optional[float] = _knob(
        None, _unit(units.parse_float, 0.0),
        "slow threshold = min × (1 + relative_coefficient)")
    count_threshold: int = _knob(
        20, _unit(units.parse_int, 0),
        "fast steps counted before the boost decays one level")
    adjust_groups: int = _knob(
        1, _unit(units.parse_int, 1),
        "how many input-side groups the boost raises (≤ `num_groups`)")
    step: int = _knob(
        1, _unit(units.parse_int, 1),
        "priority added per boost level")
    max_boost: int = _knob(
        4, _unit(units.parse_int, 0),
        "boost cap")
    warmup_batches: int = _knob(
        2, _unit(units.parse_int, 0),
        "first steps ignored (graph tracing)")
    calibration_batches: int = _knob(
        20, _unit(units.parse_int, 1),
        "neither coefficient given: steps that measure the slack")
    partition_bytes: Optional[int] = _knob(
        None, _p_auto_bytes,
        "chunk size (`\"512KiB\"`, `\"4MiB\"`, `\"1MB\"`, `\"auto\"` accepted); a chunk is "
        "ready only when its last gradient is, so big chunks start the link late "
        "([docs/bench.md](bench.md)); a gradient is cut only where a chunk can be held back "
        "(a credit — under `hvd.overlap` its default one-chunk credit —, `autotune`, an "
        "arbiter); otherwise it is never cut (its pieces would leave together and joining "
        "them costs a copy), one of half a chunk or more is a chunk of its own (a fused chunk "
        "waits for its last gradient) and smaller ones are fused up to the chunk size "
        "(`PriorityConfig.splits_tensors`)",
        shown="`auto`: an eighth of the optimizer's gradient bytes per step, within "
              "[1 MiB, 4 MiB]")
    credit_bytes: Optional[int] = _knob(
        None, _p_auto_bytes,
        "most released-but-unfinished bytes on rank 0 (a larger chunk goes alone); auto = no "
        "limit, or tuned with `autotune`; a value given, `auto` included, always wins",
        process=True,
        shown="auto; one chunk (`partition_bytes`) once an optimizer overlaps (unless "
              "`autotune`)")
    autotune: bool = _knob(
        False, _unit(units.parse_bool),
        "tune an auto credit online (below)", process=True)
    monitor: bool = _knob(
        True, _unit(units.parse_bool),
        "`0` = fixed base priorities, no step timing, no policy")
    trace_path: Optional[str] = _knob(
        None, _p_path,
        "write a Chrome-trace JSON (rank r>0: `<stem>.rank<r><ext>`, `.json` when the path "
        "has no extension)", process=True, env="HOROVOD_PRIO_TRACE")
    arbiter: Optional[str] = _knob(
        None, _p_arbiter,
        "`host:port` of a link arbiter (opt-in; needs `link` and a secret)", process=True)
    link: Optional[str] = _knob(
        None, _opt_str,
        "name of the shared link at the arbiter", process=True)
    job_id: Optional[str] = _knob(
        None, _opt_str,
        "this job's name at the arbiter", process=True, shown="host-pid")
    arbiter_secret: Optional[str] = _knob(
        None, _opt_str,
        "shared secret", process=True, secret=True)
    arbiter_secret_file: Optional[str] = _knob(
        None, _p_path,
        "or a file holding it", process=True)
    job_priority: int = _knob(
        0, _unit(units.parse_int, -(1 << 31), (1 << 31) - 1),
        "the job's class at the arbiter (a 32-bit signed integer): a higher class outranks "
        "every request of a lower class, and no lower-class chunk is granted while a higher "
        "class holds a grant ([arbiter.md](arbiter.md#job-classes))", process=True)
    arbiter_timeout: float = _knob(
        0.05, _unit(units.parse_float, 0.0, strict=True, unit=" (seconds)"),
        "seconds before an unanswered arbiter is bypassed", process=True)
    arbiter_client: str = _knob(
        "native", _p_arbiter_client,
        "which client talks to the arbiter: `native` (C++ in the scheduler library: requests "
        "sent and grants released without Python) or `python` (`arbiter/client.py`, the "
        "reference) ([arbiter.md](arbiter.md#the-job-side-client))", process=True)
    arbiter_io_priority: Optional[tuple] = _knob(
        None, _unit(units.parse_sched_priority),
        "scheduling priority of the arbiter client's I/O thread, which receives the grants: "
        "`realtime` (SCHED_FIFO 10), `realtime=N` (1..99) or `nice=N` (-20..19); refused by "
        "the system (no CAP_SYS_NICE): one warning, default priority "
        "([arbiter.md](arbiter.md#placement---cpu-and---priority))", process=True,
        shown="unset")
    cpu_nice: Optional[int] = _knob(
        None, _unit(units.parse_int, -20, 19),
        "nice value (-20..19) of every thread of the process, set when the first optimizer, "
        "tape or trainer sets the process up: a lower-class job that shares hosts with a "
        "higher class gives it the CPU the way the arbiter gives it the link (e.g. `19`), with "
        "the session's autogroup; a value below the current one without CAP_SYS_NICE is "
        "refused: one warning ([arbiter.md](arbiter.md#the-cpu-beside-the-link))",
        process=True, shown="unset")
    class_auto: bool = _knob(
        True, _unit(units.parse_bool),
        "with an arbiter: while a job of a higher class is connected to this job's link, every "
        "thread of every rank runs at nice 19 (with its autogroup) and returns to its value "
        "when none is; an explicit `cpu_nice` wins; `0` = off "
        "([arbiter.md](arbiter.md#the-cpu-beside-the-link))", process=True)
    malloc_tuning: Optional[bool] = _knob(
        None, _unit(units.parse_bool),
        "glibc malloc keeps freed blocks for reuse (mmap threshold 256 MiB, trim threshold "
        "1 GiB, top pad 64 MiB, set with `mallopt` when the first optimizer, tape or trainer "
        "sets the process up): fewer page faults and `munmap`s where a step allocates and "
        "frees the same large buffers, at the cost of free memory held by the process; unset = "
        "on for a heterogeneous trainer's ranks, off for data-parallel ones; `1` = every rank; "
        "`0` = glibc's defaults. A `MALLOC_*_` variable or `GLIBC_TUNABLES` entry the user "
        "sets wins; without glibc: one log line, nothing changed "
        "([heter.md](heter.md#malloc-on-the-heterogeneous-ranks))",
        process=True, shown="unset")
    overlap: Optional[bool] = _knob(
        None, _unit(units.parse_bool),
        "barrier crossing: unset = as `hvd.overlap(...)` says, `0` = `hvd.overlap` is a "
        "logged no-op (A/B), `1` = required ([overlap.md](overlap.md))", shown="unset")

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
        if field_name not in _FIELDS:
            raise ValueError(f"PriorityConfig has no field {field_name!r}")
        return _FIELDS[field_name].metadata["env"] or ENV_PREFIX + field_name.upper()

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
        if field_name not in _FIELDS:
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


# ------------------------------------------------------- derived from the fields
_FIELDS = {f.name: f for f in fields(PriorityConfig)}
# field name -> parser for non-None values
_PARSERS: Dict[str, Callable[[Any], Any]] = {n: f.metadata["parse"] for n, f in _FIELDS.items()}
# fields whose value may be None
_OPTIONAL = frozenset(n for n, f in _FIELDS.items() if f.default is None)
#: Fields that exist once per process: the first optimizer/tape sets them and
#: the runtime refuses a different value (:class:`horovod_prio.runtime.Runtime`).
PROCESS_FIELDS = tuple(n for n, f in _FIELDS.items() if f.metadata["process"])


def _shown_default(f) -> str:
    if f.metadata["shown"]:
        return f.metadata["shown"]
    if f.default is None:
        return "–"
    return "`%s`" % f.default if isinstance(f.default, (bool, str)) else repr(f.default)


def markdown_table() -> str:
    """The fields as ``docs/usage.md``'s configuration table (Markdown)."""
    rows = ["| field | env var | default | one per process | meaning |",
            "|---|---|---|---|---|"]
    for n, f in _FIELDS.items():
        rows.append("| `%s` | `%s` | %s | %s | %s |" % (
            n, PriorityConfig.env_var(n), _shown_default(f),
            "yes" if f.metadata["process"] else "–", f.metadata["doc"]))
    return "\n".join(rows) + "\n"


def _text_table() -> str:
    cols = [("field", "env var", "type", "default", "per process")]
    for n, f in _FIELDS.items():
        cols.append((n, PriorityConfig.env_var(n), str(f.type), repr(f.default),
                     "yes" if f.metadata["process"] else ""))
    width = [max(len(r[i]) for r in cols) for i in range(len(cols[0]))]
    rule = " ".join("=" * w for w in width)
    lines = [" ".join(c.ljust(w) for c, w in zip(r, width)).rstrip() for r in cols]
    return "\n".join([rule, lines[0], rule] + lines[1:] + [rule]) + "\n"


if __doc__:   # not under python -OO
    __doc__ += "\nFields (generated from the declarations)::\n\n" + "".join(
        "    " + line + "\n" for line in _text_table().splitlines())
