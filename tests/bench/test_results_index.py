"""results/README.md indexes every result folder (benchmarks/results_index.py)."""
import json

from benchmarks import results_index as ri


def test_results_readme_indexes_every_result_folder():
    # fails when a folder is added under results/ (or a row removed) without
    # re-running `python -m benchmarks.results_index`
    assert ri.main(["--check"]) == 0
    text = (ri.RESULTS / "README.md").read_text()
    for e in ri.entries():
        rel = e.relative_to(ri.RESULTS).as_posix() + ("/" if e.is_dir() else "")
        assert f"| [{rel}]({rel}) |" in text


def test_index_reads_what_a_run_recorded_and_says_what_it_did_not(tmp_path):
    run = tmp_path / "bench" / "run1"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({
        "meta": {"command": "python -m benchmarks.run --quick", "git": "abc1234",
                 "date": "2026-11-29T10:07:45+00:00"},
        "runs": [{"loadavg_before": 2.04, "loadavg_after": 3.46}, {"loadavg_before": 2.5}]}))
    bare = tmp_path / "sim" / "old"
    bare.mkdir(parents=True)
    (bare / "results.md").write_text("# x\n\nCommand: `horovod-prio sim --jobs 2`\n")
    (tmp_path / "sim" / "profile_x.json").write_text(json.dumps({"source": "measured on a CPU"}))
    (tmp_path / "README.md").write_text("# Results\n\nprose kept\n")
    assert ri.main(["--root", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# Results\n\nprose kept\n")
    assert ("| [bench/run1/](bench/run1/) | 2026-11-29 10:07 UTC | abc1234 "
            "| `python -m benchmarks.run --quick` | 2.0–3.5 |") in text
    assert ("| [sim/old/](sim/old/) | not recorded | not recorded "
            "| `horovod-prio sim --jobs 2` | not recorded |") in text
    assert ("| [sim/profile_x.json](sim/profile_x.json) | not recorded | not recorded "
            "| not recorded (source: measured on a CPU) | not recorded |") in text
    assert ri.main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / "bench" / "run2").mkdir()
    assert ri.main(["--root", str(tmp_path), "--check"]) == 1


def test_check_names_missing_and_stale_entries(tmp_path):
    (tmp_path / "bench" / "a").mkdir(parents=True)
    (tmp_path / "bench" / "b").mkdir()
    (tmp_path / "README.md").write_text("# Results\n")
    assert ri.main(["--root", str(tmp_path)]) == 0
    assert ri.check((tmp_path / "README.md").read_text(), tmp_path) == ([], [])
    (tmp_path / "bench" / "a").rmdir()
    (tmp_path / "sim" / "c").mkdir(parents=True)
    assert ri.check((tmp_path / "README.md").read_text(), tmp_path) == (["sim/c/"], ["bench/a/"])
    assert ri.main(["--root", str(tmp_path), "--check"]) == 1


def test_results_readme_lists_every_findings_file():
    # fails when a write-up is added under results/findings/ without re-running
    # `python -m benchmarks.results_index`, or when the generator stops listing them
    text = (ri.RESULTS / "README.md").read_text()
    files = sorted((ri.RESULTS / "findings").glob("*.md"))
    assert files and [f.name for f in ri.findings()] == [f.name for f in files]
    listed = ri.indexed_findings(text)
    assert listed == ["findings/" + f.name for f in files]


def test_findings_are_listed_by_title_and_checked(tmp_path):
    (tmp_path / "bench" / "a").mkdir(parents=True)
    fd = tmp_path / "findings"
    fd.mkdir()
    (fd / "2026-01-02-x.md").write_text("# Findings: what x showed\n\nReads bench/a.\n")
    (tmp_path / "README.md").write_text("# Results\n\nprose kept\n")
    assert ri.main(["--root", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# Results\n\nprose kept\n")
    assert "- [what x showed](findings/2026-01-02-x.md)\n" in text
    assert ri.check(text, tmp_path) == ([], [])
    assert ri.main(["--root", str(tmp_path), "--check"]) == 0
    # a new write-up not yet listed: --check fails and names it
    (fd / "2026-01-03-y.md").write_text("# Findings: y\n")
    assert ri.check(text, tmp_path) == (["findings/2026-01-03-y.md"], [])
    assert ri.main(["--root", str(tmp_path), "--check"]) == 1
    # regenerating lists it, in date order, and keeps the text around the list
    assert ri.main(["--root", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert ri.indexed_findings(text) == ["findings/2026-01-02-x.md", "findings/2026-01-03-y.md"]
    assert text.count(ri.FBEGIN) == 1 and text.startswith("# Results\n\nprose kept\n")
    # a listed write-up that is gone is named as stale
    (fd / "2026-01-02-x.md").unlink()
    assert ri.check(text, tmp_path) == ([], ["findings/2026-01-02-x.md"])
    assert ri.main(["--root", str(tmp_path), "--check"]) == 1
