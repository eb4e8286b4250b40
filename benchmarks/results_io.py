"""Result files: what a run keeps in the tree, and one way to read them.

A benchmark run records far more than its report needs: the link sampler
reads every veth counter and /proc/stat ten times a second. In the tree each
result folder keeps a compact, gzip-compressed ``results.json.gz``:

- the counter samples (``uplink_samples`` of ``benchmarks.cluster``,
  ``link_samples`` of ``benchmarks.run``) are **trimmed** to the samples the
  report interpolates at (the two around each end of every measurement
  window, so every number in ``results.md`` comes out the same from the
  compact file as from the full one) plus at most ``PLOT_SAMPLES`` evenly
  spaced ones for the link plots;
- ``_stats`` (the report's per-run cache, recomputed on every read) is dropped;
- everything else (per-step times, events, trace events, meta) is kept whole.

The full record is written beside it as ``results.raw.json.gz``, which git
ignores: rerun the command in the folder's ``results.md``/README to get it
back. Traces (``trace.rank0.json``) are stored gzip-compressed
(``trace.rank0.json.gz``; Perfetto opens them as they are), and plots as
palette PNGs (``PNG_COLOURS`` colours: a third of the bytes, the same picture).
Run ``compact`` on a new result folder before committing it; ``make test``
runs ``check`` on ``results/``.

    python -m benchmarks.results_io compact results/   # (re)compact every folder under a root
    python -m benchmarks.results_io check results/     # exit 1 if a folder is not compact

Readers use :func:`load` / :func:`read_json`, which take ``results.json`` or
``results.json.gz`` (a folder too) and decompress as needed.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from pathlib import Path

NAME = "results.json"
COMPACT = NAME + ".gz"
RAW = "results.raw.json.gz"
#: evenly spaced counter samples kept per run for the plots (besides the window ends)
PLOT_SAMPLES = 30
#: a JSON or CSV file up to this size may stay plain (readable in a browser); larger ones
#: are stored gzip-compressed (``results.json`` -> ``results.json.gz``, ``steps.csv`` -> ``steps.csv.gz``)
SMALL = 32_000
COMPRESSED = (".json", ".csv")
#: colours of a stored plot
PNG_COLOURS = 32
#: set on a run whose samples were trimmed (trimming again would thin them further)
TRIMMED = "samples_trimmed"
#: what ``report.summarize`` caches in a run (recomputed from the run on every read)
CACHE = "_stats"
#: the sample lists a run may hold, and how each stores its time
SAMPLE_KEYS = {"uplink_samples": lambda s: s["t"], "link_samples": lambda s: s[0]}


def read_json(path):
    """The JSON in ``path`` (``.gz``: decompressed)."""
    path = Path(path)
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return json.loads(data)


def results_path(path) -> Path:
    """The results file of a folder (``results.json.gz``, else ``results.json``), or ``path``
    itself if it is a file; FileNotFoundError naming both candidates if there is none."""
    p = Path(path)
    if p.is_file():
        return p
    if p.name in (NAME, COMPACT):
        p = p.parent
    for name in (COMPACT, NAME):
        if (p / name).is_file():
            return p / name
    raise FileNotFoundError(f"no {COMPACT} or {NAME} in {p}")


def load(path) -> dict:
    """A run's results from its folder or its results file (compact or not)."""
    return read_json(results_path(path))


def _gz(text: str) -> bytes:
    # mtime=0: the same results give the same bytes (no churn in git)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(text.encode())
    return buf.getvalue()


def dumps(results) -> str:
    return json.dumps(results, separators=(",", ":"))


# -- trimming ---------------------------------------------------------------

def _job_spans(run: dict) -> list[tuple[float, float]]:
    from .report import measured_steps
    return [(st[0][0], st[-1][1]) for st in (measured_steps(j) for j in run.get("jobs") or []
                                            if isinstance(j, dict)) if st]


def query_times(run: dict) -> set[float]:
    """Every time the report may interpolate a run's counters at: the ends of
    the jobs' overlap window (one job: its measured steps) and of their union
    (``report.run_stats`` and ``report.cluster_run_stats`` use one of the two)."""
    sp = _job_spans(run)
    if not sp:
        return set()
    return {max(s[0] for s in sp), min(s[1] for s in sp),        # overlap window
            min(s[0] for s in sp), max(s[1] for s in sp)}        # union


def trim_samples(samples: list, times, when, keep: int = PLOT_SAMPLES) -> list:
    """The samples to keep: first and last, the pair around each of ``times``
    (the first sample at or after t and the one before it: what linear
    interpolation at t reads), and ``keep`` evenly spaced ones."""
    n = len(samples)
    if n <= keep + 2:
        return list(samples)
    idx = {0, n - 1}
    ts = [when(s) for s in samples]
    for t in times:
        i = next((k for k, x in enumerate(ts) if x >= t), n - 1)
        idx.update((max(i - 1, 0), i))
    step = (n - 1) / keep
    idx.update(round(k * step) for k in range(keep + 1))
    return [samples[i] for i in sorted(idx)]


def compact(results: dict) -> dict:
    """A copy of ``results`` with every run's counter samples trimmed and its cache dropped
    (see the module doc)."""
    out = dict(results)
    runs = results.get("runs")
    if not isinstance(runs, list):
        return out
    new = []
    for r in runs:
        if isinstance(r, dict) and CACHE in r:
            r = {k: v for k, v in r.items() if k != CACHE}
        if (isinstance(r, dict) and not r.get(TRIMMED)
                and any(isinstance(r.get(k), list) for k in SAMPLE_KEYS)):
            r = dict(r)
            times = query_times(r)
            for k, when in SAMPLE_KEYS.items():
                if isinstance(r.get(k), list):
                    kept = trim_samples(r[k], times, when)
                    if len(kept) < len(r[k]):
                        r[k], r[TRIMMED] = kept, True
        new.append(r)
    out["runs"] = new
    return out


def save(out, results: dict, raw: bool = True) -> Path:
    """Write ``out/results.json.gz`` (compact) and, with ``raw``, the full
    ``out/results.raw.json.gz`` (ignored by git); remove a stale ``results.json``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / COMPACT
    tmp = out / (COMPACT + ".tmp")
    tmp.write_bytes(_gz(dumps(compact(results))))
    tmp.replace(path)
    if raw:
        (out / RAW).write_bytes(_gz(dumps(results)))
    if (out / NAME).exists():
        (out / NAME).unlink()
    return path


# -- converting a tree ------------------------------------------------------

def shrink_png(path: Path) -> bool:
    """Re-encode a plot as a palette PNG of ``PNG_COLOURS`` colours; False if it already is one."""
    from PIL import Image
    with Image.open(path) as im:
        if im.mode == "P":
            return False
        q = im.convert("RGB").quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT,
                                       dither=Image.Dither.NONE)
    tmp = path.with_name(path.name + ".tmp")
    q.save(tmp, format="PNG", optimize=True)
    tmp.replace(path)
    return True


def compact_tree(root: Path, log=print) -> list[Path]:
    """Under ``root``: rewrite every ``results.json`` as a compact ``results.json.gz``
    (no raw copy: the raw file stays in git history), gzip every other JSON or
    CSV file larger than ``SMALL`` and every trace, shrink every plot.
    Returns the files written."""
    written = []
    for f in sorted(root.rglob(NAME)):
        d = read_json(f)
        if isinstance(d, dict) and d != compact(d):
            written.append(save(f.parent, d, raw=False))
            log(f"compacted {f}")
    for f in sorted(p for ext in COMPRESSED for p in root.rglob("*" + ext)):
        if f.exists() and (f.stat().st_size > SMALL or f.name.startswith("trace.rank")):
            gz = f.with_name(f.name + ".gz")
            gz.write_bytes(_gz(f.read_text()))
            f.unlink()
            written.append(gz)
            log(f"compressed {f}")
    for f in sorted(root.rglob("*.png")):
        if shrink_png(f):
            written.append(f)
            log(f"shrank {f}")
    return written


def not_compact(root: Path) -> list[str]:
    """What under ``root`` is not stored compactly: JSON/CSV files above ``SMALL``, traces,
    plots that are not palette PNGs, and compact files whose counter samples are not trimmed."""
    bad = [f"{f}: {f.stat().st_size} bytes, not compressed "
           f"(python -m benchmarks.results_io compact {root})"
           for f in sorted(p for ext in COMPRESSED for p in root.rglob("*" + ext))
           if f.stat().st_size > SMALL or f.name.startswith("trace.rank")]
    from PIL import Image
    for f in sorted(root.rglob("*.png")):
        with Image.open(f) as im:
            if im.mode != "P":
                bad.append(f"{f}: not a palette PNG")
    for f in sorted(root.rglob(COMPACT)):
        d = read_json(f)
        if isinstance(d, dict) and d != compact(d):
            bad.append(f"{f}: counter samples not trimmed")
    for f in sorted(root.rglob(NAME)):
        d = read_json(f)
        if isinstance(d, dict) and d != compact(d):
            bad.append(f"{f}: counter samples not trimmed")
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.results_io", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("compact", "check"))
    p.add_argument("root", type=Path)
    a = p.parse_args(argv)
    if not a.root.is_dir():
        p.error(f"argument root: {a.root} is not a directory")
    if a.action == "compact":
        compact_tree(a.root)
        return 0
    bad = not_compact(a.root)
    for b in bad:
        print(b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
