"""Timed file writes and reads: every request of one rank's files in one queue, ``threads``
workers issuing blocking ``pwritev``/``preadv`` (like fio's iodepth with a synchronous engine)."""

from __future__ import annotations

import bisect
import errno as errno_mod
import fcntl
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import perf_counter_ns

import numpy as np

from mlckpt.engine.content import PAGE, PageId, check_buffer, round_up
from mlckpt.engine.requests import phase, recorder
from mlckpt.errors import ConfigError, InternalError, IOFailure

RWF_DONTCACHE = 0x80  # linux/fs.h, Linux 6.14+; Python's os does not define it


@dataclass(frozen=True)
class IOOptions:
    direct: bool = True  # O_DIRECT
    dontcache: bool = False  # RWF_DONTCACHE on buffered preadv/pwritev (direct must be False)
    threads: int = 4  # requests in flight per rank
    block_size: int = 4 << 20  # bytes per request, multiple of PAGE
    fsync: bool = True
    pool: str = "main"  # which worker pool: "background" for persists behind training (see run_pool)

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}", key="threads")
        if self.block_size < PAGE or self.block_size % PAGE:
            raise ConfigError(
                f"block_size must be a positive multiple of {PAGE}, got {self.block_size}",
                key="block_size",
            )
        if self.direct and self.dontcache:
            raise ConfigError(
                "dontcache applies to buffered I/O only; it cannot be combined with direct",
                key="dontcache",
            )


# eq=False: comparing or hashing a frozen dataclass that holds a numpy buffer is meaningless.
@dataclass(frozen=True, eq=False)
class FileIO:
    path: str  # absolute
    buf: np.ndarray  # from alloc(); len >= nbytes rounded up to PAGE
    nbytes: int


@dataclass(frozen=True)
class FileResult:
    path: str
    nbytes: int
    fsynced: bool
    requests: int  # pwritev/preadv requests issued (retries of short transfers not counted)
    io_bytes: int  # bytes requested from the OS, including O_DIRECT tail padding


_pool_lock = threading.Lock()


_pools: dict[str, tuple[ThreadPoolExecutor, int]] = {}


def _get_pool(workers: int, name: str = "main") -> ThreadPoolExecutor:
    """One persistent pool per name, grown when needed: no thread start-up inside timed regions.
    A background persist has a pool of its own, so it never queues behind (or delays) the
    training-side I/O of the same rank."""
    with _pool_lock:
        pool, have = _pools.get(name, (None, 0))
        if pool is None or have < workers:
            old = pool
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"mlckpt-{name}")
            _pools[name] = (pool, workers)
            if old is not None:
                old.shutdown(wait=False)  # lets work already queued by another caller finish
        return pool


def run_pool(njobs: int, job: Callable[[int], None], threads: int, pool_name: str = "main") -> None:
    """Run job(0..njobs-1) with ``threads`` workers pulling from one shared counter.

    The first failure stops every worker after its current job and is re-raised once all have
    stopped (so nobody closes file descriptors under a request still in flight).
    """
    if njobs <= 0:
        return
    workers = min(threads, njobs)
    counter = itertools.count()  # next() is atomic under the GIL: the whole queue is one int
    errors: list[BaseException] = []

    def worker() -> None:
        while not errors:
            i = next(counter)
            if i >= njobs:
                return
            try:
                job(i)
            except BaseException as exc:
                errors.append(exc)
                return

    pool = _get_pool(workers - 1, pool_name) if workers > 1 else None
    futures = [pool.submit(worker) for _ in range(workers - 1)] if pool else []
    try:
        worker()  # the caller is a worker too: threads=1 never touches the pool
        for f in futures:
            f.result()
    except BaseException as exc:  # e.g. KeyboardInterrupt while waiting
        errors.append(exc)
        for f in futures:
            f.result()
        raise
    if errors:
        raise errors[0]


def io_failure(op: str, path: str, exc: OSError, offset: int | None = None, note: str = "") -> IOFailure:
    at = f" at offset {offset}" if offset is not None else ""
    reason = exc.strerror or os.strerror(exc.errno or 0)
    return IOFailure(
        f"{op} failed on {path}{at}: {reason} (errno {exc.errno}){note}",
        op=op,
        path=path,
        errno=exc.errno,
        offset=offset,
    )


def _set_direct(fd: int, path: str, *, created: bool) -> None:
    """Turn on O_DIRECT after open, so a refusal is told apart from other open errors."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
    except OSError as exc:
        os.close(fd)
        if created:  # O_EXCL guarantees the empty file is ours: leave nothing behind
            try:
                os.unlink(path)
            except OSError:
                pass
        raise io_failure(
            "open_direct",
            path,
            exc,
            note="; the filesystem refuses O_DIRECT (run with direct I/O off to use the page cache)",
        ) from exc


def create_file(path: str, direct: bool) -> int:
    try:
        # O_EXCL: never overwrite a file nor follow a symlink planted at the path.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        note = "; refusing to overwrite an existing file" if exc.errno == errno_mod.EEXIST else ""
        raise io_failure("open", path, exc, note=note) from exc
    if direct:
        _set_direct(fd, path, created=True)
    return fd


def _open_read(path: str, direct: bool) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise io_failure("open", path, exc) from exc
    if direct:
        _set_direct(fd, path, created=False)
    return fd


def close_all(fds: list[int], paths: Sequence[str], *, report: bool) -> None:
    first: IOFailure | None = None
    for k, fd in enumerate(fds):
        if fd < 0:
            continue
        fds[k] = -1
        try:
            os.close(fd)
        except OSError as exc:  # NFS and others report deferred write errors at close
            if report and first is None:
                first = io_failure("close", paths[k], exc)
    if first is not None:
        raise first


class RequestPlan:
    """Requests of several files as one numbered queue: request i -> (file, offset, end)."""

    def __init__(self, lengths: Sequence[int], block_size: int) -> None:
        self.lengths = list(lengths)
        self.bs = block_size
        self.counts = [-(-n // block_size) for n in self.lengths]
        self.starts = [0, *itertools.accumulate(self.counts)]
        self.total = self.starts[-1]

    def request(self, i: int) -> tuple[int, int, int]:
        k = bisect.bisect_right(self.starts, i) - 1
        off = (i - self.starts[k]) * self.bs
        return k, off, min(off + self.bs, self.lengths[k])


@dataclass(frozen=True)
class Layout:
    """What every timed path shares: the paths, the on-disk lengths (O_DIRECT pads the tail to a
    page), the numbered request queue and the pwritev/preadv flags."""

    paths: list[str]
    lengths: list[int]
    plan: RequestPlan
    flags: int


def layout(files: Sequence[FileIO | StreamFile], opts: IOOptions) -> Layout:
    lengths = [round_up(f.nbytes) if opts.direct else f.nbytes for f in files]
    return Layout([f.path for f in files], lengths, RequestPlan(lengths, opts.block_size),
                  RWF_DONTCACHE if opts.dontcache else 0)


# One request of a write or read set: (the open files, the request's number) -> the nanoseconds
# the request itself took (what the op's latency histogram records).
Request = Callable[[Sequence[int], int], int]


def write_set(files: Sequence[FileIO | StreamFile], opts: IOOptions, lay: Layout,
              request: Request, *, dir_fsync: Sequence[str] = ()) -> list[FileResult]:
    """The skeleton of every timed write, each step a phase: create every file (never an existing
    one), issue the requests in the pool, cut each file's padding and fsync it (many files'
    fsyncs overlap too), fsync the folders, close.  Files already created are left in place on
    failure (the runner owns the folder and cleans it)."""
    req, took = recorder(opts.pool)
    fds: list[int] = []
    try:
        with phase(req, "open"):
            for f in files:
                fds.append(create_file(f.path, opts.direct))

        def finish_one(k: int) -> None:
            finish_file(fds[k], files[k].path, files[k].nbytes, lay.lengths[k], opts.fsync)

        with phase(req, "transfer"):
            run_pool(lay.plan.total, lambda i: took(request(fds, i)), opts.threads, opts.pool)
        with phase(req, "fsync"):
            run_pool(len(files), finish_one, opts.threads, opts.pool)
        with phase(req, "dir_fsync"):
            for d in dir_fsync:
                fsync_dir(d)
            close_all(fds, lay.paths, report=True)
    finally:
        close_all(fds, lay.paths, report=False)
    return [FileResult(f.path, f.nbytes, opts.fsync, lay.plan.counts[k], lay.lengths[k])
            for k, f in enumerate(files)]


def read_set(files: Sequence[FileIO | StreamFile], opts: IOOptions, lay: Layout,
             request: Request) -> list[FileResult]:
    """The skeleton of every timed read: open every file (its size checked before any read),
    issue the requests in the pool, close."""
    req, took = recorder(opts.pool)
    fds: list[int] = []
    try:
        with phase(req, "open"):
            for f in files:
                fds.append(open_sized(f.path, f.nbytes, opts.direct))
        with phase(req, "transfer"):
            run_pool(lay.plan.total, lambda i: took(request(fds, i)), opts.threads, opts.pool)
    finally:
        close_all(fds, lay.paths, report=False)
    return [FileResult(f.path, f.nbytes, False, lay.plan.counts[k], lay.lengths[k])
            for k, f in enumerate(files)]


def pwrite_all(fd: int, path: str, mv: memoryview, pos: int, flags: int) -> None:
    """Write all of ``mv`` at file offset ``pos``, continuing short writes where they stopped."""
    done = 0
    while done < len(mv):
        try:
            n = os.pwritev(fd, [mv[done:]], pos + done, flags)
        except OSError as exc:
            raise io_failure("write", path, exc, pos + done) from exc
        if n <= 0:
            raise IOFailure(f"write failed on {path} at offset {pos + done}: wrote 0 bytes",
                            op="write", path=path, offset=pos + done)
        done += n


def pread_all(fd: int, path: str, mv: memoryview, pos: int, need: int, size: int, flags: int) -> None:
    """Read file bytes [pos, need) into ``mv`` (whose length may be the padded request: an O_DIRECT
    read of the tail ends short, at end of file), continuing short reads."""
    done = pos
    while done < need:
        try:
            n = os.preadv(fd, [mv[done - pos :]], done, flags)
        except OSError as exc:
            raise io_failure("read", path, exc, done) from exc
        if n <= 0:
            raise IOFailure(f"read failed on {path} at offset {done}: unexpected end of file "
                            f"(expected {size} bytes)", op="read", path=path, offset=done)
        done += n


def _check_files(files: Sequence[FileIO], opts: IOOptions, what: str, writable: bool) -> None:
    for f in files:
        if f.nbytes < 0:
            raise InternalError(f"{what}: negative size for {f.path}")
        check_buffer(f.buf, round_up(f.nbytes), f"{what} {f.path}", writable=writable)
        if opts.direct and f.buf.ctypes.data % PAGE:
            raise InternalError(f"{what} {f.path}: O_DIRECT needs a page-aligned buffer (alloc)")


def write_files(
    files: Sequence[FileIO], opts: IOOptions, *, dir_fsync: Sequence[str] = ()
) -> list[FileResult]:
    """The timed part of one rank's checkpoint: create, write, (truncate,) fsync; fsync folders.

    Files must not exist.  With O_DIRECT a tail that is not a page multiple is written as a full
    padded page, then the file is truncated to ``nbytes``.  On failure, files already created are
    left in place (the runner owns the folder and cleans it).
    """
    _check_files(files, opts, "write", writable=False)
    lay = layout(files, opts)
    views = [memoryview(f.buf) for f in files]

    def write_one(fds: Sequence[int], i: int) -> int:
        t0 = perf_counter_ns()
        k, pos, end = lay.plan.request(i)
        pwrite_all(fds[k], lay.paths[k], views[k][pos:end], pos, lay.flags)
        return perf_counter_ns() - t0

    return write_set(files, opts, lay, write_one, dir_fsync=dir_fsync)


def finish_file(fd: int, path: str, nbytes: int, written: int, fsync: bool) -> None:
    """After the data: cut the O_DIRECT tail padding back to ``nbytes``, then fsync."""
    if written != nbytes:
        try:
            os.ftruncate(fd, nbytes)
        except OSError as exc:
            raise io_failure("truncate", path, exc, nbytes) from exc
    if fsync:
        try:
            os.fsync(fd)
        except OSError as exc:
            raise io_failure("fsync", path, exc) from exc


def open_sized(path: str, nbytes: int, direct: bool) -> int:
    """Open a checkpoint file for reading; its size must be exactly ``nbytes``."""
    fd = _open_read(path, direct)
    try:
        size = os.fstat(fd).st_size
    except OSError as exc:
        os.close(fd)
        raise io_failure("stat", path, exc) from exc
    if size != nbytes:
        os.close(fd)
        how = "truncated" if size < nbytes else "extended"
        raise IOFailure(
            f"size check failed on {path}: expected {nbytes} bytes, found {size} ({how} checkpoint file)",
            op="size",
            path=path,
        )
    return fd


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise io_failure("fsync_dir", path, exc) from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        raise io_failure("fsync_dir", path, exc) from exc
    finally:
        os.close(fd)


def read_files(files: Sequence[FileIO], opts: IOOptions) -> list[FileResult]:
    """The timed restore of one rank: read every file back in place into its buffer.

    Each file's size must equal ``nbytes`` (checked with fstat before any read).  With O_DIRECT
    the tail is read as a full page; the kernel stops at end of file.
    """
    _check_files(files, opts, "read", writable=True)
    lay = layout(files, opts)
    views = [memoryview(f.buf) for f in files]

    def read_one(fds: Sequence[int], i: int) -> int:
        t0 = perf_counter_ns()
        k, pos, end = lay.plan.request(i)
        pread_all(fds[k], lay.paths[k], views[k][pos:end], pos, min(end, files[k].nbytes),
                  files[k].nbytes, lay.flags)
        return perf_counter_ns() - t0

    return read_set(files, opts, lay, read_one)


@dataclass(frozen=True, eq=False)
class StreamFile:
    path: str
    nbytes: int
    pid: PageId  # whose content the file holds (the writer's identity, also when reading)
