"""The CI rule (a missing stack fails under CI=true / make test, never skips)
holds only if every skip goes through ``tests/stack_required.py``: a bare
``pytest.skip``, ``skipif`` or ``importorskip`` would turn a broken install
into a green run."""
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BARE_SKIP = re.compile(r"pytest\s*\.\s*(skip\s*\(|importorskip\s*\(|mark\s*\.\s*skip(if)?\b)")


def test_every_skip_goes_through_stack_required():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "stack_required.py" or path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if BARE_SKIP.search(line):
                offenders.append(f"{path.relative_to(TESTS)}:{n}: {line.strip()}")
    assert not offenders, ("use stack_required.needs / stack_missing / import_stack_module:\n"
                           + "\n".join(offenders))
