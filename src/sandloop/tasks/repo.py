"""Repository tasks: a repository with a bug, and the tests that decide whether a model fixed it.

A :class:`RepoTask` is data only (nothing here runs code): the repository before the fix (files
inline, or read from a directory or tarball when loaded), how to set it up and test it, the gold
fix and the deciding tests as unified diffs, and the pytest node ids that decide the reward:
``fail_to_pass`` (fail before the fix, must pass after) and ``pass_to_pass`` (must keep passing).

The tests that ``test_patch`` adds are hidden: episodes copy them in only at grading time, after
restoring every test file to its original content (docs/episodes.md). JSON form: one task per
JSONL line, ``schema: "sandloop.repo_task/v1"``; SWE-bench-style records (``instance_id``,
``FAIL_TO_PASS``, ...) load too (:func:`from_swebench`).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sandloop.tasks.loaders import TaskFormatError, read_jsonl
from sandloop.tasks.patches import PatchError, apply_patch, patched_paths

__all__ = [
    "REPO_BUILTIN_SETS",
    "REPO_SCHEMA",
    "RepoLimits",
    "RepoTask",
    "bundled_repo_path",
    "from_swebench",
    "is_repo_record",
    "is_repo_set",
    "is_test_path",
    "load_repo_tasks",
    "parse_repo_record",
    "read_snapshot",
]

REPO_SCHEMA = "sandloop.repo_task/v1"
REPO_BUILTIN_SETS = ("repo-demo",)
DEFAULT_TEST_COMMAND = "python -m pytest -q -p no:cacheprovider"
# Where a repository task runs when it names no environment: the built-in with pytest (the
# default environment is the standard library only, and grading imports pytest).
DEFAULT_REPO_ENVIRONMENT = "python-pytest"

# Files that decide how tests run or what they see. Grading restores them to the original and
# deletes new ones, so a model cannot change the rules (a conftest.py that marks every test as
# passed, a pytest.ini that deselects the failing ones).
_TEST_CONFIG = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
                          "sitecustomize.py", "usercustomize.py"})


def is_test_path(path: str) -> bool:
    """Whether ``path`` is a test file or test configuration (restored before grading)."""
    parts = path.split("/")
    name = parts[-1]
    if name in _TEST_CONFIG:
        return True
    if any(p in ("test", "tests", "testing") for p in parts[:-1]):
        return True
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RepoLimits(_Frozen):
    """Bounds for the episode's runs and for grading."""

    command_time_s: float = Field(30.0, gt=0, le=600, description="wall limit of one run / run_tests")
    test_time_s: float = Field(120.0, gt=0, le=3600, description="wall limit of setup and grading")
    memory_mb: int = Field(1024, ge=64, le=16384, description="memory of every run, and the "
                           "size cap of the repository's work dir")
    workdir_mb: int = Field(256, ge=1, le=16384, description="size of the repository's work dir")
    workdir_inodes: int = Field(65536, ge=64, le=1 << 20, description="files in the work dir")
    max_processes: int = Field(128, ge=4, le=4096)


def _hash(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _check_path(p: str) -> str:
    norm = posixpath.normpath(p)
    if not p or p.startswith("/") or norm.startswith("..") or norm != p or "\0" in p:
        raise ValueError(f"file path {p!r} must be relative, normalised, and stay inside the "
                         "repository")
    return p


class RepoTask(_Frozen):
    """One repository task (``kind == "repo"``). ``version`` is a content hash."""

    kind: str = "repo"
    id: str = Field(min_length=1)
    version: str = ""
    problem_statement: str
    files: dict[str, str] = Field(description="the repository before the fix: path -> text")
    environment: str | None = Field(None, description="runtime environment name or id (None: "
                                    "the built-in python-pytest)")

    @property
    def runtime_environment(self) -> str:
        """The environment its sessions run in."""
        return self.environment or DEFAULT_REPO_ENVIRONMENT
    setup: str | None = Field(None, description="bash run once per task in the repository; "
                              "episodes start from its result")
    test_command: str = Field(DEFAULT_TEST_COMMAND,
                              description="bash command of run_tests (the public tests)")
    patch: str | None = Field(None, description="the gold fix, unified diff")
    test_patch: str = Field("", description="unified diff adding the deciding (hidden) tests")
    fail_to_pass: tuple[str, ...] = Field(min_length=1)
    pass_to_pass: tuple[str, ...] = ()
    limits: RepoLimits = Field(default_factory=RepoLimits)
    tags: tuple[str, ...] = ()
    source: str | None = None

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v != "repo":
            raise ValueError("a RepoTask has kind 'repo'")
        return v

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, str]) -> dict[str, str]:
        if not v:
            raise ValueError("a repository task needs at least one file")
        for p in v:
            _check_path(p)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> RepoTask:
        both = set(self.fail_to_pass) & set(self.pass_to_pass)
        if both:
            raise ValueError(f"tests both fail-to-pass and pass-to-pass: {sorted(both)[:3]}")
        try:
            self.hidden_files()
            if self.patch:
                apply_patch(self.files, self.patch)
        except PatchError as e:
            raise ValueError(str(e)) from None
        expected = _hash(self.model_dump(mode="json", exclude={"version"}))
        if not self.version:
            object.__setattr__(self, "version", expected)
        elif self.version != expected:
            raise ValueError(f"version {self.version!r} does not match the content hash "
                             f"{expected!r}: drop 'version' to recompute it")
        return self

    def hidden_files(self) -> dict[str, str | None]:
        """The test files as grading writes them: originals with ``test_patch`` applied
        (None: the test patch deletes the file)."""
        return apply_patch(self.files, self.test_patch) if self.test_patch else {}

    def graded_files(self) -> dict[str, str | None]:
        """What grading writes over the final repository: every original test file and test
        configuration, then the hidden tests on top."""
        out: dict[str, str | None] = {p: c for p, c in self.files.items() if is_test_path(p)}
        out.update(self.hidden_files())
        return out

    def touched_by_test_patch(self) -> list[str]:
        """Paths the hidden test patch changes (they are hidden from the model)."""
        return patched_paths(self.test_patch) if self.test_patch else []

    @property
    def tests(self) -> tuple[str, ...]:
        """Every deciding test id: fail-to-pass, then pass-to-pass."""
        return self.fail_to_pass + self.pass_to_pass

    def to_json(self) -> str:
        """One JSONL line in the native format."""
        return json.dumps({"schema": REPO_SCHEMA, **self.model_dump(mode="json")},
                          ensure_ascii=False, separators=(",", ":"))


def read_snapshot(path: str | Path, *, max_files: int = 20000,
                  max_bytes: int = 64 << 20) -> dict[str, str]:
    """The text files of a directory or tarball (``.tar``, ``.tar.gz``): path -> content.

    Binary files, symlinks and VCS directories are left out. Raises TaskFormatError when the
    snapshot is larger than ``max_files`` files or ``max_bytes`` bytes.
    """
    p = Path(path)
    out: dict[str, str] = {}
    total = 0

    def add(name: str, data: bytes) -> None:
        nonlocal total
        if name.split("/", 1)[0] in (".git", ".hg", ".svn") or "/.git/" in name:
            return
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return
        total += len(data)
        if len(out) >= max_files or total > max_bytes:
            raise TaskFormatError(f"repository snapshot {p} is larger than {max_files} files or "
                                  f"{max_bytes} bytes; trim it")
        out[_check_path(name)] = text

    if p.is_dir():
        for f in sorted(p.rglob("*")):
            if f.is_file() and not f.is_symlink():
                add(f.relative_to(p).as_posix(), f.read_bytes())
    elif p.is_file():
        try:
            with tarfile.open(p) as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        fh = tar.extractfile(m)
                        if fh is not None:
                            add(posixpath.normpath(m.name.removeprefix("./")), fh.read())
        except tarfile.TarError as e:
            raise TaskFormatError(f"cannot read the tarball: {e}", path=str(p)) from None
    else:
        raise TaskFormatError("no such directory or tarball", path=str(p))
    return out


def _resolve_files(rec: dict[str, Any], base: Path | None) -> dict[str, str]:
    files = rec.get("files")
    repo = rec.get("repo_path")
    if files is not None and repo is not None:
        raise TaskFormatError("give either 'files' or 'repo_path', not both", field="files")
    if repo is not None:
        if not isinstance(repo, str):
            raise TaskFormatError("must be a path (string)", field="repo_path")
        rp = Path(repo)
        return read_snapshot(rp if rp.is_absolute() or base is None else base / rp)
    if not isinstance(files, Mapping):
        raise TaskFormatError("must be an object: path -> file content", field="files")
    return dict(files)


def _validated(data: dict[str, Any]) -> RepoTask:
    try:
        return RepoTask.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        raise TaskFormatError(str(err["msg"]), field=field) from None


def parse_repo_record(rec: dict[str, Any], base: Path | None = None) -> RepoTask:
    """A native repo-task record (``schema: sandloop.repo_task/v1``; ``repo_path`` instead of
    ``files`` names a directory or tarball, relative to ``base``)."""
    data = {k: v for k, v in rec.items() if k not in ("schema", "repo_path")}
    data["files"] = _resolve_files(rec, base)
    return _validated(data)


def _ids(v: Any, name: str) -> list[str]:
    if isinstance(v, str):  # SWE-bench ships these lists as JSON strings
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise TaskFormatError("not a JSON list of test ids", field=name) from None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise TaskFormatError("must be a list of pytest node ids", field=name)
    return v


def from_swebench(rec: dict[str, Any], base: Path | None = None) -> RepoTask:
    """A SWE-bench-style record: ``instance_id``, ``problem_statement``, ``files`` (the
    repository before the fix), ``patch``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``,
    optional ``setup``, ``test_command``, ``environment``."""
    for key in ("instance_id", "problem_statement", "FAIL_TO_PASS"):
        if key not in rec:
            raise TaskFormatError("missing", field=key)
    data: dict[str, Any] = {
        "id": rec["instance_id"], "problem_statement": rec["problem_statement"],
        "files": _resolve_files(rec, base), "patch": rec.get("patch"),
        "test_patch": rec.get("test_patch") or "",
        "fail_to_pass": _ids(rec["FAIL_TO_PASS"], "FAIL_TO_PASS"),
        "pass_to_pass": _ids(rec.get("PASS_TO_PASS", []), "PASS_TO_PASS"),
        "source": rec.get("repo") or "swebench",
    }
    for key in ("setup", "test_command", "environment"):
        if rec.get(key) is not None:
            data[key] = rec[key]
    return _validated(data)


def is_repo_record(rec: Mapping[str, Any]) -> bool:
    """Whether a JSON record is a repository task (native or SWE-bench style)."""
    return rec.get("schema") == REPO_SCHEMA or rec.get("kind") == "repo" \
        or {"instance_id", "FAIL_TO_PASS"} <= set(rec)


def is_repo_set(source: str | Path) -> bool:
    """Whether ``source`` names a set of repository tasks: a built-in repo set, or a JSONL
    file whose first record is one (sets are of one kind). False for anything unreadable:
    the loader that is asked for it says what is wrong."""
    if isinstance(source, str) and source in REPO_BUILTIN_SETS:
        return True
    path = Path(source)
    if not path.is_file():
        return False
    records = read_jsonl(path)
    try:
        first = next(records, None)
    except TaskFormatError:
        return False
    finally:
        records.close()  # the file, now
    return first is not None and is_repo_record(first[1])


def bundled_repo_path() -> Path:
    """The file of the bundled set ``repo-demo`` (small Python libraries with bugs to fix)."""
    return Path(__file__).resolve().parent.parent / "data" / "repo_tasks.jsonl"


def load_repo_tasks(source: str | Path) -> list[RepoTask]:
    """Load repository tasks: ``repo-demo`` (bundled) or a JSONL file of native or
    SWE-bench-style records (detected per line). Raises TaskFormatError naming the line."""
    path = bundled_repo_path() if source in REPO_BUILTIN_SETS else Path(source)
    if not path.is_file():
        raise TaskFormatError(f"no such file, and not a built-in repo set "
                              f"({', '.join(REPO_BUILTIN_SETS)})", path=str(path))
    tasks: list[RepoTask] = []
    seen: set[str] = set()
    for lineno, rec in read_jsonl(path):
        try:
            if rec.get("schema") == REPO_SCHEMA or rec.get("kind") == "repo":
                task = parse_repo_record(rec, path.parent)
            elif "instance_id" in rec:
                task = from_swebench(rec, path.parent)
            else:
                raise TaskFormatError(f"not a repository task (keys {sorted(rec)[:8]}); expect "
                                      f"schema {REPO_SCHEMA!r} or SWE-bench fields")
        except TaskFormatError as e:
            raise TaskFormatError(e.reason, path=str(path), line=lineno, field=e.field) from None
        if task.id in seen:
            raise TaskFormatError(f"duplicate task id {task.id!r}", path=str(path), line=lineno)
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise TaskFormatError("no tasks in file", path=str(path))
    return tasks

