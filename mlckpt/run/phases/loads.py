"""Loading a model's weights into replicas, on every rank: the files laid out once (untimed), then
each rank brought to hold its verified shard by one strategy (mlckpt/workload/serving_load.py),
timed from leaving a barrier until its shard is in its memory by the op timer that times every
checkpoint op (the runner's :class:`~mlckpt.run.collective.OpTimer`: its barriers, the fault seam,
the collector kept out, the host's kernel counters around the load), then verified, untimed.

* ``direct``: the rank reads its shard's files from the storage.
* ``fanout``: the rank reads its part of its shard from the storage; the holders of the shard then
  exchange their parts (an MPI all-gather among them, in place).
* ``nodecache``: the first rank of each host reads its host's shards from the storage and writes
  them into the node-local tier, durably (fsync), then evicts them from the page cache; once its
  host's ranks have left a barrier behind that, each counts what of its shard is still resident
  in the page cache and reads it from the tier (O_DIRECT where the tier takes it and the run reads
  so).  A tier in memory (tmpfs, the default ``/dev/shm``) stays resident: its reads are counted
  as such (``node_tier_resident_bytes``, from rules 1.14) and the summary labels them warm.

The storage is any :class:`~mlckpt.run.storage.backends.Storage` (files, or objects read by
ranged GETs).  Reads are cold: every file is evicted from the page cache before each load
(``cold``; a store's objects sit in none), and what is still resident is counted.  Every byte of
every rank's shard is verified against the content its file was stamped with, after the timed
part.  Every buffer a load uses (the rank's shard, the node tier's staging) is allocated before
its barrier, never timed.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from mlckpt import engine
from mlckpt.engine.content import round_up
from mlckpt.errors import InternalError, VerificationError
from mlckpt.records import LoadRecord
from mlckpt.run.collective import OpTimer, idle_barrier, idle_wait
from mlckpt.run.storage.backends import Files, Piece, Span, Storage
from mlckpt.workload.serving import FANOUT_CHUNK_BYTES
from mlckpt.workload.serving_load import LoadPlan, RankLoad
from mlckpt.workload.serving_load import Piece as Part

if TYPE_CHECKING:
    from mpi4py.MPI import Comm, Intracomm, Request

CHECKPOINT = 0  # the page tags' checkpoint field: weights are one "checkpoint"


def file_name(shard: int, file: int) -> str:
    return f"shard-{shard:04d}-{file:05d}.bin"


@dataclass(frozen=True)
class LoadSetup:
    plan: LoadPlan
    storage: Storage  # where the weights are: shard-SSSS-FFFFF.bin
    tier: Files | None  # this host's node-local tier (nodecache)
    key: bytes  # the content key (every rank the same)
    run_id: int
    opts: engine.IOOptions
    tier_direct: bool = False  # the node tier takes O_DIRECT and the run reads so (probed untimed)
    # records format 10: a load's record carries the op timer's evidence and its tier's residency
    load_evidence: bool = False
    # records format 12: a fan-out load's record carries its exchange's CPU time and exposed tail
    exchange_evidence: bool = False
    chunk_bytes: int = FANOUT_CHUNK_BYTES  # fan-out: what a holder reads and sends in one round

    def path(self, shard: int, file: int) -> str:
        """A file of the shard on the storage (one folder: what a failed run's guardian sweeps)."""
        return self.storage.at(file_name(shard, file))

    def pid(self, shard: int, file: int) -> engine.PageId:
        return engine.PageId(self.run_id, shard, CHECKPOINT, file)

    def file_offsets(self, shard: int) -> list[int]:
        """Where each file of ``shard`` starts in a rank's memory (files end to end: whole pages)."""
        out = [0]
        for size in self.plan.shard_files[shard]:
            out.append(out[-1] + round_up(size))
        return out


def lay_out(comm: Intracomm, setup: LoadSetup) -> None:
    """Untimed: the ranks of replica 0 write and fsync their shard's files on the storage."""
    me = setup.plan.ranks[comm.Get_rank()]
    if me.replica == 0:
        files = setup.plan.shard_files[me.shard]
        if setup.storage.folders:
            os.makedirs(setup.storage.at(), exist_ok=True)
        buf = engine.alloc(round_up(max(files)))
        for i, size in enumerate(files):
            engine.fill(buf, size, setup.key, setup.pid(me.shard, i))
            setup.storage.put([Piece(file_name(me.shard, i), buf, size)], setup.opts)
    comm.Barrier()


def cold(comm: Intracomm, setup: LoadSetup) -> int:
    """Every storage file this rank reads leaves the page cache; the bytes still resident."""
    mine = setup.plan.ranks[comm.Get_rank()].storage
    resident = setup.storage.evict(sorted({file_name(q.shard, q.file) for q in mine}))
    comm.Barrier()
    return resident


def _spans(setup: LoadSetup, parts: Sequence[Part], into: engine.Buffer) -> list[Span]:
    """Each part of a shard file, at its place in ``into`` (page-rounded, as O_DIRECT reads)."""
    out = []
    for q in parts:
        at = setup.file_offsets(q.shard)[q.file] + q.offset
        out.append(Span(file_name(q.shard, q.file), setup.plan.shard_files[q.shard][q.file], q.offset,
                        into[at: at + round_up(q.length)], q.length))
    return out


def _from_storage(setup: LoadSetup, parts: Sequence[Part], into: engine.Buffer) -> int:
    """The parts read from the storage into their places in ``into``."""
    return setup.storage.get_spans(_spans(setup, parts, into), setup.opts)


# The timed region of one load on this rank: ``timed(action)`` leaves a barrier, runs ``action``
# and returns the record's timing and evidence (at least ``t0_ns``, ``t1_ns`` and ``wall_start``);
# a failure on any rank raises on every rank, once every rank is out of the action.  The runner's
# is its OpTimer (mlckpt.run.collective): the barriers, the host's counters around the load, the
# fault seam, the collector kept out, as for every checkpoint op.
Timed = Callable[[Callable[[], None]], Mapping[str, object]]

# What a load's record keeps of the op timer's: its clock readings and the evidence every op
# carries (records format 10), never a checkpoint op's own fields.
TIMER_FIELDS = ("t0_ns", "t1_ns", "wall_start", "direct", "cpu_ns", "host_counters", "requests", "phases_ns",
                "witness_host_ns")


def barrier_timed(comm: Intracomm) -> Timed:
    """The plainest timed region, for a load outside a run (a benchmark, a harness): a barrier, the
    action, the clock; a rank whose action failed raises, the others wait for the job's end (the
    runner's OpTimer agrees on a failure instead, and carries the op's evidence).  Python's
    automatic collection is held through the action, as the OpTimer holds it: a library's load
    (DCP's) makes many objects, and four ranks on two cores collecting them doubled its time."""
    def timed(action: Callable[[], None]) -> Mapping[str, object]:
        comm.Barrier()
        collecting = OpTimer.hold_gc()
        t0, wall = time.monotonic_ns(), time.time()
        failed: BaseException | None = None
        try:
            action()
        except Exception as exc:
            failed = exc
        t1 = time.monotonic_ns()
        OpTimer.release_gc(collecting)
        if comm.allreduce(failed is not None):
            if failed is not None:
                raise failed
            comm.Barrier()  # the failing rank aborts the job
        return {"t0_ns": t0, "t1_ns": t1, "wall_start": wall}
    return timed


@dataclass(frozen=True, eq=False)
class Loaded:
    """One rank's load: its record (all but ``verified_bytes``) and the memory its shard is in."""

    record: LoadRecord
    arena: engine.Buffer


def load(comm: Intracomm, setup: LoadSetup, groups: tuple[Comm, Comm], timed: Timed) -> Loaded:
    """One load on this rank, unverified (:func:`verify` after it, untimed).  ``groups``: the
    communicators of its shard's holders and of its host's ranks (made untimed, before;
    ``shard_groups``); ``timed``: the timed region (see :data:`Timed`).  A rank whose reads fail
    still takes its part in every collective of the load, and raises only at the action's end:
    the others are never left waiting in one."""
    me: RankLoad = setup.plan.ranks[comm.Get_rank()]
    holders, host = groups
    size = setup.plan.shard_bytes(me.shard)
    arena = engine.alloc(max(engine.PAGE, setup.file_offsets(me.shard)[-1]))
    staging = _staging(setup, me)
    resident = cold(comm, setup)
    moved = {"storage": 0, "tier": 0, "tier_resident": 0, "exchange_cpu": 0, "exchange_tail": 0}

    def action() -> None:
        failed: list[BaseException] = []
        if setup.plan.strategy == "nodecache":
            moved["storage"], moved["tier"], moved["tier_resident"] = _node_cache(host, setup, me, arena,
                                                                                  staging,
                                                                                  failed)
        elif setup.plan.strategy == "fanout":
            moved["storage"], moved["exchange_cpu"], moved["exchange_tail"] = _fan_out(holders, setup, me,
                                                                                      arena, failed)
        else:
            moved["storage"] = _attempt(failed, lambda: _from_storage(setup, me.storage, arena))
        if failed:  # a rank that could not read sent the others garbage: its failure is the one named
            raise failed[0]

    timing = timed(action)
    storage = moved["storage"]
    tier = {"node_tier_resident_bytes": moved["tier_resident"]} if setup.load_evidence else {}
    if setup.exchange_evidence and setup.plan.strategy == "fanout":
        tier.update(exchange_cpu_ns=moved["exchange_cpu"], exchange_tail_ns=moved["exchange_tail"])
    evidence = {k: timing[k] for k in TIMER_FIELDS if k in timing} if setup.load_evidence else {
        k: timing[k] for k in ("t0_ns", "t1_ns", "wall_start")}
    # the timer's fields are a load record's own (TIMER_FIELDS), checked where records are read
    return Loaded(cast(LoadRecord, {
        "rank": me.rank, "replica": me.replica, "shard": me.shard, "host": me.host,
        "strategy": setup.plan.strategy,
        **evidence, "bytes": size, "storage_bytes": storage, "node_tier_bytes": moved["tier"],
        "received_bytes": size - storage if setup.plan.strategy == "fanout" else 0,
        "resident_bytes": resident,
        **tier}), arena)


def _staging(setup: LoadSetup, me: RankLoad) -> engine.Buffer | None:
    """Where a host's first rank holds each shard it brings into the node tier: allocated (and
    touched) before the load's barrier, the largest of those shards; None for the other ranks."""
    if setup.plan.strategy != "nodecache" or not me.storage:
        return None
    return engine.alloc(max(engine.PAGE, *(setup.file_offsets(q.shard)[-1] for q in me.storage)))


def _attempt(failed: list[BaseException], fn: Callable[[], int]) -> int:
    """``fn()``, or 0 with its exception kept in ``failed`` (raised once the collectives are over)."""
    try:
        return fn()
    except Exception as exc:
        failed.append(exc)
        return 0


def shard_groups(comm: Intracomm, plan: LoadPlan) -> tuple[Comm, Comm]:
    """The holders of this rank's shard (in replica order) and its host's ranks (in rank order)."""
    me = plan.ranks[comm.Get_rank()]
    hosts = sorted({r.host for r in plan.ranks})
    return comm.Split(me.shard, me.replica), comm.Split(hosts.index(me.host), me.rank)


def _fan_out(holders: Comm, setup: LoadSetup, me: RankLoad, arena: engine.Buffer,
             failed: list[BaseException]) -> tuple[int, int, int]:
    """Fan-out, pipelined: this holder's part read round by round in a thread, each round's chunk
    sent to the other holders (one all-gather, in place: parts are whole pages of a shard laid out
    in whole-page files, so a part's place in memory is its place in the shard) while the next is
    read, the CPU given away between polls.  Returns the bytes read, this thread's CPU time (the
    exchange's: its polls and its share of the copies) and the exchange's wall time after the last
    read (what reading did not hide)."""
    from mpi4py import MPI

    if any(size % engine.PAGE for size in setup.plan.shard_files[me.shard]):
        raise InternalError("fan-out exchanges parts in place: the shard's files must be whole pages "
                            "(a scale below 1 makes them so)")
    rounds = setup.plan.fanout_rounds(me.shard, setup.chunk_bytes)
    mine = setup.plan.fanout_group(me.shard).index(me.rank)

    def read(j: int) -> int:
        start, n = rounds[j][mine]
        return _attempt(failed, lambda: _from_storage(setup, setup.plan.pieces(me.shard, start, n), arena))

    cpu0, nread = time.thread_time_ns(), 0
    sent: list[Request] = []
    with ThreadPoolExecutor(1, thread_name_prefix="fan-out read") as pool:
        reading = pool.submit(read, 0)
        for j, row in enumerate(rounds):
            while sent and not reading.done():  # the sent chunks move only inside MPI's calls
                MPI.Request.Testall(sent)
                os.sched_yield()
            nread += reading.result()
            if j + 1 < len(rounds):
                reading = pool.submit(read, j + 1)
            counts, displs = [n for _, n in row], [start for start, _ in row]
            sent.append(holders.Iallgatherv(MPI.IN_PLACE, [arena, counts, displs, MPI.BYTE]))
    last_read = time.monotonic_ns()
    for req in sent:
        idle_wait(req)
    return nread, time.thread_time_ns() - cpu0, time.monotonic_ns() - last_read


def _node_cache(host: Comm, setup: LoadSetup, me: RankLoad, arena: engine.Buffer,
                staging: engine.Buffer | None, failed: list[BaseException]) -> tuple[int, int, int]:
    """The host's first rank fills the tier from the storage, durably, and evicts what it wrote;
    then every rank reads its shard from it.  The bytes read from the storage, from the tier, and
    of the rank's tier files still in the page cache before it read them."""
    assert setup.tier is not None
    tier: Files = setup.tier
    opts = engine.IOOptions(direct=setup.tier_direct, threads=setup.opts.threads,
                            block_size=setup.opts.block_size,
                            fsync=True)

    def fill() -> int:
        assert staging is not None  # the host's first rank's (_staging)
        storage = 0
        os.makedirs(tier.root, exist_ok=True)
        for shard in sorted({q.shard for q in me.storage}):
            mine = [q for q in me.storage if q.shard == shard]  # whole files
            storage += _from_storage(setup, mine, staging)
            at = setup.file_offsets(shard)
            tier.put([Piece(file_name(shard, q.file), staging[at[q.file]: at[q.file] + round_up(q.length)],
                            q.length) for q in mine], opts)
            tier.evict([file_name(shard, q.file) for q in mine])
        return storage

    storage = _attempt(failed, fill) if me.storage else 0
    idle_barrier(host)  # the host's other ranks wait asleep while its first fills the tier
    names = sorted({file_name(q.shard, q.file) for q in me.node_tier})
    resident = _attempt(failed, lambda: tier.resident(names))
    read = _attempt(failed, lambda: tier.get_spans(_spans(setup, me.node_tier, arena), opts))
    return storage, read, resident


def verify(setup: LoadSetup, rank: int, arena: engine.Buffer) -> int:
    """Every file of ``rank``'s shard in ``arena`` against the content it was stamped with; the
    bytes verified (VerificationError on this rank at the first mismatch)."""
    me = setup.plan.ranks[rank]
    scratch = engine.alloc(engine.VERIFY_SCRATCH_BYTES)
    offs = setup.file_offsets(me.shard)
    for i, size in enumerate(setup.plan.shard_files[me.shard]):
        held = arena[offs[i]: offs[i] + round_up(size)]
        bad = engine.verify(held, size, setup.key, setup.pid(me.shard, i), scratch)
        if bad is not None:
            raise VerificationError(f"load: shard {me.shard} file {i} on rank {me.rank}: {bad.describe()}",
                                    rank=me.rank, file=setup.path(me.shard, i), offset=bad.offset)
    return setup.plan.shard_bytes(me.shard)


def clear_tier(host: Comm, setup: LoadSetup) -> None:
    """The node tier emptied (the next load fills it again)."""
    host.Barrier()
    if setup.tier is not None and host.Get_rank() == 0:
        shutil.rmtree(setup.tier.root, ignore_errors=True)
    host.Barrier()
