"""Roles of a heterogeneous job: each rank is one parameter-server shard
(``ps``), sparse trainer (``sparse``) or dense trainer (``dense``).

``HOROVOD_PRIO_HETER_ROLES`` gives them, comma-separated, each role once:

* counts, filled in the order written: ``ps=1,sparse=1,dense=2`` -> rank 0
  is the shard, rank 1 the sparse trainer, ranks 2-3 the dense trainers;
* explicit rank lists (``+``-separated): ``dense=0+1,sparse=2,ps=3``;
* both: listed roles take their ranks first, counts fill the remaining
  ranks from the lowest, in the order written.

Every role needs at least one rank, every rank exactly one role. The
collectives of a step run on three Horovod process sets, registered at
``hvd.init(process_sets=roles.process_sets())`` and built from the roles
alone (so identical on every rank): ``sparse_ps`` (pulls and pushes of
rows), ``sparse_dense`` (activations and their gradients), ``dense`` (the
dense gradients' allreduce). Pure Python; ``process_sets`` imports
horovod.common (no framework).
"""
import os
import re

from horovod_prio.method.config import register_env_var

ROLES = ("ps", "sparse", "dense")
ENV = "HOROVOD_PRIO_HETER_ROLES"
register_env_var(ENV)   # read here, not a PriorityConfig knob: never "unknown"
_SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class Roles:
    """role -> sorted ranks of a job of ``size`` ranks (see the module doc)."""

    def __init__(self, ranks, size):
        self.size = size
        self.ranks = {r: tuple(sorted(ranks[r])) for r in ROLES}
        self._sets = None

    def role(self, rank):
        for r in ROLES:
            if rank in self.ranks[r]:
                return r
        raise ValueError("rank %r is not in this job of %d ranks" % (rank, self.size))

    def set_ranks(self):
        """name -> ranks of the three collectives' process sets."""
        return {
            "sparse_ps": tuple(sorted(self.ranks["sparse"] + self.ranks["ps"])),
            "sparse_dense": tuple(sorted(self.ranks["sparse"] + self.ranks["dense"])),
            "dense": self.ranks["dense"],
        }

    def process_sets(self):
        """The Horovod ProcessSets to pass to ``hvd.init(process_sets=...)``
        (created once per Roles). None covers every rank (every role has a
        rank), so none duplicates Horovod's global set."""
        if self._sets is None:
            from horovod.common.process_sets import ProcessSet
            self._sets = {name: ProcessSet(list(ranks)) for name, ranks in self.set_ranks().items()}
        return list(self._sets.values())

    def process_set(self, name):
        """The registered set called ``name`` (``process_sets()`` first)."""
        if self._sets is None:
            self.process_sets()
        return self._sets[name]

    def format(self):
        return ", ".join("%s=%s" % (r, "+".join(map(str, self.ranks[r]))) for r in ROLES)

    __str__ = format


def parse(text, size, field=ENV):
    """``text`` (the module doc's syntax) for a job of ``size`` ranks ->
    :class:`Roles`; a ValueError names the field and what is wrong."""
    if not isinstance(size, int) or size < 1:
        raise ValueError("%s: job size %r is not a positive number of ranks" % (field, size))
    if size < len(ROLES):
        raise ValueError("%s: a heterogeneous job needs at least 3 ranks (one ps, one sparse, "
                         "one dense trainer); this job has %d" % (field, size))
    counts, lists, order = {}, {}, []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in ROLES:
            raise ValueError("%s=%r: %r is not role=count or role=rank+rank (roles: %s)"
                             % (field, text, item, ", ".join(ROLES)))
        if name in order:
            raise ValueError("%s=%r: role %r is given twice" % (field, text, name))
        order.append(name)
        if re.fullmatch(r"\d+(\+\d+)+|\[\d+(\+\d+)*\]", value):
            lists[name] = [int(v) for v in value.strip("[]").split("+")]
        elif re.fullmatch(r"\d+", value):
            counts[name] = int(value)
        else:
            raise ValueError("%s=%r: %s=%r is neither a count nor a rank list like 0+2 or [3]"
                             % (field, text, name, value))
    for name in ROLES:
        if name not in order:
            raise ValueError("%s=%r: role %r is missing; every role needs at least one rank"
                             % (field, text, name))
        if counts.get(name, 1) < 1:
            raise ValueError("%s=%r: %s=0; every role needs at least one rank" % (field, text, name))
    ranks, taken = {}, {}
    for name, rs in lists.items():
        for r in rs:
            if r >= size:
                raise ValueError("%s=%r: %s lists rank %d, the job has ranks 0-%d"
                                 % (field, text, name, r, size - 1))
            if r in taken:
                raise ValueError("%s=%r: rank %d is both %s and %s"
                                 % (field, text, r, taken[r], name))
            taken[r] = name
        ranks[name] = rs
    free = [r for r in range(size) if r not in taken]
    need = sum(counts.values())
    if need != len(free):
        raise ValueError("%s=%r: the roles cover %d ranks, the job has %d"
                         % (field, text, need + len(taken), size))
    for name in order:
        if name in counts:
            ranks[name], free = free[:counts[name]], free[counts[name]:]
    return Roles(ranks, size)


def _first_env(names, environ):
    for n in names:
        v = environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ValueError("%s=%r is not an integer" % (n, v)) from None
    return None


def from_env(environ=None, size=None):
    """Roles from ``HOROVOD_PRIO_HETER_ROLES`` before ``hvd.init`` (the job
    size from horovodrun's / Open MPI's variables unless given)."""
    environ = os.environ if environ is None else environ
    text = environ.get(ENV)
    if not text:
        raise ValueError("%s is not set: give e.g. ps=1,sparse=1,dense=1" % ENV)
    if size is None:
        size = _first_env(_SIZE_VARS, environ)
        if size is None:
            raise ValueError("%s: the job size is unknown before hvd.init (none of %s is set); "
                             "launch with horovodrun or pass size=" % (ENV, ", ".join(_SIZE_VARS)))
    return parse(text, size)
