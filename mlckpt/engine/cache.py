"""The page cache: eviction, residency (mincore), dropping the system's caches, and probes of
what a filesystem accepts (O_DIRECT, RWF_DONTCACHE)."""

from __future__ import annotations

import ctypes
import errno as errno_mod
import fcntl
import mmap
import os
import tempfile
from collections.abc import Callable

import numpy as np

from mlckpt.engine.content import KEY_BYTES, PAGE, PageId, alloc, fill
from mlckpt.engine.files import RWF_DONTCACHE, io_failure
from mlckpt.errors import IOFailure


def evict(path: str) -> None:
    """Drop the file's pages from the page cache: fdatasync (DONTNEED skips dirty pages), then
    POSIX_FADV_DONTNEED.  Opens read-only, so it works on files the caller may not write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise io_failure("open", path, exc) from exc
    try:
        try:
            os.fdatasync(fd)
        except OSError as exc:
            # Filesystems that cannot sync (read-only, special) have no dirty pages to flush.
            if exc.errno not in (errno_mod.EINVAL, errno_mod.EBADF, errno_mod.EROFS):
                raise io_failure("fdatasync", path, exc) from exc
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            raise io_failure("fadvise", path, exc) from exc
    finally:
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)


_libc.mmap.restype = ctypes.c_void_p


_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]


_libc.munmap.restype = ctypes.c_int


_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


_libc.mincore.restype = ctypes.c_int


_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


_MAP_FAILED = ctypes.c_void_p(-1).value


_MINCORE_WINDOW = 1 << 30  # map big files a window at a time: bounded address space and vector


def _ctypes_error(op: str, path: str) -> IOFailure:
    err = ctypes.get_errno()
    return io_failure(op, path, OSError(err, os.strerror(err)))


def resident_bytes(path: str) -> tuple[int, int]:
    """(bytes of the file in the page cache, file size), from mincore() on a read-only mapping.

    Mapping does not fault pages in and mincore does not either, so measuring does not disturb.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise io_failure("open", path, exc) from exc
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        psize = mmap.PAGESIZE
        window = _MINCORE_WINDOW // psize * psize
        vec = np.zeros(window // psize, dtype=np.uint8)
        resident = 0
        for off in range(0, size, window):
            length = min(window, size - off)
            addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, off)
            if addr is None or addr == _MAP_FAILED:
                raise _ctypes_error("mmap", path)
            try:
                if _libc.mincore(addr, length, vec.ctypes.data) != 0:
                    raise _ctypes_error("mincore", path)
            finally:
                _libc.munmap(addr, length)
            npages = -(-length // psize)
            resident += int(np.count_nonzero(vec[:npages] & 1)) * psize
            if vec[npages - 1] & 1:
                resident -= npages * psize - length  # the last page is only partly file
        return resident, size
    finally:
        os.close(fd)


_DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_caches() -> bool:
    """sync, then empty the whole host's page cache; False when not permitted (containers,
    non-root, read-only /proc).  Global and disruptive: prefer ``evict`` per file."""
    os.sync()
    try:
        fd = os.open(_DROP_CACHES, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, b"3\n")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _probe(folder: str, what: str, attempt: Callable[[int, np.ndarray], None]) -> bool:
    try:
        fd, path = tempfile.mkstemp(prefix=".mlckpt-probe-", dir=folder)
    except OSError as exc:
        raise io_failure(what, folder, exc) from exc
    try:
        page = alloc(PAGE)
        fill(page, PAGE, bytes(KEY_BYTES), PageId(0, 0, 0, 0))
        attempt(fd, page)
        return True
    except OSError as exc:
        if exc.errno in (errno_mod.EINVAL, errno_mod.EOPNOTSUPP, errno_mod.ENOTSUP):
            return False
        raise io_failure(what, folder, exc) from exc
    finally:
        os.close(fd)
        os.unlink(path)


def probe_direct(folder: str) -> bool:
    """Can O_DIRECT be used in ``folder``?  Tries an aligned one-page write and read.

    tmpfs accepts O_DIRECT since Linux 6.6 (True on /dev/shm here), though its data is RAM anyway.
    """

    def attempt(fd: int, page: np.ndarray) -> None:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
        os.pwritev(fd, [page], 0)
        os.preadv(fd, [page], 0)

    return _probe(folder, "probe_direct", attempt)


def probe_dontcache(folder: str) -> bool:
    """Do pwritev/preadv accept RWF_DONTCACHE in ``folder`` (Linux 6.14+, filesystem support)?"""

    def attempt(fd: int, page: np.ndarray) -> None:
        os.pwritev(fd, [page], 0, RWF_DONTCACHE)
        os.preadv(fd, [page], 0, RWF_DONTCACHE)

    return _probe(folder, "probe_dontcache", attempt)
