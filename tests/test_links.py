"""Every relative link and #anchor in the user-facing markdown resolves
(README.md, docs/*.md, results/README.md, results/findings/*.md)."""
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", ROOT / "results" / "README.md"]
              + list((ROOT / "docs").glob("*.md"))
              + list((ROOT / "results" / "findings").glob("*.md")))

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(text):
    """``text`` without fenced code blocks and inline code spans."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return "\n".join(out)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces -> '-'."""
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)      # links: their text
    s = s.replace("`", "").strip().lower()
    s = "".join(c for c in s if c in " -_" or unicodedata.category(c)[0] in "LN")
    return s.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else "%s-%d" % (base, n))
    out.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text()))
    return out


def broken_links(path):
    bad = []
    for target in LINK.findall(_prose(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):      # http:, https:, mailto:
            continue
        file_part, _, frag = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append("%s: no such file" % target)
            continue
        if frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append("%s: no heading #%s in %s" % (target, frag, dest.name))
    return bad


def test_slugs_follow_github():
    assert slug("Cutting a gradient costs a copy (2026-12-02, fixed in git 0509fb6)") \
        == "cutting-a-gradient-costs-a-copy-2026-12-02-fixed-in-git-0509fb6"
    assert slug("The `hvd.overlap` line: 1.2×") == "the-hvdoverlap-line-12"
    assert slug("Jobs sharing a link") == "jobs-sharing-a-link"


def test_the_checker_finds_a_broken_file_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Two words\n\n[ok](#two-words) [ok](b.md#b)"
                                   " [bad](#nope) [bad](c.md) `[code](x.md)`\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert broken_links(tmp_path / "a.md") == ["#nope: no heading #nope in a.md",
                                               "c.md: no such file"]


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_links_resolve(path):
    assert broken_links(path) == []
