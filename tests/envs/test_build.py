"""Building environments for real: the built-in Python environment copied from this host, and a
numpy environment from the registry this machine reaches. The trees' interpreters run directly
(outside a sandbox) with -I and a clean environment, as the sandbox will run them."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sandloop.envs import EnvBuildError, EnvNotFound, EnvStore, load_spec, parse_spec
from sandloop.envs.build import probe_interpreter
from sandloop.envs.elf import _runpath_slots

ROOT = Path(__file__).resolve().parents[2]
CLEAN = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}


def run_in(exe: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), "-I", "-c", code], capture_output=True, text=True,
                          env=CLEAN, timeout=120)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> EnvStore:
    return EnvStore(tmp_path_factory.mktemp("envstore"))


@pytest.fixture(scope="module")
def python_env(store: EnvStore):  # type: ignore[no-untyped-def]
    return store.ensure("python")


def test_builtin_python_runs_stdlib_only(python_env) -> None:  # type: ignore[no-untyped-def]
    exe = python_env.environment().host_python
    assert exe is not None and exe.is_file()
    r = run_in(exe, "import sys, ssl, sqlite3, ctypes, decimal, json; print(sys.version)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == ".".join(map(str, sys.version_info[:3]))
    # The supervisor's packages are not there: the tree has no site-packages of the host.
    for mod in ("fastapi", "pydantic", "uvicorn", "sandloop", "numpy"):
        r = run_in(exe, f"import {mod}")
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, mod


def test_tree_names_no_host_path(python_env) -> None:  # type: ignore[no-untyped-def]
    """No text file of the tree names the host installation or the store, and the binaries
    find libpython relative to themselves ($ORIGIN), not through the host prefix."""
    tree = python_env.tree
    host_prefix = probe_interpreter(sys.executable)["base_prefix"].encode()
    store_path = str(Path(python_env.path).parent).encode()
    for dirpath, _dirs, files in os.walk(tree):
        for name in files:
            p = Path(dirpath) / name
            if p.is_symlink():
                assert not os.readlink(p).startswith("/"), p
                continue
            data = p.read_bytes()
            assert store_path not in data, p
            if data[:4] == b"\x7fELF":
                for start, length in _runpath_slots(data):
                    assert data[start:start + length].startswith(b"$ORIGIN"), p
            elif b"\0" not in data:
                assert host_prefix not in data, p
    r = run_in(python_env.environment().host_python,
               "import sysconfig; print(sysconfig.get_config_var('prefix'))")
    assert r.stdout.strip() == "/opt/env/python"


def test_tree_is_read_only_and_skips_host_extras(python_env) -> None:  # type: ignore[no-untyped-def]
    lib = next((python_env.tree / "python" / "lib").glob("python3.*"))
    assert list((lib / "site-packages").iterdir()) == []
    for gone in ("test", "idlelib", "tkinter", "ensurepip"):
        assert not (lib / gone).exists()
    for dirpath, dirs, files in os.walk(python_env.tree):
        for name in dirs + files:
            st = os.lstat(Path(dirpath) / name)
            if not stat.S_ISLNK(st.st_mode):
                assert st.st_mode & 0o222 == 0, name
                assert st.st_mode & 0o444 == 0o444, name  # readable by the sandbox's uids


def test_same_spec_same_id(store: EnvStore, python_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Content addressing: a second build of the same spec, in another store, has the same id;
    a spec differing only in a file gets another."""
    other = EnvStore(tmp_path / "other")
    again = other.build(parse_spec({"name": "again", "python": {}}, tmp_path))
    assert again.id == python_env.id
    changed = other.build(parse_spec({"name": "withfile", "python": {},
                                      "files": {"data/x.txt": "1"}}, tmp_path))
    assert changed.id != python_env.id
    assert (changed.tree / "data" / "x.txt").read_text() == "1"


def test_verify_catches_modified_added_removed_and_mode(store: EnvStore, tmp_path: Path) -> None:
    info = store.build(parse_spec({"name": "victim", "files": {"a.txt": "a", "b.txt": "b",
                                                                "c.txt": "c"}}, tmp_path))
    assert store.verify("victim").ok
    tree = info.tree
    os.chmod(tree, 0o755)
    os.chmod(tree / "a.txt", 0o644)
    (tree / "a.txt").write_text("A")           # modified
    (tree / "b.txt").unlink()                  # removed
    (tree / "d.txt").write_text("d")           # added
    os.chmod(tree / "c.txt", 0o755)            # mode only
    rep = store.verify(info.id[:8])
    assert not rep.ok
    assert rep.modified == ("a.txt", "c.txt") and rep.removed == ("b.txt",)
    assert rep.added == ("d.txt",)
    assert "rebuild" in rep.detail


def test_verify_catches_a_forged_manifest(store: EnvStore, tmp_path: Path) -> None:
    """Editing the manifest to match a modified tree does not pass: the id hashes it."""
    info = store.build(parse_spec({"name": "forged", "files": {"a.txt": "a"}}, tmp_path))
    d = Path(info.path)
    os.chmod(info.tree, 0o755)
    os.chmod(info.tree / "a.txt", 0o644)
    (info.tree / "a.txt").write_text("evil")
    os.chmod(info.tree / "a.txt", 0o444)
    os.chmod(info.tree, 0o555)
    from sandloop.envs import manifest
    os.chmod(d / "manifest.tsv", 0o644)
    (d / "manifest.tsv").write_text(manifest.render(manifest.scan(info.tree)))
    rep = store.verify("forged")
    assert not rep.ok and "id" in rep.detail


def test_names_prefixes_and_removal(store: EnvStore, tmp_path: Path) -> None:
    info = store.build(parse_spec({"name": "gone", "files": {"z.txt": "z"}}, tmp_path))
    assert store.get("gone").id == info.id
    assert store.get(info.id[:10]).id == info.id
    assert store.names()["gone"] == info.id
    store.remove("gone")
    assert not Path(info.path).exists()
    with pytest.raises(EnvNotFound, match="env ls"):
        store.get("gone")
    with pytest.raises(EnvNotFound):
        store.get("nosuchname")


def test_environment_interface(python_env) -> None:  # type: ignore[no-untyped-def]
    env = python_env.environment()
    assert env.python == "/opt/env/python/bin/python3"
    assert env.mounts()[0].target == "/opt/env" and env.mounts()[0].source == python_env.tree
    assert env.env_vars()["PYTHONHASHSEED"] == "0"
    assert env.env_vars(hash_seed=5)["PYTHONHASHSEED"] == "5"
    assert env.env_vars()["TZ"] == "UTC"
    assert env.search_path("/usr/bin:/bin").startswith("/opt/env/python/bin:")


def test_missing_system_package_fails_the_build(store: EnvStore, tmp_path: Path) -> None:
    with pytest.raises(EnvBuildError, match="apt-get install"):
        store.build(parse_spec({"name": "sys", "system": {"packages": ["no-such-pkg-zz"]}},
                               tmp_path))
    assert not list(store.root.glob(".build-*"))  # a failed build leaves nothing behind


def _registry_has_numpy() -> bool:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                            d, "numpy==2.4.6"], capture_output=True, timeout=300)
    return r.returncode == 0


@pytest.fixture(scope="module")
def numpy_env(store: EnvStore):  # type: ignore[no-untyped-def]
    if not _registry_has_numpy():
        pytest.skip("no package registry reachable from this host (pip download numpy failed)")
    return store.build(load_spec(ROOT / "examples" / "envs" / "py-numpy.toml"))


def test_numpy_environment(numpy_env, store: EnvStore) -> None:  # type: ignore[no-untyped-def]
    """The acceptance check of issue 17 that needs no sandbox: numpy builds and imports, the
    supervisor's packages do not, and verify catches a modified numpy file."""
    exe = numpy_env.environment().host_python
    r = run_in(exe, "import numpy; print(numpy.__version__, numpy.arange(4).sum())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2.4.6", "6"]
    assert run_in(exe, "import fastapi").returncode != 0
    assert numpy_env.resolved["python"]["installed"] == ["numpy==2.4.6"]
    f2py = numpy_env.tree / "python" / "bin" / "f2py"
    assert f2py.read_text().splitlines()[0] == "#!/opt/env/python/bin/python3.11"
    assert store.verify("py-numpy").ok
    target = next((numpy_env.tree / "python" / "lib").glob("python3.*/site-packages/numpy/"
                                                           "__init__.py"))
    os.chmod(target, 0o644)
    with open(target, "a") as f:
        f.write("\nimport os  # tampered\n")
    rep = store.verify("py-numpy")
    assert not rep.ok and rep.modified == (str(target.relative_to(numpy_env.tree)),)


def test_unpinned_dependency_fails_with_its_name(store: EnvStore, tmp_path: Path) -> None:
    if not _registry_has_numpy():
        pytest.skip("no package registry reachable from this host")
    spec = parse_spec({"name": "dateutil", "python": {"packages": ["python-dateutil==2.9.0.post0"]}},
                      tmp_path)
    with pytest.raises(EnvBuildError, match="six"):
        store.build(spec)


def test_node_environment_from_lockfile(store: EnvStore) -> None:
    import shutil
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("npm/node not installed")
    try:
        info = store.build(load_spec(ROOT / "examples" / "envs" / "node-leftpad" / "env.toml"))
    except EnvBuildError as e:
        if "npm ci failed" in str(e):
            pytest.skip(f"npm registry not reachable: {e}")
        raise
    env = info.environment()
    assert env.env_vars()["NODE_PATH"] == "/opt/env/node/node_modules"
    r = subprocess.run(["node", "-e", 'console.log(require("left-pad")("x", 3))'],
                       capture_output=True, text=True, timeout=60,
                       env={**CLEAN, "NODE_PATH": str(info.tree / "node" / "node_modules")})
    assert r.stdout == "  x\n", r.stderr


@pytest.mark.parametrize("name", ["java", "go", "rust", "typescript"])
def test_toolchain_builtins_record_the_binaries_they_run(store: EnvStore, name: str) -> None:
    """The new languages have built-ins like c and bash: no files, but the resolved spec
    names the package (and version) behind each binary the sandbox runs, so an upgraded host
    toolchain is another id; results of these languages record it."""
    import shutil

    from sandloop.envs.build import TOOL_PATH
    from sandloop.envs.spec import BUILTIN_TOOLS
    if any(shutil.which(t, path=TOOL_PATH) is None for t in BUILTIN_TOOLS[name]):
        pytest.skip(f"{name} toolchain not installed")
    info = store.ensure(name)
    assert info.builtin and info.files == 0
    chain = info.resolved["toolchain"]
    assert len(chain) >= 1 and all(v != "(no package)" for v in chain.values()), chain
    real = os.path.realpath(shutil.which(BUILTIN_TOOLS[name][0], path=TOOL_PATH) or "")
    assert real in chain and real in info.source["tools"]


def test_a_changed_host_binary_rebuilds_the_builtin_once(store: EnvStore) -> None:
    """ensure() rebuilds a toolchain built-in whose binaries changed since it was built (here:
    its record says another mtime, as after a reinstall), and records the new state, so the
    next ensure() does not rebuild again."""
    first = store.ensure("bash")
    env_json = Path(first.path) / "env.json"
    data = json.loads(env_json.read_text())
    for stats in data["source"]["tools"].values():
        stats[1] -= 10**9  # "built when the binary was a second older"
    os.chmod(env_json, 0o644)
    env_json.write_text(json.dumps(data))
    builds: list[str] = []
    real_build = store._build

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        builds.append(args[0].name)
        return real_build(*args, **kwargs)

    store._build = counting  # type: ignore[method-assign]
    try:
        again = store.ensure("bash")
        assert builds == ["bash"] and again.id == first.id  # same content: same id
        assert again.source["tools"] != data["source"]["tools"]  # the record was refreshed
        store.ensure("bash")
        assert builds == ["bash"]  # ...so it is not rebuilt again
    finally:
        del store._build


Change = Callable[[tarfile.TarInfo, bytes | None], tuple[tarfile.TarInfo, bytes | None]]


def _retar(archive: bytes, change: Change | None = None,
           extra: tuple[tuple[tarfile.TarInfo, bytes | None], ...] = ()) -> bytes:
    """``archive`` rewritten member by member through ``change``, then ``extra`` appended."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive)) as src, \
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        members = []
        for m in src.getmembers():
            f = src.extractfile(m) if m.isfile() else None
            data = f.read() if f is not None else None
            members.append(change(m, data) if change is not None else (m, data))
        for m, data in (*members, *extra):
            if data is not None:
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def test_an_exported_environment_installs_elsewhere_as_the_same_id(
        store: EnvStore, tmp_path: Path) -> None:
    info = store.build(parse_spec({"name": "shipped", "files": {"data/a.txt": "a",
                                                                 "bin/x.sh": "#!/bin/sh\n"}},
                                  tmp_path))
    node = EnvStore(tmp_path / "node")
    got = node.install(store.export("shipped"), info.id)
    assert got.id == info.id and node.verify(info.id).ok
    assert node.names() == {"shipped": info.id}  # the name was new on the node
    assert (got.tree / "data" / "a.txt").read_text() == "a"
    assert node.install(b"not even a tar", info.id).id == info.id  # present: not re-read


def test_an_archive_that_is_not_its_id_is_refused_and_leaves_nothing(
        store: EnvStore, tmp_path: Path) -> None:
    # The threat: a shipped archive slipping other files into runs that trust its id.
    info = store.build(parse_spec({"name": "honest", "files": {"data/a.txt": "a"}}, tmp_path))
    archive = store.export("honest")
    node = EnvStore(tmp_path / "node2")

    def evil_content(m: tarfile.TarInfo, data: bytes | None) -> tuple[tarfile.TarInfo, bytes | None]:
        return m, (b"evil" if m.name == "tree/data/a.txt" else data)

    def escape(m: tarfile.TarInfo, data: bytes | None) -> tuple[tarfile.TarInfo, bytes | None]:
        if m.name == "tree/data/a.txt":
            m.name = "../../outside.txt"
        return m, data

    for bad, match in ((_retar(archive, evil_content), "not that environment"),
                       (_retar(archive, escape), "not that environment"),
                       (b"garbage", "cannot be unpacked")):
        with pytest.raises(EnvBuildError, match=match):
            node.install(bad, info.id)
    with pytest.raises(EnvBuildError, match="not that environment"):
        node.install(archive, "0" * 64)  # a true archive, but of another id
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path.parent / "outside.txt").exists()
    assert sorted(p.name for p in node.root.iterdir()) == ["names"]  # no tree, no leftovers
    assert node.names() == {}


def test_a_refused_archive_writes_nothing_outside_the_store(
        store: EnvStore, tmp_path: Path) -> None:
    # The threat: an archive that is refused only after it is unpacked. tarfile's "tar" filter
    # lets a hard link point at any path on the store's filesystem; a file of the same name
    # extracted after it is written through the link (and the link's mode and owner applied to
    # its target), before the content check ever runs.
    info = store.build(parse_spec({"name": "linked", "files": {"data/a.txt": "a"}}, tmp_path))
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    os.chmod(victim, 0o600)
    link = tarfile.TarInfo("tree/data/b.txt")
    link.type, link.linkname, link.mode = tarfile.LNKTYPE, str(victim), 0o777
    over = tarfile.TarInfo("tree/data/b.txt")
    node = EnvStore(tmp_path / "node3")
    with pytest.raises(EnvBuildError, match="not that environment"):
        node.install(_retar(store.export("linked"), extra=((link, None), (over, b"owned\n"))),
                     info.id)
    assert victim.read_text() == "secret\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert sorted(p.name for p in node.root.iterdir()) == ["names"]
    # Other members the manifest does not list the same way: a device, a file where
    # a directory is, a symlink where a directory is.
    dev = tarfile.TarInfo("tree/data/disk")
    dev.type, dev.devmajor, dev.devminor = tarfile.BLKTYPE, 8, 0
    sym = tarfile.TarInfo("tree/data")
    sym.type, sym.linkname = tarfile.SYMTYPE, "/etc"
    for extra in ((dev, None), (tarfile.TarInfo("tree/data"), b"x"), (sym, None)):
        with pytest.raises(EnvBuildError, match="not that environment"):
            node.install(_retar(store.export("linked"), extra=(extra,)), info.id)
    assert sorted(p.name for p in node.root.iterdir()) == ["names"]


def test_a_sparse_member_is_refused_before_it_is_read(store: EnvStore, tmp_path: Path) -> None:
    # The threat: a sparse member's size is a header's say-so, its holes not in the archive:
    # read (a record) or hashed (a tree file), a terabyte of zeros from a few bytes.
    info = store.build(parse_spec({"name": "sparse", "files": {"a": "a"}}, tmp_path))
    for name in ("env.json", "tree/a"):
        def sparse(m: tarfile.TarInfo, data: bytes | None,
                   name: str = name) -> tuple[tarfile.TarInfo, bytes | None]:
            if m.name == name:
                m.pax_headers = {"GNU.sparse.map": "0,1", "GNU.sparse.size": str(1 << 40)}
                return m, b"x"
            return m, data

        with pytest.raises(EnvBuildError, match=r"cannot be unpacked|not that environment"):
            EnvStore(tmp_path / "node7").install(_retar(store.export("sparse"), sparse), info.id)


def test_an_installed_tree_belongs_to_the_installer_not_the_archives_owners(
        store: EnvStore, tmp_path: Path) -> None:
    # The threat: the manifest leaves owners out, so an archive whose members name another uid
    # (or simply the driver's user, who may be someone else on the node) installs as that id
    # with files that uid owns, and may rewrite (chmod, then write) for every later run.
    info = store.build(parse_spec({"name": "owned", "files": {"data/a.txt": "a"}}, tmp_path))

    def foreign(m: tarfile.TarInfo, data: bytes | None) -> tuple[tarfile.TarInfo, bytes | None]:
        m.uid, m.gid, m.uname, m.gname = 4242, 4242, "", ""
        return m, data

    got = EnvStore(tmp_path / "node4").install(_retar(store.export("owned"), foreign), info.id)
    owners = {os.lstat(Path(d) / n).st_uid for d, ds, fs in os.walk(got.path) for n in ds + fs}
    assert owners == {os.getuid()}


def test_an_archive_cannot_take_a_name_on_the_node(store: EnvStore, tmp_path: Path) -> None:
    # The threat: env.json's name is a label outside the id, so an archive of any true id may
    # call itself "python" (a built-in each node builds from its own toolchain) or a path.
    info = store.build(parse_spec({"name": "labelled", "files": {"a": "a"}}, tmp_path))
    for n, name in enumerate(("python", "../../escaped", "ok\n")):
        def rename(m: tarfile.TarInfo, data: bytes | None,
                   name: str = name) -> tuple[tarfile.TarInfo, bytes | None]:
            if m.name == "env.json" and data is not None:
                data = json.dumps({**json.loads(data), "name": name, "source": {}}).encode()
            return m, data

        node = EnvStore(tmp_path / f"node5-{n}")
        assert node.install(_retar(store.export("labelled"), rename), info.id).id == info.id
        assert node.names() == {}
    with pytest.raises(EnvBuildError, match="not an environment id"):
        EnvStore(tmp_path / "node5-0").install(b"", f"../node5-0/{info.id}")


def test_a_tree_with_hard_links_ships(tmp_path: Path) -> None:
    # tarfile.add writes a second name of the same inode as a hard link, which install refuses
    # (its manifest lists two files): export writes both as files.
    from sandloop.envs import manifest
    from sandloop.envs.store import EnvInfo, compute_id

    d = tmp_path / "driver" / ("e" * 64)
    (d / "tree").mkdir(parents=True)
    (d / "tree" / "one").write_text("same")
    os.link(d / "tree" / "one", d / "tree" / "two")
    text = manifest.render(manifest.scan(d / "tree"))
    resolved = {"format": 1, "spec": {"files": {}}}
    env_id = compute_id(resolved, text)
    d = d.rename(d.parent / env_id)
    (d / "manifest.tsv").write_text(text)
    (d / "env.json").write_text(EnvInfo(id=env_id, name="linked", resolved=resolved,
                                        manifest_sha256=manifest.digest(text),
                                        built_at="2026-01-01T00:00:00+00:00").model_dump_json())
    got = EnvStore(tmp_path / "node6").install(EnvStore(tmp_path / "driver").export(env_id),
                                               env_id)
    assert (got.tree / "two").read_text() == "same" and got.id == env_id
