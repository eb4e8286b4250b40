"""Benchmark harnesses for horovod_prio (code only; results live in ``results/``).

``python -m benchmarks.run`` creates a network namespace whose loopback is
shaped by ``tc`` (tbf rate, optional netem delay), runs Horovod jobs inside it
(``horovodrun --gloo --network-interface lo``) so that every rank of every job
crosses one bottleneck, and writes JSON results, a markdown table and a PNG.

Modules:

- ``netns``         -- namespace + tc shaping + process-group/namespace cleanup
- ``harness``       -- what the harnesses share: job command/env, the run loop,
                       repeats, progress, preflight, the arbiter process
- ``traces``        -- reading the binding's Chrome traces (grant waits, chunks)
- ``workload``      -- the training script each job runs (``--impl horovod|prio``)
- ``run``           -- scenarios a/b/c on one shaped loopback, CLI
- ``arbiter_bench`` -- two jobs with / without the cross-job arbiter, CLI
- ``report``        -- statistics, markdown table, PNG plot
- ``testbed``       -- racks of host namespaces joined by one shaped uplink, ssh shim
- ``cluster``       -- N jobs on the testbed (horovodrun -H across racks), CLI
- ``results_index`` -- the index of ``results/`` in ``results/README.md``
"""
