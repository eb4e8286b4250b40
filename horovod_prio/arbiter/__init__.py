"""Cross-job link arbiter (``horovod-prio arbiter``). Pure Python, stdlib only.

* :class:`~horovod_prio.arbiter.server.ArbiterServer` -- the service.
* :class:`~horovod_prio.arbiter.client.ArbiterClient` -- the job-side client.
* :class:`~horovod_prio.arbiter.core.Arbiter` -- the grant policy (no I/O).

See ``docs/arbiter.md`` for the protocol, configuration and counters.
"""
from .client import ArbiterClient, client_from_config, fetch_stats, parse_address
from .core import Arbiter
from .server import ArbiterServer

__all__ = ["ArbiterClient", "client_from_config", "ArbiterServer", "Arbiter", "fetch_stats", "parse_address"]
