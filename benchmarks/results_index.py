"""The index of ``results/``: one row per result folder (or result file).

    python -m benchmarks.results_index            # rewrite the table in results/README.md
    python -m benchmarks.results_index --check    # exit 1 if an entry is missing or stale

Entries are the folders ``results/<kind>/<name>/`` and the files
``results/<kind>/<name>.json`` (e.g. the simulator's measured model profiles).
For each the date, git commit, command and 1-minute load average are read
from what the run recorded (``results.json`` ``meta`` of the benchmark
harnesses, ``command`` of the simulator's JSON, the ``Command:`` line of a
markdown report); whatever the run did not record is written as
"not recorded", followed by the commit that first added the entry to git.
The table sits between two marker lines in ``results/README.md``; the text
around it is kept. So does the list of the dated write-ups
``results/findings/*.md`` (one line each, from the file's title), between
its own two marker lines.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import re
import subprocess
import sys
from pathlib import Path

from .results_io import read_json

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
BEGIN = "<!-- results index: begin (python -m benchmarks.results_index) -->"
END = "<!-- results index: end -->"
NOT_RECORDED = "not recorded"
FBEGIN = "<!-- findings index: begin (python -m benchmarks.results_index) -->"
FEND = "<!-- findings index: end -->"


def entries(root: Path = RESULTS) -> list[Path]:
    """Result folders and top-level result files under ``root/<kind>/``, sorted."""
    out = []
    for kind in sorted(p for p in root.iterdir() if p.is_dir()):
        for e in sorted(kind.iterdir()):
            if e.name.startswith(".") or e.name in ("README.md", "tmp"):
                continue
            if e.is_dir() or e.suffix == ".json":
                out.append(e)
    return out


def findings(root: Path = RESULTS) -> list[Path]:
    """The dated write-ups ``root/findings/*.md``, sorted (by name, i.e. by date)."""
    d = root / "findings"
    return sorted(p for p in d.glob("*.md") if p.name != "README.md") if d.is_dir() else []


def findings_list(root: Path = RESULTS) -> str:
    """One line per findings file: ``- [<title>](findings/<name>)``; the title is the
    file's first ``# `` heading without its ``Findings:`` prefix."""
    lines = []
    for f in findings(root):
        title = next((l[2:].strip() for l in f.read_text().splitlines() if l.startswith("# ")),
                     f.stem)
        title = re.sub(r"^Findings:\s*", "", title)
        lines.append(f"- [{_cell(title)}](findings/{f.name})")
    return "\n".join(lines)


def _load_json(path: Path):
    try:
        return read_json(path)
    except (OSError, ValueError, EOFError):
        return None


def _md_command(path: Path) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    m = re.search(r"Command: `([^`]+)`", text)
    return m.group(1) if m else None


def _fmt_date(s) -> str | None:
    if not s:
        return None
    try:
        d = _dt.datetime.fromisoformat(str(s))
    except ValueError:
        return str(s)
    if d.tzinfo is not None:
        d = d.astimezone(_dt.timezone.utc)
    return d.strftime("%Y-%m-%d %H:%M UTC")


def _loads(runs) -> list[float]:
    out = []
    for r in runs or []:
        if isinstance(r, dict):
            for k in ("loadavg_before", "loadavg_after"):
                if isinstance(r.get(k), (int, float)):
                    out.append(float(r[k]))
    return out


def describe(entry: Path) -> dict:
    """``{"date", "git", "command", "load", "source"}`` of one entry (None = not recorded;
    ``source`` is the free-text origin a profile JSON records instead of a command)."""
    info = {"date": None, "git": None, "command": None, "load": None, "source": None}
    files = [entry] if entry.is_file() else sorted([*entry.glob("*.json"), *entry.glob("*.json.gz")])
    for f in files:
        d = _load_json(f)
        if not isinstance(d, dict):
            continue
        meta = d.get("meta") if isinstance(d.get("meta"), dict) else d
        info["command"] = info["command"] or meta.get("command")
        info["date"] = info["date"] or _fmt_date(meta.get("date"))
        info["git"] = info["git"] or meta.get("git")
        loads = _loads(d.get("runs"))
        if not loads and isinstance(meta.get("loadavg"), (list, tuple)):
            loads = [float(x) for x in meta["loadavg"] if isinstance(x, (int, float))]
        if loads and info["load"] is None:
            info["load"] = (min(loads), max(loads))
        if isinstance(meta.get("source"), str):
            info["source"] = meta["source"]
    if not info["command"] and entry.is_dir():
        for md in sorted(entry.glob("*.md")):
            info["command"] = _md_command(md)
            if info["command"]:
                break
    return info


#: where result folders lived before they moved to results/<kind>/ (2026-12-01)
FORMER = {"bench": "benchmarks/results", "sim": "benchmarks/sim_results"}


def first_commit(entry: Path, root: Path = RESULTS) -> str | None:
    """``<hash> <date>`` of the oldest commit that added a file of ``entry``, at its
    current path or at its former one (see FORMER)."""
    try:
        rel = entry.resolve().relative_to(root.resolve())
        paths = [str(entry.resolve().relative_to(REPO))]
    except ValueError:
        return None
    if rel.parts and rel.parts[0] in FORMER:
        paths.append("/".join((FORMER[rel.parts[0]],) + rel.parts[1:]))
    try:
        p = subprocess.run(["git", "log", "--no-renames", "--diff-filter=A", "--format=%h %ad",
                            "--date=short", "--"] + paths, capture_output=True, text=True,
                           cwd=str(REPO), timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = p.stdout.strip().splitlines()
    return lines[-1] if lines else None


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def table(root: Path = RESULTS) -> str:
    lines = ["| entry | date | git | command | 1-min load |", "|---|---|---|---|---|"]
    for e in entries(root):
        info = describe(e)
        rel = e.relative_to(root).as_posix() + ("/" if e.is_dir() else "")
        date, git = info["date"], info["git"]
        if date is None or git is None:
            fc = first_commit(e, root)
            h, d = fc.split() if fc else (None, None)
            date = date or (f"{NOT_RECORDED} (first committed {d})" if d else NOT_RECORDED)
            git = git or (f"{NOT_RECORDED} (first committed in {h})" if h else NOT_RECORDED)
        if info["load"] is None:
            load = NOT_RECORDED
        else:
            lo, hi = info["load"]
            load = f"{lo:.1f}" if round(lo, 1) == round(hi, 1) else f"{lo:.1f}–{hi:.1f}"
        if info["command"]:
            cmd = f"`{_cell(info['command'])}`"
        elif info.get("source"):
            cmd = f"{NOT_RECORDED} (source: {_cell(info['source'])})"
        else:
            cmd = NOT_RECORDED
        lines.append(f"| [{rel}]({rel}) | {date} | {git} | {cmd} | {load} |")
    return "\n".join(lines)


def _put(text: str, begin: str, end: str, body: str, heading: str = "") -> str:
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        return f"{head}{begin}\n{body}\n{end}{tail or chr(10)}"
    return f"{text.rstrip()}\n\n{heading}{begin}\n{body}\n{end}\n"


def render(readme_text: str, tab: str, flist: str = "") -> str:
    """``readme_text`` with the index table (and, when there are findings files or
    their markers, the findings list) written between their markers."""
    if flist or (FBEGIN in readme_text and FEND in readme_text):
        readme_text = _put(readme_text, FBEGIN, FEND, flist, "## Findings\n\n")
    return _put(readme_text, BEGIN, END, tab)


def indexed(readme_text: str) -> list[str]:
    """The entries (``kind/name/`` or ``kind/name.json``) listed in the index table."""
    if BEGIN not in readme_text or END not in readme_text:
        return []
    body = readme_text.split(BEGIN, 1)[1].split(END, 1)[0]
    return re.findall(r"^\| \[([^\]]+)\]\(", body, flags=re.M)


def indexed_findings(readme_text: str) -> list[str]:
    """The findings files (``findings/<name>.md``) listed between the findings markers."""
    if FBEGIN not in readme_text or FEND not in readme_text:
        return []
    body = readme_text.split(FBEGIN, 1)[1].split(FEND, 1)[0]
    return re.findall(r"^- \[.*\]\((findings/[^)]+)\)\s*$", body, flags=re.M)


def check(readme_text: str, root: Path = RESULTS) -> tuple[list[str], list[str]]:
    """(entries missing from the index, indexed entries that no longer exist). Only
    the list is compared: the git-derived text differs in shallow clones."""
    have = [e.relative_to(root).as_posix() + ("/" if e.is_dir() else "") for e in entries(root)]
    have += [f.relative_to(root).as_posix() for f in findings(root)]
    listed = indexed(readme_text) + indexed_findings(readme_text)
    return [e for e in have if e not in listed], [e for e in listed if e not in have]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.results_index", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if results/README.md's table or findings list "
                         "misses an entry or lists one that is gone")
    ap.add_argument("--root", default=str(RESULTS), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    root = Path(a.root)
    readme = root / "README.md"
    old = readme.read_text() if readme.exists() else "# Results\n"
    if a.check:
        missing, stale = check(old, root)
        if missing or stale:
            sys.stderr.write(f"{readme} is out of date (missing: {missing or '-'}; no longer "
                             f"present: {stale or '-'}): run python -m benchmarks.results_index\n")
            return 1
        return 0
    new = render(old, table(root), findings_list(root))
    readme.write_text(new)
    sys.stderr.write(f"wrote {readme} ({len(entries(root))} entries, "
                     f"{len(findings(root))} findings)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
