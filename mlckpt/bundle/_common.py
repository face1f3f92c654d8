"""Internal: the bundle format's constants and the small helpers every part uses (strict JSON,
path rules, problem reports, atomic files)."""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, NoReturn

from mlckpt import formats
from mlckpt.errors import BundleIntegrityError, IntegrityKind, IntegrityProblem

BUNDLE_FORMAT = formats.BUNDLE.version


SUPPORTED_BUNDLE_FORMATS = frozenset(formats.BUNDLE.reads)


SIGNATURE_FILE = "bundle.dsse.json"


PAYLOAD_TYPE = "application/vnd.in-toto+json"


STATEMENT_TYPE = "https://in-toto.io/Statement/v1"


PREDICATE_TYPE = "https://mlckpt.dev/result-bundle/v1"


CODE_DIGEST_ALG = formats.CODE_DIGEST.version


TRUSTED_KEYS_FORMAT = formats.TRUSTED_KEYS.version


DEFAULT_PASSPHRASE_ENV = "MLCKPT_KEY_PASSPHRASE"


REQUIRED_PREDICATE_KEYS = (
    "bundle_format",
    "run_id",
    "mlckpt_version",
    "runner_code_sha256",
    "rules_version",
    "workload",
    "division",
    "started",
    "ended",
)


DIVISIONS = ("closed", "open")


MAX_ENVELOPE_BYTES = 16 << 20


MAX_KEY_FILE_BYTES = 64 << 10


MAX_TRUSTED_KEYS_BYTES = 1 << 20


MAX_PATH_BYTES = 4096


MAX_COMPONENT_BYTES = 255


MAX_DEPTH = 128


MAX_MESSAGE_PROBLEMS = 50


# The one set of archive limits (safe_unpack's defaults), for every reader of a packed bundle:
# mlckpt verify, mlckpt-check, compare and the leaderboard.  The parse caps (mlckpt.strict.CAPS)
# plus room for logs.
DEFAULT_MAX_MEMBERS = 1000
DEFAULT_MAX_TOTAL_BYTES = 1 << 30
DEFAULT_MAX_MEMBER_BYTES = 600 << 20


MAX_TAR_METADATA_BYTES = 32 << 10  # one pax/GNU long-name header; names are <= 4 KiB anyway


HASH_CHUNK = 1 << 20  # 1 MiB reads: as fast as 4-8 MiB here and kinder to the L2 cache


PARALLEL_MIN_BYTES = 8 << 20


HEX64 = re.compile(r"[0-9a-f]{64}")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


_DRIVE = re.compile(r"[A-Za-z]:")


O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


Problem = IntegrityProblem


def problem(path: str, message: str, kind: str | None = None) -> IntegrityProblem:
    """An integrity problem; without ``kind``: the envelope's (SIGNATURE) or a file's (FILES)."""
    if kind is None:
        kind = IntegrityKind.SIGNATURE if path == SIGNATURE_FILE else IntegrityKind.FILES
    return IntegrityProblem(path, message, kind)


def display_name(name: str) -> str:
    """``name`` as is when printable, else its ascii() escape: safe for one-line messages."""
    if name.isprintable() and not _CONTROL.search(name):
        try:
            name.encode("utf-8")
            return name
        except UnicodeEncodeError:
            pass
    return ascii(name)


def default_key_path() -> Path:
    """``$XDG_CONFIG_HOME/mlckpt/signing-key.pem``, else ``~/.config/mlckpt/signing-key.pem``."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "mlckpt" / "signing-key.pem"










def relpath_problem(name: object) -> str | None:
    """Why ``name`` is not an acceptable bundle-relative path, or None when it is."""
    if not isinstance(name, str):
        return "name is not a string"
    if not name:
        return "empty path"
    if "\x00" in name:
        return "contains a NUL character"
    if "\\" in name:
        return "contains a backslash"
    if _CONTROL.search(name):
        return "contains a control character"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if name.startswith("/") or _DRIVE.match(name):
        return "absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "contains a '..' component"
    if "." in parts:
        return "contains a '.' component"
    if "" in parts:
        return "contains an empty component ('//' or a trailing '/')"
    if len(encoded) > MAX_PATH_BYTES:
        return f"longer than {MAX_PATH_BYTES} bytes"
    if any(len(p.encode("utf-8")) > MAX_COMPONENT_BYTES for p in parts):
        return f"has a component longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def raise_problems(where: str, problems: Sequence[Problem]) -> None:
    """One BundleIntegrityError listing every problem; first line = count + first problem."""
    if not problems:
        return
    n = len(problems)
    first_path, first_msg = problems[0]
    head = f"{where}: {n} integrity problem{'s' if n != 1 else ''}: {display_name(first_path)}: {first_msg}"
    lines = [head]
    if n > 1:
        lines += [f"  {display_name(p)}: {m}" for p, m in problems[:MAX_MESSAGE_PROBLEMS]]
        if n > MAX_MESSAGE_PROBLEMS:
            lines.append(f"  ... and {n - MAX_MESSAGE_PROBLEMS} more")
    raise BundleIntegrityError("\n".join(lines), problems)


def fail(where: str, path: str, message: str, kind: str | None = None) -> NoReturn:
    raise_problems(where, [problem(path, message, kind)])
    raise AssertionError("unreachable")


thread_state = threading.local()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(target: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A file that appears at ``target`` complete or not at all: temp file in the same folder,
    fsync, rename, fsync of the folder (the temp file is removed on any failure)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(target.parent)


def atomic_write(target: Path, data: bytes, mode: int = 0o644) -> None:
    with atomic_file(target, mode) as f:
        f.write(data)


def create_exclusive(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
