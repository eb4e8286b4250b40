"""docs/ is timeless design text: a date (YYYY-MM-DD) may appear on a line of
docs/*.md only inside a link to a file or folder under results/ (a findings file
or a result folder; docs/ and results/ are siblings). Dated findings live in
results/findings/, listed in results/README.md."""
import re
import pytest

from test_links import LINK, ROOT

DOCS = sorted((ROOT / "docs").glob("*.md"))
DATE = re.compile(r"(?<![0-9])(?:19|20)[0-9]{2}-[01][0-9]-[0-3][0-9](?![0-9])")


def _into_results(target, path):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
        return False
    file_part = target.partition("#")[0]
    if not file_part:
        return False
    dest = (path.parent / file_part).resolve()
    return (path.parent.parent / "results").resolve() in dest.parents


def dated_lines(path):
    """``"<name>:<line>: <text>"`` of every line of ``path`` with a date outside a
    link into results/ (code spans and fenced blocks count: a dated command or
    output path is a finding too)."""
    bad = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        rest = LINK.sub(lambda m: "" if _into_results(m.group(1), path) else m.group(0), line)
        if DATE.search(rest):
            bad.append("%s:%d: %s" % (path.name, n, line.strip()))
    return bad


def test_the_checker_allows_dates_only_in_links_into_results(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "results" / "findings").mkdir(parents=True)
    doc = docs / "x.md"
    doc.write_text(
        "Design text.\n"
        "Measurements: [findings](../results/findings/2026-12-02-x.md).\n"
        "[a run](../results/bench/run-2026-12-01/results.md#t-2026-12-01)\n"
        "Measured 2026-12-02 on this box.\n"
        "`--out results/bench/run-2026-12-01`\n"
        "[a doc section](y.md#fixed-2026-12-02)\n"
        "[https link](https://example.org/2026-12-02)\n"
        "2026-12-02 [findings](../results/findings/2026-12-02-x.md)\n")
    assert [b.split(":")[1] for b in dated_lines(doc)] == ["4", "5", "6", "7", "8"]


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_docs_carry_no_dates_outside_links_into_results(path):
    assert dated_lines(path) == []
