"""Resuming at another scale, on every rank: the checkpoint of an N-rank layout laid out once on the
storage (untimed), with its index; then each resume brings every new rank to hold its verified shard
of the model under the new layout (mlckpt/workload/resume.py), timed from leaving a barrier, in four
recorded parts:

* ``metadata``: the rank reads the checkpoint's index from the storage and parses it, as every rank of
  a DCP load reads ``.metadata``;
* ``planning``: it works out, from that index alone, which byte ranges of which old files its new
  shard needs;
* ``reads``: it reads those ranges, rounded out to whole pages and merged file by file, into a
  staging buffer (one queue of requests, ``io.threads`` in flight, O_DIRECT where the run reads so);
* ``placing``: it copies each needed range from the staging buffer to its place in its new state.

Reads are cold: each old file a rank reads is evicted from the page cache before the barrier, and
what is still resident is counted.  Every byte of every new state is verified after the timed part
against the content its old file was stamped with.  The staging buffer and the state are allocated
before the barrier from the same plan, never timed; the timed planning must come out equal to it.

Old rank ``r``'s files are laid out by new rank ``r % M``, each stamped with the content of writer
``r``, so a resume reads what the N-rank layout's ranks would have written, byte for byte.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mlckpt import engine
from mlckpt.engine.content import FileContent, round_up
from mlckpt.errors import InternalError, VerificationError
from mlckpt.run.phases.loads import TIMER_FIELDS
from mlckpt.run.storage.backends import Files, Piece, Span, Storage
from mlckpt.workload.layout import PAGE, Plan
from mlckpt.workload.model import Workload
from mlckpt.workload.resume import Index, RankResume, Read, checkpoint_index, rank_resume

if TYPE_CHECKING:
    from mpi4py.MPI import Intracomm

CHECKPOINT = 0  # the page tags' checkpoint field: one checkpoint is resumed from
INDEX_NAME = "index.json"


@dataclass(frozen=True)
class ResumeSetup:
    old: Plan  # the layout the checkpoint was written at
    workload: Workload  # the model (its layers and names)
    ranks: int  # the new layout: ranks, TP and PP (DP what is left)
    tp: int
    pp: int
    storage: Storage  # where the checkpoint is: the old plan's file names and index.json
    key: bytes
    run_id: int
    opts: engine.IOOptions

    @cached_property
    def index(self) -> Index:
        """The old layout's checkpoint index (the plans' source, untimed; a resume times reading it)."""
        return checkpoint_index(self.old)

    def pid(self, writer: int, index: int) -> engine.PageId:
        return engine.PageId(self.run_id, writer, CHECKPOINT, index)

    def name(self, writer: int, index: int) -> str:
        return self.old.rank_plans[writer].files[index].name


def lay_out(comm: Intracomm, setup: ResumeSetup) -> int:
    """Untimed, collective: the old layout's files written and made durable, old rank ``r``'s by new
    rank ``r % M``; rank 0 writes the index.  Returns the index's size in bytes (every rank), once
    every rank's files are written."""
    me, size = comm.Get_rank(), comm.Get_size()
    mine = [rp for rp in setup.old.rank_plans if rp.rank % size == me]
    if setup.storage.folders:
        os.makedirs(setup.storage.at(), exist_ok=True)
    biggest = max((f.bytes for rp in mine for f in rp.files), default=0)
    buf = engine.alloc(max(PAGE, round_up(biggest)))
    for rp in mine:
        for i, f in enumerate(rp.files):
            engine.fill(buf, f.bytes, setup.key, setup.pid(rp.rank, i))
            setup.storage.put([Piece(f.name, buf, f.bytes)], setup.opts)
    nbytes = 0
    if me == 0:
        raw = setup.index.to_json()
        nbytes = len(raw)
        doc = engine.alloc(round_up(nbytes))
        doc[:nbytes] = np.frombuffer(raw, dtype=np.uint8)
        setup.storage.put([Piece(INDEX_NAME, doc, nbytes)], setup.opts)
    # every rank's files written before any rank leaves (a broadcast is no barrier: a rank that got
    # rank 0's number went on to evict files another rank was still writing)
    out: int = max(comm.allgather(nbytes))
    return out


@dataclass(frozen=True, eq=False)
class Prepared:
    """What a rank holds before a resume's barrier: its plan (to size the buffers), the staging
    buffer its reads land in (each read at a page of it), and its new state."""

    plan: RankResume
    reads: tuple[Read, ...]
    at: tuple[int, ...]  # each read's place in the staging buffer
    staging: engine.Buffer
    state: engine.Buffer


def prepare(setup: ResumeSetup, rank: int, spread: bool = True) -> Prepared:
    """``spread=False``: as DCP stores a replicated tensor, once (mlckpt/engine/dcp_reshard.py)."""
    plan = rank_resume(setup.index, setup.workload, setup.ranks, setup.tp, setup.pp, rank,
                       spread)
    reads = plan.reads(_file_bytes(setup.old))
    at, total = [], 0
    for rd in reads:
        at.append(total)
        total += round_up(rd.length)
    staging, state = engine.alloc(max(PAGE, total)), engine.alloc(max(PAGE, plan.bytes))
    return Prepared(plan, reads, tuple(at), staging, state)


def _file_bytes(plan: Plan) -> dict[tuple[int, int], int]:
    return {(rp.rank, i): f.bytes for rp in plan.rank_plans for i, f in enumerate(rp.files)}


def cold(comm: Intracomm, setup: ResumeSetup, prepared: Prepared) -> int:
    """Every old file this rank reads (and the index) leaves the page cache; the bytes still resident."""
    names = sorted({setup.name(rd.writer, rd.index) for rd in prepared.reads} | {INDEX_NAME})
    resident = setup.storage.evict(names)
    comm.Barrier()
    return resident


Timed = Callable[[Callable[[], None]], Mapping[str, object]]


def resume(comm: Intracomm, setup: ResumeSetup, prepared: Prepared, index_bytes: int, timed: Timed,
           ) -> dict[str, object]:
    """One resume on this rank, unverified (:func:`verify` after it, untimed); its record's fields."""
    me = comm.Get_rank()
    parts: dict[str, int] = {}
    moved = {"read": 0}
    timed_plan: list[RankResume] = []  # what the timed planning gave, compared after the clock stops
    doc = engine.alloc(round_up(index_bytes))

    def action() -> None:
        t0 = time.monotonic_ns()
        setup.storage.get([Piece(INDEX_NAME, doc, index_bytes)], setup.opts)
        index = Index.from_json(doc[:index_bytes].tobytes())
        t1 = time.monotonic_ns()
        plan = rank_resume(index, setup.workload, setup.ranks, setup.tp, setup.pp, me)
        reads = plan.reads(index.file_bytes)
        t2 = time.monotonic_ns()
        timed_plan.append(plan)
        st = prepared.staging
        spans = [Span(setup.name(rd.writer, rd.index), index.file_bytes[(rd.writer, rd.index)], rd.offset,
                      st[a: a + round_up(rd.length)], rd.length)
                 for rd, a in zip(reads, prepared.at, strict=True)]
        moved["read"] = setup.storage.get_spans(spans, setup.opts)
        t3 = time.monotonic_ns()
        _place(prepared)
        t4 = time.monotonic_ns()
        parts.update(metadata_ns=t1 - t0, planning_ns=t2 - t1, read_ns=t3 - t2, placing_ns=t4 - t3)

    resident = cold(comm, setup, prepared)
    timing = timed(action)
    if timed_plan[0] != prepared.plan:  # the reads went where the buffers were sized for
        raise InternalError("resume: the timed plan differs from the one the buffers were sized by")
    # the op timer's evidence (a run's: its clock readings, the host's counters, CPU time, requests)
    evidence = _evidence(timing, engine_requests=True)
    return {"rank": me, **evidence, **parts,
            "bytes": prepared.plan.bytes, "read_bytes": moved["read"], "index_bytes": index_bytes,
            "needs": len(prepared.plan.needs), "reads": len(prepared.reads),
            "tensors": len(prepared.plan.tensors),
            "files": len({(rd.writer, rd.index) for rd in prepared.reads}), "resident_bytes": resident}


def _evidence(timing: Mapping[str, object], engine_requests: bool) -> dict[str, object]:
    """The op timer's evidence a resume record keeps: its clock readings, the host's counters, CPU
    time, and (``engine_requests``) the engine's requests and their phases."""
    dropped = ("witness_host_ns",) + (() if engine_requests else ("requests", "phases_ns"))
    return {k: timing[k] for k in TIMER_FIELDS if k in timing and k not in dropped}


def _place(prepared: Prepared) -> None:
    """Each needed range copied from where its read put it to its place in the state."""
    where: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for rd, a in zip(prepared.reads, prepared.at, strict=True):
        where.setdefault((rd.writer, rd.index), []).append((rd.offset, rd.offset + rd.length, a))
    st, state = prepared.staging, prepared.state
    for n in prepared.plan.needs:
        start, _, a = next(s for s in where[(n.writer, n.index)] if s[0] <= n.offset < s[1])
        src = a + n.offset - start
        state[n.dest: n.dest + n.length] = st[src: src + n.length]


def verify(setup: ResumeSetup, prepared: Prepared, rank: int) -> int:
    """Every byte of the new state against the content its old file was stamped with; the bytes
    verified (VerificationError at the first mismatch)."""
    scratch = engine.alloc(engine.VERIFY_SCRATCH_BYTES)
    for n in prepared.plan.needs:
        content = FileContent(setup.key, setup.pid(n.writer, n.index), start=n.offset // PAGE * PAGE)
        pos = n.offset // PAGE * PAGE
        end = n.offset + n.length
        while pos < end:
            size = min(len(scratch), round_up(end) - pos)
            want = scratch[:size]
            content.produce(want, pos)
            lo, hi = max(pos, n.offset), min(pos + size, end)
            got = prepared.state[n.dest + lo - n.offset: n.dest + hi - n.offset]
            if not np.array_equal(want[lo - pos: hi - pos], got):
                at = lo + int(np.flatnonzero(want[lo - pos: hi - pos] != got)[0])
                name = setup.name(n.writer, n.index)
                raise VerificationError(f"resume: rank {rank}: byte {at} of {name} (old rank {n.writer}) is "
                                        "not what was written there", rank=rank, file=setup.storage.at(name),
                                        offset=at)
            pos += size
    return prepared.plan.bytes


def remove(comm: Intracomm, setup: ResumeSetup) -> None:
    """The checkpoint's files and index removed, each by the rank that laid it out."""
    me, size = comm.Get_rank(), comm.Get_size()
    comm.Barrier()
    names = [f.name for rp in setup.old.rank_plans if rp.rank % size == me for f in rp.files]
    setup.storage.remove([setup.storage.at(n) for n in names + ([INDEX_NAME] if me == 0 else [])])



def dcp_lay_out(comm: Intracomm, setup: ResumeSetup, cdir: Path) -> None:
    """Untimed, collective: the old layout's state saved through DCP as its N ranks would save it
    (mlckpt/engine/dcp_reshard.py), old rank ``r``'s pieces by new rank ``r % M``, each stamped with
    the content of writer ``r``; its files durable (DCP fsyncs them) before the barrier."""
    from mlckpt.engine import dcp_reshard

    me, size = comm.Get_rank(), comm.Get_size()
    mine = [rp for rp in setup.old.rank_plans if rp.rank % size == me]
    files = {}
    for rp in mine:
        for i, f in enumerate(rp.files):
            files[(rp.rank, i)] = engine.alloc(max(PAGE, round_up(f.bytes)))
            engine.fill(files[(rp.rank, i)], f.bytes, setup.key, setup.pid(rp.rank, i))
    dcp_reshard.save(setup.index, [rp.rank for rp in mine], files, cdir)
    comm.Barrier()


def dcp_resume(comm: Intracomm, setup: ResumeSetup, prepared: Prepared, cdir: Path, timed: Timed,
               ) -> dict[str, object]:
    """One resume through DCP's own resharding load on this rank (``prepare(spread=False)``), cold
    (DCP's files this rank reads, and its metadata, evicted first), unverified; its record's fields
    (the op timer's evidence, less the engine's requests: none went through it)."""
    from mlckpt.engine import dcp_reshard

    me = comm.Get_rank()
    writers = sorted({n.writer for n in prepared.plan.needs})
    resident = Files(cdir).evict([dcp_reshard.file_name(w) for w in writers] + [dcp_reshard.METADATA])
    comm.Barrier()
    loaded: list[dcp_reshard.Loaded] = []
    timing = timed(lambda: loaded.append(dcp_reshard.load(setup.index, prepared.plan, prepared.state, cdir)))
    got = loaded[0]
    evidence = _evidence(timing, engine_requests=False)  # none went through the engine
    plan = prepared.plan
    return {"rank": me, **evidence, "metadata_ns": got.metadata_ns, "planning_ns": got.planning_ns,
            "read_ns": got.read_ns, "placing_ns": 0, "bytes": plan.bytes, "read_bytes": got.read_bytes,
            "index_bytes": got.metadata_bytes, "needs": len(plan.needs), "reads": got.reads,
            "tensors": len(plan.tensors), "files": got.files, "resident_bytes": resident}
