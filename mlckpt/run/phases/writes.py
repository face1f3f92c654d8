"""The write phase: each checkpoint as training sees it.

Each checkpoint: a barrier (the training step all ranks reach), then the stall: wait for the
previous checkpoint's background work if it is still running (back-pressure), then the blocking
stage (sync: the durable write; async: the snapshot into staging; sync with tiers: the fast-tier
write).  The background stages then run in this rank's background thread while it "trains" for
checkpoint.compute_interval_s (the next checkpoint's content is made in that interval).  After the
last checkpoint, a final wait until it is durable.  Rank 0 gathers the records once every
checkpoint is durable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from mlckpt import engine
from mlckpt.errors import VerificationError
from mlckpt.records import StageRecord, WriteRecord
from mlckpt.run.collective import Job, OpTimer
from mlckpt.run.console import durable_line, op_line, stall_line
from mlckpt.run.phases import library
from mlckpt.run.phases.background import Background
from mlckpt.run.phases.library import LibraryWrites
from mlckpt.run.storage.backends import Files, Storage, pieces
from mlckpt.run.storage.cleanup import Created
from mlckpt.witness import protocol
from mlckpt.workload.layout import PAGE
from mlckpt.workload.pipeline import DURABLE, FAST, MEMORY, Pipeline

if TYPE_CHECKING:
    from mlckpt.engine.gpu import DeviceState
    from mlckpt.workload.layout import FileSpec


@dataclass
class WriteState:
    """What one rank's write phase works with."""

    durable: Storage  # this run's folder (or prefix) on the durable tier
    fast: Files | None  # ... and its folder on the fast tier
    mine: Sequence[FileSpec]  # this rank's planned files
    offsets: list[int]  # their places in the arena
    arena: engine.Buffer  # the state (full residency) or the stream ring
    key: bytes
    opts: engine.IOOptions
    stream: bool
    leader: bool  # this host's first rank (makes folders)
    staging: engine.Buffer | None = None  # async: the snapshot's host staging copy of the state
    ring: engine.Buffer | None = None  # tiers: the drain's bounded buffer
    dev: DeviceState | None = None  # GPU-resident state (rules 1.7); arena is its bounce buffer
    lib: library.LibraryWrites | None = None  # a library writer's checkpoints (rules 1.11)

    @property
    def nbytes(self) -> int:
        return sum(f.bytes for f in self.mine)

    @property
    def fast_root(self) -> Path:
        """The fast tier's run folder (tiers only: the fast tier is a filesystem's)."""
        assert self.fast is not None
        return self.fast.root

    def staged(self) -> engine.Buffer:
        """The staging copy, which a pipeline with a memory stage allocates before its first write."""
        assert self.staging is not None
        return self.staging

    def folder(self, k: int) -> Path:
        """Checkpoint k's folder on the durable tier, where a library or the drain writes files
        (rules keep both to a filesystem)."""
        return Path(self.durable.at(ckpt_dir(k)))


def ckpt_dir(k: int) -> str:
    return f"ckpt-{k:04d}"


def fast_opts(opts: engine.IOOptions, fast_direct: bool) -> engine.IOOptions:
    """The fast tier's I/O: O_DIRECT when asked for and the fast filesystem takes it."""
    return replace(opts, direct=opts.direct and fast_direct, dontcache=False)


@dataclass
class Stall:
    """What one checkpoint's timed stall found, for its record: the wait for the previous
    checkpoint's background work, a GPU's copy out, and the blocking stage."""

    wait_ns: int = 0
    device_copy_ns: int | None = None
    stage: StageRecord = field(default_factory=lambda: StageRecord(tier=MEMORY, t0_ns=0, t1_ns=0, bytes=0))


@dataclass
class WritePhase:
    job: Job
    pipe: Pipeline
    w: WriteState
    run_id: int
    timer: OpTimer
    created: Created
    fast_direct: bool  # this host's fast tier takes O_DIRECT
    # Checkpoint -> the run id its page tags carry, for writes sealed with a witness's nonce.
    tags: dict[int, int] = field(default_factory=dict)

    def pid(self, k: int, i: int) -> engine.PageId:
        return engine.PageId(self.tags.get(k, self.run_id), self.job.rank, k, i)

    def seal(self, k: int, nonce: str) -> None:
        """Bind checkpoint k's content to the witness's nonce: its page tags carry
        ``protocol.tag_run_id`` (the state restamped, untimed; stream residency makes its content
        inside the timed region, from ``pid``, and needs no restamp)."""
        self.tags[k] = protocol.tag_run_id(self.run_id, nonce)
        w = self.w
        if not w.stream:
            for i, f in enumerate(w.mine):
                engine.seal(w.arena[w.offsets[i] : w.offsets[i + 1]], f.bytes, self.tags[k])

    def prepare(self, k: int) -> None:
        """Checkpoint k's content (new bytes in every page) and folders; untimed.  Collective."""
        w = self.w
        with self.job.step(f"prepare checkpoint {k}", made=k):  # its folders may exist from here
            if not w.stream:
                for i, f in enumerate(w.mine):
                    engine.fill(w.arena[w.offsets[i] : w.offsets[i + 1]], f.bytes, w.key, self.pid(k, i))
            if w.dev is not None:  # training made the new state on the GPU: only its bytes may persist
                w.dev.upload(w.arena, w.offsets[-1])
                engine.wipe_tags(w.arena, w.offsets[-1])
            for tier in (w.durable, w.fast):
                if w.leader and tier is not None and tier.folders:
                    cdir = Path(tier.at(ckpt_dir(k)))
                    cdir.mkdir(exist_ok=True)
                    self.created.add_dir(cdir)
        lib = self.library(k)
        for tier in (w.durable, w.fast):
            if tier is not None:
                self.created.add_files(lib.planned_paths(Path(tier.at(ckpt_dir(k)))) if lib is not None else
                                       [tier.at(f"{ckpt_dir(k)}/{f.name}") for f in w.mine])

    def library(self, k: int) -> LibraryWrites | None:
        """The library writer checkpoint k goes through (rules 1.11), if any."""
        return self.w.lib if self.w.lib is not None and self.w.lib.writes(k) else None

    def write_to(self, k: int, tier: Storage, buf: engine.Buffer, opts: engine.IOOptions) -> None:
        """Write checkpoint k's files of this rank from ``buf`` (the state or its staging copy)
        to ``tier``, each durable (with ``opts.fsync``) when this returns."""
        w = self.w
        names = [f"{ckpt_dir(k)}/{f.name}" for f in w.mine]
        lib = self.library(k)
        if lib is not None:
            lib.save(k, Path(tier.at(ckpt_dir(k))), buf)
        elif w.stream:  # content made inside the timed write, through a ring (a filesystem's)
            sfiles = [engine.StreamFile(tier.at(n), f.bytes, self.pid(k, i))
                      for i, (n, f) in enumerate(zip(names, w.mine, strict=True))]
            dirs = [tier.at(ckpt_dir(k))] if opts.fsync else []
            engine.write_stream(sfiles, w.key, opts, buf, dir_fsync=dirs)
        else:
            tier.put(pieces(names, buf, w.offsets, [f.bytes for f in w.mine]), opts)

    def fast(self, opts: engine.IOOptions) -> engine.IOOptions:
        return fast_opts(opts, self.fast_direct)

    def persist(self, k: int) -> list[StageRecord]:
        """Checkpoint k's background stages (in the background thread): the persist from staging
        (async), the verified drain fast → durable (tiers).  Returns the stage entries."""
        pipe, w, bg = self.pipe, self.w, replace(self.w.opts, pool="background")
        stages: list[StageRecord] = []
        lib = self.library(k)
        if pipe.mode == "async" and lib is not None:  # the library's own thread wrote it
            stages.append(lib.finish(k, w.folder(k), w.nbytes))
        elif pipe.mode == "async":
            tier = FAST if pipe.tiered else DURABLE
            o = self.fast(bg) if pipe.tiered else bg
            t0 = time.perf_counter_ns()
            self.write_to(k, w.fast if pipe.tiered and w.fast is not None else w.durable, w.staged(), o)
            stages.append(
                {
                    "tier": tier,
                    "t0_ns": t0,
                    "t1_ns": time.perf_counter_ns(),
                    "bytes": w.nbytes,
                    "direct": o.direct,
                }
            )
        if pipe.tiered:
            stages.append(self.drain(k, bg))
        return stages

    def drain(self, k: int, bg: engine.IOOptions) -> StageRecord:
        """Checkpoint k's verified drain from the fast tier to the durable one."""
        w = self.w
        assert w.ring is not None
        fdir, cdir = w.fast_root / ckpt_dir(k), w.folder(k)
        sfiles = [
            engine.StreamFile(str(fdir / f.name), f.bytes, self.pid(k, i)) for i, f in enumerate(w.mine)
        ]
        self.job.faults.before_drain(self.job.rank, k, w.fast_root, [f.name for f in w.mine])
        t0 = time.perf_counter_ns()
        res = engine.drain(
            sfiles,
            [str(cdir / f.name) for f in w.mine],
            w.key,
            self.fast(bg),
            bg,
            w.ring,
            dir_fsync=[str(cdir)] if bg.fsync else [],
        )
        t1 = time.perf_counter_ns()
        if res.mismatch is not None:
            path, m = res.mismatch
            raise VerificationError(
                f"drain of checkpoint {k}: the fast tier gave back other bytes "
                f"than were written, reading {path}: {m.describe()}",
                rank=self.job.rank,
                file=path,
                offset=m.offset,
            )
        return {
            "tier": DURABLE,
            "t0_ns": t0,
            "t1_ns": t1,
            "bytes": w.nbytes,
            "direct": bg.direct,
            "verified_bytes": res.verified_bytes,
            "mismatches": 0,
        }

    def evict_fast(self, k: int) -> None:
        """Once checkpoint k is durable: remove this rank's fast-tier copies no longer kept.  Run
        by the background thread after it reported k durable (housekeeping is not part of the
        persist, and the next fast write queues behind it, so the fast tier never holds more
        than Pipeline.fast_peak_checkpoints)."""
        for j in self.pipe.evict_after(k):
            for f in self.w.mine:
                with suppress(FileNotFoundError):
                    os.unlink(self.w.fast_root / ckpt_dir(j) / f.name)

    def allocate(self) -> None:
        pipe, w = self.pipe, self.w
        if pipe.mode == "async":
            with self.job.step("staging allocation"):
                w.staging = engine.alloc(max(w.offsets[-1], PAGE))
                if w.dev is not None:
                    w.dev.pin(w.staging)
        if pipe.tiered:
            with self.job.step("drain buffer allocation"):
                w.ring = engine.alloc(pipe.drain_ring_bytes(w.opts.threads, w.opts.block_size))

    def run(self, nw: int) -> list[WriteRecord]:
        """Every checkpoint; returns all ranks' records on rank 0 (in op, rank order), else []."""
        pipe = self.pipe
        self.allocate()
        bg = Background() if pipe.background else None
        if bg is not None:
            self.job.say(
                f"checkpoint.mode={pipe.label}: training waits for the {pipe.blocking} stage; "
                f"{' then '.join(pipe.background)} run{'s' if len(pipe.background) == 1 else ''} "
                f"in the background during {pipe.compute_interval_s:g} s of training per checkpoint"
            )
        mine: list[WriteRecord] = []
        self.prepare(1)
        try:
            for k in range(1, nw + 1):
                mine.append(self.checkpoint(k, nw, bg, mine))
            if bg is not None:
                self.timer(
                    "drain",
                    nw,
                    nw,
                    partial(self.settle, bg, mine, Stall()),
                    self.w.nbytes,
                    len(self.w.mine),
                    self.w.opts,
                )
        finally:
            if bg is not None:
                bg.close()
        return self.gathered(mine, nw, bg is not None)

    def settle(self, background: Background | None, mine: list[WriteRecord], info: Stall) -> None:
        """Wait for the previous checkpoint's background work: its records complete."""
        if background is None or not background.pending:
            info.wait_ns = 0
            return
        t = time.perf_counter_ns()
        done = background.done()  # already finished: no wait at all
        stages = background.wait()
        end = time.perf_counter_ns()
        durable = stages[-1]["t1_ns"]
        # The stall counts the whole wait (thread wake-up included); the persist's exposed part
        # is only the wait before it became durable.
        info.wait_ns = 0 if done else end - t
        prev = mine[-1]
        prev["stages"] += stages
        prev["t1_ns"] = durable
        prev["exposed_ns"] = 0 if done else max(0, min(end, durable) - t)
        if self.w.lib is not None:
            prev.update(self.w.lib.fields(int(prev["checkpoint"])))

    def blocking(
        self, k: int, background: Background | None, mine: list[WriteRecord], info: Stall
    ) -> None:
        """The stall: back-pressure, then the blocking stage, then the hand-over (timed)."""
        pipe, w = self.pipe, self.w
        self.settle(background, mine, info)
        fast = pipe.blocking == FAST
        opts = self.fast(w.opts) if fast else w.opts
        if self.library(k):
            opts = library.buffered(opts)
        t0 = time.perf_counter_ns()
        if pipe.blocking == MEMORY and w.dev is not None:  # the snapshot is the device's copy out
            w.dev.download(w.staged(), w.offsets[-1])
            info.device_copy_ns = time.perf_counter_ns() - t0
        elif pipe.blocking == MEMORY and (lib := self.library(k)) is not None:  # DCP's async_save stages it
            lib.start_async(k, w.folder(k), w.arena)
        elif pipe.blocking == MEMORY:
            engine.snapshot(w.staged(), w.arena, w.offsets[-1], w.opts.threads)
        else:
            if w.dev is not None:  # sync: out of the device into the pinned bounce, then to storage
                w.dev.download(w.arena, w.offsets[-1])
                info.device_copy_ns = time.perf_counter_ns() - t0
            self.write_to(k, w.fast if fast and w.fast is not None else w.durable, w.arena, opts)
        t1 = time.perf_counter_ns()
        info.stage = {"tier": pipe.blocking, "t0_ns": t0, "t1_ns": t1, "bytes": w.nbytes}
        if pipe.blocking != MEMORY:
            info.stage["direct"] = opts.direct
        if background is not None:
            background.submit(partial(self.persist, k), after=partial(self.evict_fast,
                                                                      k) if pipe.tiered else None)

    def checkpoint(
        self, k: int, nw: int, background: Background | None, mine: list[WriteRecord]
    ) -> WriteRecord:
        """Checkpoint k: the timed stall, its line, then training until the interval is over."""
        info = Stall()
        op = self.timer(
            "write",
            k,
            k,
            partial(self.blocking, k, background, mine, info),
            self.w.nbytes,
            len(self.w.mine),
            library.buffered(self.w.opts) if self.library(k) else self.w.opts,
            seal=partial(self.seal, k),
        )
        if background is None:  # sync, one tier: the stage is the whole op, barrier to durable
            info.stage["t0_ns"], info.stage["t1_ns"] = op["t0_ns"], op["t1_ns"]
        else:  # the timed stall is a copy or a fast-tier write: not the durable tier's requests
            op.pop("requests", None)
            op.pop("phases_ns", None)
        rec: WriteRecord = {**op, "mode": self.pipe.mode, "staged_ns": op["t1_ns"],
                            "backpressure_ns": info.wait_ns, "exposed_ns": 0, "compute_ns": 0,
                            "stages": [info.stage]}
        if info.device_copy_ns is not None:
            rec["device_copy_ns"] = info.device_copy_ns
        if self.w.lib is not None:
            rec.update(self.w.lib.fields(k))
            if self.library(k):  # none of its requests went through the engine
                rec.pop("requests", None)
                rec.pop("phases_ns", None)
        recs = self.job.gather(rec)
        if self.job.rank == 0:
            self.job.say(
                op_line(recs, "write", k, nw, {})
                if background is None
                else stall_line(recs, k, nw, self.pipe.blocking)
            )
        # Training: the next checkpoint's content is made, then the rest of the interval.
        if k < nw:
            self.prepare(k + 1)
        until = rec["staged_ns"] + int(self.pipe.compute_interval_s * 1e9)
        if self.w.dev is not None:  # the GPU trains through the interval (kernels of its own stream)
            self.w.dev.train(until)
        else:
            time.sleep(max(0, until - time.perf_counter_ns()) / 1e9)
        rec["compute_ns"] = time.perf_counter_ns() - rec["staged_ns"]
        return rec

    def gathered(self, mine: list[WriteRecord], nw: int, background: bool) -> list[WriteRecord]:
        records = self.job.gather(mine)
        if self.job.rank != 0:
            return []
        flat = sorted((r for rank_recs in records for r in rank_recs), key=lambda r: (r["index"], r["rank"]))
        if background:
            for k in range(1, nw + 1):
                self.job.say(durable_line([r for r in flat if r["index"] == k], k, nw))
        return flat
