"""Extension points: a lower layer calls them, the package root wires them to a higher layer.

The layer table (DESIGN.md) forbids the engine to import episodes, yet the issue's API is a
method of the engine: ``async with engine.episode(task) as ep``. So the engine calls
:data:`episode_opener`, and ``sandloop/__init__.py`` (which runs before any ``sandloop.*``
module, and belongs to no layer) sets it to a function that imports ``sandloop.episodes`` when
first called. Nothing here imports anything: the engine stays free of the layers above it, and
``import sandloop.engine`` does not pay for episodes (~150 ms) until one is opened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["episode_opener"]

# (engine, task, config, **keywords) -> an async context manager yielding an Episode.
episode_opener: Callable[..., Any] | None = None
