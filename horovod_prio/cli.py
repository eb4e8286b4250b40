"""``horovod-prio`` command line: ``horovod-prio {check,sim,arbiter} ...``."""
import importlib
import sys

COMMANDS = {
    "check": ("horovod_prio.check", "check the installed stack, our libraries, config and arbiter"),
    "sim": ("horovod_prio.sim.cli", "discrete-event simulator of jobs sharing links"),
    "arbiter": ("horovod_prio.arbiter.cli", "cross-job link arbiter service"),
}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: horovod-prio {%s} [args...]\n" % ",".join(COMMANDS))
        for name, (_, text) in COMMANDS.items():
            print("  %-8s %s" % (name, text))
        return 0 if argv else 2
    name = argv[0]
    if name not in COMMANDS:
        print("horovod-prio: unknown command %r (choose from %s)" % (name, ", ".join(COMMANDS)),
              file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
