"""The patent's method, pure Python (no TensorFlow, no compiled code).

* :mod:`.sequence` - task sequence, group partition, base priorities (claim 5);
* :mod:`.policy` - the adaptive priority policy (claims 1-4);
* :mod:`.plan` - gradients -> tasks -> groups -> chunks (what is sent when);
* :mod:`.config` - :class:`PriorityConfig`, every knob validated, read once;
* :mod:`.units` - the one parser of each kind of input (byte sizes, counts, ...).
"""
