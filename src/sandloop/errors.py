"""sandloop's exception tree: one base class per layer under ``SandloopError``.

Catch ``SandloopError`` to handle anything sandloop raises on purpose; anything else that escapes
is a bug. Each layer's base says where a failure came from, and ``InputError`` (also a
``ValueError``) marks what the caller got wrong, as opposed to what failed underneath::

    SandloopError
    ├── InputError (ValueError)          the caller's input is wrong: fix it and retry
    │   ├── ConfigError                  sandloop.toml, [tool.sandloop] or a SANDLOOP_* variable
    │   ├── JsonLineError                a JSONL line that is not what it should be
    │   └── ValueCodecError              a typed value that cannot be encoded or decoded
    │                                    (tasks.values, which the sandbox harness also runs
    │                                    alone: standard library only, so no layer base)
    ├── SandboxError                     one run's isolation or execution machinery
    │   ├── IsolationUnavailable         the host cannot give the isolation asked for
    │   ├── LanguageUnavailable          a language's toolchain is missing
    │   ├── WorkspaceLost                a workspace's files are gone (its slot restarted)
    │   ├── WorkspaceWriteError (OSError)  files cannot be written into a workspace
    │   │   └── WorkspaceFull              they do not fit in it
    │   ├── SlotBroken                   a slot's fork-server failed under a run
    │   ├── CgroupError                  cgroups cannot be set up
    │   ├── ProgramInputError (InputError)  a program, file name or text it refuses
    │   └── BatchRequestError (InputError)  a bad line in an exec-batch file
    ├── EngineError                      scheduling: EngineClosed, DeadlineExceeded, RateLimited,
    │                                    IdempotencyConflict (InputError), SessionFull (InputError),
    │                                    QueueFull, ResourceTooLarge (InputError), SessionClosed,
    │                                    SessionExpired, SessionLimit, SessionLost, JournalError,
    │                                    ClusterUnavailable, NodeLost, RemoteRunError,
    │                                    RemoteInputError (InputError)
    ├── TaskError                        task data: TaskFormatError, LabelError, PatchError,
    │                                    SignatureError (InputError)
    ├── RewardError                      verification and scoring: CompletionFileError (InputError)
    ├── StoreError                       the durable result store
    ├── EnvError                         runtime environments: SpecError (InputError),
    │                                    EnvBuildError, EnvNotFound (InputError)
    ├── MonitorError                     the rollout log and its analyses: LogFormatError
    │                                    (InputError), RunChoiceError (InputError: --run),
    │                                    RolloutLogError, ParquetUnavailable
    ├── EpisodeError                     episodes: EpisodeFinished (InputError), ReplayError,
    │                                    SetupFailed
    ├── IntegrationError                 trainer adapters: InfraFailure, RemoteScoringError,
    │                                    AdapterSettingError (InputError), RemoteEpisodeError
    └── ServerError                      the service: KeysFileError (InputError), UsageLedgerError,
                                         SFRequestError (InputError), RequestError (InputError),
                                         ConfigError (InputError: serve's settings)

The HTTP status each of them answers is the table in ``sandloop.server.errors``.

Most classes also keep the builtin base they had before this tree existed (``RuntimeError``,
``ValueError``), so older ``except`` clauses still catch them.
"""

from __future__ import annotations

__all__ = [
    "EngineError",
    "EnvError",
    "EpisodeError",
    "InputError",
    "IntegrationError",
    "MonitorError",
    "RewardError",
    "SandboxError",
    "SandloopError",
    "ServerError",
    "StoreError",
    "TaskError",
]


class SandloopError(Exception):
    """Base of every exception sandloop raises on purpose."""


class InputError(SandloopError, ValueError):
    """The caller's input is wrong (a file, a field, an option): the message names what to fix."""


class SandboxError(SandloopError):
    """The sandbox layer: isolation, slots, workspaces, toolchains."""


class EngineError(SandloopError):
    """The engine: scheduling, admission, sessions, the journal."""


class TaskError(SandloopError):
    """Task data: schemas, loaders, typed values."""


class EnvError(SandloopError):
    """Runtime environments: specs, builds, the content-addressed store."""


class RewardError(SandloopError):
    """Verification, comparison and scoring."""


class StoreError(SandloopError):
    """The durable result store."""


class MonitorError(SandloopError):
    """Reward monitoring: the rollout log, its analyses, audits and reports."""


class IntegrationError(SandloopError):
    """Trainer adapters (TRL, verl, OpenRLHF) and remote scoring clients."""


class ServerError(SandloopError):
    """The HTTP service: keys, quotas, compatibility front ends."""


class EpisodeError(SandloopError):
    """Multi-turn episodes: tool calls after the end, unknown episodes, replays."""
