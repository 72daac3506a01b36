"""Task.environment (issue 17): optional, validated, and left out of the content hash when unset,
so that the versions of tasks stored before the field existed do not change."""

from __future__ import annotations

import pytest

from sandloop.tasks.models import Task

BASE = {"id": "t", "entry_point": "f",
        "hidden_tests": [{"kind": "call", "name": "a", "args": [1], "expected": 1}]}


def test_version_without_environment_is_unchanged() -> None:
    # 7678c21da1129c92: this task's version before Task had an environment field.
    assert Task.model_validate(BASE).version == "7678c21da1129c92"
    assert Task.model_validate({**BASE, "version": "7678c21da1129c92"}).environment is None


def test_environment_counts_when_set() -> None:
    numpy = Task.model_validate({**BASE, "environment": "py-numpy"})
    assert numpy.environment == "py-numpy"
    assert numpy.version not in ("7678c21da1129c92",
                                 Task.model_validate({**BASE, "environment": "python"}).version)
    with pytest.raises(ValueError, match="not an environment name"):
        Task.model_validate({**BASE, "environment": "/opt/env"})
