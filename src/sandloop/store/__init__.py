"""Durable records: the SQLite result store (idempotent by key)."""

from sandloop.store.results import ResultKey, ResultStore, StoreError

__all__ = ["ResultKey", "ResultStore", "StoreError"]
