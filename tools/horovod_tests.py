#!/usr/bin/env python3
"""Run Horovod's own TensorFlow test suites against plain Horovod and against the swap.

Horovod 0.28.1's tests (``test/parallel/*.py``) are not in its PyPI sdist, and
this repository does not carry them: they are read from a Horovod source tree
that you point at (``--src``: a checkout, or a git directory holding the tag
``v0.28.1``). For each suite and controller the tool writes the suite's files
into a scratch folder twice: once as shipped and once with exactly one line
changed, Horovod's import of itself swapped for ours
(``import horovod.tensorflow.keras as hvd`` ->
``import horovod_prio.tensorflow.keras as hvd``; ``horovod.tensorflow`` ->
``horovod_prio.tensorflow``). Both run under real ``horovodrun -np 2``
(``--gloo`` / ``--mpi``), pytest on every rank writing its own JUnit XML. The
swapped run must pass every test the plain run passes, on every rank, and
must not fail a test the plain run skips; the exit code says whether it did.

    python tools/horovod_tests.py --src ../horovod [--suite keras,tensorflow] \
        [--controller gloo,mpi] [--examples keras_synthetic,synthetic|none] [--out DIR]

Horovod's TF2 example scripts that need no download (the synthetic benchmarks,
with short arguments) run the same way, plain and swapped: both must finish,
and the swapped one must have sent its gradients through our scheduler.

``make conformance HOROVOD_SRC=...`` runs every suite on both controllers.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HOROVOD_TAG = "v0.28.1"

# suite -> (test file, Horovod's import line, our import line)
SUITES = {
    "keras": ("test_tensorflow2_keras.py", "import horovod.tensorflow.keras as hvd",
              "import horovod_prio.tensorflow.keras as hvd"),
    "tensorflow": ("test_tensorflow.py", "import horovod.tensorflow as hvd",
                   "import horovod_prio.tensorflow as hvd"),
    "keras_process_sets": ("test_tensorflow2_keras_process_sets.py",
                           "import horovod.tensorflow.keras as hvd",
                           "import horovod_prio.tensorflow.keras as hvd"),
    "process_sets": ("test_tensorflow_process_sets.py", "import horovod.tensorflow as hvd",
                     "import horovod_prio.tensorflow as hvd"),
    "process_sets_dynamic": ("test_tensorflow_process_sets_dynamic.py",
                             "import horovod.tensorflow as hvd",
                             "import horovod_prio.tensorflow as hvd"),
}
# Horovod's TF2 example scripts that run offline (synthetic data), with short arguments.
# The MNIST examples download their data set at run time: not run here.
EXAMPLES = {
    "keras_synthetic": ("examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py",
                        "import horovod.tensorflow.keras as hvd",
                        "import horovod_prio.tensorflow.keras as hvd",
                        ["--model", "MobileNetV2", "--batch-size", "8",
                         "--num-batches-per-iter", "2", "--num-iters", "2"]),
    "synthetic": ("examples/tensorflow2/tensorflow2_synthetic_benchmark.py",
                  "import horovod.tensorflow as hvd", "import horovod_prio.tensorflow as hvd",
                  ["--model", "MobileNetV2", "--batch-size", "8", "--num-warmup-batches", "1",
                   "--num-batches-per-iter", "2", "--num-iters", "2"]),
    "synthetic_fp16": ("examples/tensorflow2/tensorflow2_synthetic_benchmark.py",
                       "import horovod.tensorflow as hvd", "import horovod_prio.tensorflow as hvd",
                       ["--model", "MobileNetV2", "--batch-size", "8", "--num-warmup-batches",
                        "1", "--num-batches-per-iter", "2", "--num-iters", "2",
                        "--fp16-allreduce"]),
}
# every suite's helpers (test/parallel imports them by name, test/utils via sys.path)
HELPERS = ("test/conftest.py", "test/utils/common.py", "test/parallel/base_test_tensorflow.py")
CONTROLLERS = ("gloo", "mpi")

# What every rank runs: pytest with a JUnit file named after the rank.
RANK_RUNNER = """\
import os, sys
import pytest
rank = next((os.environ[k] for k in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
             if k in os.environ), "x")
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=",
                      "--junitxml=" + os.path.join(sys.argv[1], "rank-%s.xml" % rank),
                      sys.argv[2]]))
"""


class SourceError(Exception):
    """The Horovod source tree cannot give the files."""


def read_source(src, relpath):
    """A file of Horovod's tree at HOROVOD_TAG (git) or as checked out."""
    if os.path.isfile(os.path.join(src, relpath)):
        with open(os.path.join(src, relpath), encoding="utf-8") as f:
            return f.read()
    gitdir = src if os.path.isdir(os.path.join(src, "objects")) else os.path.join(src, ".git")
    if not os.path.isdir(gitdir):
        raise SourceError("--src %s: neither a Horovod checkout with %s nor a git directory"
                          % (src, relpath))
    proc = subprocess.run(["git", "--git-dir", gitdir, "show", "%s:%s" % (HOROVOD_TAG, relpath)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError("--src %s: git cannot show %s:%s (%s)"
                          % (src, HOROVOD_TAG, relpath, proc.stderr.strip()))
    return proc.stdout


def swap_import(text, old, new, filename):
    """``text`` with exactly one line ``old`` replaced by ``new`` (else SourceError)."""
    lines = text.split("\n")
    hits = [i for i, line in enumerate(lines) if line.strip() == old]
    if len(hits) != 1:
        raise SourceError("%s: expected exactly one line %r, found %d" % (filename, old, len(hits)))
    indent = lines[hits[0]][:len(lines[hits[0]]) - len(lines[hits[0]].lstrip())]
    lines[hits[0]] = indent + new
    out = "\n".join(lines)
    changed = [i for i, (a, b) in enumerate(zip(text.split("\n"), out.split("\n"))) if a != b]
    assert changed == hits, changed
    return out


def materialize(src, suite, swapped, dest):
    """Write the suite's files into ``dest`` (test/ tree); return the test file's path."""
    filename, old, new = SUITES[suite]
    for rel in HELPERS + ("test/parallel/" + filename,):
        text = read_source(src, rel)
        if swapped and rel.endswith("/" + filename):
            text = swap_import(text, old, new, filename)
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return os.path.join(dest, "test", "parallel", filename)


def parse_junit(path):
    """{test id: 'passed'|'failed'|'skipped'} of one rank's JUnit XML."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = "%s::%s" % (case.get("classname", ""), case.get("name", ""))
        tags = {child.tag for child in case}
        out[tid] = ("failed" if tags & {"failure", "error"} else
                    "skipped" if "skipped" in tags else "passed")
    return out


def _horovodrun(controller, np, args, cwd, log_path, timeout, extra_env=None):
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep
                              + os.environ.get("PATH", ""))
    cmd = [horovodrun or "horovodrun", "-np", str(np), "-H", "localhost:%d" % np,
           "--" + controller] + (["--network-interface", "lo"] if controller == "gloo" else []) \
        + [sys.executable] + list(args)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
        [p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     os.environ.get("PYTHONPATH")) if p]))
    # loopback only, as root (what tests/tf/hvdrun.py sets)
    for key, value in (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                       ("OMPI_MCA_btl", "self,tcp"), ("OMPI_MCA_btl_tcp_if_include", "lo"),
                       ("OMPI_MCA_oob_tcp_if_include", "lo"), ("OMPI_MCA_mpi_yield_when_idle", "1")):
        env.setdefault(key, value)
    env.update(extra_env or {})
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = "timeout after %ds" % timeout
    return rc, round(time.monotonic() - start, 1)


def run_example(src, name, controller, workdir, timeout, np=2):
    """Run one example plain and swapped; return a list of problems (empty: it conforms)."""
    rel, old, new, args = EXAMPLES[name]
    text = read_source(src, rel)
    problems, logs = [], {}
    for swapped in (False, True):
        root = os.path.join(workdir, "example-%s-%s-%s" % (name, controller,
                                                            "swapped" if swapped else "plain"))
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        script = os.path.join(root, os.path.basename(rel))
        with open(script, "w") as f:
            f.write(swap_import(text, old, new, rel) if swapped else text)
        trace = os.path.join(root, "trace.json")
        rc, secs = _horovodrun(controller, np, [script] + args, root,
                               os.path.join(root, "horovodrun.log"), timeout,
                               {"HOROVOD_PRIO_TRACE": trace} if swapped else None)
        with open(os.path.join(root, "horovodrun.log"), errors="replace") as f:
            logs[swapped] = f.read()
        what = "swapped" if swapped else "plain"
        if rc != 0:
            problems.append("%s: %s run exited %s (log %s/horovodrun.log)" % (name, what, rc, root))
        elif "Total img/sec" not in logs[swapped]:
            problems.append("%s: %s run printed no 'Total img/sec'" % (name, what))
        if swapped and rc == 0:
            chunks = 0
            if os.path.exists(trace):
                from horovod_prio.runtime.trace import load_trace
                chunks = sum(1 for e in load_trace(trace) if e.get("cat") == "chunk")
            if not chunks:
                problems.append("%s: the swapped run sent no chunk through the priority "
                                "scheduler (trace %s)" % (name, trace))
    return problems


def run_suite(src, suite, controller, swapped, workdir, timeout, np=2):
    """Run one suite once; return {'ranks': {rank: {test: outcome}}, 'rc', 'seconds', 'log'}."""
    tag = "%s-%s-%s" % (suite, controller, "swapped" if swapped else "plain")
    root = os.path.join(workdir, tag)
    shutil.rmtree(root, ignore_errors=True)
    test_file = materialize(src, suite, swapped, root)
    results = os.path.join(root, "junit")
    os.makedirs(results)
    runner = os.path.join(root, "rank_runner.py")
    with open(runner, "w") as f:
        f.write(RANK_RUNNER)
    log_path = os.path.join(root, "horovodrun.log")
    rc, secs = _horovodrun(controller, np, [runner, results, test_file],
                           os.path.dirname(test_file), log_path, timeout)
    ranks = {}
    for name in sorted(os.listdir(results)):
        m = re.match(r"rank-(\w+)\.xml$", name)
        if m:
            ranks[m.group(1)] = parse_junit(os.path.join(results, name))
    return {"suite": suite, "controller": controller, "swapped": swapped, "rc": rc,
            "seconds": secs, "ranks": ranks, "log": log_path, "np": np}


def outcomes(run):
    """{test: {rank: outcome}}"""
    out = {}
    for rank, tests in run["ranks"].items():
        for tid, o in tests.items():
            out.setdefault(tid, {})[rank] = o
    return out


def compare(plain, swapped):
    """The swapped run's problems against the plain run (a list of strings; empty = conforms).

    A test plain Horovod passes on every rank must pass on every rank after the
    swap; a test it skips must not fail; no test may be missing or extra; both
    runs must have a result from every rank.
    """
    problems = []
    for run, what in ((plain, "plain"), (swapped, "swapped")):
        if len(run["ranks"]) != run.get("np", 2):
            problems.append("%s run: results from %d of %d ranks (horovodrun rc %s, log %s)"
                            % (what, len(run["ranks"]), run.get("np", 2), run["rc"], run["log"]))
    p, s = outcomes(plain), outcomes(swapped)
    for tid in sorted(set(p) | set(s)):
        if tid not in s:
            problems.append("%s: missing after the swap" % tid)
            continue
        if tid not in p:
            problems.append("%s: not in plain Horovod's run" % tid)
            continue
        for rank in sorted(set(p[tid]) | set(s[tid])):
            before, after = p[tid].get(rank), s[tid].get(rank)
            if before == "passed" and after != "passed":
                problems.append("%s (rank %s): plain Horovod passed, the swap %s"
                                % (tid, rank, after))
            elif before == "skipped" and after == "failed":
                problems.append("%s (rank %s): plain Horovod skipped, the swap failed"
                                % (tid, rank))
    return problems


def summary(run):
    counts = {}
    for tests in run["ranks"].values():
        for o in tests.values():
            counts[o] = counts.get(o, 0) + 1
    n = max(len(run["ranks"]), 1)
    return ", ".join("%d %s" % (counts[k] // n, k) for k in ("passed", "failed", "skipped")
                     if k in counts) or "no results"


def parse_list(text, allowed, flag):
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if not items or bad:
        raise argparse.ArgumentTypeError("%s: unknown %r (choose from %s)"
                                         % (flag, ",".join(bad) or text, ", ".join(allowed)))
    return items


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True,
                    help="a Horovod checkout or git directory with tag %s" % HOROVOD_TAG)
    ap.add_argument("--suite", default=",".join(SUITES),
                    type=lambda t: parse_list(t, tuple(SUITES), "--suite"))
    ap.add_argument("--controller", default=",".join(CONTROLLERS),
                    type=lambda t: parse_list(t, CONTROLLERS, "--controller"))
    ap.add_argument("--examples", default=",".join(EXAMPLES),
                    type=lambda t: [] if t == "none" else parse_list(t, tuple(EXAMPLES),
                                                                    "--examples"),
                    help="Horovod's TF2 examples to run plain and swapped ('none': no example)")
    ap.add_argument("--out", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--timeout", type=int, default=1500, help="seconds per horovodrun")
    ap.add_argument("--json", default=None, help="write the summary here")
    args = ap.parse_args(argv)
    workdir = args.out or tempfile.mkdtemp(prefix="horovod-tests-")
    try:
        for rel in HELPERS:
            read_source(args.src, rel)
    except SourceError as e:
        ap.error(str(e))
    report, failed = [], False
    for suite in args.suite:
        for controller in args.controller:
            plain = run_suite(args.src, suite, controller, False, workdir, args.timeout)
            swapped = run_suite(args.src, suite, controller, True, workdir, args.timeout)
            problems = compare(plain, swapped)
            failed |= bool(problems)
            print("%-22s %-4s plain: %-40s swapped: %-40s %s" % (
                suite, controller, "%s (%.0fs)" % (summary(plain), plain["seconds"]),
                "%s (%.0fs)" % (summary(swapped), swapped["seconds"]),
                "OK" if not problems else "%d PROBLEMS" % len(problems)), flush=True)
            for p in problems:
                print("    " + p, flush=True)
            report.append({"suite": suite, "controller": controller,
                           "plain": summary(plain), "swapped": summary(swapped),
                           "plain_s": plain["seconds"], "swapped_s": swapped["seconds"],
                           "problems": problems})
    for name in args.examples:
        for controller in args.controller:
            problems = run_example(args.src, name, controller, workdir, args.timeout)
            failed |= bool(problems)
            print("example %-14s %-4s %s" % (name, controller, "OK: plain and swapped ran, the "
                                             "swapped one through the priority scheduler"
                                             if not problems else "%d PROBLEMS" % len(problems)),
                  flush=True)
            for p in problems:
                print("    " + p, flush=True)
            report.append({"example": name, "controller": controller, "problems": problems})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print("conformance: %s (scratch %s)" % ("FAILED" if failed else "every suite conforms",
                                             workdir))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
