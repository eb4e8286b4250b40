"""Heterogeneous trainers (patent CN112329919B): layers placed on sparse or
dense trainers by the op types of their forward and backward graphs, embedding
tables sharded over parameter-server shards, one synchronous step over Horovod
collectives on process sets. See docs/heter.md.

Submodules: ``placement`` (layer -> kind, TF only to trace graphs),
``tape_placement`` (the variables of a tape-based step -> kind), ``roles``
(rank -> role, process sets; pure Python), ``ps`` (the shards and their
optimizers, TF math), ``trainer`` (the step, TF + Horovod). This package root
imports no TensorFlow.
"""
