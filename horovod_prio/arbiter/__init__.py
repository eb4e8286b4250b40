"""Cross-job link arbiter (``horovod-prio arbiter``). Pure Python, stdlib only.

* :class:`~horovod_prio.arbiter.server.ArbiterServer` -- the service.
* :class:`~horovod_prio.arbiter.client.ArbiterClient` -- the job-side client.
* :class:`~horovod_prio.arbiter.core.Arbiter` -- the grant policy (no I/O).
* :mod:`~horovod_prio.arbiter.protocol` (frames, handshake) and
  :mod:`~horovod_prio.arbiter.transport` (non-blocking framed connection),
  shared by both sides; :func:`~horovod_prio.arbiter.stats.fetch_stats`.

See ``docs/arbiter.md`` for the protocol, configuration and counters.
"""
from .client import ArbiterClient, client_from_config
from .core import Arbiter
from .server import ArbiterServer
from .stats import fetch_stats
from .transport import parse_address

__all__ = ["ArbiterClient", "client_from_config", "ArbiterServer", "Arbiter", "fetch_stats", "parse_address"]
