"""The README is a user guide whose headline table is generated from the
result folders it cites (``tools/readme_table.py``)."""
import importlib.util
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_table", ROOT / "tools" / "readme_table.py")
readme_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_table)


def test_readme_table_is_what_the_script_generates():
    assert readme_table.current((ROOT / "README.md").read_text()) == readme_table.table(), \
        "README.md's headline table is stale: run `python tools/readme_table.py --write`"


def test_rows_are_read_from_the_result_folders(tmp_path):
    folder = "bench/overlap-mnv2-b128-b160-2026-12-05"
    shutil.copytree(ROOT / "results" / folder, tmp_path / folder,
                    ignore=shutil.ignore_patterns("*.json", "*.png"))
    md = tmp_path / folder / "results.md"
    md.write_text(md.read_text().replace("| 0.539 |", "| 0.555 |").replace("git 01ea86d", "git abc1234"))
    (h,) = [h for h in readme_table.HEADLINES if h[1] == folder]
    row = readme_table.headline_row(*h, root=tmp_path)
    assert "| 0.664 | 0.555 | 1.22× (1.19–1.25) | 2026-12-05, git abc1234 |" in row
    assert "](results/%s/)" % folder in row
    md.write_text(md.read_text().replace("mobilenetv2, 160", "mobilenetv2, 161"))
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
