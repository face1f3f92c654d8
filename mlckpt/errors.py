"""The one error hierarchy of mlckpt.

Every error a user can cause is an ``MlckptError`` subclass carrying the exit status the CLI uses
(2 = usage / bad input, 3 = integrity, 4 = internal) and a one-line message that names
the rule or key and says what was expected.  The CLI prints ``str(err)`` and exits; no traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

# A run that completed and published its bundle, but is no valid result (docs: Errors and exit
# statuses): its verdict is invalid; or other processes on its host spoilt the measurement.
INVALID_STATUS = 5
DISTURBED_STATUS = 6
INTERRUPTED_STATUS = 130  # Ctrl-C: `mlckpt run` returns once the run's files are removed
# Each exit status of `mlckpt run` in one word (the sweep's table, `mlckpt run --json`).
STATUS_WORDS = {0: "ok", 1: "failed", 2: "refused", 3: "integrity", 4: "internal error",
                INVALID_STATUS: "invalid", DISTURBED_STATUS: "disturbed", INTERRUPTED_STATUS: "interrupted"}


class MlckptError(Exception):
    """Base class.  ``exit_status`` is what the command-line tools return for it."""

    exit_status: int = 1

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key

    def __str__(self) -> str:
        return self.message


class UsageError(MlckptError):
    """Bad command-line input: unknown key, wrong type, out-of-range value."""

    exit_status = 2


class ConfigError(UsageError):
    """A configuration that cannot describe a valid workload (e.g. ranks not a multiple of TP·PP)."""


class RuleError(UsageError):
    """A rule that can be checked before I/O failed; ``rule`` is the rule ID (e.g. ``RANKS-MULTIPLE``)."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


class IntegrityError(MlckptError):
    """A bundle whose signature, digests or paths do not hold."""

    exit_status = 3


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

    exit_status = 1


class VerificationError(RunFailure):
    """Data read back differs from what was written; carries where."""

    def __init__(self, message: str, *, rank: int, file: str, offset: int) -> None:
        super().__init__(message)
        self.rank = rank
        self.file = file
        self.offset = offset


class InternalError(MlckptError):
    """A defect in mlckpt itself; never blamed on the user or a submitter."""

    exit_status = 4


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
