"""Bytes a link carries for a TCP stream's payload: the frame rule.

A TCP/IPv4 stream over Ethernet is cut into frames of ``mtu - 52`` payload
bytes (IPv4 header 20, TCP header 20, the timestamp option 12, on by default
in Linux), each ``mtu + 14`` bytes long on the wire (the Ethernet header,
which a qdisc on the sending device counts, as ``tc tbf`` does): 1514 bytes
per 1448 of payload at the Ethernet default MTU of 1500, 4.6 % more than the
payload. ``mtu=0`` means no framing: the link carries the payload only.

The rule is a rate (bytes on the wire per payload byte), as for a long
stream: a transfer's last, partial frame is not rounded up, so the wire
bytes of one message are a lower bound within one frame's headers.

One copy of the rule: the simulator's link (:class:`horovod_prio.sim.engine.
LinkConfig` ``mtu``) and the benchmarks' bounds (``benchmarks.bounds``) both
use it. Pure Python, no imports.
"""
from __future__ import annotations

import math
import numbers

#: bytes of every TCP/IPv4 frame inside the MTU that are not payload
TCP_HEADERS = 52
#: bytes of every frame outside the MTU (the Ethernet header)
ETHERNET_HEADER = 14
#: the Ethernet default MTU (a veth created without one has it)
ETHERNET_MTU = 1500
#: the smallest MTU IPv4 allows
IPV4_MIN_MTU = 68


def check_mtu(mtu, name: str = "mtu") -> int:
    """``mtu`` if it is 0 (no framing) or an integer >= 68; else a ValueError naming ``name``."""
    if (isinstance(mtu, bool) or not isinstance(mtu, numbers.Integral)
            or not (mtu == 0 or mtu >= IPV4_MIN_MTU)):
        raise ValueError(f"{name} must be 0 (no framing) or an integer >= {IPV4_MIN_MTU} "
                         f"(the IPv4 minimum), got {mtu!r}")
    return int(mtu)


def wire_factor(mtu: int) -> float:
    """Bytes on the wire per payload byte: ``(mtu + 14) / (mtu - 52)``; 1 for ``mtu=0``."""
    mtu = check_mtu(mtu)
    if not mtu:
        return 1.0
    return (mtu + ETHERNET_HEADER) / (mtu - TCP_HEADERS)


def wire_bytes(payload: float, mtu: int) -> float:
    """Bytes the link carries for ``payload`` bytes of a TCP stream at ``mtu``."""
    if (isinstance(payload, bool) or not isinstance(payload, numbers.Real)
            or not math.isfinite(payload) or payload < 0):
        raise ValueError(f"payload bytes must be a finite number >= 0, got {payload!r}")
    return payload * wire_factor(mtu)
