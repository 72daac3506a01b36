"""API keys: bearer tokens stored only as SHA-256 hashes, with per-key rate limits and quotas.

The keys file is JSON: ``{"keys": [{"id": "trainer-a", "sha256": "<hex>", "rate": 50,
"burst": 100, "max_runs": 1000000, "max_concurrent": 256, "weight": 1.0, "max_sessions": 8}]}``.
Only ``id`` and ``sha256`` are required; ``max_sessions`` overrides the server's sessions-per-key
cap. ``sandloop serve`` never sees a token in clear except in requests; tokens are random
(``sl-`` + 32 random bytes), so a plain SHA-256 is enough (no password stretching). Create keys
with ``sandloop add-key --keys-file F --id NAME``. Quota use (``max_runs``) is kept in a
:class:`~sandloop.server.usage.UsageLedger` when one is attached, so it survives restarts;
rate-limit buckets and in-flight counts are live state and start afresh.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandloop.engine.scheduling import TokenBucket
from sandloop.errors import InputError, ServerError
from sandloop.server.usage import UsageLedger, UsageLedgerError

__all__ = [
    "ANONYMOUS",
    "KeyPolicy",
    "KeyRecord",
    "KeyStore",
    "KeysFileError",
    "Refused",
    "add_key",
    "generate_token",
    "hash_token",
    "tenant_run",
    "tenant_runs",
]

ANONYMOUS = "anonymous"


def tenant_run(key_id: str, run_id: str | None) -> str:
    """The live monitor's name for ``key_id``'s training run ``run_id``: runs are the key's
    own (one tenant's dashboard, statistics and alerts are never another's, and no one posts
    into another's run). Without keys (one tenant on loopback) the run's own name."""
    run = run_id or "default"
    return run if key_id == ANONYMOUS else f"{key_id}/{run}"


def tenant_runs(key_id: str, runs: list[str]) -> list[str]:
    """Of the monitor's ``runs``, those of ``key_id`` (see :func:`tenant_run`)."""
    return runs if key_id == ANONYMOUS else [r for r in runs if r.startswith(key_id + "/")]


class KeysFileError(ServerError, InputError):
    """The keys file is missing or malformed (the message names the file and the entry)."""


class KeyRecord(BaseModel):
    """One API key as stored: its id, the hash of its token, and its limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    rate: float | None = Field(None, gt=0, description="runs per second (token bucket)")
    burst: float | None = Field(None, ge=1, description="runs at once; default max(1, rate)")
    max_runs: int | None = Field(None, ge=0, description="total runs allowed (quota)")
    max_concurrent: int | None = Field(None, ge=1, description="requests in flight at once")
    weight: float = Field(1.0, gt=0, description="fair share among keys at one priority")
    max_sessions: int | None = Field(None, ge=0, description="sessions open at once; default: "
                                     "the server's --max-sessions-per-key")


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[KeyRecord] = Field(default_factory=list)


def generate_token() -> str:
    """A new random API token."""
    return "sl-" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


_REFUSED_CODES = {401: "unauthorized", 403: "forbidden", 429: "too_many_requests",
                  503: "unavailable"}


class Refused(Exception):
    """A request the key's policy refuses: ``status`` is the HTTP code (401, 403, 429, 503),
    ``code`` the error reply's code (default: by status)."""

    def __init__(self, status: int, message: str, retry_after_s: float | None = None, *,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        self.code = code or _REFUSED_CODES.get(status, f"http_{status}")


@dataclass
class KeyPolicy:
    """The live state of one key: its token bucket, runs used, requests in flight."""

    record: KeyRecord
    bucket: TokenBucket | None = None
    runs: int = 0
    inflight: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    ledger: UsageLedger | None = None  # where quota use is kept (else in memory only)

    @property
    def id(self) -> str:
        return self.record.id

    def _over_quota(self) -> Refused:
        r = self.record
        return Refused(429, f"key {r.id!r} has used {self.runs} of its quota of {r.max_runs} "
                            "runs; ask the operator to raise max_runs", code="quota_exceeded")

    def admit(self, runs: int) -> None:
        """Charge ``runs`` runs to this key or raise :class:`Refused` (429; 503 when the quota
        ledger cannot be written)."""
        r = self.record
        if r.max_runs is not None and self.runs + runs > r.max_runs:
            raise self._over_quota()
        if r.max_concurrent is not None and self.inflight >= r.max_concurrent:
            raise Refused(429, f"key {r.id!r} already has {self.inflight} requests in flight "
                               f"(max_concurrent={r.max_concurrent}); wait for results",
                          retry_after_s=0.5, code="too_many_in_flight")
        if self.bucket is not None and runs > 0:
            if runs > self.bucket.burst:
                raise Refused(429, f"{runs} runs in one request exceed key {r.id!r}'s burst of "
                                   f"{self.bucket.burst:g}; split the batch", code="over_burst")
            wait = self.bucket.take(time.monotonic(), runs)
            if wait > 0:
                raise Refused(429, f"key {r.id!r} exceeded its rate limit of {r.rate:g} runs/s; "
                                   f"retry in {wait:.3f} s", retry_after_s=wait, code="rate_limited")
        if r.max_runs is None or self.ledger is None:
            self.runs += runs
            return
        # The ledger decides: another server process may share it.
        try:
            charged, self.runs = self.ledger.charge(r.id, runs, r.max_runs)
        except UsageLedgerError as e:
            raise Refused(503, f"cannot record key {r.id!r}'s quota use: {e}",
                          retry_after_s=1.0, code="quota_ledger_unavailable") from None
        if not charged:
            raise self._over_quota()


class KeyStore:
    """The configured keys (hash -> policy). Empty means no keys: anonymous loopback access."""

    def __init__(self, records: list[KeyRecord]) -> None:
        self._by_hash: dict[str, KeyPolicy] = {}
        ids: set[str] = set()
        for rec in records:
            if rec.id in ids:
                raise KeysFileError(f"duplicate key id {rec.id!r}")
            ids.add(rec.id)
            bucket = (TokenBucket(rec.rate, rec.burst or max(1.0, rec.rate), time.monotonic())
                      if rec.rate is not None else None)
            self._by_hash[rec.sha256] = KeyPolicy(rec, bucket)
        self.anonymous = KeyPolicy(KeyRecord(id=ANONYMOUS, sha256="0" * 64))

    @classmethod
    def load(cls, path: Path | None) -> KeyStore:
        """The keys in ``path`` (no keys for None). Raises :class:`KeysFileError` for a file
        that cannot be read or is not a keys file."""
        if path is None:
            return cls([])
        data = _read_keys_json(path)
        try:
            parsed = _KeysFile.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            raise KeysFileError(f"{path}: {loc}: {err['msg']}") from None
        except RecursionError:  # a value nested too deeply for the validator
            raise KeysFileError(f"{path}: not a keys file (JSON nested too deeply)") from None
        return cls(parsed.keys)

    @property
    def enabled(self) -> bool:
        return bool(self._by_hash)

    def attach_ledger(self, ledger: UsageLedger) -> None:
        """Keep quota use in ``ledger`` from now on, starting from what it already holds."""
        for pol in self._by_hash.values():
            pol.ledger = ledger
            pol.runs = ledger.used(pol.id)

    def policies(self) -> list[KeyPolicy]:
        return list(self._by_hash.values())

    def authenticate(self, token: str | None) -> KeyPolicy:
        """The key's policy for ``token``; anonymous when no keys are configured; else 401."""
        if not self._by_hash:
            return self.anonymous
        if not token:
            raise Refused(401, "missing API key: send 'Authorization: Bearer <key>' (or, on "
                               "compatibility endpoints, '?api_key=<key>' or '/k/<key>/...')")
        digest = hash_token(token)
        # Constant-time comparison against every stored hash (a handful of keys).
        found: KeyPolicy | None = None
        for h, pol in self._by_hash.items():
            if hmac.compare_digest(h, digest):
                found = pol
        if found is None:
            raise Refused(401, "invalid API key")
        return found


def _read_keys_json(path: Path) -> Any:
    """The JSON in ``path``; :class:`KeysFileError` if it cannot be read or parsed.

    ``json.loads`` raises RecursionError (not a JSONDecodeError) on arrays or objects nested
    some thousands deep; caught here, so such a file is a bad keys file (exit 2), not an
    internal error of the server."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise KeysFileError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise KeysFileError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise KeysFileError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise KeysFileError(f"{path}: not a keys file (JSON nested too deeply)") from None


def add_key(path: Path, key_id: str, **limits: Any) -> str:
    """Create a key ``key_id`` in the keys file at ``path`` (created if missing, mode 0600);
    returns the token, which is shown only once."""
    data: dict[str, Any] = {"keys": []}
    if path.exists():
        # Validated as a whole first: a key appended to a file the server cannot load would
        # only fail later, at ``serve``; and a JSON array here used to crash the appending.
        KeyStore.load(path)
        data = _read_keys_json(path)
    token = generate_token()
    rec = KeyRecord(id=key_id, sha256=hash_token(token),
                    **{k: v for k, v in limits.items() if v is not None})
    if any(k.get("id") == key_id for k in data.get("keys", [])):
        raise KeysFileError(f"{path}: key id {key_id!r} already exists")
    data.setdefault("keys", []).append(rec.model_dump(exclude_none=True))
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
    os.replace(tmp, path)
    return token
