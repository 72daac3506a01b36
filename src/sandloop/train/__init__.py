"""The closed loop (``sandloop train``): GRPO through TRL with sandloop rewards, the curation
layer's ``TaskSampler`` as its curriculum and the monitor layer watching every step, on a CPU
with a tiny model or on a GPU with a real one.

The pure parts (toy task set, records, monitoring) import without the ``train`` extra;
:mod:`sandloop.train.loop` and :mod:`sandloop.train.tiny` need torch, transformers and trl.
"""

from sandloop.train.monitoring import LivePoster, RunMonitor

__all__ = ["LivePoster", "RunMonitor"]
