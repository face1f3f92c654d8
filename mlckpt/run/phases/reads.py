"""The restores: each a cold read of a written checkpoint (every file evicted from the page cache
and its residency measured first, and the state poisoned so that only what the restore places
verifies), from the nearest tier that holds it, with every page verified against the content its
writer stamped."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from mlckpt import engine
from mlckpt.errors import VerificationError
from mlckpt.records import ReadRecord
from mlckpt.run.collective import Job, OpTimer
from mlckpt.run.console import op_line
from mlckpt.run.phases import library
from mlckpt.run.phases.writes import ckpt_dir, fast_opts
from mlckpt.run.storage.backends import Files, Piece, Storage, pieces
from mlckpt.workload.frameworks import ENGINE, Framework
from mlckpt.workload.pipeline import FAST, Pipeline

if TYPE_CHECKING:
    from mlckpt.engine.gpu import DeviceState
    from mlckpt.workload.layout import RestoreRead
    from mlckpt.workload.tensors import TensorSpec


@dataclass
class ReadPhase:
    job: Job
    pipe: Pipeline
    run_id: int
    key: bytes
    durable: Storage  # this run's folder (or prefix) on the durable tier
    fast: Files | None  # ... and its folder on the fast tier
    reads: Sequence[RestoreRead]  # this rank's
    offsets: list[int]  # their places in the arena
    arena: engine.Buffer
    opts: engine.IOOptions
    stream: bool
    timer: OpTimer
    fast_direct: bool
    fast_fs: Mapping[str, str | None]
    writer_hosts: frozenset[str]
    tags: Mapping[int, int]  # checkpoint -> the run id its page tags carry, when witnessed
    dev: DeviceState | None = None  # GPU-resident state (rules 1.7): each restore ends in device memory
    fw: Framework = field(default_factory=Framework)  # who wrote each checkpoint (rules 1.11)
    # a library's checkpoints: each read's file's tensors, as its writer handed them (rules 1.19)
    tensors: Sequence[tuple[TensorSpec, ...]] = ()

    def pid(self, rd: RestoreRead, c: int) -> engine.PageId:
        """What the pages of ``rd`` in checkpoint ``c`` must carry (its writer stamped it)."""
        return engine.PageId(self.tags.get(c, self.run_id), rd.writer, c, rd.index)

    def run(self, nw: int, nr: int) -> list[ReadRecord]:
        """Every restore; returns all ranks' records on rank 0, else []."""
        scratch = engine.alloc(engine.VERIFY_SCRATCH_BYTES)
        if self.dev is not None:  # training has stopped: its last kernels end before the restores
            self.dev.settle()
        records: list[ReadRecord] = []
        for k in range(1, nr + 1):
            rec = self.restore(k, (k - 1) % nw + 1, nw, scratch)
            if self.fw.library:
                rec.setdefault("writer", ENGINE)
            recs = self.job.gather(rec)
            if self.job.rank == 0:
                self.job.say(op_line(recs, "read", k, nr, self.fast_fs))
                records += recs
        return records

    def restore(self, k: int, c: int, nw: int, scratch: engine.Buffer) -> ReadRecord:
        """Restore k of checkpoint c: evict, measure residency, read (timed), verify."""
        tier = self.pipe.restore_tier(c, nw, set(self.writer_hosts), self.job.host)
        ropts = fast_opts(self.opts, self.fast_direct) if tier == FAST else self.opts
        where: Storage = self.fast if tier == FAST and self.fast is not None else self.durable
        names = [f"{ckpt_dir(c)}/{rd.file.name}" for rd in self.reads]
        nbytes = sum(rd.file.bytes for rd in self.reads)
        with self.job.step(f"poison the state before restore {k}"):
            self.poison()
        if self.fw.by_library(c):
            return library.restore(self, k, c, Path(where.at(ckpt_dir(c))), scratch)
        with self.job.step(f"evict before restore {k}"):
            resident = where.evict(names)  # a store's objects sit in no page cache of this host: 0
        if self.stream:
            sfiles = [
                engine.StreamFile(where.at(n), rd.file.bytes, self.pid(rd, c))
                for n, rd in zip(names, self.reads, strict=True)
            ]
            op = self.timer(
                "read",
                k,
                c,
                partial(engine.read_stream, sfiles, self.key, ropts, self.arena),
                nbytes,
                len(self.reads),
                ropts,
            )
            return {**op, "resident_bytes": resident, "cached_check_bytes": nbytes, "verified_bytes": nbytes,
                    "mismatches": 0, "tier": tier}
        ps = pieces(names, self.arena, self.offsets, [rd.file.bytes for rd in self.reads])
        copied: dict[str, int] = {}
        op = self.timer("read", k, c, partial(self.read_to_device, where, ps, ropts, copied), nbytes,
                        len(self.reads), ropts)
        with self.job.step(f"verify restore {k}"):
            if self.dev is not None:  # verify what the device holds: copied back over wiped tags
                engine.wipe_tags(self.arena, self.offsets[-1])
                self.dev.download(self.arena, self.offsets[-1])
            verified = self.verify(k, c, [(where.at(p.name), p.buf, p.nbytes) for p in ps], scratch)
        rec: ReadRecord = {**op, "resident_bytes": resident, "cached_check_bytes": nbytes, "tier": tier,
                           "verified_bytes": verified, "mismatches": 0}
        if "device_copy_ns" in copied:
            rec["device_copy_ns"] = copied["device_copy_ns"]
        return rec

    def poison(self) -> None:
        """Untimed, before every restore: the tag of every page the restore must fill is wiped in
        the state (and in device memory, for a GPU source), so that only bytes the restore placed
        there verify.  Without it, a run of one checkpoint restores into a state that already holds
        those bytes, and a loader that reads the files but never places them would pass.  A
        streamed restore verifies each block as it arrives, in a ring it reuses: nothing to wipe."""
        if self.stream:
            return
        engine.wipe_tags(self.arena, self.offsets[-1])
        if self.dev is not None:
            self.dev.upload(self.arena, self.offsets[-1])

    def read_to_device(self, where: Storage, ps: Sequence[Piece], ropts: engine.IOOptions,
                       copied: dict[str, int]) -> None:
        """The timed restore: the files into the arena, then (GPU source) into device memory."""
        where.get(ps, ropts)
        if self.dev is not None:
            t0 = time.perf_counter_ns()
            self.dev.upload(self.arena, self.offsets[-1])
            copied["device_copy_ns"] = time.perf_counter_ns() - t0

    def verify(self, k: int, c: int, files: Sequence[tuple[str, engine.Buffer, int]],
               scratch: engine.Buffer) -> int:
        """Every page of each (location, buffer, bytes) against what its writer stamped: the bytes
        verified (a mismatch raises)."""
        verified = 0
        for (where, buf, nbytes), rd in zip(files, self.reads, strict=True):
            bad = engine.verify(buf, nbytes, self.key, self.pid(rd, c), scratch)
            if bad is not None:
                raise VerificationError(
                    f"read {k}: verification failed reading {where}: {bad.describe()}",
                    rank=self.job.rank,
                    file=where,
                    offset=bad.offset,
                )
            verified += nbytes
        return verified
