"""The README's headline table, generated from the result folders it cites.

    python tools/readme_table.py            # print the table
    python tools/readme_table.py --write    # replace it in README.md (between the markers)
    python tools/readme_table.py --check    # exit 1 if README.md's table differs
    python tools/readme_table.py --write --from results/headline/<date>

Each row names a result folder and the rows of its ``results.md`` (the
table the run's own report wrote) to read: plain Horovod's and
horovod_prio's s/step, the ratio as the report gives it (median of the
per-repeat ratios, so not always the quotient of the two medians), the
share of the bound's gain (``benchmarks.report.bound_cells``; the link
floor in wire bytes at the link's MTU) where the folder gives the row's
bound, and the run's date and git commit from its
``Command:`` line.

``--from DIR`` (a ``python -m benchmarks.headline`` folder) takes every row
that folder measured from its ``results.json.gz`` instead (matched by the
scenario text); the other rows keep their folders. The folder is recorded in
the README's begin marker, so ``--write`` and ``--check`` without ``--from``
keep using it. Where that folder holds ``ratios.png`` (the sweep's plot of each
row's ratio beside its bound), the line under the table shows it.
"""
import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from benchmarks.netns import MTU as LO_MTU  # noqa: E402
from benchmarks.headline import PLOT  # noqa: E402
from benchmarks.report import bound_cells  # noqa: E402
from benchmarks.testbed import MTU as TESTBED_MTU  # noqa: E402
from horovod_prio.sim.wire import wire_factor  # noqa: E402
from benchmarks.results_io import read_json, results_path  # noqa: E402

README = REPO / "README.md"
BEGIN = "<!-- headline table: begin (python tools/readme_table.py --write) -->"
BEGIN_RE = re.compile(r"<!-- headline table: begin \(python tools/readme_table\.py --write"
                      r"(?: --from (\S+))?\) -->")
END = "<!-- headline table: end -->"
HEADLINE_FORMAT = "horovod_prio.headline/1"


def begin_marker(source=None):
    """The begin marker; ``source``: the headline folder the table is made from."""
    return BEGIN if not source else BEGIN[:-len(") -->")] + " --from %s) -->" % source

BENCH = dict(table=0, value="mean s/step", ratio="speedup vs hvd")
JOB = dict(table=1, value="s/step shared", ratio="vs hvd (same job)")

#: How a folder row's bound is read (``bound`` below): the comm floor of the
#: baseline's row; the overlap ceiling max(the baseline's job CPU s/step, its
#: comm floor) -- the same rule as ``benchmarks.headline.bound_of``; the
#: job's own s/step alone (before the other joined) in our row; or a reason
#: why the row has no bound. The comm floor counts wire bytes at the link's MTU
#: (``floor_s``): a folder whose table gives it in payload bytes (its column
#: names no unit) is scaled by the frame rule.
FLOOR = ("floor",)
OVERLAP = ("overlap",)
ALONE = ("alone",)


def none(reason):
    return ("none", reason)


#: (scenario, folder under results/, the rows {column: value} of plain Horovod and of ours,
#: kind, bound)
HEADLINES = [
    ("one job, default settings: MLP, 1 Gbit/s, batch 1024",
     "bench/sweep-mlp-per-gradient-chunks-2026-12-02",
     {"link": "1gbit", "model, batch/rank": "mlp, 1024", "jobs": "hvd"},
     {"link": "1gbit", "model, batch/rank": "mlp, 1024", "jobs": "prio"}, BENCH, FLOOR),
    ("two jobs sharing 1 Gbit/s, no arbiter: MLP, batch 512",
     "bench/shared-mlp-1gbit-aa-2026-12-04",
     {"model, batch/rank": "mlp, 512", "jobs": "hvd+hvd"},
     {"model, batch/rank": "mlp, 512", "jobs": "prio+prio"}, BENCH, FLOOR),
    ("`hvd.overlap`: MobileNetV2, 300 Mbit/s, batch 128",
     "bench/overlap-default-mnv2-2026-12-05",
     {"model, batch/rank": "mobilenetv2, 128", "jobs": "hvd"},
     {"model, batch/rank": "mobilenetv2, 128", "jobs": "overlap"}, BENCH, OVERLAP),
    ("`hvd.overlap`: MobileNetV2, 300 Mbit/s, batch 256 (compute-bound)",
     "bench/overlap-default-mnv2-2026-12-05",
     {"model, batch/rank": "mobilenetv2, 256", "jobs": "hvd"},
     {"model, batch/rank": "mobilenetv2, 256", "jobs": "overlap"}, BENCH, OVERLAP),
    ("`hvd.overlap`: MLP, 1 Gbit/s, batch 256 (no room: its big layers sit at the input)",
     "bench/overlap-default-mlp-2026-12-01",
     {"model, batch/rank": "mlp, 256", "jobs": "hvd"},
     {"model, batch/rank": "mlp, 256", "jobs": "overlap"}, BENCH, OVERLAP),
    ("job classes, 1 Gbit/s uplink: the class-1 job beside a class-0 job",
     "cluster/classes-join-1gbit-b64-pinned-strict-2026-12-04",
     {"variant": "hvd", "job": "job0 hvd"}, {"variant": "spec", "job": "job0 arb(c1)"}, JOB, ALONE),
    ("job classes, 1 Gbit/s uplink: the class-0 job (pays for it)",
     "cluster/classes-join-1gbit-b64-pinned-strict-2026-12-04",
     {"variant": "hvd", "job": "job1 hvd@8s"}, {"variant": "spec", "job": "job1 arb(c0)@8s"}, JOB,
     none("the class-0 job yields by design")),
    ("arbiter + adaptive boost, 1 Gbit/s uplink: job A while B joins",
     "cluster/join-1gbit-b64-pinned-thr-2026-12-05",
     {"variant": "hvd", "job": "job0 hvd"}, {"variant": "spec", "job": "job0 arb"}, JOB, ALONE),
    ("arbiter + adaptive boost, 1 Gbit/s uplink: the joining job B (pays for it)",
     "cluster/join-1gbit-b64-pinned-thr-2026-12-05",
     {"variant": "hvd", "job": "job1 hvd@8s"}, {"variant": "spec", "job": "job1 arb@8s"}, JOB,
     none("the joining job yields by design")),
    ("two identical jobs + arbiter, 400 Mbit/s uplink, batch 320",
     "cluster/identical-400mbit-b320-monitor-2026-12-05",
     {"variant": "hvd"}, {"variant": "spec"},
     dict(table=0, value="mean s/step", ratio="speedup vs hvd"), FLOOR),
]


def tables(text):
    """Every markdown table of ``text`` as a list of {column: cell} rows."""
    out, cur = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cur is None:
                cur = {"head": cells, "rows": []}
            elif not all(set(c) <= set("-: ") for c in cells):
                cur["rows"].append(dict(zip(cur["head"], cells)))
        elif cur is not None:
            out.append(cur["rows"])
            cur = None
    if cur is not None:
        out.append(cur["rows"])
    return out


def _row(rows, match, folder):
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if len(found) != 1:
        raise ValueError("results/%s/results.md: %d rows match %r" % (folder, len(found), match))
    return found[0]


def _num(cell):
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def folder_mtu(folder):
    """The MTU of a result folder's bottleneck: the testbed's uplink for
    ``cluster/`` folders, the shaped loopback otherwise."""
    return TESTBED_MTU if folder.startswith("cluster/") else LO_MTU


def floor_s(row, folder):
    """A results table row's comm floor in wire bytes: its ``comm floor s/step
    (wire bytes at MTU N)`` cell, or its unit-less ``comm floor s/step`` cell
    (payload bytes, tables written before the floor counted frames) times the
    frame rule's factor at the folder's MTU; None without one."""
    for col, cell in row.items():
        if col == "comm floor s/step":
            t = _num(cell)
            return None if t is None else t * wire_factor(folder_mtu(folder))
        if col.startswith("comm floor s/step ("):
            return _num(cell)
    return None


def share_cell(bound, base_row, ours_row, value, folder=""):
    """The share of the bound's gain for a folder row, or "–" with the reason
    the folder gives no bound."""
    if bound[0] == "none":
        return "– (%s)" % bound[1]
    base, ours = _num(base_row[value]), _num(ours_row[value])
    if bound[0] == "alone":
        t = _num(ours_row.get("s/step alone"))
        why = "no time alone in this folder"
    else:
        t = floor_s(base_row, folder)
        why = "no comm floor in this folder"
        if bound[0] == "overlap" and t is not None:
            cpu = _num(base_row.get("job CPU s/step"))
            t = max(cpu, t) if cpu is not None else None
            why = "no job CPU s/step in this folder (recorded since 2026-12-04)"
    if t is None or base is None or ours is None:
        return "– (%s)" % why
    return bound_cells(base, ours, t)[1]


def headline_row(scenario, folder, base, ours, kind, bound, root=REPO / "results"):
    text = (root / folder / "results.md").read_text()
    m = re.search(r"^Command: `[^`]*` — (\d{4}-\d\d-\d\d)T[^,]*, git ([0-9a-f]+)", text, re.M)
    if not m:
        raise ValueError("results/%s/results.md: no `Command: ... — date, git` line" % folder)
    rows = tables(text)[kind["table"]]
    b, o = _row(rows, base, folder), _row(rows, ours, folder)
    ratio = o[kind["ratio"]]
    return "| %s | %s | %s | %s | %s | %s, git %s | [%s](results/%s/) |" % (
        scenario, b[kind["value"]], o[kind["value"]], ratio,
        share_cell(bound, b, o, kind["value"], folder), m.group(1), m.group(2), folder, folder)


def read_headline(folder, repo=REPO):
    """``{scenario text: row line}`` of a ``benchmarks.headline`` folder
    (``folder`` relative to the repository, e.g. ``results/headline/2026-12-08``)."""
    path = repo / folder / "results.json.gz"
    try:
        res = read_json(results_path(repo / folder))
    except (OSError, ValueError, EOFError) as e:
        raise ValueError("--from %s: cannot read %s (%s)" % (folder, path, e)) from None
    if res.get("format") != HEADLINE_FORMAT:
        raise ValueError("--from %s: %s is not a benchmarks.headline result (format %r)"
                         % (folder, path, res.get("format")))
    meta = res["meta"]
    name = Path(folder).relative_to("results").as_posix() if folder.startswith("results/") \
        else Path(folder).name
    out = {}
    for r in res["rows"]:
        if r.get("base_s") is None or r.get("ours_s") is None or r.get("ratio") is None:
            continue
        rs = r["ratios"]
        ratio = "%.2f×" % r["ratio"] + (" (%.2f–%.2f)" % (min(rs), max(rs)) if len(rs) > 1 else "")
        b = r["bound"]
        share = b["cells"][1] if b.get("s") is not None and b.get("cells") else \
            "– (%s)" % b.get("reason", "no bound")
        out[r["title"]] = "| %s | %.3f | %.3f | %s | %s | %s, git %s | [%s](%s/) |" % (
            r["title"], r["base_s"], r["ours_s"], ratio, share, meta["date"][:10], meta["git"],
            name, folder)
    return out


def table(root=REPO / "results", source=None, repo=REPO):
    """The table; ``source``: a headline folder whose rows replace the folders'."""
    fresh = read_headline(source, repo) if source else {}
    lines = ["| scenario | plain Horovod s/step | horovod_prio s/step | ratio "
             "| share of the bound | run | result folder |",
             "|---|---|---|---|---|---|---|"]
    lines += [fresh.get(h[0]) or headline_row(*h, root=root) for h in HEADLINES]
    if source and (repo / source / PLOT).is_file():
        lines += ["", "![each row's ratio (bar) beside its bound (black tick)](%s/%s)"
                  % (source, PLOT)]
    return "\n".join(lines)


def _span(readme_text):
    m = BEGIN_RE.search(readme_text)
    if not m or END not in readme_text[m.end():]:
        raise ValueError("README.md has no headline table markers (%s ... %s)" % (BEGIN, END))
    return m, readme_text.index(END, m.end())


def current(readme_text):
    """The table between the markers of ``readme_text``."""
    m, b = _span(readme_text)
    return readme_text[m.end():b].strip()


def source_of(readme_text):
    """The headline folder the README's table was made from (its marker), or None."""
    return _span(readme_text)[0].group(1)


def render(readme_text, tab, source=None):
    m, b = _span(readme_text)
    return readme_text[:m.start()] + begin_marker(source) + "\n" + tab + "\n" + readme_text[b:]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python tools/readme_table.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="replace the table in README.md")
    g.add_argument("--check", action="store_true", help="exit 1 if README.md's table differs")
    p.add_argument("--from", dest="source", metavar="DIR",
                   help="a benchmarks.headline folder (e.g. results/headline/2026-12-08) whose "
                        "rows replace those of the folders (default: the one the README's "
                        "marker names, if any)")
    args = p.parse_args(argv)
    text = README.read_text()
    source = args.source.rstrip("/") if args.source else source_of(text)
    try:
        tab = table(source=source)
    except ValueError as e:
        p.error(str(e))
    if args.write:
        README.write_text(render(text, tab, source))
    elif args.check:
        if current(text) != tab or source_of(text) != source:
            print("README.md's headline table differs from `python tools/readme_table.py`; "
                  "run it with --write", file=sys.stderr)
            return 1
    else:
        print(tab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
