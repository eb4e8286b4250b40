"""The arbiter's service recipes (systemd unit, container command in the
README) run a command line the arbiter's CLI accepts."""
import re
import shlex
from pathlib import Path

from horovod_prio.arbiter.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent.parent


def _arbiter_args(argv):
    i = argv.index("arbiter")
    assert Path(argv[i - 1]).name == "horovod-prio", argv
    return argv[i + 1:]


def test_systemd_unit_runs_a_valid_arbiter_command():
    unit = (ROOT / "tools" / "horovod-prio-arbiter.service").read_text()
    (execs,) = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    args = build_parser().parse_args(_arbiter_args(shlex.split(execs.replace("%d", "/run/creds"))))
    assert args.bind == "0.0.0.0:7077" and args.secret_file == "/run/creds/arbiter.secret"
    assert re.search(r"^LoadCredential=arbiter\.secret:/etc/horovod-prio/arbiter\.secret$", unit, re.M)
    assert re.search(r"^Restart=always$", unit, re.M)


def test_readme_container_command_runs_a_valid_arbiter():
    readme = (ROOT / "README.md").read_text()
    (cmd,) = re.findall(r"docker run [^`]*?arbiter\.secret\n", readme)
    argv = shlex.split(cmd.replace("\\\n", " "))
    args = build_parser().parse_args(_arbiter_args(argv))
    assert args.bind.endswith(":7077") and "-p" in argv and "7077:7077" in argv
    mount = argv[argv.index("-v") + 1].split(":")
    assert args.secret_file.startswith(mount[1] + "/")
