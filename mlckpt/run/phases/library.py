"""A library writer's part of the write and restore phases (rules 1.11; the writers:
mlckpt/workload/frameworks.py).  The phases call it for the checkpoints the library writes; the
engine's checkpoints of the same run (the reference) go the usual way.

Timed as the engine's ops are, from the barrier to the last byte durable (writes: the library's
save, then the fsyncs it does not do itself) or placed in the state (restores: the library's load
and the copy into the state, as ``load_state_dict`` does), every byte verified afterwards against
the content the engine would have written.  A library writes through the page cache, so its files
are evicted before every restore and their residency measured, as the engine's are.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mlckpt import engine
from mlckpt.engine import frameworks
from mlckpt.records import LibraryFields, OpRecord, ReadRecord, StageRecord
from mlckpt.workload.frameworks import ENGINE, Framework
from mlckpt.workload.pipeline import DURABLE

if TYPE_CHECKING:
    from concurrent.futures import Future

    from mlckpt.run.collective import Job, OpTimer
    from mlckpt.run.storage.cleanup import Created
    from mlckpt.workload.layout import FileSpec, RestoreRead
    from mlckpt.workload.tensors import TensorSpec


def buffered(opts: engine.IOOptions) -> engine.IOOptions:
    """What a library's op does, as its record says: buffered, every file fsynced."""
    return replace(opts, direct=False, dontcache=False, fsync=True)


def items(names: Sequence[str], writers: Sequence[int], sizes: Sequence[int], offsets: Sequence[int],
          buf: engine.Buffer, tensors: Sequence[tuple[TensorSpec, ...]]) -> list[frameworks.Item]:
    """Each planned file as the library sees it: its key (by the rank that wrote it), its name,
    its bytes in ``buf`` at its offset (``offsets``: the arena's, one past the last), the tensors
    that tile them."""
    return [frameworks.Item(frameworks.key_of(w, n), n, buf[o : o + b], ts)
            for n, w, b, o, ts in zip(names, writers, sizes, offsets[: len(names)], tensors, strict=True)]


@dataclass
class LibraryWrites:
    """One rank's library checkpoints: what each save left (file sizes, who fsynced), and DCP's
    futures while an async save runs."""

    fw: Framework
    rank: int
    mine: Sequence[FileSpec]  # this rank's planned files
    offsets: Sequence[int]
    created: Created  # the run's: the library's files, to evict and remove
    tensors: Sequence[tuple[TensorSpec, ...]]  # each planned file's (mlckpt/workload/tensors.py)
    counted: bool  # records format 12: the records count the tensors
    saved: dict[int, frameworks.Saved] = field(default_factory=dict)
    futures: dict[int, Future[object]] = field(default_factory=dict)

    def writes(self, k: int) -> bool:
        return self.fw.by_library(k)

    def _items(self, buf: engine.Buffer) -> list[frameworks.Item]:
        return items([f.name for f in self.mine], [self.rank] * len(self.mine), [f.bytes for f in self.mine],
                     self.offsets, buf, self.tensors)

    def planned_paths(self, cdir: Path) -> list[str]:
        """The files known before the save (DCP names its own: listed once it made them)."""
        if self.fw.spec.collective:  # DCP names its own files: listed once it made them
            return []
        return frameworks.paths_of(self.fw.writer, cdir, [f.name for f in self.mine])

    def save(self, k: int, cdir: Path, buf: engine.Buffer) -> None:
        self._keep(k, frameworks.save(self.fw, cdir, self._items(buf), self.rank))

    def start_async(self, k: int, cdir: Path, buf: engine.Buffer) -> None:
        self.futures[k] = frameworks.start_async_save(self.fw, cdir, self._items(buf))

    def finish(self, k: int, cdir: Path, nbytes: int) -> StageRecord:
        """The async save's durable stage (in the background thread): from the stall's end, when
        DCP's thread took over, until every file and the folder are durable."""
        t0 = time.perf_counter_ns()
        self._keep(k, frameworks.finish_async_save(self.fw, cdir, self.futures.pop(k), self.rank))
        return {"tier": DURABLE, "t0_ns": t0, "t1_ns": time.perf_counter_ns(), "bytes": nbytes,
                "direct": False}

    def _keep(self, k: int, saved: frameworks.Saved) -> None:
        self.saved[k] = saved
        if self.fw.spec.collective:  # files it named itself, to evict and remove
            self.created.add_files(list(saved.files))

    def fields(self, k: int) -> LibraryFields:
        """What checkpoint k's write record adds (records format 8)."""
        if not self.writes(k):
            return {"writer": ENGINE}
        out: LibraryFields = {"writer": self.fw.writer}
        if k in self.saved:
            out["file_bytes"], out["synced_by"] = self.saved[k].file_bytes, self.saved[k].synced_by
        if self.counted:
            out["tensors"] = sum(len(ts) for ts in self.tensors)
        return out


class Restoring(Protocol):
    """What a library's restore asks of the read phase (``mlckpt.run.phases.reads.ReadPhase``)."""

    job: Job
    fw: Framework
    reads: Sequence[RestoreRead]
    offsets: list[int]
    arena: engine.Buffer
    opts: engine.IOOptions
    timer: OpTimer
    tensors: Sequence[tuple[TensorSpec, ...]]  # each read's file's, as its writer handed them

    def verify(self, k: int, c: int, files: Sequence[tuple[str, engine.Buffer, int]],
               scratch: engine.Buffer) -> int: ...


def restore(phase: Restoring, k: int, c: int, cdir: Path, scratch: engine.Buffer) -> ReadRecord:
    """Restore k of checkpoint c through the library: evict its files and measure their residency,
    load (timed), verify every page in the state.  ``phase``: the ReadPhase (which imports this
    module: not named here)."""
    writer = phase.fw.writer_of(c)
    reads = phase.reads
    names = [rd.file.name for rd in reads]
    nbytes = sum(rd.file.bytes for rd in reads)
    paths = frameworks.paths_of(writer, cdir, names)
    with phase.job.step(f"evict before restore {k}"):
        for path in paths:
            engine.evict(path)
        # over the library's files that hold these bytes (DCP: all of the checkpoint's): an upper
        # bound of what of them is resident
        resident = min(nbytes, sum(engine.resident_bytes(path)[0] for path in paths))
    its = items(names, [rd.writer for rd in reads], [rd.file.bytes for rd in reads], phase.offsets,
                phase.arena, phase.tensors)
    ropts = buffered(phase.opts)
    load = partial(frameworks.load, writer, cdir, its, phase.job.rank)
    op: OpRecord = phase.timer("read", k, c, load, nbytes, len(reads), replace(ropts, fsync=phase.opts.fsync))
    op.pop("requests", None)  # none went through the engine
    op.pop("phases_ns", None)
    files = [(str(cdir / it.name), it.buf, int(it.buf.size)) for it in its]
    with phase.job.step(f"verify restore {k}"):
        verified = phase.verify(k, c, files, scratch)
    rec: ReadRecord = {**op, "resident_bytes": resident, "cached_check_bytes": nbytes, "tier": DURABLE,
                       "writer": writer, "verified_bytes": verified, "mismatches": 0}
    if phase.timer.written.has("tensors"):
        rec["tensors"] = frameworks.tensor_count(its)
    return rec
