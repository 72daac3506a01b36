"""How each language is compiled and run inside the sandbox."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from sandloop.errors import SandboxError
from sandloop.sandbox.models import canonical_language
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


@dataclass(frozen=True)
class LanguageSpec:
    name: str
    main_file: str
    compile: Step | None
    run: Step
    tools: tuple[str, ...]  # host binaries that must exist
    binary: str = "main"  # what the compile step produces, relative to the work dir

    def check_available(self) -> None:
        missing = [t for t in self.tools if shutil.which(t, path=HOST_PATH) is None]
        if missing:
            raise LanguageUnavailable(
                f"{self.name}: {', '.join(missing)} not found; install it "
                f"(Debian: apt-get install {' '.join(_DEBIAN_PKG.get(t, t) for t in missing)})"
            )


_DEBIAN_PKG = {"gcc": "gcc", "g++": "g++", "node": "nodejs", "bash": "bash"}


def _exe(name: str) -> str:
    return shutil.which(name, path=HOST_PATH) or f"/usr/bin/{name}"


_COMPILED = {"c": ("gcc", "gnu17", "c"), "cpp": ("g++", "gnu++17", "cpp")}  # compiler, -std, ext


def spec_for(language: str, argv: tuple[str, ...] = (), main_dir: str = WORK_DIR) -> LanguageSpec:
    """The compile and run steps for ``language``; ``argv`` is passed to the program.

    ``main_dir`` is where the program's own file (source or binary) lives during the run step:
    the work dir, or ``/tmp`` for runs in a workspace, whose files must stay the user's own.
    Compilation always happens in a fresh work dir.
    """
    lang = canonical_language(language)
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
    raise LanguageUnavailable(f"no runner for {lang}")  # pragma: no cover - guarded by canonical


def sandbox_env(language: str) -> dict[str, str]:
    """The whole environment a program sees: nothing inherited from the host."""
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
    if language == "javascript":
        env["NODE_OPTIONS"] = ""
    return env
