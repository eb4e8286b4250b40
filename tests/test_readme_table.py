"""The README is a user guide whose headline table is generated from the
result folders it cites (``tools/readme_table.py``)."""
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_table", ROOT / "tools" / "readme_table.py")
readme_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_table)


def test_readme_table_is_what_the_script_generates():
    text = (ROOT / "README.md").read_text()
    assert readme_table.current(text) == readme_table.table(source=readme_table.source_of(text)), \
        "README.md's headline table is stale: run `python tools/readme_table.py --write`"


def test_rows_are_read_from_the_result_folders(tmp_path):
    folder = "bench/overlap-default-mnv2-2026-12-05"
    shutil.copytree(ROOT / "results" / folder, tmp_path / folder,
                    ignore=shutil.ignore_patterns("*.json", "*.png"))
    md = tmp_path / folder / "results.md"
    md.write_text(md.read_text().replace("| 0.512 |", "| 0.555 |").replace("git 3a15705", "git abc1234"))
    (h,) = [h for h in readme_table.HEADLINES if h[1] == folder and "batch 128" in h[0]]
    row = readme_table.headline_row(*h, root=tmp_path)
    assert "| 0.622 | 0.555 | 1.22× (1.18–1.24) |" in row and "| 2026-12-05, git abc1234 |" in row
    assert "](results/%s/)" % folder in row
    md.write_text(md.read_text().replace("mobilenetv2, 128", "mobilenetv2, 129"))
    with pytest.raises(ValueError, match="0 rows match"):
        readme_table.headline_row(*h, root=tmp_path)


def test_every_headline_folder_exists_with_its_command():
    for h in readme_table.HEADLINES:
        text = (ROOT / "results" / h[1] / "results.md").read_text()
        assert text.startswith("Command: `python -m benchmarks."), h[1]


def test_readme_is_a_short_guide_without_issue_numbers():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"(?<![\w/&])#\d+\b|\bissues? \d+", text)


def _folder(tmp_path, folder):
    shutil.copytree(ROOT / "results" / folder, tmp_path / folder,
                    ignore=shutil.ignore_patterns("*.json", "*.png"))
    return tmp_path / folder / "results.md"


def test_share_of_the_bound_comes_from_the_folder_or_says_why_not(tmp_path):
    h = {x[0]: x for x in readme_table.HEADLINES}
    md = _folder(tmp_path, "bench/overlap-default-mnv2-2026-12-05")
    b128 = h["`hvd.overlap`: MobileNetV2, 300 Mbit/s, batch 128"]
    # overlap ceiling = max(plain's job CPU s/step, its comm floor), then bound_cells
    rows = readme_table.tables(md.read_text())[0]
    base = [r for r in rows if r["model, batch/rank"] == "mobilenetv2, 128" and r["jobs"] == "hvd"][0]
    ceiling = max(float(base["job CPU s/step"]), float(base["comm floor s/step"]))
    want = readme_table.bound_cells(0.622, 0.512, ceiling)[1]
    assert "| 1.22× (1.18–1.24) | %s |" % want in readme_table.headline_row(*b128, root=tmp_path)
    md.write_text(md.read_text().replace("job CPU s/step", "job CPU"))     # no CPU column
    assert "| – (no job CPU s/step in this folder" in readme_table.headline_row(*b128, root=tmp_path)
    # the link floor of the baseline's row
    one = h["one job, default settings: MLP, 1 Gbit/s, batch 1024"]
    _folder(tmp_path, one[1])
    assert "| %s |" % readme_table.bound_cells(0.733, 0.735, 0.405)[1] in \
        readme_table.headline_row(*one, root=tmp_path)
    # the class-1 job's own time alone, in our row
    c1 = h["job classes, 1 Gbit/s uplink: the class-1 job beside a class-0 job"]
    md = _folder(tmp_path, c1[1])
    assert "| 1.51× | 99% |" in readme_table.headline_row(*c1, root=tmp_path)
    md.write_text(md.read_text().replace("| 0.277 | 0.277 | 0.276 |", "| 0.277 | 0.277 | 0.350 |"))
    assert "| 1.51× | %s |" % readme_table.bound_cells(0.422, 0.277, 0.350)[1] in \
        readme_table.headline_row(*c1, root=tmp_path)
    c0 = h["job classes, 1 Gbit/s uplink: the class-0 job (pays for it)"]
    assert "| 0.39× | – (the class-0 job yields by design) |" in \
        readme_table.headline_row(*c0, root=tmp_path)


def test_a_folders_comm_floor_is_read_in_wire_bytes():
    """Tables written before the floor counted frames give it in payload bytes
    (a column without a unit): scaled by the frame rule at the folder's link's
    MTU (the shaped lo's for bench/, the testbed uplink's for cluster/); a
    column that names its unit is read as it is."""
    old = {"comm floor s/step": "0.400", "mean s/step": "0.5"}
    assert readme_table.floor_s(old, "cluster/x") == pytest.approx(0.4 * 1514 / 1448)
    assert readme_table.floor_s(old, "bench/x") == pytest.approx(0.4 * 65550 / 65484)
    new = {"comm floor s/step (wire bytes at MTU 1500)": "0.400"}
    assert readme_table.floor_s(new, "cluster/x") == 0.4
    assert readme_table.floor_s({"comm floor s/step": "–"}, "bench/x") is None
    assert readme_table.floor_s({"mean s/step": "0.5"}, "bench/x") is None
    # the share of a floor row of an old testbed folder: against the wire floor
    base, ours = {**old, "mean s/step": "1.000"}, {"mean s/step": "0.700"}
    assert readme_table.share_cell(("floor",), base, ours, "mean s/step", "cluster/x") == \
        readme_table.bound_cells(1.0, 0.7, 0.4 * 1514 / 1448)[1] == "52%"       # not 50%


def _headline(tmp_path, rows, fmt="horovod_prio.headline/1"):
    d = tmp_path / "results" / "headline" / "2026-12-08"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({
        "format": fmt, "meta": {"date": "2026-12-08T05:00:00+00:00", "git": "1234abc"},
        "rows": rows}))
    return "results/headline/2026-12-08"


def test_rows_a_headline_folder_measured_replace_their_folders(tmp_path):
    one = "one job, default settings: MLP, 1 Gbit/s, batch 1024"
    src = _headline(tmp_path, [
        {"title": one, "base_s": 0.7301, "ours_s": 0.7402, "ratio": 0.99,
         "ratios": [0.98, 0.99, 1.01],
         "bound": {"s": 0.405, "source": "link floor", "cells": ["0.99×", "-3%"]}},
        {"title": "job classes, 1 Gbit/s uplink: the class-0 job (pays for it)",
         "base_s": 0.43, "ours_s": 1.1, "ratio": 0.39, "ratios": [0.39],
         "bound": {"s": None, "reason": "the class-0 job yields by design: no bound"}},
        {"title": "a row the README does not list", "base_s": 1, "ours_s": 1, "ratio": 1,
         "ratios": [1], "bound": {"s": None, "reason": "x"}},
        {"title": "`hvd.overlap`: MobileNetV2, 300 Mbit/s, batch 128", "base_s": None,
         "ours_s": None, "ratio": None, "ratios": [], "bound": {"s": None, "reason": "none"}}])
    tab = readme_table.table(source=src, repo=tmp_path)
    lines = tab.splitlines()
    assert len(lines) == 2 + len(readme_table.HEADLINES)
    assert ("| %s | 0.730 | 0.740 | 0.99× (0.98–1.01) | -3%% | 2026-12-08, git 1234abc | "
            "[headline/2026-12-08](results/headline/2026-12-08/) |" % one) in lines
    assert "| 0.39× | – (the class-0 job yields by design: no bound) | 2026-12-08, git 1234abc" in tab
    assert "a row the README does not list" not in tab
    # a row the headline run has no numbers for, and rows it did not run, keep their folders
    assert "[bench/overlap-default-mnv2-2026-12-05](results/bench/overlap-default-mnv2-2026-12-05/)" \
        in tab
    assert "[bench/overlap-default-mlp-2026-12-01]" in tab
    with pytest.raises(ValueError, match="not a benchmarks.headline result"):
        readme_table.table(source=_headline(tmp_path / "x", [], fmt="other"), repo=tmp_path / "x")
    with pytest.raises(ValueError, match="--from results/nope: cannot read"):
        readme_table.table(source="results/nope", repo=tmp_path)


def test_the_marker_records_the_headline_folder_for_write_and_check():
    text = "intro\n%s\nold\n%s\nafter\n" % (readme_table.BEGIN, readme_table.END)
    assert readme_table.source_of(text) is None
    new = readme_table.render(text, "| t |", "results/headline/2026-12-08")
    assert readme_table.source_of(new) == "results/headline/2026-12-08"
    assert readme_table.current(new) == "| t |"
    assert new.startswith("intro\n<!-- headline table: begin (python tools/readme_table.py "
                          "--write --from results/headline/2026-12-08) -->\n| t |\n")
    assert new.endswith(readme_table.END + "\nafter\n")
    back = readme_table.render(new, "| u |")
    assert readme_table.source_of(back) is None and back.count("begin") == 1


def test_check_and_write_follow_the_folder_the_marker_names(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    monkeypatch.setattr(readme_table, "README", readme)
    text = (ROOT / "README.md").read_text()
    readme.write_text(text)
    assert readme_table.main(["--check"]) == 0
    # the marker names a headline folder: --check and --write read it (here: missing)
    readme.write_text(readme_table.render(text, readme_table.current(text),
                                          "results/headline-1999-01-01"))
    with pytest.raises(SystemExit):
        readme_table.main(["--check"])
    assert "--from results/headline-1999-01-01: cannot read" in capsys.readouterr().err
    # --write --from rewrites the marker; --write alone then keeps it
    src = _headline(tmp_path, [])
    monkeypatch.setattr(readme_table, "REPO", tmp_path)
    real_table = readme_table.table
    monkeypatch.setattr(readme_table, "table",
                        lambda root=ROOT / "results", source=None, repo=tmp_path:
                        real_table(root=ROOT / "results", source=source, repo=tmp_path))
    assert readme_table.main(["--write", "--from", src + "/"]) == 0
    assert readme_table.source_of(readme.read_text()) == src
    assert readme_table.main(["--check"]) == 0
    readme.write_text(readme_table.render(readme.read_text(), readme_table.current(
        readme.read_text())))                                   # same table, marker dropped
    assert readme_table.main(["--check", "--from", src]) == 1
