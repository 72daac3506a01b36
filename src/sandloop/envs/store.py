"""The content-addressed store of built environments.

Layout under the store directory (``$SANDLOOP_ENV_DIR``, default ``/var/lib/sandloop/envs``:
outside any home and any checkout, so that nothing the sandbox shows names them)::

    <id>/tree/           the read-only tree, mounted at /opt/env in the sandbox
    <id>/manifest.tsv    kind, mode, size, sha256 (or link target), path of every entry
    <id>/env.json        id, name, resolved spec, build timings, source facts
    names/<name>         the id a name points to (the latest build of that spec name)
    .lock                serialises commits and first-use builds between processes

``id = sha256(canonical JSON of the resolved spec + "\\n" + sha256(manifest.tsv))``: the same
resolved spec building the same bytes lands on the same id; any changed file gives another.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from sandloop.envs import manifest
from sandloop.envs.build import build_tree, default_interpreter, tool_stats
from sandloop.envs.environment import MOUNT_POINT, NODE_DIR, PYTHON_DIR, Environment
from sandloop.envs.errors import EnvBuildError, EnvNotFound
from sandloop.envs.spec import (
    BUILTIN_ENVIRONMENTS,
    BUILTIN_TOOLS,
    NAME_RE,
    Determinism,
    EnvSpec,
    builtin_spec,
)

DEFAULT_DIR = "/var/lib/sandloop/envs"
FORMAT = 1


def default_dir() -> Path:
    """``$SANDLOOP_ENV_DIR``, else /var/lib/sandloop/envs."""
    return Path(os.environ.get("SANDLOOP_ENV_DIR") or DEFAULT_DIR)


def compute_id(resolved: dict[str, Any], manifest_text: str) -> str:
    canon = json.dumps(resolved, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{canon}\n{manifest.digest(manifest_text)}".encode()).hexdigest()


class EnvInfo(BaseModel):
    """One built environment's record (its env.json) and where it lies."""

    model_config = ConfigDict(frozen=True)

    format: int = FORMAT
    id: str
    name: str
    description: str = ""
    builtin: bool = False
    resolved: dict[str, Any]
    manifest_sha256: str
    built_at: str
    timings: dict[str, float] = {}
    files: int = 0
    size_bytes: int = 0
    source: dict[str, Any] = {}
    path: str = ""

    @property
    def short_id(self) -> str:
        return self.id[:12]

    @property
    def tree(self) -> Path:
        return Path(self.path) / "tree"

    def environment(self) -> Environment:
        """The sandbox's view of it (environment.py)."""
        spec = self.resolved.get("spec", {})
        py = spec.get("python")
        python = None
        path: list[str] = []
        if py is not None:
            python = f"{MOUNT_POINT}/{PYTHON_DIR}/bin/python3"
            path.append(f"{MOUNT_POINT}/{PYTHON_DIR}/bin")
        extra = dict(spec.get("env") or {})
        if spec.get("node") is not None:
            extra["NODE_PATH"] = f"{MOUNT_POINT}/{NODE_DIR}/node_modules"
            path.append(f"{MOUNT_POINT}/{NODE_DIR}/node_modules/.bin")
        return Environment(
            id=self.id, name=self.name, root=self.tree, python=python,
            preload=tuple((py or {}).get("preload") or ()),
            determinism=Determinism.model_validate(spec.get("determinism") or {}),
            extra_env=extra, path=tuple(path))


class VerifyReport(BaseModel):
    """The outcome of re-hashing an environment."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    ok: bool
    detail: str
    modified: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


class EnvStore:
    """Built environments under one directory."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_dir()

    # -- layout ---------------------------------------------------------------------------
    def _ensure_root(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / "names").mkdir(exist_ok=True)
        except OSError as e:
            raise EnvBuildError(f"cannot create the environment store {self.root} "
                                f"({e.strerror}); set $SANDLOOP_ENV_DIR to a writable "
                                "directory outside any home and checkout") from None

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self._ensure_root()
        with open(self.root / ".lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _read_info(self, d: Path) -> EnvInfo | None:
        try:
            data = json.loads((d / "env.json").read_text(encoding="utf-8"))
            return EnvInfo.model_validate({**data, "path": str(d)})
        except (OSError, ValueError):
            return None

    # -- queries --------------------------------------------------------------------------
    def list(self) -> list[EnvInfo]:
        """Every built environment, newest first."""
        if not self.root.is_dir():
            return []
        out = [i for d in self.root.iterdir()
               if len(d.name) == 64 and d.is_dir() and (i := self._read_info(d)) is not None]
        return sorted(out, key=lambda i: i.built_at, reverse=True)

    def names(self) -> dict[str, str]:
        """name -> id of the environment the name points to."""
        d = self.root / "names"
        if not d.is_dir():
            return {}
        return {p.name: p.read_text().strip() for p in sorted(d.iterdir()) if p.is_file()}

    def get(self, ref: str) -> EnvInfo:
        """An environment by name, full id or unique id prefix (at least 6 characters)."""
        ids: list[str] = []
        target = self.names().get(ref)
        if target is not None:
            ids = [target]
        elif len(ref) >= 6 and all(c in "0123456789abcdef" for c in ref) and self.root.is_dir():
            ids = [d.name for d in self.root.iterdir() if len(d.name) == 64
                   and d.name.startswith(ref)]
        if len(ids) > 1:
            raise EnvNotFound(f"id prefix {ref!r} matches {len(ids)} environments; give more "
                              "characters")
        info = self._read_info(self.root / ids[0]) if ids else None
        if info is None:
            hint = (" (built-in: `sandloop env build " + ref + "`, or built on first use)"
                    if ref in BUILTIN_ENVIRONMENTS else "")
            raise EnvNotFound(f"no environment {ref!r} in {self.root}; `sandloop env ls` "
                              f"lists them, `sandloop env build SPEC` makes one{hint}")
        return info

    # -- changes --------------------------------------------------------------------------
    def build(self, spec: EnvSpec, *, builtin: bool = False,
              log: Callable[[str], None] | None = None) -> EnvInfo:
        """Build ``spec`` and add it to the store (or find its identical twin there); its name
        then points to it."""
        return self._build(spec, builtin=builtin, log=log, locked=False)

    def _build(self, spec: EnvSpec, *, builtin: bool, log: Callable[[str], None] | None,
               locked: bool) -> EnvInfo:
        self._ensure_root()
        say = log or (lambda _msg: None)
        with self._scratch(".build-") as work:
            res = build_tree(spec, work, say, builtin=builtin,
                             tools=BUILTIN_TOOLS.get(spec.name, ()) if builtin else ())
            env_id = compute_id(res.resolved, res.manifest_text)
            entries = manifest.parse(res.manifest_text)
            info = EnvInfo(
                id=env_id, name=spec.name, description=spec.description, builtin=builtin,
                resolved=res.resolved, manifest_sha256=manifest.digest(res.manifest_text),
                built_at=datetime.now(UTC).isoformat(timespec="seconds"),
                timings={k: round(v, 3) for k, v in res.timings.items()},
                files=sum(e.kind == "f" for e in entries),
                size_bytes=sum(e.size for e in entries), source=res.source)
            (work / "manifest.tsv").write_text(res.manifest_text, encoding="utf-8")
            (work / "env.json").write_text(
                info.model_dump_json(indent=2, exclude={"path"}), encoding="utf-8")
            for f in ("manifest.tsv", "env.json"):
                os.chmod(work / f, 0o444)
            os.chmod(work, 0o755)
            final = self.root / env_id
            with contextlib.nullcontext() if locked else self._lock():
                if final.exists():
                    # The same content again (same id): keep the tree. A built-in's record
                    # then says where it was made from now: without this, a built-in whose
                    # source only changed its mtime (a reinstall) kept its old record and
                    # was rebuilt on every first use. ``source`` is not part of the id.
                    if builtin:
                        os.replace(work / "env.json", final / ".env.json.new")
                        os.replace(final / ".env.json.new", final / "env.json")
                else:
                    os.rename(work, final)
                self._point(spec.name, env_id)
            return self._committed(final)

    @contextlib.contextmanager
    def _scratch(self, prefix: str) -> Iterator[Path]:
        """A private directory of the store for a tree being made; removed on the way out
        unless it was moved into place (renamed to its id)."""
        work = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))
        try:
            yield work
        finally:
            if work.exists():
                _remove_tree(work)

    def _committed(self, final: Path) -> EnvInfo:
        got = self._read_info(final)
        assert got is not None, final
        return got

    def _point(self, name: str, env_id: str) -> None:
        tmp = self.root / "names" / f".{name}.tmp"
        tmp.write_text(env_id + "\n")
        os.replace(tmp, self.root / "names" / name)

    def remove(self, ref: str) -> EnvInfo:
        """Delete an environment and the names pointing to it."""
        info = self.get(ref)
        with self._lock():
            for name, target in self.names().items():
                if target == info.id:
                    (self.root / "names" / name).unlink()
            _remove_tree(Path(info.path))
        return info

    def verify(self, ref: str) -> VerifyReport:
        """Re-hash the tree and compare with the manifest and the id."""
        info = self.get(ref)
        d = Path(info.path)
        try:
            recorded = (d / "manifest.tsv").read_text(encoding="utf-8")
            actual = manifest.scan(d / "tree")
        except (OSError, EnvBuildError) as e:
            return VerifyReport(id=info.id, name=info.name, ok=False,
                                detail=f"cannot re-hash: {e}; rebuild it")
        diff = manifest.compare(manifest.parse(recorded), actual)
        base = {"id": info.id, "name": info.name, "modified": diff.changed,
                "added": diff.added, "removed": diff.removed}
        if not diff.clean:
            return VerifyReport(**base, ok=False, detail=f"the tree changed since it was "
                                f"built: {diff.summary()}; rebuild it (`sandloop env rm` "
                                "then `sandloop env build`)")
        if compute_id(info.resolved, recorded) != info.id:
            return VerifyReport(**base, ok=False, detail="env.json or manifest.tsv no longer "
                                "hash to the environment's id; rebuild it")
        return VerifyReport(**base, ok=True, detail=f"{len(actual)} entries match the "
                            "manifest and the id")

    # -- moving between machines ------------------------------------------------------------
    def export(self, ref: str) -> bytes:
        """An environment as one archive (its tree, manifest.tsv and env.json) that
        :meth:`install` accepts in another store: how a cluster's driver ships its build to
        the nodes."""
        info = self.get(ref)
        d = Path(info.path)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in ("env.json", "manifest.tsv", "tree"):
                tar.add(d / name, arcname=name, filter=functools.partial(_no_hard_links, d))
        return buf.getvalue()

    def install(self, archive: bytes, expected_id: str) -> EnvInfo:
        """Add an environment :meth:`export` made elsewhere, if it is ``expected_id``.

        The threat: an archive that is not what its id says (corrupted on the way, or made to
        slip other files into runs that trust that id, or to write outside the store while it
        is unpacked). Nothing is written before its record (env.json, manifest.tsv) hashes to
        ``expected_id``; then every member must be what that manifest lists at its path
        (files of its size, symlinks to its target): no hard links, devices, sparse files or
        other paths. tarfile's ``tar`` filter alone lets a hard link name any file on the
        store's filesystem, and a later member of the same name is written through it. Files
        are the installer's, never the archive's owners. Unpacked into a private directory of
        the store, the files must hash to the manifest, as ``verify`` checks a local build;
        only then does it join the store. A name is pointed at it only where the name is new
        here and not a built-in's (names are labels, outside the id).
        """
        if not _ID_RE.fullmatch(expected_id):
            raise EnvBuildError(f"{expected_id!r} is not an environment id")
        self._ensure_root()
        final = self.root / expected_id
        if (info := self._read_info(final)) is not None:
            return info

        def refused(why: str) -> EnvBuildError:
            return EnvBuildError(f"refused the archive of environment {expected_id[:12]}: it "
                                 f"is not that environment ({why})")

        def unreadable(e: Exception) -> EnvBuildError:
            return EnvBuildError(f"the archive of environment {expected_id[:12]} cannot be "
                                 f"unpacked ({e}); check the build where it came from (`sandloop env verify "
                                 f"{expected_id[:12]}`), or build it on this machine")

        with self._scratch(".install-") as work:
            with contextlib.ExitStack() as stack:
                try:
                    tar = stack.enter_context(
                        tarfile.open(fileobj=io.BytesIO(archive), mode="r:"))
                    members = tar.getmembers()
                    info, recorded = _record(tar, members)
                except (OSError, ValueError, tarfile.TarError, EnvBuildError) as e:
                    raise unreadable(e) from e
                if info.id != expected_id or compute_id(info.resolved, recorded) != expected_id:
                    raise refused("its record does not hash to it")
                if (odd := _unlisted(members, manifest.parse(recorded))) is not None:
                    raise refused(f"{odd.name!r} is not what its manifest lists")
                try:
                    tar.extractall(work, members=members, filter=_installer_owns)
                    actual = manifest.scan(work / "tree")
                except (OSError, ValueError, tarfile.TarError, EnvBuildError) as e:
                    raise unreadable(e) from e
            diff = manifest.compare(manifest.parse(recorded), actual)
            if not diff.clean:
                raise refused(diff.summary())
            with self._lock():
                if not final.exists():  # else the same id came meanwhile: work is dropped
                    os.chmod(work, 0o755)
                    os.rename(work, final)
                if (NAME_RE.fullmatch(info.name) and info.name not in BUILTIN_ENVIRONMENTS
                        and info.name not in self.names()):
                    self._point(info.name, expected_id)
            return self._committed(final)

    def ensure(self, name: str, *, log: Callable[[str], None] | None = None) -> EnvInfo:
        """The named environment; a built-in one (``python``, ``c``, ...) is built from the host
        on first use, and rebuilt when the host interpreter it copied changed."""
        if name not in BUILTIN_ENVIRONMENTS:
            return self.get(name)
        with contextlib.suppress(EnvNotFound):
            info = self.get(name)
            if _source_unchanged(info):
                return info
        with self._lock():  # one process builds; the others wait and then find it
            with contextlib.suppress(EnvNotFound):
                info = self.get(name)
                if _source_unchanged(info):
                    return info
            return self._build(builtin_spec(name), builtin=True, log=log, locked=True)


def _source_unchanged(info: EnvInfo) -> bool:
    """Whether what a built-in was made from is still what the host has: the interpreter it
    copied, or its toolchain's binaries, found again by name (an upgraded gcc, or the JDK
    that /usr/bin/javac now points to, is another build and id)."""
    source = info.source
    tools = BUILTIN_TOOLS.get(info.name)
    if tools is not None:
        return bool(tool_stats(tools) == source.get("tools"))
    exe = source.get("interpreter")
    if not exe:
        return True
    # The built-in copies the configured interpreter ($SANDLOOP_PYTHON, else sandloop's own):
    # another one configured now is another environment.
    if os.path.realpath(default_interpreter()) != os.path.realpath(exe):
        return False
    try:
        st = os.stat(exe)
    except OSError:
        return True  # the host interpreter is gone: the copy still works
    return bool(st.st_size == source.get("size") and st.st_mtime_ns == source.get("mtime_ns"))


_ID_RE = re.compile(r"[0-9a-f]{64}")


def _no_hard_links(d: Path, member: tarfile.TarInfo) -> tarfile.TarInfo:
    """A second name of a file goes into an export as a file: install takes no links between
    files (its manifest lists each as a file)."""
    if member.islnk():
        member = member.replace(deep=False)
        member.type, member.linkname = tarfile.REGTYPE, ""
        member.size = (d / member.name).stat().st_size
    return member


def _record(tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> tuple[EnvInfo, str]:
    """An archive's env.json and manifest.tsv (untrusted until they hash to its id)."""
    by_name = {m.name: m for m in members}

    def read(name: str) -> bytes:
        m = by_name.get(name)
        # Not a sparse member: its holes are not in the archive (a terabyte to read, from it).
        plain = m is not None and m.type in _FILE_TYPES and not m.issparse()
        f = tar.extractfile(m) if plain and m is not None else None
        if f is None:
            raise EnvBuildError(f"no {name}")
        return f.read()

    return EnvInfo.model_validate_json(read("env.json")), read("manifest.tsv").decode()


_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)


def _unlisted(members: list[tarfile.TarInfo],
              entries: list[manifest.Entry]) -> tarfile.TarInfo | None:
    """The first member that is not what the (trusted) manifest lists at its path, if any."""
    want = {f"tree/{e.path}": e for e in entries}
    for m in members:
        e = want.get(m.name)
        if m.name in ("env.json", "manifest.tsv"):
            ok = m.type in _FILE_TYPES
        elif m.name == "tree":
            ok = m.isdir()
        elif e is None:
            ok = False
        elif e.kind == "f":
            ok = m.type in _FILE_TYPES and m.size == e.size
        elif e.kind == "l":
            ok = m.issym() and m.linkname == e.digest
        else:
            ok = e.kind == "d" and m.isdir()
        if not ok:
            return m
    return None


def _installer_owns(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    # Extracting as root would give each file the archive's owner: a uid that could rewrite,
    # on this node, a tree every run trusts (owners are not in the manifest, nor the id).
    return tarfile.tar_filter(member, dest).replace(uid=-1, gid=-1, uname="", gname="",
                                                    deep=False)


def _remove_tree(path: Path) -> None:
    """Delete a sealed (read-only) tree: directories get their write bit back first."""
    for dirpath, dirs, _files in os.walk(path):
        for name in dirs:
            p = Path(dirpath) / name
            if not p.is_symlink():
                os.chmod(p, 0o755)
    if path.exists() and not path.is_symlink():
        os.chmod(path, stat.S_IMODE(path.stat().st_mode) | 0o700)
    shutil.rmtree(path)


def age_s(info: EnvInfo) -> float:
    """Seconds since ``info`` was built."""
    return time.time() - datetime.fromisoformat(info.built_at).timestamp()
