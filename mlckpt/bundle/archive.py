"""Packed bundles: ``pack`` and the bounded, link-free ``safe_unpack`` (tarfile never extracts)."""

from __future__ import annotations

import errno
import gzip
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlckpt.bundle._common import (
    DEFAULT_MAX_MEMBER_BYTES,
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_TOTAL_BYTES,
    HASH_CHUNK,
    MAX_TAR_METADATA_BYTES,
    O_CLOEXEC,
    O_NOFOLLOW,
    SIGNATURE_FILE,
    atomic_file,
    display_name,
    fail,
    problem,
    raise_problems,
    relpath_problem,
)
from mlckpt.bundle._fs import open_beneath, open_error, open_kind, open_root, scan
from mlckpt.errors import IntegrityKind, UsageError


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
    root_fd = open_root(folder)
    try:
        files, bad = scan(root_fd)
        names = sorted(files)
        if _has_envelope(root_fd, where):
            names = sorted([*names, SIGNATURE_FILE])
        problems = bad + [problem(n, why, IntegrityKind.PATHS) for n in names if (why := relpath_problem(n))]
        raise_problems(where, sorted(problems))
        with (
            atomic_file(out_abs) as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
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
        fail(where, SIGNATURE_FILE, "is not a regular file", IntegrityKind.PATHS)
    return True


def _add_member(tar: tarfile.TarFile, root_fd: int, name: str, where: str) -> None:
    try:
        fd = open_beneath(root_fd, name)
    except OSError as exc:
        fail(where, name, open_error(exc), open_kind(exc))
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
            fail(
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

    def _proc_member(self, tarfile_: tarfile.TarFile) -> object:
        meta = (
            tarfile.XHDTYPE,
            tarfile.XGLTYPE,
            tarfile.SOLARIS_XHDTYPE,
            tarfile.GNUTYPE_LONGNAME,
            tarfile.GNUTYPE_LONGLINK,
        )
        if self.type in meta and self.size > MAX_TAR_METADATA_BYTES:
            fail(
                self.where,
                self.name,
                f"metadata header of {self.size} bytes exceeds {MAX_TAR_METADATA_BYTES}",
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            fail(self.where, self.name, "sparse members are not allowed", IntegrityKind.PATHS)
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
            fail(where, "(archive)", f"not a valid .tar.gz: {exc}")
        except UnicodeError as exc:
            fail(where, "(archive)", f"undecodable member name: {exc}")
        os.chmod(dest, 0o755)
        ok = True
        return dest
    finally:
        src.close()
        if not ok:
            shutil.rmtree(dest, ignore_errors=True)


def _check_member(member: tarfile.TarInfo, name: str, raw_name: str, where: str, dest_str: str) -> None:
    """Refuse a member whose name or type a bundle may not hold (every refusal is a PATHS problem)."""
    why = relpath_problem(name)
    if why:
        fail(where, raw_name, f"member name rejected: {why}", IntegrityKind.PATHS)
    if member.issym():
        fail(
            where,
            raw_name,
            f"symlink member (-> {display_name(member.linkname)}) not allowed",
            IntegrityKind.PATHS,
        )
    if member.islnk():
        fail(
            where,
            raw_name,
            f"hard-link member (-> {display_name(member.linkname)}) not allowed",
            IntegrityKind.PATHS,
        )
    if member.sparse is not None:
        fail(where, raw_name, "sparse member not allowed", IntegrityKind.PATHS)
    if not (member.isreg() or member.isdir()):
        fail(where, raw_name, "device, FIFO or other special member not allowed", IntegrityKind.PATHS)
    target = os.path.normpath(os.path.join(dest_str, name))
    if os.path.commonpath([dest_str, target]) != dest_str or target == dest_str:
        fail(
            where, raw_name, "member would land outside the destination", IntegrityKind.PATHS
        )  # belt and braces


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
    # a stream ("r|") is only read: the reader has no seek or write for the file protocol's stubs
    opened = tarfile.open(fileobj=stream, mode="r|", tarinfo=guarded,  # type: ignore[call-overload]
                          encoding="utf-8", errors="strict")
    with opened as tar:
        for member in tar:
            count += 1
            raw_name = member.name
            name = raw_name
            while name.startswith("./"):
                name = name[2:]
            name = name.rstrip("/") if member.isdir() else name
            if count > max_members:
                fail(where, raw_name, f"more than {max_members} members")
            if member.isdir() and name in ("", "."):
                continue
            _check_member(member, name, raw_name, where, dest_str)
            if member.isdir() and seen.get(name) == "implied dir":
                seen[name] = "dir"  # its contents came first; the folder exists already
                continue
            if seen.get(name) == "implied dir":
                fail(
                    where,
                    raw_name,
                    "a file member named like a folder of earlier members",
                    IntegrityKind.PATHS,
                )
            if name in seen:
                fail(where, raw_name, "duplicate member")
            if name == SIGNATURE_FILE and member.isdir():
                fail(where, raw_name, "the envelope name cannot be a folder", IntegrityKind.PATHS)
            _make_parents(name, raw_name, dest, where, seen)
            if member.isdir():
                _mkdir_member(dest / name, where, raw_name)
                seen[name] = "dir"
                continue
            if member.size > max_member_bytes:
                fail(where, raw_name, f"member of {member.size} bytes exceeds {max_member_bytes}")
            if total + member.size > max_total_bytes:
                fail(
                    where,
                    raw_name,
                    f"total uncompressed size would exceed {max_total_bytes} bytes",
                )
            seen[name] = "file"
            total = _write_member(
                tar, member, dest / name, where, raw_name, total, max_total_bytes, max_member_bytes
            )


def _make_parents(name: str, raw_name: str, dest: Path, where: str, seen: dict[str, str]) -> None:
    """Create a member's parent folders as needed; a parent that is a file member is a conflict."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        kind = seen.get(parent)
        if kind == "file":
            fail(where, raw_name, f"parent {display_name(parent)} is a file member", IntegrityKind.PATHS)
        if kind is None:
            _mkdir_member(dest / parent, where, raw_name)
            seen[parent] = "implied dir"


def _mkdir_member(path: Path, where: str, raw_name: str) -> None:
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not path.is_dir() or path.is_symlink():
            fail(where, raw_name, "conflicts with an existing member")
    except OSError as exc:
        fail(where, raw_name, f"cannot create folder: {exc.strerror or exc}")


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
        fail(where, raw_name, "cannot read member data")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC
    try:
        fd = os.open(target, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG):
            fail(where, raw_name, f"cannot create file: {exc.strerror}")
        raise
    written = 0
    with os.fdopen(fd, "wb") as out:
        while True:
            chunk = src.read(HASH_CHUNK)
            if not chunk:
                break
            written += len(chunk)
            total += len(chunk)
            if written > max_member_bytes:
                fail(where, raw_name, f"member larger than {max_member_bytes} bytes")
            if total > max_total_bytes:
                fail(where, raw_name, f"total uncompressed size exceeds {max_total_bytes} bytes")
            out.write(chunk)
    if written != member.size:
        fail(where, raw_name, f"truncated member: {written} of {member.size} bytes")
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


@contextmanager
def open_bundle(path: Path) -> Iterator[Path]:
    """A bundle's folder: ``path`` itself, or a packed bundle unpacked by :func:`safe_unpack`
    (the one set of archive limits) into a temporary folder removed on exit."""
    path = Path(path)
    if path.is_dir():
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="mlckpt-bundle-")
    try:
        yield find_bundle_root(safe_unpack(path, Path(tmp) / "bundle"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
