"""Emulated shared-link benchmark harness for horovod_prio.

``python -m benchmarks.run`` creates a network namespace whose loopback is
shaped by ``tc`` (tbf rate, optional netem delay), runs Horovod jobs inside it
(``horovodrun --gloo --network-interface lo``) so that every rank of every job
crosses one bottleneck, and writes JSON results, a markdown table and a PNG.

Modules:

- ``netns``    -- namespace + tc shaping + process-group/namespace cleanup
- ``workload`` -- the training script each job runs (``--impl horovod|prio``)
- ``run``      -- scenarios, repeats, CLI
- ``report``   -- statistics, markdown table, PNG plot
"""
