"""Internal: a bundle's files opened beneath its folder's descriptor (never following a link),
scanned and hashed."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlckpt.bundle._common import (
    HASH_CHUNK,
    MAX_DEPTH,
    O_CLOEXEC,
    O_DIRECTORY,
    O_NOFOLLOW,
    O_NONBLOCK,
    PARALLEL_MIN_BYTES,
    SIGNATURE_FILE,
    Problem,
    problem,
    thread_state,
)
from mlckpt.errors import IntegrityKind, UsageError


class _NotRegular(OSError):
    pass


def open_root(folder: Path) -> int:
    try:
        return os.open(folder, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"{folder}: no such bundle folder") from None
    except NotADirectoryError:
        raise UsageError(f"{folder}: not a folder") from None


def open_beneath(root_fd: int, rel: str) -> int:
    """Open regular file ``rel`` beneath ``root_fd`` following no symlink; fd or OSError."""
    parts = rel.split("/")
    dir_fd = root_fd
    opened: list[int] = []
    try:
        for part in parts[:-1]:
            dir_fd = os.open(part, os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, dir_fd=dir_fd)
            opened.append(dir_fd)
        fd = os.open(parts[-1], os.O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, dir_fd=dir_fd)
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


def open_error(exc: OSError) -> str:
    if isinstance(exc, _NotRegular):
        return "is not a regular file"
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return "is a symlink (not allowed in bundles)"
    if exc.errno == errno.ENOENT:
        return "missing"
    if exc.errno == errno.ENOTDIR:
        return "a parent component is not a directory"
    return f"cannot read: {exc.strerror or exc}"


def open_kind(exc: OSError) -> str | None:
    """The integrity kind of a failed open: an entry a bundle may not hold, or (None) the default."""
    if isinstance(exc, _NotRegular) or exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
        return IntegrityKind.PATHS
    return None


def scan(root_fd: int) -> tuple[dict[str, int], list[Problem]]:
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
                    bad.append(problem(rel, "is a symlink (not allowed in bundles)", IntegrityKind.PATHS))
                elif entry.is_dir(follow_symlinks=False):
                    if depth >= MAX_DEPTH:
                        bad.append(
                            problem(rel, f"nested deeper than {MAX_DEPTH} folders", IntegrityKind.PATHS)
                        )
                        continue
                    sub = os.open(
                        entry.name,
                        os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                        dir_fd=dir_fd,
                    )
                    try:
                        walk(sub, rel + "/", depth + 1)
                    finally:
                        os.close(sub)
                elif entry.is_file(follow_symlinks=False):
                    files[rel] = entry.stat(follow_symlinks=False).st_size
                else:
                    bad.append(
                        problem(rel, "is not a regular file (device, FIFO or socket)", IntegrityKind.PATHS)
                    )
            except OSError as exc:
                bad.append(problem(rel, open_error(exc), open_kind(exc)))

    walk(root_fd, "", 0)
    files.pop(SIGNATURE_FILE, None)
    if any(p == SIGNATURE_FILE for p, _ in bad):
        bad = [b for b in bad if b[0] != SIGNATURE_FILE]  # reported by the envelope reader
    return files, bad


def _hash_one(root_fd: int, rel: str) -> str:
    buf = getattr(thread_state, "buf", None)
    if buf is None:
        buf = thread_state.buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    fd = open_beneath(root_fd, rel)
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


def hash_many(root_fd: int, sizes: Mapping[str, int]) -> dict[str, str | OSError]:
    """sha256 of each file (or the OSError met), largest first over a small thread pool."""
    order = sorted(sizes, key=lambda n: (-sizes[n], n))

    def job(rel: str) -> str | OSError:
        try:
            return _hash_one(root_fd, rel)
        except OSError as exc:
            return exc

    if len(order) < 2 or sum(sizes.values()) < PARALLEL_MIN_BYTES:
        return {rel: job(rel) for rel in order}
    with ThreadPoolExecutor(max_workers=min(_hash_workers(), len(order))) as pool:
        return dict(zip(order, pool.map(job, order), strict=True))
