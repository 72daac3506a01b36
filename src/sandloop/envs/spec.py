"""Environment specs: what a runtime environment holds, read from TOML (or YAML) and checked.

A spec names everything that goes into a build, pinned (see docs/environments.md)::

    name = "py-data"
    description = "numpy for data tasks"

    [python]                       # the interpreter and its standard library, copied from the host
    version = "3.11"               # must match the host interpreter (major.minor); optional
    packages = ["numpy==2.4.6"]    # exact pins only; installed with --no-deps, so this is the lock
    lock = "requirements.lock"     # or a pip requirements file of exact pins (and --hash=...)
    preload = ["numpy"]            # imported by the build's check and by the environment's zygotes

    [node]                         # optional: node_modules from an npm lockfile (npm ci)
    package = "package.json"       # next to it: package-lock.json

    [system]
    packages = ["libgomp1"]        # host distribution packages the environment needs (versions recorded)

    [files]                        # extra files under /opt/env (text)
    "data/words.txt" = "a\\nb\\n"

    [env]                          # environment variables of every run
    OMP_NUM_THREADS = "1"

    [determinism]
    hash_seed = 0                  # PYTHONHASHSEED
    locale = "C.UTF-8"
    timezone = "UTC"
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandloop.envs.errors import SpecError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# name==version, nothing looser: the spec is the lock, so "numpy>=2" would build differently
# tomorrow than today. Extras are refused because packages install with --no-deps (an extra
# would silently install nothing).
PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
HASH_RE = re.compile(r"^--hash=(sha256|sha384|sha512):[0-9a-f]{64,128}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the sandbox owns: a spec setting them would break the run or its isolation.
RESERVED_ENV = frozenset({"PATH", "HOME", "TMPDIR", "USER", "PYTHONHASHSEED", "LANG", "LC_ALL",
                          "TZ", "PYTHONHOME", "PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH",
                          "LD_AUDIT", "NODE_PATH"})


class Pin(BaseModel):
    """One exact package pin, with the artifact hashes pip must check (if any)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str
    hashes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, line: str) -> Pin:
        """``numpy==2.4.6 --hash=sha256:...``, as in a pip requirements file."""
        tokens = line.split()
        if not tokens:
            raise SpecError("an empty package pin; write name==version")
        m = PIN_RE.match(tokens[0])
        if not m:
            raise SpecError(f"package {tokens[0]!r} is not an exact pin; write name==version "
                            "(e.g. numpy==2.4.6): the spec is the lock, ranges would resolve "
                            "differently over time")
        hashes = tuple(tokens[1:])
        for h in hashes:
            if not HASH_RE.match(h):
                raise SpecError(f"{tokens[0]}: {h!r} is not --hash=sha256:<hex>")
        return cls(name=_canonical(m.group(1)), version=m.group(2),
                   hashes=tuple(sorted(h.removeprefix("--hash=") for h in hashes)))

    def requirement(self) -> str:
        """The pip requirements line for this pin."""
        return " ".join([f"{self.name}=={self.version}", *(f"--hash={h}" for h in self.hashes)])


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class PythonSpec(BaseModel):
    """The Python runtime: the host interpreter's copy plus pinned packages."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str | None = Field(None, description="major.minor the host interpreter must have")
    interpreter: str | None = Field(
        None, description="host interpreter to copy (default: the one running sandloop's base "
                          "installation, or $SANDLOOP_PYTHON)")
    packages: tuple[Pin, ...] = ()
    preload: tuple[str, ...] = ()

    @field_validator("version")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"3\.\d+", v):
            raise ValueError(f"python version {v!r}: write major.minor, e.g. '3.11'")
        return v

    @field_validator("preload")
    @classmethod
    def _preload(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for mod in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", mod):
                raise ValueError(f"preload {mod!r} is not a module name")
        return v


class NodeSpec(BaseModel):
    """node_modules installed by ``npm ci`` from a package.json and its package-lock.json."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    package_json: str = Field(description="package.json text")
    lockfile: str = Field(description="package-lock.json text")


class SystemSpec(BaseModel):
    """Host distribution packages the environment relies on (served by the host's /usr)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    packages: tuple[str, ...] = ()

    @field_validator("packages")
    @classmethod
    def _names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", p):
                raise ValueError(f"system package {p!r} is not a Debian package name")
        return tuple(sorted(set(v)))


class Determinism(BaseModel):
    """What every run of the environment pins (docs/environments.md, "Reproducibility")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hash_seed: int = Field(0, ge=0, le=4294967295, description="PYTHONHASHSEED")
    locale: str = Field("C.UTF-8", pattern=r"^[A-Za-z0-9_.@-]+$")
    timezone: str = Field("UTC", pattern=r"^[A-Za-z0-9_+/-]+$")

    def env_vars(self, hash_seed: int | None = None) -> dict[str, str]:
        """The variables that pin it; ``hash_seed`` overrides the spec's (a seed per task)."""
        seed = self.hash_seed if hash_seed is None else hash_seed
        return {"PYTHONHASHSEED": str(seed), "LANG": self.locale, "LC_ALL": self.locale,
                "TZ": self.timezone}


class EnvSpec(BaseModel):
    """A whole environment spec, after reading referenced files (lock, package.json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    python: PythonSpec | None = None
    node: NodeSpec | None = None
    system: SystemSpec = Field(default_factory=SystemSpec)
    files: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    determinism: Determinism = Field(default_factory=Determinism)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"name {v!r}: use lowercase letters, digits, '.', '_' and '-' "
                             "(at most 64, starting with a letter or digit)")
        if re.fullmatch(r"[0-9a-f]{6,64}", v):
            raise ValueError(f"name {v!r} looks like an environment id; choose another")
        return v

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, str]) -> dict[str, str]:
        for path in v:
            parts = path.split("/")
            if (not path or path.startswith("/") or "\0" in path
                    or any(p in ("", ".", "..") for p in parts)):
                raise ValueError(f"file {path!r}: give a relative path without '.', '..' or "
                                 "empty components (it lands under /opt/env)")
            if parts[0] in ("python", "node"):
                raise ValueError(f"file {path!r}: python/ and node/ belong to the runtimes")
        # A name that is also another's directory ("a" and "a/b") cannot be built: say so
        # here, as bad input, not as the build's FileExistsError.
        dirs = {path.rsplit("/", k)[0] for path in v for k in range(1, path.count("/") + 1)}
        clash = sorted(dirs & set(v))
        if clash:
            inside = sorted(p for p in v if p.startswith(clash[0] + "/"))[0]
            raise ValueError(f"files {clash[0]!r} and {inside!r} conflict: {clash[0]!r} cannot be "
                             "both a file and a directory")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not ENV_NAME_RE.match(k):
                raise ValueError(f"env {k!r} is not a variable name")
            if k in RESERVED_ENV or k.startswith("SANDLOOP_"):
                raise ValueError(f"env {k!r} is set by the sandbox or [determinism]; "
                                 "remove it from [env]")
            if "\0" in val:
                raise ValueError(f"env {k!r} contains a NUL byte")
        return v


def parse_spec(data: dict[str, Any], base_dir: Path) -> EnvSpec:
    """Check a spec's mapping (from TOML/YAML); ``lock``/``package`` paths are relative to
    ``base_dir``."""
    data = dict(data)
    try:
        py = data.get("python")
        if isinstance(py, dict):
            py = dict(py)
            lines = [str(x) for x in py.pop("packages", []) or []]
            if "lock" in py:
                lines += _requirement_lines(_read(base_dir, str(py.pop("lock")), "python.lock"))
            pins = [Pin.parse(line) for line in lines]
            names = [p.name for p in pins]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise SpecError(f"python packages pinned twice: {', '.join(dup)}")
            py["packages"] = sorted(pins, key=lambda p: p.name)
            data["python"] = py
        node = data.get("node")
        if isinstance(node, dict):
            pkg = str(node.get("package", "package.json"))
            extra = set(node) - {"package"}
            if extra:
                raise SpecError(f"[node]: unknown keys {sorted(extra)}; only 'package' "
                                "(a package.json next to its package-lock.json)")
            data["node"] = {"package_json": _read(base_dir, pkg, "node.package"),
                            "lockfile": _read(base_dir, str(Path(pkg).with_name(
                                "package-lock.json")), "node lockfile")}
        return EnvSpec.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "spec"
        raise SpecError(f"{where}: {first['msg']}") from None


def _read(base: Path, rel: str, what: str) -> str:
    p = base / rel
    try:
        return p.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"{what}: cannot read {p} ({e.strerror}); paths are relative to the "
                        "spec file") from None


def _requirement_lines(text: str) -> list[str]:
    """The requirement lines of a pip requirements file (comments and continuations joined)."""
    joined = re.sub(r"\\\r?\n", " ", text)
    out = []
    for raw in joined.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            if line.startswith("-"):
                raise SpecError(f"lock line {line!r}: options are not allowed in a lock, only "
                                "name==version [--hash=...] lines")
            out.append(line)
    return out


def load_spec(path: str | Path) -> EnvSpec:
    """Read a spec file: ``.toml``, or ``.yaml``/``.yml`` when PyYAML is installed."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise SpecError(f"{p}: cannot read the spec ({e.strerror})") from None
    if p.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise SpecError(f"{p}: YAML specs need PyYAML (pip install pyyaml); or write the "
                            "spec in TOML") from None
        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise SpecError(f"{p}: not valid YAML: {e}") from None
    else:
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise SpecError(f"{p}: not valid TOML: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: a spec is a mapping of sections (name, [python], ...)")
    return parse_spec(data, p.parent)


BUILTIN_LANGUAGES = ("python", "c", "cpp", "javascript", "bash", "java", "go", "rust",
                     "typescript")
# Built-ins beyond the languages': python-pytest is the interpreter with pytest, which grading
# a repository task (episodes) imports in the sandbox. Its pins are pytest's dependencies, exact.
PYTEST_PINS = ("pytest==9.2.0", "iniconfig==2.3.1", "packaging==26.4", "pluggy==1.7.0",
               "pygments==2.21.0")
BUILTIN_ENVIRONMENTS = (*BUILTIN_LANGUAGES, "python-pytest")


def builtin_spec(name: str) -> EnvSpec:
    """The zero-config environment of a language: ``python`` is the host interpreter and its
    standard library only (no site-packages); the others hold no files of their own and record
    the host toolchain they run on (served by the host's /usr)."""
    if name == "python":
        return EnvSpec(name="python", description="the host interpreter and its standard "
                       "library, nothing else", python=PythonSpec())
    if name == "python-pytest":
        return EnvSpec(name=name, description="the host interpreter, its standard library and "
                       "pytest (repository tasks' grading)",
                       python=PythonSpec(packages=tuple(Pin.parse(p) for p in PYTEST_PINS)))
    if name not in _BUILTIN_SYSTEM:
        raise SpecError(f"no built-in environment {name!r}; built-ins: "
                        f"{', '.join(BUILTIN_ENVIRONMENTS)}")
    return EnvSpec(name=name, description=f"the host's {name} toolchain",
                   system=SystemSpec(packages=_BUILTIN_SYSTEM[name]))


# The host distribution packages of each toolchain built-in (their versions are part of the
# resolved spec), and the binaries a run of the language executes (sandbox/languages.py uses
# the same names). Which package really provides each binary, and its version, is recorded
# too (a meta package such as default-jdk-headless keeps its version across OpenJDK updates),
# and the binaries' size and mtime tell ``EnvStore.ensure`` to rebuild after a host upgrade.
_BUILTIN_SYSTEM: dict[str, tuple[str, ...]] = {
    "c": ("gcc", "libc6-dev"), "cpp": ("g++", "libstdc++6"), "javascript": ("nodejs",),
    "bash": ("bash", "coreutils"), "java": ("default-jdk-headless",), "go": ("golang-go",),
    "rust": ("rustc",), "typescript": ("node-typescript", "nodejs"),
}
BUILTIN_TOOLS: dict[str, tuple[str, ...]] = {
    "c": ("gcc",), "cpp": ("g++",), "javascript": ("node",), "bash": ("bash",),
    "java": ("javac", "java", "jar"), "go": ("go",), "rust": ("rustc", "cc"),
    "typescript": ("tsc", "node"),
}


def host_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"
