"""Which heterogeneous-step exchanges the scheduler holds, who holds them,
and their priorities: the one statement of the rule. Pure Python.

The heterogeneous step (``horovod_prio.heter.trainer``, docs/heter.md) moves
keys, rows, activations, activation gradients and row gradients by
alltoall, and allreduces the dense gradients among the dense trainers.

**Priorities: what a step waits for soonest ranks highest.** On the patent's
scale (a group sequence whose last group the next step needs first, base
priorities ``0..N-1``, the adaptive boost raising the last groups):

* the dense allreduce's groups come first in the sequence, lowest: the
  data-parallel plan of the dense part (output side lowest, input side
  highest, :func:`horovod_prio.method.sequence.base_priorities`). The dense
  trainers need the reduced gradients only when the next step's activations
  have arrived, after the next step's pull and the sparse trainers' forward;
* then the row-gradient push: the next step's pull waits for it (a shard
  answers the next keys only after it applied the push; with the next batch
  known, the push carries those keys too), and the pull comes
  before anything the dense trainers do in the next step -- so the push
  ranks above the dense allreduce, which runs beside it on other ranks;
* last, highest: the step's own path -- keys, rows, activations and
  activation gradients. Every rank of the step waits for them now.

Of these only the push and the dense allreduce ever wait for the link at the
same time (a rank runs its exchanges one after the other, and the keys, rows
and activation gradients of a step follow each other on every rank), so the
order acts between them inside the job, and against other jobs' traffic
through the arbiter, where the boost of a slowed heterogeneous job raises
its step's path first.

**Holders: one rank per exchange.** Horovod starts a collective once every
member submitted it, so one member's release order is the collective's; two
members holding one collective could each wait for a grant the other's
granted part keeps from them (the arbiter's credit fits one, the other waits
for its completion, which needs it). The first rank of each role holds what
that role sends (:data:`HELD`); the role's other ranks pass the gate at once,
as every data-parallel rank but rank 0 does.

**What a holder asks for: the whole collective.** Every member of an
alltoall sends its part at once, so with several ranks in the sending role
the link carries all their parts while the holder's request is granted. With
an arbiter, the holder asks for the bytes of every sender's part (every rank
holds the global batch, so the holder computes them: each sparse trainer's
unique keys per table width, the rows and row gradients of those keys, the
global batch's activation gradients): what crosses a link every part
crosses. Without an arbiter a holder runs one exchange at a
time and the local credit holds back only the dense allreduce's chunks, so
its own part's bytes are asked for and nothing is computed. The dense
allreduce's chunks are the data-parallel plan's, asked for as there.

**What is not held: the activations.** A sparse trainer sends them while a
dense trainer may still wait for the previous step's allreduce grant; a
grant held for them would keep the credit from that allreduce while the
activations wait for that dense trainer -- a cycle. Nothing else runs on a
dense trainer meanwhile, so holding them could not order anything.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

from horovod_prio.method.sequence import base_priorities

__all__ = ["EXCHANGES", "HELD", "num_groups", "levels", "priorities", "base_vector",
           "holders", "whole_collective"]

#: The alltoall exchanges of one step, in the order the step runs them.
EXCHANGES = ("keys", "rows", "activations", "activation_grads", "row_grads")

#: What each role's first rank holds (sends through the scheduler): its own
#: part of these exchanges; ``"dense"`` is the dense allreduce's chunks.
HELD = {"sparse": ("keys", "row_grads"), "ps": ("rows",),
        "dense": ("activation_grads", "dense")}

_PATH = ("keys", "rows", "activations", "activation_grads")


def _check_groups(dense_groups):
    if isinstance(dense_groups, bool) or not isinstance(dense_groups, int) or dense_groups < 0:
        raise ValueError("dense_groups must be an int >= 0, got %r" % (dense_groups,))
    return dense_groups


def num_groups(dense_groups: int) -> int:
    """Length of the heterogeneous step's group sequence: the dense
    allreduce's ``dense_groups`` groups, the row-gradient push, the step's path."""
    return _check_groups(dense_groups) + 2


def levels(dense_groups: int) -> Dict[str, int]:
    """Exchange -> its index in the group sequence (``"dense:<g>"`` for the
    dense allreduce's group ``g``)."""
    n = _check_groups(dense_groups)
    out = {"dense:%d" % g: g for g in range(n)}
    out["row_grads"] = n
    out.update({e: n + 1 for e in _PATH})
    return out


def priorities(vector: Sequence[int], dense_groups: int) -> Dict[str, int]:
    """Exchange -> priority under the step's priority ``vector`` (one entry
    per group of :func:`num_groups`: the base priorities, or the monitor's
    boosted ones)."""
    if len(vector) != num_groups(dense_groups):
        raise ValueError("priority vector: %d entries for %d dense groups, expected %d"
                         % (len(vector), dense_groups, num_groups(dense_groups)))
    return {e: int(vector[i]) for e, i in levels(dense_groups).items()}


def base_vector(dense_groups: int) -> List[int]:
    """The unboosted vector (:func:`horovod_prio.method.sequence.base_priorities`)."""
    return base_priorities(num_groups(dense_groups))


def holders(role_ranks: Dict[str, Sequence[int]]) -> Dict[str, int]:
    """Role -> the rank that holds its sends (its first rank)."""
    out = {}
    for role in HELD:
        ranks = sorted(role_ranks.get(role, ()))
        if not ranks:
            raise ValueError("role %r has no rank" % role)
        out[role] = ranks[0]
    return out


def whole_collective(role: str, role_ranks: Dict[str, Sequence[int]], arbiter: bool) -> bool:
    """Whether ``role``'s holder asks for its held alltoalls with every
    sender's part (see the module doc): with an arbiter, and the role has
    several ranks (with one, its part is the whole)."""
    if role not in HELD:
        raise ValueError("role %r: give one of %s" % (role, ", ".join(sorted(HELD))))
    return bool(arbiter) and len(role_ranks.get(role, ())) > 1
