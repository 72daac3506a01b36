"""Opening a command's result store (``--db`` / ``--no-db``), kept apart from ``cli/score``.

``exec-batch``, ``monitor`` and ``tasks`` open the store too; importing it from ``cli/score``
pulled the scorer, the monitor and numpy into their start-up (about a third of a second).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandloop.settings import Settings
    from sandloop.store import ResultStore

__all__ = ["open_result_store"]


def open_result_store(db: Path | None, no_db: bool,
                      settings: Settings | None = None) -> ResultStore | None:
    """The result store of a command: ``--db``, else the project's
    (:func:`sandloop.settings.default_db_path`); None with ``--no-db``. Raises StoreError naming
    the path when it cannot be opened."""
    if no_db:
        return None
    from sandloop.settings import default_db_path
    from sandloop.store import ResultStore, StoreError

    path = db or default_db_path(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return ResultStore(path)
    except (StoreError, OSError) as e:
        raise StoreError(f"result store {path}: {e}") from None
