"""Byte ranges of files read into place: a part of a shard file, as a replica loading a model reads
it (mlckpt/workload/serving_load.py).  The same queue as :func:`mlckpt.engine.read_files`: every
request of every range in one numbered queue, ``threads`` of them in flight, ``preadv`` straight into
the caller's buffer; each file opened once and its size checked before any byte is read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter_ns

import numpy as np

from mlckpt.engine.content import PAGE, check_buffer, round_up
from mlckpt.engine.files import (
    RWF_DONTCACHE,
    IOOptions,
    RequestPlan,
    close_all,
    open_sized,
    pread_all,
    run_pool,
)
from mlckpt.engine.requests import phase, recorder
from mlckpt.errors import InternalError


# eq=False: a frozen dataclass holding a numpy buffer has no meaningful equality.
@dataclass(frozen=True, eq=False)
class RangeIO:
    """``nbytes`` of file ``path`` (of ``file_bytes`` in all) from ``offset``, into ``buf``."""

    path: str
    file_bytes: int
    offset: int
    buf: np.ndarray  # len >= nbytes (rounded up to a page with O_DIRECT)
    nbytes: int


def read_ranges(ranges: Sequence[RangeIO], opts: IOOptions) -> int:
    """Read every range into its buffer; the bytes read.  With O_DIRECT every range starts on a
    page of its file and of memory, and ends on one or at the file's end."""
    for r in ranges:
        if not (0 <= r.offset and r.nbytes >= 0 and r.offset + r.nbytes <= r.file_bytes):
            raise InternalError(f"read {r.path}: range {r.offset}+{r.nbytes} outside its "
                                f"{r.file_bytes} bytes")
        ends_file = r.offset + r.nbytes == r.file_bytes
        check_buffer(r.buf, round_up(r.nbytes) if opts.direct else r.nbytes, f"read {r.path}", writable=True)
        whole = r.offset % PAGE == 0 and r.buf.ctypes.data % PAGE == 0 and (r.nbytes % PAGE == 0 or ends_file)
        if opts.direct and not whole:
            raise InternalError(f"read {r.path}: O_DIRECT reads whole pages into page-aligned memory")
    paths = sorted({r.path for r in ranges})
    lengths = [round_up(r.nbytes) if opts.direct else r.nbytes for r in ranges]
    queue = RequestPlan(lengths, opts.block_size)
    flags = RWF_DONTCACHE if opts.dontcache else 0
    views = [memoryview(r.buf) for r in ranges]
    req, took = recorder(opts.pool)  # each request's latency and the phases, as every timed read's
    fds: list[int] = []
    try:
        sizes = {r.path: r.file_bytes for r in ranges}
        with phase(req, "open"):
            for p in paths:
                fds.append(open_sized(p, sizes[p], opts.direct))
        fd_of = dict(zip(paths, fds, strict=True))

        def read_one(i: int) -> None:
            t0 = perf_counter_ns()
            k, a, b = queue.request(i)
            r = ranges[k]
            pread_all(fd_of[r.path], r.path, views[k][a:b], r.offset + a, r.offset + min(b, r.nbytes),
                      r.file_bytes, flags)
            took(perf_counter_ns() - t0)

        with phase(req, "transfer"):
            run_pool(queue.total, read_one, opts.threads, opts.pool)
    finally:
        close_all(fds, paths, report=False)
    return sum(r.nbytes for r in ranges)
