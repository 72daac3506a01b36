"""The closed loop (``sandloop train``): GRPO through TRL with sandloop rewards, a curriculum and
a hidden-test audit, on a CPU with a tiny model or on a GPU with a real one.

The pure parts (curriculum, toy task set, audit, records) import without the ``train`` extra;
:mod:`sandloop.train.loop` and :mod:`sandloop.train.tiny` need torch, transformers and trl.
"""

from sandloop.train.curriculum import Curriculum, TieredCurriculum

__all__ = ["Curriculum", "TieredCurriculum"]
