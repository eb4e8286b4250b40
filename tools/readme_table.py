"""The README's headline table, generated from the result folders it cites.

    python tools/readme_table.py            # print the table
    python tools/readme_table.py --write    # replace it in README.md (between the markers)
    python tools/readme_table.py --check    # exit 1 if README.md's table differs

Each row names a result folder and the rows of its ``results.md`` (the
table the run's own report wrote) to read: plain Horovod's and
horovod_prio's s/step, the ratio as the report gives it (median of the
per-repeat ratios, so not always the quotient of the two medians), and the
run's date and git commit from its ``Command:`` line.
"""
import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
BEGIN = "<!-- headline table: begin (python tools/readme_table.py --write) -->"
END = "<!-- headline table: end -->"

BENCH = dict(table=0, value="mean s/step", ratio="speedup vs hvd")
JOB = dict(table=1, value="s/step shared", ratio="vs hvd (same job)")

#: (scenario, folder under results/, the rows {column: value} of plain Horovod and of ours, kind)
HEADLINES = [
    ("one job, default settings: MLP, 1 Gbit/s, batch 1024",
     "bench/sweep-mlp-per-gradient-chunks-2026-12-02",
     {"link": "1gbit", "model, batch/rank": "mlp, 1024", "jobs": "hvd"},
     {"link": "1gbit", "model, batch/rank": "mlp, 1024", "jobs": "prio"}, BENCH),
    ("two jobs sharing 1 Gbit/s, no arbiter: MLP, batch 512",
     "bench/shared-mlp-1gbit-aa-2026-12-04",
     {"model, batch/rank": "mlp, 512", "jobs": "hvd+hvd"},
     {"model, batch/rank": "mlp, 512", "jobs": "prio+prio"}, BENCH),
    ("`hvd.overlap`: MobileNetV2, 300 Mbit/s, batch 128",
     "bench/overlap-default-mnv2-2026-12-05",
     {"model, batch/rank": "mobilenetv2, 128", "jobs": "hvd"},
     {"model, batch/rank": "mobilenetv2, 128", "jobs": "overlap"}, BENCH),
    ("`hvd.overlap`: MobileNetV2, 300 Mbit/s, batch 160",
     "bench/overlap-mnv2-b128-b160-2026-12-05",
     {"model, batch/rank": "mobilenetv2, 160", "jobs": "hvd"},
     {"model, batch/rank": "mobilenetv2, 160", "jobs": "overlap"}, BENCH),
    ("`hvd.overlap`: MobileNetV2, 300 Mbit/s, batch 256 (compute-bound)",
     "bench/overlap-default-mnv2-2026-12-05",
     {"model, batch/rank": "mobilenetv2, 256", "jobs": "hvd"},
     {"model, batch/rank": "mobilenetv2, 256", "jobs": "overlap"}, BENCH),
    ("`hvd.overlap`: MLP, 1 Gbit/s, batch 256 (no room: its big layers sit at the input)",
     "bench/overlap-default-mlp-2026-12-01",
     {"model, batch/rank": "mlp, 256", "jobs": "hvd"},
     {"model, batch/rank": "mlp, 256", "jobs": "overlap"}, BENCH),
    ("job classes, 1 Gbit/s uplink: the class-1 job beside a class-0 job",
     "cluster/classes-join-1gbit-b64-pinned-strict-2026-12-04",
     {"variant": "hvd", "job": "job0 hvd"}, {"variant": "spec", "job": "job0 arb(c1)"}, JOB),
    ("job classes, 1 Gbit/s uplink: the class-0 job (pays for it)",
     "cluster/classes-join-1gbit-b64-pinned-strict-2026-12-04",
     {"variant": "hvd", "job": "job1 hvd@8s"}, {"variant": "spec", "job": "job1 arb(c0)@8s"}, JOB),
    ("arbiter + adaptive boost, 1 Gbit/s uplink: job A while B joins",
     "cluster/join-1gbit-b64-pinned-thr-2026-12-05",
     {"variant": "hvd", "job": "job0 hvd"}, {"variant": "spec", "job": "job0 arb"}, JOB),
    ("arbiter + adaptive boost, 1 Gbit/s uplink: the joining job B (pays for it)",
     "cluster/join-1gbit-b64-pinned-thr-2026-12-05",
     {"variant": "hvd", "job": "job1 hvd@8s"}, {"variant": "spec", "job": "job1 arb@8s"}, JOB),
    ("two identical jobs + arbiter, 400 Mbit/s uplink, batch 320 (link already full)",
     "cluster/identical-400mbit-b320-monitor-2026-12-05",
     {"variant": "hvd"}, {"variant": "spec"},
     dict(table=0, value="mean s/step", ratio="speedup vs hvd")),
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


def headline_row(scenario, folder, base, ours, kind, root=REPO / "results"):
    text = (root / folder / "results.md").read_text()
    m = re.search(r"^Command: `[^`]*` — (\d{4}-\d\d-\d\d)T[^,]*, git ([0-9a-f]+)", text, re.M)
    if not m:
        raise ValueError("results/%s/results.md: no `Command: ... — date, git` line" % folder)
    rows = tables(text)[kind["table"]]
    b, o = _row(rows, base, folder), _row(rows, ours, folder)
    ratio = o[kind["ratio"]]
    return "| %s | %s | %s | %s | %s, git %s | [%s](results/%s/) |" % (
        scenario, b[kind["value"]], o[kind["value"]], ratio, m.group(1), m.group(2),
        folder, folder)


def table(root=REPO / "results"):
    lines = ["| scenario | plain Horovod s/step | horovod_prio s/step | ratio | run | result folder |",
             "|---|---|---|---|---|---|"]
    lines += [headline_row(*h, root=root) for h in HEADLINES]
    return "\n".join(lines)


def current(readme_text):
    """The table between the markers of ``readme_text``."""
    try:
        a = readme_text.index(BEGIN) + len(BEGIN)
        b = readme_text.index(END)
    except ValueError:
        raise ValueError("README.md has no headline table markers (%s ... %s)" % (BEGIN, END))
    return readme_text[a:b].strip()


def render(readme_text, tab):
    current(readme_text)
    a = readme_text.index(BEGIN) + len(BEGIN)
    b = readme_text.index(END)
    return readme_text[:a] + "\n" + tab + "\n" + readme_text[b:]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python tools/readme_table.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="replace the table in README.md")
    g.add_argument("--check", action="store_true", help="exit 1 if README.md's table differs")
    args = p.parse_args(argv)
    tab = table()
    if args.write:
        README.write_text(render(README.read_text(), tab))
    elif args.check:
        if current(README.read_text()) != tab:
            print("README.md's headline table differs from `python tools/readme_table.py`; "
                  "run it with --write", file=sys.stderr)
            return 1
    else:
        print(tab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
