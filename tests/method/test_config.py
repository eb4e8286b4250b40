"""Unit tests for horovod_prio.method.config (pure Python)."""
import dataclasses
import logging
import pathlib
import pickle

import pytest

from horovod_prio.method.config import PriorityConfig, register_env_var
from horovod_prio.method.policy import AdaptivePriorityPolicy

DEFAULTS = dict(
    enabled=True, num_groups=4, ratio_threshold=2.0, scene="first", coefficient=None,
    relative_coefficient=None, count_threshold=20, adjust_groups=1, step=1, max_boost=4,
    warmup_batches=2, calibration_batches=20, partition_bytes=None, credit_bytes=None, autotune=False, monitor=True, trace_path=None,
    arbiter=None, link=None, job_id=None, arbiter_secret=None, arbiter_secret_file=None,
    job_priority=0, arbiter_timeout=0.05, arbiter_client="native", arbiter_io_priority=None,
    cpu_nice=None, class_auto=True, malloc_tuning=None, overlap=None,
)
# what arbiter= needs beside it
WITH_ARBITER = dict(link="l", arbiter_secret="s")


def env(**kw):
    """``env(num_groups='3')`` -> ``{'HOROVOD_PRIO_NUM_GROUPS': '3'}``."""
    return {PriorityConfig.env_var(k): v for k, v in kw.items()}


# ------------------------------------------------------------------- defaults
def test_defaults_from_empty_env():
    assert PriorityConfig.from_env({}).as_dict() == DEFAULTS


def test_defaults_direct_construction(clean_env):
    assert PriorityConfig().as_dict() == DEFAULTS


def test_fields_in_spec_order():
    assert PriorityConfig.field_names() == tuple(DEFAULTS)


def test_kwargs_direct(clean_env):
    c = PriorityConfig(num_groups=3)
    assert c.num_groups == 3 and c.step == 1


def test_direct_construction_reads_os_environ(clean_env):
    clean_env.setenv("HOROVOD_PRIO_MAX_BOOST", "7")
    clean_env.setenv("HOROVOD_PRIO_NUM_GROUPS", "9")
    c = PriorityConfig(num_groups=3)
    assert c.num_groups == 3 and c.max_boost == 7   # kwarg wins, env fills the rest


def test_env_read_once_at_construction(clean_env):
    clean_env.setenv("HOROVOD_PRIO_STEP", "2")
    c = PriorityConfig()
    clean_env.setenv("HOROVOD_PRIO_STEP", "5")
    assert c.step == 2
    assert PriorityConfig().step == 5


def test_from_env_overrides():
    c = PriorityConfig.from_env(env(num_groups="6", step="2"), step=3)
    assert c.num_groups == 6 and c.step == 3


def test_from_env_none_uses_os_environ(clean_env):
    clean_env.setenv("HOROVOD_PRIO_SCENE", "tail")
    assert PriorityConfig.from_env().scene == "tail"


# ------------------------------------------------------------ env var names
def test_env_var_names():
    for name in DEFAULTS:
        expected = "HOROVOD_PRIO_TRACE" if name == "trace_path" else \
            "HOROVOD_PRIO_" + name.upper()
        assert PriorityConfig.env_var(name) == expected
    assert PriorityConfig.from_env({}).env_var("num_groups") == "HOROVOD_PRIO_NUM_GROUPS"
    with pytest.raises(ValueError, match="nope"):
        PriorityConfig.env_var("nope")


def test_trace_env_is_not_trace_path():
    c = PriorityConfig.from_env({"HOROVOD_PRIO_TRACE": "/tmp/t.json"})
    assert c.trace_path == "/tmp/t.json"


# ---------------------------------------------------------------- every field
@pytest.mark.parametrize("field,raw,value", [
    ("enabled", "0", False), ("enabled", "1", True), ("enabled", "TRUE", True),
    ("enabled", "false", False), ("enabled", "yes", True), ("enabled", " No ", False),
    ("num_groups", "7", 7), ("num_groups", " 2 ", 2),
    ("ratio_threshold", "1.5", 1.5), ("ratio_threshold", "3", 3.0),
    ("scene", "tail", "tail"), ("scene", "first", "first"), ("scene", "TAIL", "tail"),
    ("coefficient", "0.02", 0.02), ("coefficient", "0", 0.0),
    ("relative_coefficient", "0.3", 0.3),
    ("count_threshold", "0", 0), ("count_threshold", "50", 50),
    ("adjust_groups", "2", 2), ("step", "4", 4), ("max_boost", "0", 0),
    ("warmup_batches", "0", 0),
    ("partition_bytes", "4MiB", 4194304), ("partition_bytes", "512KiB", 524288),
    ("partition_bytes", "1MB", 1000000), ("partition_bytes", "2048", 2048),
    ("partition_bytes", "1024", 1024), ("credit_bytes", "1GiB", 1 << 30),
    ("credit_bytes", "1.5KiB", 1536),
    ("trace_path", "/tmp/x.json", "/tmp/x.json"),
    ("arbiter", "127.0.0.1:7000", "127.0.0.1:7000"), ("arbiter", "host:65535", "host:65535"),
    ("arbiter", "[::1]:1", "[::1]:1"),
    ("link", "lo", "lo"), ("job_id", "job-a", "job-a"), ("arbiter_secret", "s3cret", "s3cret"),
    ("arbiter_secret_file", "/run/secret", "/run/secret"), ("job_priority", "-3", -3),
    ("job_priority", "2", 2), ("arbiter_timeout", "0.5", 0.5),
    ("arbiter_client", "python", "python"), ("arbiter_client", " Native ", "native"),
    ("arbiter_io_priority", "realtime", ("realtime", 10)),
    ("arbiter_io_priority", "realtime=50", ("realtime", 50)),
    ("arbiter_io_priority", "nice=-5", ("nice", -5)),
    ("cpu_nice", "10", 10), ("cpu_nice", "-20", -20), ("cpu_nice", " 19 ", 19),
    ("malloc_tuning", "0", False), ("malloc_tuning", "1", True), ("malloc_tuning", " Off ", False),
    ("malloc_tuning", "yes", True),
])
def test_env_values_parsed(field, raw, value):
    extra = env(**WITH_ARBITER) if field == "arbiter" else {}
    c = PriorityConfig.from_env(dict(extra, **env(**{field: raw})))
    assert getattr(c, field) == value
    assert type(getattr(c, field)) is type(value)


@pytest.mark.parametrize("field,value", [
    ("enabled", False), ("num_groups", 2), ("ratio_threshold", 0.5), ("scene", "tail"),
    ("coefficient", 0.01), ("relative_coefficient", 0.0), ("count_threshold", 3),
    ("step", 2), ("max_boost", 1), ("warmup_batches", 5), ("partition_bytes", 1024),
    ("credit_bytes", 2048), ("trace_path", "t.json"), ("arbiter", "localhost:9"),
    ("link", "veth0"), ("job_id", "j"), ("arbiter_secret", "x"), ("arbiter_timeout", 1),
    ("job_priority", 5),
])
def test_kwarg_values(field, value):
    extra = WITH_ARBITER if field == "arbiter" else {}
    c = PriorityConfig.from_env({}, **dict(extra, **{field: value}))
    assert getattr(c, field) == value


def test_kwarg_string_sizes_and_paths():
    c = PriorityConfig.from_env({}, partition_bytes="8MiB", credit_bytes="16MiB",
                                trace_path=pathlib.Path("/tmp/a.json"), enabled="no")
    assert c.partition_bytes == 8 << 20 and c.credit_bytes == 16 << 20
    assert c.trace_path == "/tmp/a.json" and c.enabled is False


def test_empty_env_value_counts_as_unset():
    c = PriorityConfig.from_env(env(num_groups="", trace_path="  "))
    assert c.num_groups == 4 and c.trace_path is None


def test_kwarg_none_overrides_env_for_optional_field():
    c = PriorityConfig.from_env(env(trace_path="/tmp/t"), trace_path=None)
    assert c.trace_path is None


def test_credit_smaller_than_partition_is_allowed():
    c = PriorityConfig.from_env({}, partition_bytes="4MiB", credit_bytes="1MiB")
    assert c.credit_bytes < c.partition_bytes


# --------------------------------------------------------------- bad values
BAD = [
    ("enabled", "maybe"), ("enabled", "2"),
    ("num_groups", "abc"), ("num_groups", "0"), ("num_groups", "-1"), ("num_groups", "2.5"),
    ("ratio_threshold", "0"), ("ratio_threshold", "-1"), ("ratio_threshold", "nan"),
    ("ratio_threshold", "x"),
    ("scene", "middle"),
    ("coefficient", "-0.1"), ("coefficient", "inf"), ("coefficient", "fast"),
    ("relative_coefficient", "-1"),
    ("count_threshold", "-1"), ("count_threshold", "1.5"),
    ("adjust_groups", "0"), ("step", "0"), ("max_boost", "-1"), ("warmup_batches", "-2"),
    ("partition_bytes", "1023"), ("partition_bytes", "4XB"), ("partition_bytes", "-4MiB"),
    ("partition_bytes", "0.5B"), ("credit_bytes", "1000"), ("credit_bytes", "lots"),
    ("arbiter", "localhost"), ("arbiter", "localhost:0"), ("arbiter", "localhost:65536"),
    ("arbiter", ":80"), ("arbiter", "host:http"),
    ("arbiter_timeout", "0"), ("arbiter_timeout", "-1"),
    ("arbiter_client", "c++"), ("arbiter_client", "grpc"),
    ("arbiter_io_priority", "fifo"), ("arbiter_io_priority", "realtime=0"),
    ("arbiter_io_priority", "nice=20"),
    ("cpu_nice", "20"), ("cpu_nice", "-21"), ("cpu_nice", "nice=5"), ("cpu_nice", "1.5"),
    ("malloc_tuning", "maybe"), ("malloc_tuning", "2"), ("malloc_tuning", "256MiB"),
]


@pytest.mark.parametrize("field,raw", BAD)
def test_bad_env_names_field_and_env_var(field, raw):
    var = PriorityConfig.env_var(field)
    with pytest.raises(ValueError) as ei:
        PriorityConfig.from_env({var: raw})
    msg = str(ei.value)
    assert f"PriorityConfig.{field}" in msg
    assert f"from env {var}" in msg
    assert repr(raw) in msg


@pytest.mark.parametrize("field,raw", BAD)
def test_bad_kwarg_names_field_and_env_var(field, raw):
    with pytest.raises(ValueError) as ei:
        PriorityConfig.from_env({}, **{field: raw})
    msg = str(ei.value)
    assert f"PriorityConfig.{field}" in msg and PriorityConfig.env_var(field) in msg


def test_error_message_format_example():
    with pytest.raises(ValueError) as ei:
        PriorityConfig.from_env({"HOROVOD_PRIO_NUM_GROUPS": "abc"})
    assert str(ei.value) == ("PriorityConfig.num_groups must be an integer >= 1, got 'abc' "
                             "(from env HOROVOD_PRIO_NUM_GROUPS)")


@pytest.mark.parametrize("field,value", [
    ("enabled", None), ("enabled", 2), ("num_groups", None), ("num_groups", True),
    ("num_groups", 2.5), ("ratio_threshold", True), ("ratio_threshold", None),
    ("scene", None), ("scene", 1), ("count_threshold", -1), ("max_boost", None),
    ("partition_bytes", 1.5), ("partition_bytes", True), ("trace_path", ""), ("trace_path", 3),
    ("link", ""), ("job_id", 5), ("arbiter", 8080), ("arbiter_timeout", None),
])
def test_bad_kwarg_types(field, value):
    with pytest.raises(ValueError, match=f"PriorityConfig.{field}"):
        PriorityConfig.from_env({}, **{field: value})


def test_adjust_groups_must_not_exceed_num_groups():
    with pytest.raises(ValueError) as ei:
        PriorityConfig.from_env(env(num_groups="2", adjust_groups="3"))
    msg = str(ei.value)
    assert "PriorityConfig.adjust_groups" in msg and "num_groups" in msg
    assert "HOROVOD_PRIO_ADJUST_GROUPS" in msg and "HOROVOD_PRIO_NUM_GROUPS" in msg
    assert PriorityConfig.from_env({}, num_groups=3, adjust_groups=3).adjust_groups == 3


# ------------------------------------------------------- coefficient pair
def test_measured_threshold_when_neither_given():
    c = PriorityConfig.from_env({})
    assert c.coefficient is None and c.relative_coefficient is None
    p = c.make_policy(3)
    assert p.auto_threshold and p.calibrating


def test_coefficient_alone_disables_relative_default():
    c = PriorityConfig.from_env(env(coefficient="0.05"))
    assert c.coefficient == 0.05 and c.relative_coefficient is None


def test_both_in_env_error_names_both():
    with pytest.raises(ValueError) as ei:
        PriorityConfig.from_env(env(coefficient="0.05", relative_coefficient="0.2"))
    msg = str(ei.value)
    for s in ("PriorityConfig.coefficient", "PriorityConfig.relative_coefficient",
              "HOROVOD_PRIO_COEFFICIENT", "HOROVOD_PRIO_RELATIVE_COEFFICIENT"):
        assert s in msg


def test_both_in_kwargs_error_names_both():
    with pytest.raises(ValueError) as ei:
        PriorityConfig.from_env({}, coefficient=0.05, relative_coefficient=0.2)
    msg = str(ei.value)
    assert "PriorityConfig.coefficient" in msg and "PriorityConfig.relative_coefficient" in msg


def test_kwarg_coefficient_overrides_env_pair():
    c = PriorityConfig.from_env(env(relative_coefficient="0.2"), coefficient=0.01)
    assert c.coefficient == 0.01 and c.relative_coefficient is None
    c = PriorityConfig.from_env(env(coefficient="0.2"), relative_coefficient=0.3)
    assert c.coefficient is None and c.relative_coefficient == 0.3


def test_explicit_none_pair_reads_env():
    c = PriorityConfig.from_env(env(coefficient="0.2"), coefficient=None)
    assert c.coefficient == 0.2


# ------------------------------------------------------------- unknown names
def test_unknown_kwarg_is_type_error(clean_env):
    with pytest.raises(TypeError, match="num_group"):
        PriorityConfig(num_group=3)
    with pytest.raises(TypeError, match="bogus"):
        PriorityConfig.from_env({}, bogus=1)


def test_unknown_env_var_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="horovod_prio"):
        c = PriorityConfig.from_env({"HOROVOD_PRIO_NUMGROUPS": "3", "HOROVOD_PRIO_STEP": "2",
                                     "OTHER_VAR": "1"})
    assert c.num_groups == 4 and c.step == 2
    recs = [r for r in caplog.records if r.name == "horovod_prio"]
    assert len(recs) == 1 and recs[0].levelno == logging.WARNING
    assert "HOROVOD_PRIO_NUMGROUPS" in recs[0].getMessage()
    assert "HOROVOD_PRIO_NUM_GROUPS" in recs[0].getMessage()  # suggestion
    assert "OTHER_VAR" not in recs[0].getMessage()


def test_known_env_vars_do_not_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="horovod_prio"):
        PriorityConfig.from_env(env(**{k: v for k, v in [("num_groups", "3"),
                                                         ("trace_path", "/tmp/t")]}))
    assert not [r for r in caplog.records if r.name == "horovod_prio"]


def test_non_config_env_vars_do_not_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="horovod_prio"):
        PriorityConfig.from_env({"HOROVOD_PRIO_CACHE": "/tmp/c",
                                 "HOROVOD_PRIO_TEST_CONTROLLERS": "gloo"})
    assert not [r for r in caplog.records if r.name == "horovod_prio"]


def test_register_env_var_silences_warning(caplog):
    register_env_var("HOROVOD_PRIO_TEST_ONLY_REGISTERED")
    with caplog.at_level(logging.WARNING, logger="horovod_prio"):
        PriorityConfig.from_env({"HOROVOD_PRIO_TEST_ONLY_REGISTERED": "1"})
    assert not [r for r in caplog.records if r.name == "horovod_prio"]


# ------------------------------------------------------------- the object
def test_frozen_hashable_picklable():
    c = PriorityConfig.from_env({}, num_groups=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.num_groups = 5
    assert c == PriorityConfig.from_env({}, num_groups=3)
    assert hash(c) == hash(PriorityConfig.from_env({}, num_groups=3))
    assert pickle.loads(pickle.dumps(c)) == c


def test_dataclasses_replace(clean_env):
    c = PriorityConfig(num_groups=3)
    d = dataclasses.replace(c, step=2)
    assert d.step == 2 and d.num_groups == 3
    with pytest.raises(ValueError, match="step"):
        dataclasses.replace(c, step=0)


def test_secret_hidden_from_repr():
    c = PriorityConfig.from_env({}, arbiter_secret="hunter2")
    assert "hunter2" not in repr(c)
    assert c.as_dict()["arbiter_secret"] == "hunter2"
    assert c.as_dict(redact_secrets=True)["arbiter_secret"] == "***"


def test_as_dict_is_a_copy():
    c = PriorityConfig.from_env({})
    d = c.as_dict()
    d["num_groups"] = 99
    assert c.num_groups == 4


# ------------------------------------------------------------- make_policy
def test_make_policy_uses_knobs():
    c = PriorityConfig.from_env({}, coefficient=0.03, count_threshold=5, adjust_groups=2,
                                step=3, max_boost=6, warmup_batches=1)
    p = c.make_policy(4)
    assert isinstance(p, AdaptivePriorityPolicy)
    assert p.base_priorities == (0, 1, 2, 3)
    assert (p.coefficient, p.relative_coefficient, p.count_threshold, p.adjust_groups,
            p.step, p.max_boost, p.warmup_batches) == (0.03, None, 5, 2, 3, 6, 1)


def test_make_policy_measured_default_and_clamp():
    c = PriorityConfig.from_env({}, num_groups=4, adjust_groups=3, calibration_batches=7)
    p = c.make_policy(2)  # e.g. a 2-layer model
    assert p.adjust_groups == 2 and p.num_groups == 2
    assert p.relative_coefficient is None and p.coefficient is None and p.auto_threshold
    for _ in range(2 + 7):
        p.after_batch(1.0)
    assert not p.calibrating and p.coefficient == pytest.approx(0.05)


def test_make_policy_overrides_and_errors():
    c = PriorityConfig.from_env({})
    assert c.make_policy(3, max_events=5).events.maxlen == 5
    with pytest.raises(ValueError, match="num_groups"):
        c.make_policy(0)


def test_make_groups_clamps_to_tasks():
    c = PriorityConfig.from_env({}, num_groups=4, scene="tail")
    assert c.effective_num_groups(2) == 2
    assert c.make_groups(2) == [[0], [1]]
    assert c.make_groups(8) == [[0, 1, 2, 3, 4], [5], [6], [7]]
    with pytest.raises(ValueError, match="num_tasks"):
        c.make_groups(0)


# ------------------------------------------------------------- cross-field: the arbiter
def test_arbiter_needs_a_link_and_a_secret():
    with pytest.raises(ValueError, match=r"PriorityConfig\.link is required .*HOROVOD_PRIO_LINK"):
        PriorityConfig.from_env({}, arbiter="h:1", arbiter_secret="s")
    with pytest.raises(ValueError, match="arbiter_secret or PriorityConfig.arbiter_secret_file"):
        PriorityConfig.from_env(env(arbiter="h:1", link="l"))
    c = PriorityConfig.from_env(env(arbiter="h:1", link="l", arbiter_secret_file="/s"))
    assert c.arbiter_secret is None and c.arbiter_secret_file == "/s"


@pytest.mark.parametrize("raw", ["x", "1.5", str(1 << 31)])
def test_job_priority_errors_name_the_field(raw):
    with pytest.raises(ValueError, match="PriorityConfig.job_priority must be an integer in"):
        PriorityConfig.from_env(env(job_priority=raw))


def test_credit_auto_or_bytes():
    assert PriorityConfig.from_env({}).credit_bytes is None
    assert PriorityConfig.from_env(env(credit_bytes="AUTO")).credit_bytes is None
    assert PriorityConfig.from_env({}, credit_bytes="auto").credit_bytes is None
    assert PriorityConfig.from_env(env(credit_bytes="8MiB")).credit_bytes == 8 << 20
    with pytest.raises(ValueError, match=r"credit_bytes must be a byte size >= 1024 .*or 'auto'"):
        PriorityConfig.from_env(env(credit_bytes="fast"))
    c = PriorityConfig.from_env(env(autotune="1", monitor="0"))
    assert c.autotune is True and c.monitor is False


# ------------------------------------------------------------- overlap defaults
def test_is_set_tells_given_fields_from_defaults(clean_env):
    c = PriorityConfig.from_env({"HOROVOD_PRIO_CREDIT_BYTES": "2MiB"}, num_groups=3)
    assert c.is_set("num_groups") and c.is_set("credit_bytes")
    assert not c.is_set("partition_bytes") and not c.is_set("step")
    # "auto" given explicitly is given (no limit, chosen)
    assert PriorityConfig.from_env({"HOROVOD_PRIO_CREDIT_BYTES": "auto"}).is_set("credit_bytes")
    with pytest.raises(ValueError, match="no field 'credit'"):
        c.is_set("credit")
    # not part of the value: equal configs stay equal
    assert PriorityConfig.from_env({}, num_groups=4) == PriorityConfig.from_env({})


def test_chunk_size_and_overlap_credit_default_only_where_not_given():
    d = PriorityConfig.from_env({})
    assert d.partition_bytes is None and d.credit_bytes is None      # both "auto"
    # an eighth of a step's gradient bytes, within [1 MiB, 4 MiB]
    assert d.partition_bytes_for(24 << 20) == 3 << 20
    assert d.partition_bytes_for(8 << 20) == 1 << 20
    assert d.partition_bytes_for(1000) == 1 << 20
    assert d.partition_bytes_for(100 << 20) == 4 << 20
    assert PriorityConfig.from_env({"HOROVOD_PRIO_PARTITION_BYTES": "auto"}) == d
    assert d.overlap_credit_bytes(3 << 20) == 3 << 20                # one chunk
    with pytest.raises(ValueError, match="step_bytes"):
        d.partition_bytes_for(-1)
    given = PriorityConfig.from_env({"HOROVOD_PRIO_PARTITION_BYTES": "2MiB"}, credit_bytes="8MiB")
    assert given.partition_bytes_for(8 << 20) == 2 << 20
    assert given.partition_bytes_for(100 << 20) == 2 << 20
    assert given.overlap_credit_bytes(4 << 20) == 8 << 20
    assert PriorityConfig.from_env({}, credit_bytes="auto").overlap_credit_bytes(1 << 20) is None
    assert PriorityConfig.from_env({}, autotune=True).overlap_credit_bytes(1 << 20) is None


def test_gradients_are_cut_only_where_a_chunk_can_be_held_back():
    d = PriorityConfig.from_env({})
    assert not d.splits_tensors(None, False)          # default: chunks leave when ready
    assert d.splits_tensors(8 << 20, False)           # a credit holds chunks back
    assert d.splits_tensors(None, True)               # so does an arbiter's grant
    assert PriorityConfig.from_env({}, autotune=True).splits_tensors(None, False)  # tuned credit


# ------------------------------------------------------- one declaration per field
def test_docs_configuration_table_is_the_one_generated_from_the_fields():
    """docs/usage.md's table is tools/config_table.py's output: a field added,
    renamed, re-defaulted or re-documented in config.py without regenerating
    the docs (or a row edited by hand) fails here."""
    from tools import config_table
    with open(config_table.DOC) as f:
        _, body, _ = config_table.split(f.read())
    assert body == config_table.table()
    assert config_table.main(["--check"]) == 0
    for name in DEFAULTS:
        row = "| `%s` | `%s` |" % (name, PriorityConfig.env_var(name))
        assert sum(line.startswith(row) for line in body.splitlines()) == 1


def test_derived_views_of_the_field_declarations():
    """The parsers, the fields that may be None, the process-wide fields and
    the docstring's table all come from the one declaration per field."""
    from horovod_prio.method import config
    from horovod_prio import runtime
    assert set(config._PARSERS) == set(DEFAULTS)
    assert config._OPTIONAL == {n for n, v in DEFAULTS.items() if v is None}
    assert runtime.PROCESS_FIELDS is config.PROCESS_FIELDS
    assert set(config.PROCESS_FIELDS) == {
        "credit_bytes", "autotune", "trace_path", "arbiter", "link", "job_id",
        "arbiter_secret", "arbiter_secret_file", "arbiter_timeout", "job_priority",
        "arbiter_client", "arbiter_io_priority", "cpu_nice", "class_auto",
        "malloc_tuning"}
    for name in DEFAULTS:
        assert config.__doc__.count("\n    %s " % name) == 1, name
    assert "arbiter_secret" not in repr(PriorityConfig.from_env({}, arbiter_secret="s2")) \
        .replace("arbiter_secret_file", "")
