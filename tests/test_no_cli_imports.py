"""No module of the package or of benchmarks/ imports a command-line module
(a ``cli.py``): what a command parses lives in ``horovod_prio.method.units``
and what it runs in a library module, so a library never drags a command's
argparse set-up in and a parser has one home. ``horovod_prio/cli.py`` starts
the commands by name (``importlib``), which is not an import of them."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREES = ("horovod_prio", "benchmarks")


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
    return rel[:-1] if rel[-1] == "__init__" else rel


def imported_modules(path):
    """Every module an ``import``/``from ... import`` in ``path`` names
    (dotted, relative ones resolved; ``from a import b`` gives ``a`` and ``a.b``)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    me = _module_name(path)
    package = me if path.endswith("__init__.py") else me[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            out.append(mod)
            out += [mod + "." + a.name for a in node.names]
    return out


def is_cli(module):
    return module.split(".")[-1] == "cli"


def cli_imports():
    found = []
    for tree in TREES:
        for d, _, files in os.walk(os.path.join(ROOT, tree)):
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(d, f)
                    found += ["%s imports %s" % (os.path.relpath(path, ROOT), m)
                              for m in imported_modules(path) if is_cli(m)]
    return found


def test_no_module_imports_a_cli_module():
    assert cli_imports() == []


def test_the_check_sees_absolute_relative_and_from_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "horovod_prio" / "sim"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .cli import parse\n")
    (pkg / "b.py").write_text("from ..arbiter import cli\n")
    (pkg / "c.py").write_text("def f():\n    import horovod_prio.sim.cli\n")
    (pkg / "d.py").write_text("from ..method import units\nimport argparse\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(tmp_path))
    assert sorted(cli_imports()) == [
        "horovod_prio/sim/a.py imports horovod_prio.sim.cli",
        "horovod_prio/sim/b.py imports horovod_prio.arbiter.cli",
        "horovod_prio/sim/c.py imports horovod_prio.sim.cli"]
