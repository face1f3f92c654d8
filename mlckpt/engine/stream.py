"""Streaming I/O through a bounded ring (content made and checked per request), the async
snapshot, and the verified drain from a fast tier to the durable one."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from time import perf_counter_ns

import numpy as np

from mlckpt.engine.content import (
    PAGE,
    FileContent,
    Mismatch,
    check_buffer,
    equal_bytes,
    mismatch_at,
    round_up,
)
from mlckpt.engine.files import (
    RWF_DONTCACHE,
    FileResult,
    IOOptions,
    RequestPlan,
    StreamFile,
    close_all,
    create_file,
    finish_file,
    fsync_dir,
    layout,
    open_sized,
    pread_all,
    pwrite_all,
    read_set,
    run_pool,
    write_set,
)
from mlckpt.errors import InternalError
from mlckpt.workload.pipeline import ring_bytes


class _Slots:
    """Per-thread slices of the ring: each worker thread gets its own ``width``-byte slots."""

    def __init__(self, ring: np.ndarray, width: int, per_thread: int, threads: int) -> None:
        need = width * per_thread * threads
        if len(ring) < need or ring.ctypes.data % PAGE:
            raise InternalError(
                f"stream ring of {len(ring)} B cannot hold {threads} threads × "
                f"{per_thread} × {width} B (page-aligned)"
            )
        self.ring, self.width, self.per = ring, width, per_thread
        self.assigned: dict[int, int] = {}
        self.lock = threading.Lock()

    def mine(self, j: int) -> np.ndarray:
        tid = threading.get_ident()
        with self.lock:
            t = self.assigned.setdefault(tid, len(self.assigned))
        base = (t * self.per + j) * self.width
        return self.ring[base : base + self.width]


def stream_ring_bytes(opts: IOOptions, *, reading: bool) -> int:
    """Ring bytes a stream op needs: one block per thread (two when verifying reads)."""
    return ring_bytes(opts.threads, opts.block_size, verifying=reading)


def _check_block(key: bytes, f: StreamFile, got: np.ndarray, want: np.ndarray, pos: int) -> None:
    """Compare one block read at file offset ``pos`` with its regenerated content (``want`` is
    scratch of the same length); raise StreamMismatch at the first differing byte."""
    real = len(got)
    FileContent(key, f.pid, pos).produce(want[:real], pos)
    if not equal_bytes(want[:real], got):
        at = int(np.flatnonzero(want[:real] != got)[0])
        page0 = at // PAGE * PAGE
        m = mismatch_at(got[page0 : page0 + PAGE], min(PAGE, real - page0), f.pid, at - page0)
        raise StreamMismatch(f.path, replace(m, offset=pos + at, expected_page=(pos + at) // PAGE))


def write_stream(
    files: Sequence[StreamFile],
    key: bytes,
    opts: IOOptions,
    ring: np.ndarray,
    *,
    dir_fsync: Sequence[str] = (),
) -> list[FileResult]:
    """``residency=stream`` write: every request's content is generated into the worker's ring slot
    and written from there, so memory stays at the ring while the file can be any size.  The
    generation (AES-CTR + tags) is inside the caller's timed region: stream results are labelled."""
    lay = layout(files, opts)
    slots = _Slots(ring, opts.block_size, 1, min(opts.threads, max(lay.plan.total, 1)))

    def write_one(fds: Sequence[int], i: int) -> int:
        k, pos, end = lay.plan.request(i)
        f = files[k]
        buf = slots.mine(0)[: end - pos]
        real = max(0, min(end, f.nbytes) - pos)
        FileContent(key, f.pid, pos).produce(buf[:real], pos)
        buf[real:] = 0  # O_DIRECT tail padding, truncated after the data
        t0 = perf_counter_ns()  # the request, not the content's generation before it
        pwrite_all(fds[k], f.path, memoryview(buf), pos, lay.flags)
        return perf_counter_ns() - t0

    return write_set(files, opts, lay, write_one, dir_fsync=dir_fsync)


class StreamMismatch(Exception):
    """A block read in stream mode differs from its expected content."""

    def __init__(self, path: str, mismatch: Mismatch) -> None:
        super().__init__(f"{path}: {mismatch.describe()}")
        self.path = path
        self.mismatch = mismatch


def read_stream(
    files: Sequence[StreamFile], key: bytes, opts: IOOptions, ring: np.ndarray
) -> list[FileResult]:
    """``residency=stream`` restore: each block is read into the worker's ring slot and verified
    there against regenerated content (inside the timed region: there is nowhere else to keep it).
    The first difference raises StreamMismatch with its exact file offset."""
    lay = layout(files, opts)
    slots = _Slots(ring, opts.block_size, 2, min(opts.threads, max(lay.plan.total, 1)))

    def read_one(fds: Sequence[int], i: int) -> int:
        k, pos, end = lay.plan.request(i)
        f = files[k]
        got, want = slots.mine(0)[: end - pos], slots.mine(1)[: end - pos]
        need = min(end, f.nbytes)
        t0 = perf_counter_ns()
        pread_all(fds[k], f.path, memoryview(got), pos, need, f.nbytes, lay.flags)
        took = perf_counter_ns() - t0  # the request; its verification follows, in the transfer phase
        _check_block(key, f, got[: need - pos], want, pos)
        return took

    return read_set(files, opts, lay, read_one)


SNAPSHOT_CHUNK = 64 << 20


def snapshot(dst: np.ndarray, src: np.ndarray, nbytes: int, threads: int) -> None:
    """Copy ``src[:nbytes]`` into the staging buffer ``dst`` (what an asynchronous checkpoint's
    stall is: a device-to-host copy in a real trainer).  ``threads`` copies in parallel (numpy
    releases the GIL for plain copies)."""
    check_buffer(src, nbytes, "snapshot source", writable=False)
    check_buffer(dst, nbytes, "snapshot staging", writable=True)
    chunks = -(-nbytes // SNAPSHOT_CHUNK)

    def copy_one(i: int) -> None:
        a, b = i * SNAPSHOT_CHUNK, min((i + 1) * SNAPSHOT_CHUNK, nbytes)
        np.copyto(dst[a:b], src[a:b])

    run_pool(chunks, copy_one, threads)


@dataclass(frozen=True)
class DrainResult:
    verified_bytes: int
    mismatch: tuple[str, Mismatch] | None  # (fast-tier path, first difference), if any


def drain(files: Sequence[StreamFile], targets: Sequence[str], key: bytes, src: IOOptions, dst: IOOptions,
          ring: np.ndarray, *, dir_fsync: Sequence[str] = ()) -> DrainResult:
    """Copy fast-tier files (``files``: path, size and whose content they hold) to the durable tier
    (``targets``), verifying every page of what the fast tier gave back before writing it, then
    fsync each target and ``dir_fsync``.  Bounded memory: two blocks per worker of ``ring``.
    A page that differs stops the drain: nothing unverified reaches the durable tier (the target
    is left short and the caller fails the run)."""
    if len(files) != len(targets):
        raise InternalError("drain: one target per file")
    padded = src.direct or dst.direct  # an O_DIRECT side needs whole-page requests (tail padded)
    lengths = [round_up(f.nbytes) if padded else f.nbytes for f in files]
    plan = RequestPlan(lengths, dst.block_size)
    slots = _Slots(ring, dst.block_size, 2, min(dst.threads, max(plan.total, 1)))
    rflags = RWF_DONTCACHE if src.dontcache else 0
    wflags = RWF_DONTCACHE if dst.dontcache else 0
    found: list[tuple[str, Mismatch]] = []
    fds: list[int] = []
    outs: list[int] = []
    try:
        for f in files:
            fds.append(open_sized(f.path, f.nbytes, src.direct))
        for t in targets:
            outs.append(create_file(t, dst.direct))

        def copy_one(i: int) -> None:
            k, pos, end = plan.request(i)
            f = files[k]
            got, want = slots.mine(0)[: end - pos], slots.mine(1)[: end - pos]
            need = min(end, f.nbytes)
            pread_all(fds[k], f.path, memoryview(got), pos, need, f.nbytes, rflags)
            try:
                _check_block(key, f, got[: need - pos], want, pos)
            except StreamMismatch as exc:
                found.append((exc.path, exc.mismatch))
                raise
            got[need - pos :] = 0  # O_DIRECT tail padding, truncated below
            pwrite_all(outs[k], targets[k], memoryview(got), pos, wflags)

        def finish_one(k: int) -> None:
            finish_file(outs[k], targets[k], files[k].nbytes, lengths[k], dst.fsync)

        try:
            run_pool(plan.total, copy_one, dst.threads, dst.pool)
        except StreamMismatch:
            return DrainResult(0, found[0])
        run_pool(len(files), finish_one, dst.threads, dst.pool)
        for d in dir_fsync:
            fsync_dir(d)
        close_all(outs, list(targets), report=True)
    finally:
        close_all(fds, [f.path for f in files], report=False)
        close_all(outs, list(targets), report=False)
    return DrainResult(sum(f.nbytes for f in files), None)
