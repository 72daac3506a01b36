"""How each language is compiled and run inside the sandbox."""

from __future__ import annotations

import math
import shlex
import shutil
from dataclasses import dataclass, field

from sandloop.errors import SandboxError
from sandloop.sandbox.models import Limits, canonical_language
from sandloop.sandbox.protocol import TOOLS_DIR as TOOLS_DIR  # re-exported
from sandloop.sandbox.protocol import WORK_DIR as WORK_DIR  # re-exported
from sandloop.sandbox.protocol import ExecMode, ExecSpec

HOST_PATH = "/usr/local/bin:/usr/bin:/bin"
SANDBOX_PATH = f"{TOOLS_DIR}:{HOST_PATH}"


class LanguageUnavailable(SandboxError, RuntimeError):
    """The toolchain for a language is not installed on this host."""


@dataclass(frozen=True)
class Step:
    """One sandboxed process: either exec an argv, or run a Python file in the warm zygote."""

    mode: ExecMode
    argv: tuple[str, ...]
    path: str = ""

    def to_wire(self) -> ExecSpec:
        return {"mode": self.mode, "argv": list(self.argv), "path": self.path}

    def shell(self) -> str:
        """The step as one shell command line (an ``exec`` step only)."""
        return " ".join(shlex.quote(a) for a in self.argv)


@dataclass(frozen=True)
class LanguageSpec:
    """How one language's program is laid out, compiled (if it is) and run.

    A compiled language's compile step runs in a fresh work dir holding the source
    (``main_file``) and ``compile_files``, under ``compile_env`` on top of the common
    environment; it must leave one file, ``binary`` (the artifact), which the run step finds
    in its own fresh work dir (read-only to nothing else: one artifact, many runs)."""

    name: str
    main_file: str
    compile: Step | None
    run: Step
    tools: tuple[str, ...]  # host binaries that must exist
    binary: str = "main"  # what the compile step produces, relative to the work dir
    build_dir: str = ""  # the compile step's scratch directory in its work dir, if any
    native: bool = True  # the artifact is an executable (chmod +x before the run)
    compile_files: dict[str, bytes] = field(default_factory=dict)
    compile_env: dict[str, str] = field(default_factory=dict)
    run_env: dict[str, str] = field(default_factory=dict)

    def check_available(self) -> None:
        missing = [t for t in self.tools if shutil.which(t, path=HOST_PATH) is None]
        if missing:
            raise LanguageUnavailable(
                f"{self.name}: {', '.join(missing)} not found; install it "
                f"(Debian: apt-get install {' '.join(_DEBIAN_PKG.get(t, t) for t in missing)})"
            )

    @property
    def own_files(self) -> frozenset[str]:
        """Work-dir names the language takes for itself (models.OWN_FILES mirrors them)."""
        names = {self.main_file, *self.compile_files}
        if self.compile is not None:
            names.add(self.binary)
        if self.build_dir:
            names.add(self.build_dir)
        return frozenset(names)

    def compile_script(self) -> str:
        """The compile step as a bash script run in the work dir (for callers that run it as
        a program of its own, e.g. the verifier's compile-once path)."""
        assert self.compile is not None
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.compile_env.items())
        return f"{exports}exec {self.compile.shell()}\n"

    def run_script(self) -> str:
        """The run step, on an artifact that a compile step left in the work dir, as a bash
        script (the counterpart of ``compile_script``)."""
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.run_env.items())
        chmod = f"chmod +x ./{self.binary}\n" if self.compile is not None and self.native else ""
        return f"{chmod}{exports}exec {self.run.shell()}\n"


_DEBIAN_PKG = {"gcc": "gcc", "g++": "g++", "node": "nodejs", "bash": "bash",
               "javac": "default-jdk-headless", "java": "default-jdk-headless",
               "jar": "default-jdk-headless", "go": "golang-go", "rustc": "rustc",
               "tsc": "node-typescript", "cc": "gcc"}


def _exe(name: str) -> str:
    return shutil.which(name, path=HOST_PATH) or f"/usr/bin/{name}"


_COMPILED = {"c": ("gcc", "gnu17", "c"), "cpp": ("g++", "gnu++17", "cpp")}  # compiler, -std, ext


def _jvm_flags(memory_mb: int, cpus: float) -> tuple[str, ...]:
    """JVM options for a run within ``memory_mb`` (the cgroup's limit) and ``cpus``.

    The JVM sizes itself from the host (all its RAM, all its cores), not from the cgroup it
    cannot see in the sandbox, so both are given. The heap may grow to the cgroup's limit: a
    memory hog is then killed by the cgroup (``memory_limit``) instead of failing with an
    OutOfMemoryError (a ``runtime_error`` the program could also just print). Serial GC, C1
    only and no perf-data file: the fewest threads (``max_processes`` counts them) and the
    fastest start-up; ``-Xshare:auto`` maps the JDK's class-data archive when there is one."""
    return (
        "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-XX:-UsePerfData",
        f"-XX:MaxRAM={memory_mb}m", f"-Xmx{memory_mb}m", "-Xss64m",
        f"-XX:ActiveProcessorCount={max(1, math.ceil(cpus))}",
    )


# The compile step's scratch space (class files, Go's build cache): in its own work dir, never
# part of the artifact. Relative to the work dir (the compile step's current directory), so the
# unisolated runner (no private /tmp) keeps each compile's scratch apart too.
BUILD_DIR = ".sandloop-build"

# TypeScript is type-checked against the ES2020 library and these declarations of Node's globals
# (Debian packages no @types/node): `process`, `require`, Node modules and timers are typed
# `any`, so programs using them compile, and a type error in the program's own code is still
# a compile error.
TS_NODE_DECLARATIONS = b"""\
// sandloop: Node.js globals for type checking (no @types/node in the sandbox).
declare var process: any;
declare var require: any;
declare var module: any;
declare var exports: any;
declare var Buffer: any;
declare var __dirname: string;
declare var __filename: string;
declare var console: any;
declare var global: any;
declare function setTimeout(cb: (...args: any[]) => void, ms?: number, ...args: any[]): any;
declare function clearTimeout(handle: any): void;
declare function setInterval(cb: (...args: any[]) => void, ms?: number, ...args: any[]): any;
declare function clearInterval(handle: any): void;
declare function setImmediate(cb: (...args: any[]) => void, ...args: any[]): any;
declare function queueMicrotask(cb: () => void): void;
declare class TextEncoder { encode(s?: string): Uint8Array; }
declare class TextDecoder { constructor(label?: string); decode(b?: any): string; }
declare module "*";
"""

_TSC_OPTIONS = ("--target", "es2020", "--module", "commonjs", "--lib", "es2020",
                "--esModuleInterop", "--noEmitOnError", "--pretty", "false")


def spec_for(language: str, argv: tuple[str, ...] = (), main_dir: str = WORK_DIR,
             limits: Limits | None = None, sources: tuple[str, ...] = ()) -> LanguageSpec:
    """The compile and run steps for ``language``; ``argv`` is passed to the program.

    ``main_dir`` is where the program's own file (source or binary) lives during the run step:
    the work dir, or ``/tmp`` for runs in a workspace, whose files must stay the user's own.
    Compilation always happens in a fresh work dir. ``limits`` sizes the runtimes that size
    themselves (the JVM's heap, Go's scheduler and GC); default: ``Limits()``. ``sources``
    names further files of a Go program, built with the main file (the verifier's
    function-call harness: ``main.go`` and the completion's ``solution.go``).
    """
    lang = canonical_language(language)
    limits = limits or Limits()
    w = WORK_DIR
    m = main_dir
    if lang == "python":
        return LanguageSpec("python", "main.py", None,
                            Step("python", argv, path=f"{m}/main.py"), ())
    if lang in _COMPILED:
        compiler, std, ext = _COMPILED[lang]
        return LanguageSpec(
            lang, f"main.{ext}",
            Step("exec", (_exe(compiler), "-O2", f"-std={std}", "-pipe", "-o", f"{w}/main",
                          f"{w}/main.{ext}", "-lm")),
            Step("exec", (f"{m}/main", *argv)), (compiler,))
    if lang == "javascript":
        return LanguageSpec("javascript", "main.js", None,
                            Step("exec", (_exe("node"), f"{m}/main.js", *argv)), ("node",))
    if lang == "bash":
        return LanguageSpec("bash", "main.sh", None,
                            Step("exec", (_exe("bash"), f"{m}/main.sh", *argv)), ("bash",))
    if lang == "java":
        cflags = " ".join(f"-J{f}" for f in _jvm_flags(limits.compile_memory_limit_mb, 1.0))
        # javac writes one class file per class (Main$Node.class, ...): they travel as one
        # jar. A source without a class Main compiles but could never run: a compile error.
        script = (
            f"set -e\n{_exe('javac')} {cflags} -encoding UTF-8 -nowarn -d {BUILD_DIR} "
            f"{w}/Main.java\n"
            f"if [ ! -f {BUILD_DIR}/Main.class ]; then\n"
            "  echo 'error: Main.java must declare a class Main with "
            "public static void main(String[] args)' >&2; exit 1\nfi\n"
            f"exec {_exe('jar')} {cflags} --create --file {w}/main.jar --no-manifest "
            f"-C {BUILD_DIR} .\n")
        return LanguageSpec(
            "java", "Main.java", Step("exec", (_exe("bash"), "-c", script)),
            Step("exec", (_exe("java"), *_jvm_flags(limits.memory_mb, limits.cpus),
                          "-cp", f"{m}/main.jar", "Main", *argv)),
            ("javac", "java", "jar", "bash"), binary="main.jar", native=False,
            build_dir=BUILD_DIR)
    if lang == "go":
        # The go command needs a writable build cache (absolute paths): the compile step's
        # scratch dir. Go 1.19's standard library ships compiled, so the cache starts empty at
        # little cost. No cgo: a static binary, and no C toolchain in the build.
        # No -trimpath (GOFLAGS): the shipped library was built without it, so with it every
        # compile rebuilt the whole standard library (12 s instead of 0.4 s, measured).
        build_env = {"GO111MODULE": "off", "CGO_ENABLED": "0", "GOFLAGS": "",
                     "GOTOOLCHAIN": "local", "GOTELEMETRY": "off", "GOMAXPROCS": "1"}
        script = (f'export GOCACHE="$PWD/{BUILD_DIR}/cache" GOPATH="$PWD/{BUILD_DIR}/path"\n'
                  f"exec {_exe('go')} build -ldflags '-s -w' -o {w}/main {w}/main.go"
                  + "".join(f" {w}/{shlex.quote(f)}" for f in sources) + "\n")
        # The scheduler sized to the CPU quota, not the host's cores; the GC works harder as
        # the heap nears the cgroup's limit (a soft limit: live data beyond it is still
        # killed by the cgroup, as memory_limit).
        run_env = {"GOMAXPROCS": str(max(1, math.ceil(limits.cpus))),
                   "GOMEMLIMIT": f"{max(1, limits.memory_mb * 9 // 10)}MiB"}
        return LanguageSpec(
            "go", "main.go", Step("exec", (_exe("bash"), "-c", script)),
            Step("exec", (f"{m}/main", *argv)), ("go", "bash"), build_dir=BUILD_DIR,
            compile_env=build_env, run_env=run_env)
    if lang == "rust":
        # rustc alone, offline: the standard library and no crates (no cargo registry).
        return LanguageSpec(
            "rust", "main.rs",
            # Without symbols: a hello world is 0.4 MiB instead of 4 MiB, which the run's
            # own work dir must hold.
            Step("exec", (_exe("rustc"), "--edition", "2021", "-C", "opt-level=2",
                          "-C", "strip=symbols",
                          "--crate-name", "main", "-o", f"{w}/main", f"{w}/main.rs")),
            Step("exec", (f"{m}/main", *argv)), ("rustc", "cc"))
    if lang == "typescript":
        # tsc type-checks and reports on stdout; the compile result's stderr is what a
        # compile_error shows, so the report goes there.
        tsc = " ".join(shlex.quote(a) for a in (_exe("tsc"), *_TSC_OPTIONS))
        script = f"exec {tsc} {w}/main.ts {w}/sandloop-node.d.ts >&2\n"
        return LanguageSpec(
            "typescript", "main.ts", Step("exec", (_exe("bash"), "-c", script)),
            Step("exec", (_exe("node"), f"{m}/main.js", *argv)), ("tsc", "node", "bash"),
            binary="main.js", native=False,
            compile_files={"sandloop-node.d.ts": TS_NODE_DECLARATIONS})
    raise LanguageUnavailable(f"no runner for {lang}")  # pragma: no cover - guarded by canonical


def sandbox_env(language: str) -> dict[str, str]:
    """The whole environment a program sees: nothing inherited from the host (a language's
    ``compile_env``/``run_env`` go on top)."""
    env = {
        "PATH": SANDBOX_PATH,
        "HOME": WORK_DIR,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "USER": "sandbox",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }
    if language in ("javascript", "typescript"):
        env["NODE_OPTIONS"] = ""
    return env
