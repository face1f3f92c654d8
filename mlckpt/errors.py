"""The one error hierarchy of mlckpt.

Every error a user can cause is an ``MlckptError`` subclass carrying the exit status the CLI uses
(an :class:`ExitStatus`: USAGE, INTEGRITY, INTERNAL...) and a one-line message that names
the rule or key and says what was expected.  The CLI prints ``str(err)`` and exits; no traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum


class ExitStatus(IntEnum):
    """Every exit status of mlckpt's commands (docs: Errors and exit statuses)."""

    OK = 0
    FAILED = 1  # the answer is no: a run failed; mlckpt-check or `plan` found a result invalid
    USAGE = 2  # bad input, refused before any I/O
    INTEGRITY = 3  # a bundle's signature, files or paths
    INTERNAL = 4  # a defect of mlckpt
    # `mlckpt run`: the run completed and published its bundle, but is no valid result: its verdict
    # is invalid; or (also mlckpt-check) other processes on its host spoilt the measurement
    INVALID = 5
    DISTURBED = 6
    INTERRUPTED = 130  # Ctrl-C: `mlckpt run` returns once the run's files are removed
    BROKEN_PIPE = 141  # `mlckpt plan | head`: the reader left


# Each exit status of `mlckpt run` in one word (the sweep's table, `mlckpt run --json`).
_WORDS: dict[int, str] = {ExitStatus.OK: "ok", ExitStatus.FAILED: "failed", ExitStatus.USAGE: "refused",
          ExitStatus.INTEGRITY: "integrity", ExitStatus.INTERNAL: "internal error",
          ExitStatus.INVALID: "invalid", ExitStatus.DISTURBED: "disturbed",
          ExitStatus.INTERRUPTED: "interrupted"}


def status_word(status: int) -> str:
    """A run's exit status in one word; "" for one no command of mlckpt returns."""
    return _WORDS.get(status, "")


class MlckptError(Exception):
    """Base class.  ``exit_status`` is what the command-line tools return for it."""

    exit_status: int = ExitStatus.FAILED

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key

    def __str__(self) -> str:
        return self.message


class UsageError(MlckptError):
    """Bad command-line input: unknown key, wrong type, out-of-range value."""

    exit_status = ExitStatus.USAGE


class ConfigError(UsageError):
    """A configuration that cannot describe a valid workload (e.g. ranks not a multiple of TP·PP)."""


class RuleError(UsageError):
    """A rule that can be checked before I/O failed; ``rule`` is the rule ID (e.g. ``RANKS-MULTIPLE``)."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


class IntegrityError(MlckptError):
    """A bundle whose signature, digests or paths do not hold."""

    exit_status = ExitStatus.INTEGRITY


class EnvelopeError(IntegrityError):
    """A DSSE envelope (a bundle's signature file, a witness's receipt or transcript) that does not
    hold; ``kind`` says which part failed, set where it is raised."""

    MALFORMED = "malformed"  # not an envelope of the expected type: JSON, fields, base64, sizes, key id
    SIGNATURE = "signature"  # the signature does not verify under the key
    PAYLOAD = "payload"  # signed, but the payload is not strict JSON
    KEY = "key"  # signed, but by another key than the one the caller expects

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class RunFailure(MlckptError):
    """The benchmark itself failed (I/O error, verification mismatch, timeout, a rank died)."""

    exit_status = ExitStatus.FAILED


class VerificationError(RunFailure):
    """Data read back differs from what was written; carries where."""

    def __init__(self, message: str, *, rank: int, file: str, offset: int) -> None:
        super().__init__(message)
        self.rank = rank
        self.file = file
        self.offset = offset


class InternalError(MlckptError):
    """A defect in mlckpt itself; never blamed on the user or a submitter."""

    exit_status = ExitStatus.INTERNAL


class IOFailure(RunFailure):
    """A system call on a checkpoint file or folder failed.

    ``op`` is the operation (``open``, ``write``, ``read``, ``fsync``, ``size``, ...), ``path`` the
    file or folder, ``errno`` the OS error number (``None`` for failures the OS did not report,
    e.g. a file of the wrong size or a short read at end of file), ``offset`` the byte offset when
    the failure concerns one request.
    """

    def __init__(
        self,
        message: str,
        *,
        op: str,
        path: str,
        errno: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.op = op
        self.path = path
        self.errno = errno
        self.offset = offset


class IntegrityKind:
    """What an integrity problem is about, set where it is raised (never recovered from the
    wording of its message): the checker reports each kind under its own rule
    (BUNDLE-SIGNATURE, BUNDLE-KEY, BUNDLE-FILES, BUNDLE-PATHS)."""

    SIGNATURE = "signature"  # the envelope, the signature or the signed statement
    KEY = "key"  # the signer's key: untrusted, or not the organisation's
    FILES = "files"  # a file's presence, size or digest
    PATHS = "paths"  # a name or entry a bundle may not hold (links, '..', devices, ...)
    ALL = (SIGNATURE, KEY, FILES, PATHS)


class IntegrityProblem(tuple[str, str]):
    """``(path, message)`` with its :class:`IntegrityKind` in ``kind``."""

    kind: str

    def __new__(cls, path: str, message: str, kind: str) -> IntegrityProblem:
        if kind not in IntegrityKind.ALL:
            raise ValueError(f"unknown integrity kind {kind!r}")
        self = super().__new__(cls, (path, message))
        self.kind = kind
        return self

    def __getnewargs__(self) -> tuple[str, str, str]:
        return (self[0], self[1], self.kind)


class BundleIntegrityError(IntegrityError):
    """Every integrity problem found in one bundle or archive.

    ``problems`` is a list of :class:`IntegrityProblem` (path relative to the bundle, or
    ``bundle.dsse.json`` for envelope and statement problems, or the member name in an archive);
    ``summary`` is the first line of the message: the count and the first problem.
    """

    def __init__(self, message: str, problems: Sequence[IntegrityProblem] | None = None) -> None:
        super().__init__(message)
        self.problems: list[IntegrityProblem] = list(problems or [])
        self.summary = message.splitlines()[0] if message else ""
