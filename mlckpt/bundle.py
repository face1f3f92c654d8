"""Signed result bundles: layout, in-toto statement, DSSE envelope, Ed25519 keys, pack/unpack.

Format history
--------------
``BUNDLE_FORMAT = "1.0"``

- 1.0: first version: a folder whose regular files are all listed, with their sha256, as the
  subjects of an in-toto Statement v1 (predicateType ``https://mlckpt.dev/result-bundle/v1``),
  serialised as sorted-key compact UTF-8 JSON, carried in a DSSE envelope
  (``application/vnd.in-toto+json``) in ``bundle.dsse.json`` with exactly one Ed25519 signature
  whose entry also embeds the signer's raw public key (``public_key``, base64).  Runner code
  hash algorithm ``mlckpt-tree-sha256-v1`` (see :func:`code_digest`).  Trusted-keys file
  ``mlckpt_trusted_keys: "1.0"``.

Bundle layout
-------------
A bundle is a folder.  The runner decides what goes in it (typically ``run.json``,
``summary.json``, ``system.json``, ``records/*.jsonl``, ``logs/...``); this module only requires:

- ``bundle.dsse.json`` at the top level: the DSSE envelope, the only file not listed as a subject
  (a ``bundle.dsse.json`` deeper in the tree is an ordinary subject);
- every other entry is a regular file or a directory: no symlinks, hard-link tricks are harmless
  (content is hashed), no devices, FIFOs or sockets.  Empty directories carry no data and are
  ignored;
- every regular file is a subject ``{"name": relative/posix/path, "digest": {"sha256": hex}}``,
  sorted by name.  Names are UTF-8, relative, without ``.``/``..``/empty components,
  backslashes, NUL or control characters, at most 4096 bytes (255 per component).

Envelope (``bundle.dsse.json``)::

    {"payloadType": "application/vnd.in-toto+json",
     "payload": "<base64 of the statement bytes>",
     "signatures": [{"keyid": "<sha256 hex of the raw 32-byte public key>",
                     "sig": "<base64 Ed25519 signature over PAE(payloadType, payload bytes)>",
                     "public_key": "<base64 raw 32-byte public key>"}]}

``PAE(type, body) = "DSSEv1" SP len(type) SP type SP len(body) SP body`` (lengths in bytes, ASCII
decimal).  Verification never re-serialises the statement: it checks the signature over the
decoded payload bytes exactly as stored and only then parses them, so the serialisation need
only be deterministic for reproducibility, not canonical for security (no RFC 8785 needed).

Statement::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [...],
     "predicateType": "https://mlckpt.dev/result-bundle/v1",
     "predicate": {"bundle_format": "1.0", "run_id": ..., "mlckpt_version": ...,
                   "runner_code_sha256": ..., "runner_code_hash_alg": "mlckpt-tree-sha256-v1",
                   "rules_version": ..., "workload": ..., "division": "closed"|"open",
                   "started": ISO-8601 UTC, "ended": ISO-8601 UTC, ...extra keys...}}

Keys and trust
--------------
Private keys are PKCS8 PEM files (mode 0600, encrypted with the best available scheme when a
passphrase is given, read from ``$MLCKPT_KEY_PASSPHRASE`` by default).  The public key is written
next to it as ``<key>.pub``: one line ``ed25519:<base64 raw key>``.  ``keyid`` is the sha256 hex of
the raw public key (as go-securesystemslib ``dsse.SHA256KeyID``).

The trusted-keys file is YAML (a ``.json`` suffix selects strict JSON instead)::

    mlckpt_trusted_keys: "1.0"
    organizations:
      acme-storage:
        - ed25519:9f1b...=          # one line per key, as printed by `mlckpt keygen`
      other-org: [ "ed25519:..." ]

A key may belong to one organisation only.  Without a trusted-keys file, :func:`verify_bundle`
checks the signature against the key embedded in the envelope: that proves the bundle is
unchanged since it was signed, not who signed it.  With one, the signer's keyid must be
registered (for ``org`` when given) and the registered key is used.

What a signature does not prove: that the numbers are honest, that the runner was unmodified
(``runner_code_sha256`` is self-reported by the runner; the checker can only compare it to the
hashes of released versions), that the hardware matches the system description, or that the
timestamps are true.

Concurrency and trust boundaries: files are opened beneath a directory descriptor of the bundle
with ``O_NOFOLLOW`` at every component, so a path swapped for a symlink while verifying is refused
rather than followed.  Archives are extracted only by :func:`safe_unpack`, which never calls
``tarfile``'s extraction and bounds every read.
"""

from __future__ import annotations

import base64
import binascii
import errno
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import threading
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from mlckpt.errors import BundleIntegrityError, UsageError

__all__ = [
    "BUNDLE_FORMAT",
    "CODE_DIGEST_ALG",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "REQUIRED_PREDICATE_KEYS",
    "SIGNATURE_FILE",
    "STATEMENT_TYPE",
    "SUPPORTED_BUNDLE_FORMATS",
    "TRUSTED_KEYS_FORMAT",
    "KeyInfo",
    "Predicate",
    "TrustedKeys",
    "VerifiedBundle",
    "code_digest",
    "default_key_path",
    "display_name",
    "find_bundle_root",
    "generate_key",
    "keyid_of",
    "load_private_key",
    "make_envelope",
    "make_statement",
    "pack",
    "pae",
    "public_key_text",
    "read_envelope_predicate",
    "safe_unpack",
    "sign_bundle",
    "verify_bundle",
]

BUNDLE_FORMAT = "1.0"
SUPPORTED_BUNDLE_FORMATS = frozenset({"1.0"})
SIGNATURE_FILE = "bundle.dsse.json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://mlckpt.dev/result-bundle/v1"
CODE_DIGEST_ALG = "mlckpt-tree-sha256-v1"
TRUSTED_KEYS_FORMAT = "1.0"
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

DEFAULT_MAX_MEMBERS = 10_000
DEFAULT_MAX_TOTAL_BYTES = 4 << 30
DEFAULT_MAX_MEMBER_BYTES = 1 << 30
MAX_TAR_METADATA_BYTES = 32 << 10  # one pax/GNU long-name header; names are <= 4 KiB anyway

HASH_CHUNK = 1 << 20  # 1 MiB reads: as fast as 4-8 MiB here and kinder to the L2 cache
_PARALLEL_MIN_BYTES = 8 << 20

_HEX64 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"[A-Za-z]:")

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

Problem = tuple[str, str]


# ----------------------------------------------------------------------------------------------
# Small helpers


def display_name(name: str) -> str:
    """``name`` as is when printable, else its ascii() escape: safe for one-line messages."""
    if name.isprintable() and not _CONTROL.search(name):
        try:
            name.encode("utf-8")
            return name
        except UnicodeEncodeError:
            pass
    return ascii(name)


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: Any, what: str) -> bytes:
    """Strict standard base64 (padding required, no whitespace); ValueError naming ``what``."""
    if not isinstance(text, str):
        raise ValueError(f"{what} is not a string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise ValueError(f"{what} is not valid base64") from None


def _canonical_json(obj: Any) -> bytes:
    """Deterministic serialisation: sorted keys, compact, UTF-8, no NaN/Infinity."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _strict_json(data: bytes) -> Any:
    """Parse UTF-8 JSON rejecting duplicate keys, NaN/Infinity; ValueError on anything odd."""
    try:
        text = data.decode("utf-8")
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int-digit limit
        raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def keyid_of(raw_public_key: bytes) -> str:
    """sha256 hex of the raw 32-byte Ed25519 public key."""
    return hashlib.sha256(raw_public_key).hexdigest()


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_text(key: Ed25519PublicKey | Ed25519PrivateKey | bytes) -> str:
    """``ed25519:<base64 raw key>``: the one-line form used in ``.pub`` and trusted-keys files."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    raw = key if isinstance(key, bytes) else _raw_public(key)
    return "ed25519:" + _b64encode(raw)


def _parse_public_key_text(text: Any) -> bytes:
    """Raw key bytes of ``ed25519:<base64>``; ValueError saying what is wrong."""
    if not isinstance(text, str) or not text.startswith("ed25519:"):
        raise ValueError("expected 'ed25519:<base64 raw key>'")
    raw = _b64decode(text[len("ed25519:") :].strip(), "public key")
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, this one {len(raw)}")
    Ed25519PublicKey.from_public_bytes(raw)
    return raw


def _check_relpath(name: Any) -> str | None:
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


def _raise_problems(where: str, problems: Sequence[Problem]) -> None:
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


def _fail(where: str, path: str, message: str) -> NoReturn:
    _raise_problems(where, [(path, message)])
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------
# Predicate


@dataclass(frozen=True)
class Predicate:
    """What the runner asserts about a run; ``extra`` keys are added to the predicate object."""

    run_id: str
    mlckpt_version: str
    runner_code_sha256: str
    rules_version: str
    workload: str
    division: str
    started: str
    ended: str
    bundle_format: str = BUNDLE_FORMAT
    runner_code_hash_alg: str = CODE_DIGEST_ALG
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        clash = sorted(set(out) & set(self.extra))
        if clash:
            raise UsageError(f"predicate extra keys shadow standard keys: {', '.join(clash)}")
        out.update(self.extra)
        return out


def _parse_utc(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None or when.utcoffset() != timedelta(0):
        return None
    return when


def _predicate_problems(pred: Any) -> list[str]:
    """Format-level checks of a predicate (both when signing and when verifying)."""
    if not isinstance(pred, Mapping):
        return ["predicate is not an object"]
    out = []
    missing = [k for k in REQUIRED_PREDICATE_KEYS if k not in pred]
    if missing:
        out.append(f"predicate lacks required keys: {', '.join(missing)}")
    for k in REQUIRED_PREDICATE_KEYS:
        if k in pred and (not isinstance(pred[k], str) or not pred[k]):
            out.append(f"predicate key {k!r} must be a non-empty string, got {pred[k]!r:.80}")
    fmt = pred.get("bundle_format")
    if isinstance(fmt, str) and fmt and fmt not in SUPPORTED_BUNDLE_FORMATS:
        out.append(f"unsupported bundle_format {fmt!r}")
    code = pred.get("runner_code_sha256")
    if isinstance(code, str) and code and not _HEX64.fullmatch(code):
        out.append("predicate key 'runner_code_sha256' must be 64 lowercase hex digits")
    div = pred.get("division")
    if isinstance(div, str) and div and div not in DIVISIONS:
        out.append(f"predicate key 'division' must be one of {', '.join(DIVISIONS)}, got {div!r}")
    times = {}
    for k in ("started", "ended"):
        if isinstance(pred.get(k), str) and pred[k]:
            times[k] = _parse_utc(pred[k])
            if times[k] is None:
                out.append(f"predicate key {k!r} must be an ISO-8601 UTC time, got {pred[k]!r}")
    if times.get("started") and times.get("ended") and times["ended"] < times["started"]:
        out.append("predicate 'ended' is before 'started'")
    return out


def _predicate_dict(predicate: Predicate | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(predicate, Predicate):
        pred = predicate.to_dict()
    elif isinstance(predicate, Mapping):
        pred = dict(predicate)
        pred.setdefault("bundle_format", BUNDLE_FORMAT)
        pred.setdefault("runner_code_hash_alg", CODE_DIGEST_ALG)
    else:
        raise UsageError(f"predicate must be a Predicate or a mapping, got {type(predicate)}")
    problems = _predicate_problems(pred)
    if pred.get("bundle_format") != BUNDLE_FORMAT:
        problems.append(f"this mlckpt writes bundle_format {BUNDLE_FORMAT!r} only")
    if problems:
        raise UsageError("invalid predicate: " + "; ".join(dict.fromkeys(problems)))
    try:
        _canonical_json(pred)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid predicate: not serialisable as strict JSON: {exc}") from None
    return pred


# ----------------------------------------------------------------------------------------------
# Walking and hashing beneath a directory descriptor


class _NotRegular(OSError):
    pass


def _open_root(folder: Path) -> int:
    try:
        return os.open(folder, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"{folder}: no such bundle folder") from None
    except NotADirectoryError:
        raise UsageError(f"{folder}: not a folder") from None


def _open_beneath(root_fd: int, rel: str) -> int:
    """Open regular file ``rel`` beneath ``root_fd`` following no symlink; fd or OSError."""
    parts = rel.split("/")
    dir_fd = root_fd
    opened: list[int] = []
    try:
        for part in parts[:-1]:
            dir_fd = os.open(part, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd)
            opened.append(dir_fd)
        fd = os.open(parts[-1], os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
    finally:
        for d in opened:
            os.close(d)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotRegular(errno.EINVAL, "not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_error(exc: OSError) -> str:
    if isinstance(exc, _NotRegular):
        return "is not a regular file"
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return "is a symlink (not allowed in bundles)"
    if exc.errno == errno.ENOENT:
        return "missing"
    if exc.errno == errno.ENOTDIR:
        return "a parent component is not a directory"
    return f"cannot read: {exc.strerror or exc}"


def _scan(root_fd: int) -> tuple[dict[str, int], list[Problem]]:
    """Regular files (name -> size) under root, and every entry that is not allowed."""
    files: dict[str, int] = {}
    bad: list[Problem] = []

    def walk(dir_fd: int, prefix: str, depth: int) -> None:
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = prefix + entry.name
            try:
                if entry.is_symlink():
                    bad.append((rel, "is a symlink (not allowed in bundles)"))
                elif entry.is_dir(follow_symlinks=False):
                    if depth >= MAX_DEPTH:
                        bad.append((rel, f"nested deeper than {MAX_DEPTH} folders"))
                        continue
                    sub = os.open(
                        entry.name,
                        os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC,
                        dir_fd=dir_fd,
                    )
                    try:
                        walk(sub, rel + "/", depth + 1)
                    finally:
                        os.close(sub)
                elif entry.is_file(follow_symlinks=False):
                    files[rel] = entry.stat(follow_symlinks=False).st_size
                else:
                    bad.append((rel, "is not a regular file (device, FIFO or socket)"))
            except OSError as exc:
                bad.append((rel, _open_error(exc)))

    walk(root_fd, "", 0)
    files.pop(SIGNATURE_FILE, None)
    if any(p == SIGNATURE_FILE for p, _ in bad):
        bad = [(p, m) for p, m in bad if p != SIGNATURE_FILE]  # reported by the envelope reader
    return files, bad


_tls = threading.local()


def _hash_one(root_fd: int, rel: str) -> str:
    buf = getattr(_tls, "buf", None)
    if buf is None:
        buf = _tls.buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    fd = _open_beneath(root_fd, rel)
    with io.FileIO(fd, "rb", closefd=True) as f:
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except OSError:
                pass
        h = hashlib.sha256()
        while True:
            n = f.readinto(view)
            if not n:
                break
            h.update(view[:n])  # releases the GIL for large buffers
    return h.hexdigest()


def _hash_workers() -> int:
    try:
        ncpu = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        ncpu = os.cpu_count() or 1
    return max(2, min(8, ncpu))


def _hash_many(root_fd: int, sizes: Mapping[str, int]) -> dict[str, str | OSError]:
    """sha256 of each file (or the OSError met), largest first over a small thread pool."""
    order = sorted(sizes, key=lambda n: (-sizes[n], n))

    def job(rel: str) -> str | OSError:
        try:
            return _hash_one(root_fd, rel)
        except OSError as exc:
            return exc

    if len(order) < 2 or sum(sizes.values()) < _PARALLEL_MIN_BYTES:
        return {rel: job(rel) for rel in order}
    with ThreadPoolExecutor(max_workers=min(_hash_workers(), len(order))) as pool:
        return dict(zip(order, pool.map(job, order), strict=True))


# ----------------------------------------------------------------------------------------------
# Statement and envelope


def make_statement(files: Mapping[str, str], predicate: Mapping[str, Any]) -> dict[str, Any]:
    """The in-toto statement for ``files`` (name -> sha256 hex), subjects sorted by name."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": n, "digest": {"sha256": files[n]}} for n in sorted(files)],
        "predicateType": PREDICATE_TYPE,
        "predicate": dict(predicate),
    }


def make_envelope(statement: Mapping[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """Serialise ``statement`` deterministically and sign it into a DSSE envelope."""
    if not isinstance(key, Ed25519PrivateKey):
        raise TypeError(f"expected an Ed25519PrivateKey, got {type(key).__name__}")
    payload = _canonical_json(statement)
    raw = _raw_public(key.public_key())
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": _b64encode(payload),
        "signatures": [
            {
                "keyid": keyid_of(raw),
                "sig": _b64encode(key.sign(pae(PAYLOAD_TYPE, payload))),
                "public_key": _b64encode(raw),
            }
        ],
    }


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def _atomic_file(target: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
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


def _atomic_write(target: Path, data: bytes, mode: int = 0o644) -> None:
    with _atomic_file(target, mode) as f:
        f.write(data)


def sign_bundle(folder: Path, key: Ed25519PrivateKey, predicate: Predicate | Mapping[str, Any]) -> Path:
    """Hash every file of ``folder`` and write (or replace) its signed envelope; return its path.

    Raises UsageError for a bad predicate or folder, BundleIntegrityError when the folder holds
    anything that cannot be part of a bundle (symlinks, devices, unacceptable names).
    """
    folder = Path(folder)
    pred = _predicate_dict(predicate)
    root_fd = _open_root(folder)
    try:
        files, bad = _scan(root_fd)
        problems = list(bad)
        problems += [(n, why) for n in files if (why := _check_relpath(n))]
        target = folder / SIGNATURE_FILE
        if target.is_symlink() or (target.exists() and not target.is_file()):
            problems.append((SIGNATURE_FILE, "exists and is not a regular file"))
        _raise_problems(f"{folder}: cannot sign", sorted(problems))
        digests = _hash_many(root_fd, files)
    finally:
        os.close(root_fd)
    errors = [(n, _open_error(d)) for n, d in digests.items() if isinstance(d, OSError)]
    _raise_problems(f"{folder}: cannot sign", sorted(errors))
    statement = make_statement({n: str(d) for n, d in digests.items()}, pred)
    envelope = make_envelope(statement, key)
    _atomic_write(target, (json.dumps(envelope, indent=2, sort_keys=True) + "\n").encode())
    return target


# ----------------------------------------------------------------------------------------------
# Verification


@dataclass(frozen=True)
class VerifiedBundle:
    """A bundle whose signature, paths and digests all hold."""

    folder: Path
    statement: dict[str, Any]
    predicate: dict[str, Any]
    keyid: str
    public_key: str  # ed25519:<base64>
    org: str | None  # from the trusted-keys file; None when verified without one
    files: dict[str, str]  # name -> sha256 hex, as signed and as found on disk
    statement_sha256: str  # of the signed payload bytes: a replay/duplicate-submission key


def _read_envelope_bytes(root_fd: int, where: str) -> bytes:
    try:
        fd = _open_beneath(root_fd, SIGNATURE_FILE)
    except OSError as exc:
        why = _open_error(exc)
        if why == "missing":
            why = "missing: the bundle is not signed"
        _fail(where, SIGNATURE_FILE, why)
    with io.FileIO(fd, "rb", closefd=True) as f:
        if os.fstat(fd).st_size > MAX_ENVELOPE_BYTES:
            _fail(where, SIGNATURE_FILE, f"larger than {MAX_ENVELOPE_BYTES >> 20} MiB")
        chunks = []
        total = 0
        while total <= MAX_ENVELOPE_BYTES:
            chunk = f.read(min(1 << 20, MAX_ENVELOPE_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    if total > MAX_ENVELOPE_BYTES:
        _fail(where, SIGNATURE_FILE, f"larger than {MAX_ENVELOPE_BYTES >> 20} MiB")
    return b"".join(chunks)


@dataclass(frozen=True)
class _Envelope:
    payload: bytes
    keyid: str
    sig: bytes
    public_key: bytes


def _parse_envelope(data: bytes) -> _Envelope:
    """Strict structural parse; ValueError saying what is wrong.  Verifies nothing."""
    try:
        env = _strict_json(data)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc}); truncated or corrupted?") from None
    if not isinstance(env, dict):
        raise ValueError("not a JSON object")
    want = {"payloadType", "payload", "signatures"}
    if set(env) != want:
        extra = sorted(set(env) - want)
        missing = sorted(want - set(env))
        detail = "; ".join(
            s
            for s in (
                f"missing {', '.join(missing)}" if missing else "",
                f"unexpected {', '.join(map(repr, extra))}" if extra else "",
            )
            if s
        )
        raise ValueError(f"envelope fields must be exactly payloadType, payload, signatures ({detail})")
    if env["payloadType"] != PAYLOAD_TYPE:
        raise ValueError(f"payloadType must be {PAYLOAD_TYPE!r}, got {env['payloadType']!r:.80}")
    payload = _b64decode(env["payload"], "payload")
    sigs = env["signatures"]
    if not isinstance(sigs, list) or len(sigs) != 1:
        raise ValueError("signatures must be a list of exactly one signature (format 1.0)")
    entry = sigs[0]
    if not isinstance(entry, dict) or set(entry) != {"keyid", "sig", "public_key"}:
        raise ValueError("the signature entry must have exactly keyid, sig and public_key")
    keyid = entry["keyid"]
    if not isinstance(keyid, str) or not _HEX64.fullmatch(keyid):
        raise ValueError("keyid must be 64 lowercase hex digits")
    sig = _b64decode(entry["sig"], "sig")
    if len(sig) != 64:
        raise ValueError(f"an Ed25519 signature has 64 bytes, this one {len(sig)}")
    pub = _b64decode(entry["public_key"], "public_key")
    if len(pub) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, this one {len(pub)}")
    if keyid_of(pub) != keyid:
        raise ValueError("keyid is not the sha256 of the embedded public key")
    return _Envelope(payload=payload, keyid=keyid, sig=sig, public_key=pub)


def _statement_problems(stmt: Any) -> tuple[dict[str, str], list[Problem]]:
    """Subjects (name -> sha256) and every problem with the statement's subject list."""
    files: dict[str, str] = {}
    problems: list[Problem] = []
    subjects = stmt["subject"]
    if not isinstance(subjects, list):
        return files, [(SIGNATURE_FILE, "statement 'subject' is not a list")]
    for i, item in enumerate(subjects):
        if not isinstance(item, dict) or set(item) != {"name", "digest"}:
            problems.append((SIGNATURE_FILE, f"subject #{i} must have exactly name and digest"))
            continue
        name, digest = item["name"], item["digest"]
        label = name if isinstance(name, str) else f"subject #{i}"
        why = _check_relpath(name)
        if why is None and name == SIGNATURE_FILE:
            why = "the envelope cannot be its own subject"
        if why:
            problems.append((label, f"subject name rejected: {why}"))
            continue
        if (
            not isinstance(digest, dict)
            or set(digest) != {"sha256"}
            or not isinstance(digest["sha256"], str)
            or not _HEX64.fullmatch(digest["sha256"])
        ):
            problems.append((name, "subject digest must be exactly {sha256: 64 lowercase hex}"))
            continue
        if name in files:
            problems.append((name, "duplicate subject"))
            continue
        files[name] = digest["sha256"]
    return files, problems


def verify_bundle(
    folder: Path, trusted: TrustedKeys | None = None, *, org: str | None = None
) -> VerifiedBundle:
    """Verify ``folder``; return what was verified or raise BundleIntegrityError (exit 3).

    Order: envelope structure, payloadType, signer known (with ``trusted``: registered, and for
    ``org`` when given), signature over PAE of the payload bytes, and only then the statement:
    types, bundle_format, subject names, the on-disk file set against the subjects, each digest.
    Problems from the statement on are all collected before raising.
    """
    folder = Path(folder)
    where = str(folder)
    if org is not None:
        if trusted is None:
            raise UsageError("checking the organisation (--org) needs a trusted-keys file")
        if not trusted.keys_for(org):
            raise UsageError(f"organisation {org!r} has no keys in {trusted.source}")
    root_fd = _open_root(folder)
    try:
        data = _read_envelope_bytes(root_fd, where)
        try:
            env = _parse_envelope(data)
        except ValueError as exc:
            _fail(where, SIGNATURE_FILE, str(exc))

        signer_org: str | None = None
        key_raw = env.public_key
        if trusted is not None:
            signer_org = trusted.org_for(env.keyid)
            if signer_org is None:
                _fail(where, SIGNATURE_FILE, f"signed by untrusted key {env.keyid}")
            if org is not None and signer_org != org:
                _fail(
                    where,
                    SIGNATURE_FILE,
                    f"signed by key {env.keyid} registered for organisation {signer_org!r}, not {org!r}",
                )
            trusted_raw = trusted.public_key_for(env.keyid)
            if trusted_raw != env.public_key:
                _fail(where, SIGNATURE_FILE, "embedded public key differs from the trusted key")
            key_raw = trusted_raw  # type: ignore[assignment]
        try:
            Ed25519PublicKey.from_public_bytes(key_raw).verify(env.sig, pae(PAYLOAD_TYPE, env.payload))
        except (InvalidSignature, ValueError):
            _fail(
                where,
                SIGNATURE_FILE,
                f"bad signature by key {env.keyid}: the statement or the signature was altered",
            )

        # Authenticated from here on: parse the statement.
        try:
            stmt = _strict_json(env.payload)
        except ValueError as exc:
            _fail(where, SIGNATURE_FILE, f"signed payload is not valid JSON: {exc}")
        if not isinstance(stmt, dict) or set(stmt) != {
            "_type",
            "subject",
            "predicateType",
            "predicate",
        }:
            _fail(
                where,
                SIGNATURE_FILE,
                "statement must have exactly _type, subject, predicateType and predicate",
            )
        if stmt["_type"] != STATEMENT_TYPE:
            _fail(where, SIGNATURE_FILE, f"statement _type must be {STATEMENT_TYPE!r}")
        if stmt["predicateType"] != PREDICATE_TYPE:
            _fail(
                where,
                SIGNATURE_FILE,
                f"predicateType must be {PREDICATE_TYPE!r}, got {stmt['predicateType']!r:.80}",
            )
        pred = stmt["predicate"]
        if not isinstance(pred, dict):
            _fail(where, SIGNATURE_FILE, "predicate is not an object")
        fmt = pred.get("bundle_format")
        if not isinstance(fmt, str) or fmt not in SUPPORTED_BUNDLE_FORMATS:
            _fail(
                where,
                SIGNATURE_FILE,
                f"unsupported bundle_format {fmt!r} (this mlckpt reads "
                f"{', '.join(sorted(SUPPORTED_BUNDLE_FORMATS))})",
            )
        problems: list[Problem] = [(SIGNATURE_FILE, p) for p in _predicate_problems(pred)]
        subjects, subject_problems = _statement_problems(stmt)
        problems += subject_problems

        on_disk, bad = _scan(root_fd)
        rejected = {p for p, _ in subject_problems}
        disk_problems: list[Problem] = list(bad)
        bad_names = {p for p, _ in bad}
        for name in sorted(set(subjects) - set(on_disk)):
            if name not in bad_names:
                disk_problems.append((name, "missing (listed in the statement, not in the folder)"))
        for name in sorted(set(on_disk) - set(subjects)):
            if name not in rejected:
                disk_problems.append((name, "extra file (not listed in the statement)"))
        problems += sorted(disk_problems)

        to_hash = {n: on_disk[n] for n in subjects if n in on_disk}
        digests = _hash_many(root_fd, to_hash)
    finally:
        os.close(root_fd)
    for name in sorted(digests):
        got = digests[name]
        if isinstance(got, OSError):
            problems.append((name, _open_error(got)))
        elif got != subjects[name]:
            problems.append((name, f"digest mismatch: signed sha256 {subjects[name]}, file has {got}"))
    _raise_problems(where, problems)
    return VerifiedBundle(
        folder=folder,
        statement=stmt,
        predicate=pred,
        keyid=env.keyid,
        public_key=public_key_text(env.public_key),
        org=signer_org,
        files=dict(sorted(subjects.items())),
        statement_sha256=hashlib.sha256(env.payload).hexdigest(),
    )


def read_envelope_predicate(folder: Path) -> dict[str, Any]:
    """The predicate of ``folder``'s existing envelope, parsed strictly but NOT verified.

    For re-signing a bundle whose files changed: the new signer takes responsibility for it.
    """
    folder = Path(folder)
    root_fd = _open_root(folder)
    try:
        data = _read_envelope_bytes(root_fd, str(folder))
    finally:
        os.close(root_fd)
    try:
        env = _parse_envelope(data)
        stmt = _strict_json(env.payload)
    except ValueError as exc:
        _fail(str(folder), SIGNATURE_FILE, str(exc))
    pred = stmt.get("predicate") if isinstance(stmt, dict) else None
    if not isinstance(pred, dict):
        _fail(str(folder), SIGNATURE_FILE, "statement has no predicate object")
    return pred  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# Keys


@dataclass(frozen=True)
class KeyInfo:
    """A public key (``ed25519:<base64>``), its keyid and, for generated keys, the file paths."""

    keyid: str
    public_key: str
    path: Path | None = None
    public_path: Path | None = None


def _create_exclusive(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def default_key_path() -> Path:
    """``$XDG_CONFIG_HOME/mlckpt/signing-key.pem``, else ``~/.config/mlckpt/signing-key.pem``."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "mlckpt" / "signing-key.pem"


def generate_key(path: Path, passphrase: bytes | None = None) -> KeyInfo:
    """New Ed25519 key: PKCS8 PEM at ``path`` (0600, never overwritten) and ``<path>.pub``."""
    path = Path(path)
    pub_path = path.with_name(path.name + ".pub")
    for p in (path, pub_path):
        if os.path.lexists(p):
            raise UsageError(f"{p}: already exists; refusing to overwrite a key")
    if passphrase is not None and not passphrase:
        raise UsageError("empty passphrase; give a non-empty one or none")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:  # a file in the way, a read-only mount, no permission: the user's to fix
        raise UsageError(f"{path}: cannot create the key folder: {exc.strerror or exc}") from None
    key = Ed25519PrivateKey.generate()
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    )
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    text = public_key_text(key)
    try:
        _create_exclusive(path, pem, 0o600)
    except FileExistsError:
        raise UsageError(f"{path}: already exists; refusing to overwrite a key") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the key: {exc.strerror or exc}") from None
    try:
        _create_exclusive(pub_path, (text + "\n").encode("ascii"), 0o644)
    except BaseException as exc:
        os.unlink(path)
        if isinstance(exc, FileExistsError):
            raise UsageError(f"{pub_path}: already exists; refusing to overwrite a key") from None
        raise
    raw = _raw_public(key.public_key())
    return KeyInfo(keyid=keyid_of(raw), public_key=text, path=path, public_path=pub_path)


def load_private_key(path: Path, passphrase_env: str = DEFAULT_PASSPHRASE_ENV) -> Ed25519PrivateKey:
    """Load a PEM Ed25519 private key; an encrypted one takes its passphrase from ``$passphrase_env``."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such key file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read key: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise UsageError(f"{path}: too large for a key file")
    password: bytes | None = None
    if b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data:
        value = os.environ.get(passphrase_env)
        if not value:
            raise UsageError(f"{path}: the key is encrypted; set {passphrase_env} to its passphrase")
        password = os.fsencode(value)
    try:
        key = serialization.load_pem_private_key(data, password=password)
    except TypeError as exc:  # e.g. encrypted in a way the header test did not see
        raise UsageError(
            f"{path}: the key is encrypted; set {passphrase_env} to its passphrase ({exc})"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        if password is not None:
            raise UsageError(
                f"{path}: cannot decrypt the key with the passphrase in {passphrase_env}"
            ) from None
        raise UsageError(f"{path}: not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(f"{path}: not an Ed25519 key ({type(key).__name__})")
    return key


class TrustedKeys:
    """Organisation -> Ed25519 public keys, as pinned by the committee (see module docstring)."""

    def __init__(self, organisations: Mapping[str, Iterable[str]], *, source: str = "<mapping>"):
        self.source = source
        self._by_keyid: dict[str, tuple[str, bytes]] = {}
        self._by_org: dict[str, list[KeyInfo]] = {}
        for org, keys in organisations.items():
            if not isinstance(org, str) or not org.strip():
                raise UsageError(f"{source}: organisation names must be non-empty strings: {org!r}")
            if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
                raise UsageError(f"{source}: organizations.{org} must be a list of public keys")
            infos = self._by_org.setdefault(org, [])
            for i, text in enumerate(keys):
                try:
                    raw = _parse_public_key_text(text)
                except ValueError as exc:
                    raise UsageError(f"{source}: organizations.{org}[{i}]: {exc}") from None
                kid = keyid_of(raw)
                if kid in self._by_keyid:
                    other = self._by_keyid[kid][0]
                    if other != org:
                        raise UsageError(f"{source}: key {kid} is registered for both {other!r} and {org!r}")
                    continue
                self._by_keyid[kid] = (org, raw)
                infos.append(KeyInfo(keyid=kid, public_key=public_key_text(raw)))

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "<mapping>") -> TrustedKeys:
        """Validate a parsed trusted-keys document (``mlckpt_trusted_keys`` + ``organizations``)."""
        if not isinstance(data, Mapping):
            raise UsageError(f"{source}: a trusted-keys file must be a mapping")
        unknown = sorted(map(str, set(data) - {"mlckpt_trusted_keys", "organizations"}))
        if unknown:
            raise UsageError(f"{source}: unknown keys {', '.join(unknown)}")
        version = data.get("mlckpt_trusted_keys")
        if isinstance(version, float):  # YAML reads an unquoted 1.0 as a float
            version = repr(version)
        if version != TRUSTED_KEYS_FORMAT:
            raise UsageError(
                f"{source}: mlckpt_trusted_keys must be {TRUSTED_KEYS_FORMAT!r}, got {version!r}"
            )
        orgs = data.get("organizations")
        if not isinstance(orgs, Mapping):
            raise UsageError(f"{source}: organizations must map organisation -> list of keys")
        return cls(orgs, source=source)

    @classmethod
    def load(cls, path: Path) -> TrustedKeys:
        path = Path(path)
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_TRUSTED_KEYS_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"{path}: cannot read trusted keys: {exc.strerror or exc}") from None
        if len(data) > MAX_TRUSTED_KEYS_BYTES:
            raise UsageError(f"{path}: trusted-keys file larger than 1 MiB")
        try:
            if path.suffix.lower() == ".json":
                doc = _strict_json(data)
            else:
                import yaml

                doc = yaml.safe_load(data.decode("utf-8"))
        except Exception as exc:  # yaml.YAMLError, ValueError, UnicodeDecodeError
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"{path}: cannot parse trusted keys: {first}") from None
        return cls.from_mapping(doc, source=str(path))

    @property
    def organisations(self) -> tuple[str, ...]:
        return tuple(sorted(self._by_org))

    def org_for(self, keyid: str) -> str | None:
        hit = self._by_keyid.get(keyid)
        return hit[0] if hit else None

    def keys_for(self, org: str) -> tuple[KeyInfo, ...]:
        return tuple(self._by_org.get(org, ()))

    def public_key_for(self, keyid: str) -> bytes | None:
        hit = self._by_keyid.get(keyid)
        return hit[1] if hit else None


# ----------------------------------------------------------------------------------------------
# Runner code digest


def _code_files() -> list[tuple[str, Path]]:
    """(name in the digest, file) for the mlckpt package and its shipped data folders."""
    pkg = Path(__file__).resolve().parent
    out: list[tuple[str, Path]] = []

    def add(base: Path, prefix: str, skip_data: bool) -> None:
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = Path(dirpath).relative_to(base).as_posix()
            dirnames[:] = [
                d
                for d in dirnames
                if d != "__pycache__" and not (skip_data and rel_dir == "." and d == "_data")
            ]
            for fn in filenames:
                if fn.endswith((".pyc", ".pyo")):
                    continue
                p = Path(dirpath) / fn
                if not p.is_file() or p.is_symlink():
                    continue
                rel = fn if rel_dir == "." else f"{rel_dir}/{fn}"
                out.append((prefix + rel, p))

    add(pkg, "", skip_data=True)
    from mlckpt import resources

    for name in ("workloads", "rules"):
        try:
            base = resources.data_dir(name)
        except FileNotFoundError:
            continue
        add(base, f"_data/{name}/", skip_data=False)
    return sorted(out)


@cache
def code_digest() -> str:
    """sha256 hex over the installed mlckpt package (algorithm ``mlckpt-tree-sha256-v1``).

    For each file, sorted by name: ``name NUL len(content) NUL content``, where names are
    relative POSIX paths of every file under the package folder except ``__pycache__`` and
    ``*.pyc``, with the data folders named ``_data/workloads/...`` and ``_data/rules/...``
    whether they come from a wheel or a source checkout.  Length-prefixing keeps the framing
    unambiguous.  This is self-reported: a modified runner can report any value; the checker
    can only compare it to the digests of released versions.
    """
    h = hashlib.sha256()
    for name, path in _code_files():
        data = path.read_bytes()
        h.update(name.encode("utf-8") + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Pack and safe unpack


def pack(folder: Path, out: Path) -> Path:
    """Deterministic ``.tar.gz`` of ``folder``'s files (sorted, mtime 0, uid/gid 0, no links).

    Members are bundle-relative (no top-level folder).  Written atomically; returns ``out``.
    """
    folder, out = Path(folder), Path(out)
    where = f"{folder}: cannot pack"
    try:
        out_abs = out.parent.resolve() / out.name
        if out_abs.is_relative_to(folder.resolve()):
            raise UsageError(f"{out}: the archive cannot be written inside the bundle {folder}")
    except OSError as exc:
        raise UsageError(f"{out}: {exc.strerror or exc}") from None
    root_fd = _open_root(folder)
    try:
        files, bad = _scan(root_fd)
        names = sorted(files)
        if _has_envelope(root_fd, where):
            names = sorted([*names, SIGNATURE_FILE])
        problems = bad + [(n, why) for n in names if (why := _check_relpath(n))]
        _raise_problems(where, sorted(problems))
        with _atomic_file(out_abs) as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in names:
                _add_member(tar, root_fd, name, where)
    finally:
        os.close(root_fd)
    return out


def _has_envelope(root_fd: int, where: str) -> bool:
    try:
        st = os.stat(SIGNATURE_FILE, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        _fail(where, SIGNATURE_FILE, "is not a regular file")
    return True


def _add_member(tar: tarfile.TarFile, root_fd: int, name: str, where: str) -> None:
    try:
        fd = _open_beneath(root_fd, name)
    except OSError as exc:
        _fail(where, name, _open_error(exc))
    with io.FileIO(fd, "rb", closefd=True) as f:
        info = tarfile.TarInfo(name)
        info.size = os.fstat(fd).st_size
        info.mtime = 0
        info.mode = 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.type = tarfile.REGTYPE
        tar.addfile(info, f)


class _BoundedReader:
    """File-like ``read`` returning at most 1 MiB per call and ``limit`` bytes in total.

    tarfile's stream reader loops over short reads, so this bounds both the memory of one call
    and the work of the whole extraction, whatever the headers claim.
    """

    def __init__(self, inner: Any, limit: int, where: str) -> None:
        self._inner = inner
        self._left = limit
        self._limit = limit
        self._where = where

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = 1 << 20
        size = min(size, 1 << 20, self._left + 1)  # one byte past the limit detects it
        data = self._inner.read(size)
        if len(data) > self._left:
            _fail(
                self._where,
                "(archive)",
                f"decompressed stream exceeds {self._limit} bytes (limit reached; archive bomb?)",
            )
        self._left -= len(data)
        return data


class _GuardedTarInfo(tarfile.TarInfo):
    """Refuses oversized metadata headers (pax / GNU long names) and sparse members before
    tarfile reads them into memory.  Relies on ``TarInfo._proc_member``; if a future Python
    renames it, the bounded reader still caps everything read."""

    where = "archive"  # set per archive by safe_unpack (a subclass per call)

    def _proc_member(self, tarfile_: tarfile.TarFile) -> Any:
        meta = (
            tarfile.XHDTYPE,
            tarfile.XGLTYPE,
            tarfile.SOLARIS_XHDTYPE,
            tarfile.GNUTYPE_LONGNAME,
            tarfile.GNUTYPE_LONGLINK,
        )
        if self.type in meta and self.size > MAX_TAR_METADATA_BYTES:
            _fail(
                self.where,
                self.name,
                f"metadata header of {self.size} bytes exceeds {MAX_TAR_METADATA_BYTES}",
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            _fail(self.where, self.name, "sparse members are not allowed")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def safe_unpack(
    archive: Path,
    dest: Path,
    *,
    max_members: int = DEFAULT_MAX_MEMBERS,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
) -> Path:
    """Extract a bundle ``.tar.gz`` into the new folder ``dest`` (must not exist); return it.

    Only regular files and directories with acceptable relative names are allowed; links,
    devices, FIFOs, sparse or duplicate members, too many members and too many bytes (counted
    while streaming, with every read bounded, so a gzip bomb stops at the limit) raise
    BundleIntegrityError naming the member, after removing everything extracted.  A leading
    ``./`` is accepted.  Permissions in the archive are ignored (files 0644, folders 0755).
    """
    archive, dest = Path(archive), Path(dest)
    where = str(archive)
    if os.path.lexists(dest):
        raise UsageError(f"{dest}: already exists; safe_unpack extracts into a new folder only")
    try:
        src = open(archive, "rb")  # closed in the finally below
    except OSError as exc:
        raise UsageError(f"{archive}: cannot open archive: {exc.strerror or exc}") from None
    try:
        os.mkdir(dest, 0o700)
    except OSError as exc:
        src.close()
        raise UsageError(f"{dest}: cannot create: {exc.strerror or exc}") from None
    ok = False
    try:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise UsageError(f"{archive}: not a regular file")
        stream_limit = max_total_bytes + (max_members + 2) * 3 * tarfile.BLOCKSIZE + (1 << 20)
        gz = gzip.GzipFile(fileobj=src, mode="rb")
        bounded = _BoundedReader(gz, stream_limit, where)
        try:
            _extract_all(bounded, dest, where, max_members, max_total_bytes, max_member_bytes)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            _fail(where, "(archive)", f"not a valid .tar.gz: {exc}")
        except UnicodeError as exc:
            _fail(where, "(archive)", f"undecodable member name: {exc}")
        os.chmod(dest, 0o755)
        ok = True
        return dest
    finally:
        src.close()
        if not ok:
            shutil.rmtree(dest, ignore_errors=True)


def _extract_all(
    stream: _BoundedReader,
    dest: Path,
    where: str,
    max_members: int,
    max_total_bytes: int,
    max_member_bytes: int,
) -> None:
    seen: dict[str, str] = {}  # name -> "file" | "dir" | "implied dir" (created for a member)
    dest_str = os.path.abspath(dest)
    total = 0
    count = 0
    guarded = type("_GuardedTarInfo", (_GuardedTarInfo,), {"where": where})
    opened = tarfile.open(fileobj=stream, mode="r|", tarinfo=guarded, encoding="utf-8", errors="strict")
    with opened as tar:
        for member in tar:
            count += 1
            raw_name = member.name
            name = raw_name
            while name.startswith("./"):
                name = name[2:]
            name = name.rstrip("/") if member.isdir() else name
            if count > max_members:
                _fail(where, raw_name, f"more than {max_members} members")
            if member.isdir() and name in ("", "."):
                continue
            why = _check_relpath(name)
            if why:
                _fail(where, raw_name, f"member name rejected: {why}")
            if member.issym():
                _fail(where, raw_name, f"symlink member (-> {display_name(member.linkname)}) not allowed")
            if member.islnk():
                _fail(where, raw_name, f"hard-link member (-> {display_name(member.linkname)}) not allowed")
            if member.sparse is not None:
                _fail(where, raw_name, "sparse member not allowed")
            if not (member.isreg() or member.isdir()):
                _fail(where, raw_name, "device, FIFO or other special member not allowed")
            target = os.path.normpath(os.path.join(dest_str, name))
            if os.path.commonpath([dest_str, target]) != dest_str or target == dest_str:
                _fail(where, raw_name, "member would land outside the destination")  # belt and braces
            if member.isdir() and seen.get(name) == "implied dir":
                seen[name] = "dir"  # its contents came first; the folder exists already
                continue
            if seen.get(name) == "implied dir":
                _fail(where, raw_name, "a file member named like a folder of earlier members")
            if name in seen:
                _fail(where, raw_name, "duplicate member")
            if name == SIGNATURE_FILE and member.isdir():
                _fail(where, raw_name, "the envelope name cannot be a folder")
            # Parents: create as needed; a parent that is a file member is a conflict.
            parts = name.split("/")
            for i in range(1, len(parts)):
                parent = "/".join(parts[:i])
                kind = seen.get(parent)
                if kind == "file":
                    _fail(where, raw_name, f"parent {display_name(parent)} is a file member")
                if kind is None:
                    _mkdir_member(dest / parent, where, raw_name)
                    seen[parent] = "implied dir"
            if member.isdir():
                _mkdir_member(dest / name, where, raw_name)
                seen[name] = "dir"
                continue
            if member.size > max_member_bytes:
                _fail(where, raw_name, f"member of {member.size} bytes exceeds {max_member_bytes}")
            if total + member.size > max_total_bytes:
                _fail(
                    where,
                    raw_name,
                    f"total uncompressed size would exceed {max_total_bytes} bytes",
                )
            seen[name] = "file"
            total = _write_member(
                tar, member, dest / name, where, raw_name, total, max_total_bytes, max_member_bytes
            )


def _mkdir_member(path: Path, where: str, raw_name: str) -> None:
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not path.is_dir() or path.is_symlink():
            _fail(where, raw_name, "conflicts with an existing member")
    except OSError as exc:
        _fail(where, raw_name, f"cannot create folder: {exc.strerror or exc}")


def _write_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    target: Path,
    where: str,
    raw_name: str,
    total: int,
    max_total_bytes: int,
    max_member_bytes: int,
) -> int:
    src = tar.extractfile(member)
    if src is None:
        _fail(where, raw_name, "cannot read member data")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    try:
        fd = os.open(target, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG):
            _fail(where, raw_name, f"cannot create file: {exc.strerror}")
        raise
    written = 0
    with os.fdopen(fd, "wb") as out:
        while True:
            chunk = src.read(HASH_CHUNK)  # type: ignore[union-attr]
            if not chunk:
                break
            written += len(chunk)
            total += len(chunk)
            if written > max_member_bytes:
                _fail(where, raw_name, f"member larger than {max_member_bytes} bytes")
            if total > max_total_bytes:
                _fail(where, raw_name, f"total uncompressed size exceeds {max_total_bytes} bytes")
            out.write(chunk)
    if written != member.size:
        _fail(where, raw_name, f"truncated member: {written} of {member.size} bytes")
    return total


def find_bundle_root(folder: Path) -> Path:
    """``folder`` if it holds the envelope, else its single sub-folder that does (archives made
    with ``tar czf x.tgz bundle/``); otherwise ``folder`` (verification then reports it)."""
    folder = Path(folder)
    if os.path.lexists(folder / SIGNATURE_FILE):
        return folder
    entries = list(folder.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        if os.path.lexists(entries[0] / SIGNATURE_FILE):
            return entries[0]
    return folder
