"""Collective agreement and the op timer.

Each step that can fail locally ends in :meth:`Job.agree`: if any rank failed, every rank raises
the same :class:`CollectiveFailure` (rank 0 prints it), so no rank waits forever in a barrier.
Every timed op of every kind of run goes through :class:`OpTimer`; a rank that never gets to an
agreement is caught by the op watch (:mod:`mlckpt.run.watch`).
"""

from __future__ import annotations

import gc
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from mlckpt import engine, latency
from mlckpt.engine import StreamMismatch
from mlckpt.errors import InternalError, IOFailure, MlckptError, VerificationError
from mlckpt.records import CounterSample, OpRecord, RequestFields
from mlckpt.run.console import Console, DeviceMeter
from mlckpt.run.faults import NO_FAULTS, Faults
from mlckpt.run.guardian import Guardian
from mlckpt.run.watch import MPIDone, OpWatch
from mlckpt.written import Written

if TYPE_CHECKING:
    from mpi4py.MPI import Comm, Intracomm, Request

    from mlckpt.host.facts import DeviceSampler



@dataclass
class Failure:
    rank: int
    host: str
    kind: str
    message: str
    status: int


class CollectiveFailure(MlckptError):
    """Some rank failed a step; carries the first failure (lowest rank)."""

    def __init__(self, failures: list[Failure]) -> None:
        first = failures[0]
        n = len(failures) - 1
        # Bad input is the same on every rank (every rank judges the same data): name the
        # problem, not a rank, nor how many ranks found it.
        more = f" (and {n} more rank{'s' if n > 1 else ''})" if n and first.status != 2 else ""
        where = "" if first.status == 2 else f"rank {first.rank} on {first.host}: "
        super().__init__(f"{where}{first.message}{more}")
        self.exit_status = first.status
        self.failures = failures


def failures_of(errors: list[tuple[str, str, int] | None], hosts: list[str]) -> list[Failure]:
    """The failures among every rank's (kind, message, exit status) or None, lowest rank first."""
    return [Failure(r, hosts[r], e[0], e[1], e[2]) for r, e in enumerate(errors) if e]


def idle_barrier(comm: Comm, poll_s: float = 0.002) -> None:
    """A barrier that waits asleep, polled: MPI's own busy-polls the CPUs other ranks still need."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(poll_s)


def idle_wait(req: Request) -> None:
    """Wait for a non-blocking collective that moves data, giving the CPU away between polls: a
    blocking one spins, and with more ranks than free cores the spinning ranks starve the ones
    with data to send.  MPI moves a shared-memory transfer's data only inside its own calls, so
    each poll is followed by a yield of the CPU (other runnable ranks go first), not a sleep."""
    while not req.Test():
        os.sched_yield()


T = TypeVar("T")


@dataclass
class Job:
    """This rank's place in the MPI job, and the effects every phase needs: the communicator,
    rank 0's console and guardian, the fault seam."""

    comm: Intracomm
    console: Console
    guardian: Guardian | None = None
    faults: Faults = NO_FAULTS
    rank: int = field(init=False)
    size: int = field(init=False)
    host: str = field(init=False)

    def __post_init__(self) -> None:
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.host = socket.gethostname()

    def gather(self, mine: T) -> list[T]:
        """Every rank's ``mine`` in rank order on rank 0; an empty list on the others."""
        return self.comm.gather(mine, root=0) or []

    def say(self, line: str) -> None:
        if self.rank == 0:
            self.console.say(line)

    def note(self, **msg: object) -> None:
        """Rank 0 tells its guardian what is going on (a pipe write, never inside a timed region)."""
        if self.guardian is not None:
            self.guardian.send(**msg)

    def agree(self, err: BaseException | None) -> None:
        mine = None
        if err is not None:
            mine = (type(err).__name__, str(err), getattr(err, "exit_status", 1))
        allerr = self.comm.allgather(mine)
        if any(allerr):
            raise CollectiveFailure(failures_of(allerr, self.comm.allgather(self.host)))

    def idle_barrier(self, poll_s: float = 0.002) -> None:
        idle_barrier(self.comm, poll_s)

    @contextmanager
    def step(self, what: str, **note: object) -> Iterator[None]:
        self.note(step=what, **note)
        if self.rank == 0:
            self.console.stage(what)
        err: BaseException | None = None
        try:
            yield
        except MlckptError as exc:
            err = exc
        except Exception as exc:  # a defect or an unexpected OS error: still agree, then stop
            err = InternalError(f"{what}: {type(exc).__name__}: {exc}")
        try:
            self.agree(err)
        finally:
            if self.rank == 0:
                self.console.stage(None)


class OpWitness(Protocol):
    """What the op timer tells a witness (mlckpt.run.features.witnessing.Witnessing)."""

    def start(self, op: str, index: int) -> str | None:
        """Report the op's start before its barrier (collective); a write's nonce."""

    def end(self, op: str, index: int) -> None:
        """Report the op's end, once every rank agreed it is over."""

    def host_ns(self, t0_ns: int, t1_ns: int) -> list[int] | None:
        """Rank 0's own time around the op, on its perf counter."""


def op_meter(timer: OpTimer, op: str, nbytes: int) -> DeviceMeter | None:
    """Rank 0's meter of an op (None without a device to read)."""
    if timer.probe is None or timer.device is None:
        return None
    field = "written_bytes" if op == "write" else "read_bytes"
    return DeviceMeter(timer.probe, field, nbytes * timer.host_ranks, nbytes * timer.job.size)


@dataclass
class OpTimer:
    """Runs one timed op on this rank, after a barrier; every rank agrees on failure.

    The clock is this host's monotonic clock, from leaving the barrier to the op's last byte
    (durable for writes).  The op is watched (``io.timeout_s``): each rank reports "done" to rank 0
    after taking t1, and rank 0's :class:`OpWatch` calls ``on_stall(op, index, ckpt, late, elapsed)``
    if some rank has not by the deadline.  ``channel`` is None where MPI lacks
    MPI_THREAD_MULTIPLE (no watch)."""

    job: Job
    timeout_s: float
    channel: MPIDone | None
    on_stall: Callable[[str, int, int, list[int], float], None]
    # On each host's first rank: the host's kernel counters (mlckpt.host.facts.counters_sample),
    # read on leaving the op's barrier (just before its own t0: a start moved later in an edit
    # leaves a gap there; from records format 6 every rank waits for them in a second barrier)
    # and after every rank agreed the op ended.  Untimed (tens of µs; with 8 ranks' accounting
    # ~0.3 ms).  The device is the checkpoint folder's.
    probe: Callable[..., CounterSample] | None = None
    device: str | None = None
    host_ranks: int = 1  # ranks on this rank's host (rank 0's progress estimate)
    # A witnessed run (mlckpt.run.features.witnessing.Witnessing): each op's start is reported before its
    # barrier (a write's nonce comes back and ``seal`` binds it into the content, untimed), its
    # end once every rank agreed it is over.
    witness: OpWitness | None = None
    # What the rule set's records carry (mlckpt.written).  ``op_cpu``: the huge-page share of
    # ``state`` (the rank's arena) is read from /proc/self/smaps before the barrier (~6 ms of CPU a
    # read: not before every op).
    written: Written = field(default_factory=lambda: Written("", 0, 3, 0))
    # Records format 7: the leader's device counters sampled through each op (a timeline).
    sampler: DeviceSampler | None = None
    state: engine.Buffer | None = None
    sampled: set[str] = field(default_factory=set)
    frozen: bool = False  # the objects of the run's set-up moved out of the collector's reach

    def collect_garbage(self) -> None:
        """First thing in an op, before the witness is told it starts: with :meth:`hold_gc`, keeps
        Python's cyclic garbage collector out of the timed region.

        A full collection stops every thread of the rank while it scans all objects: ~70 ms in a
        rank holding the run's ~110k objects (config, plan, rules, the S3 client's model).
        Triggered by the allocations of an op's own requests, it fell inside the first restore
        of most ranks of an object run, and the slowest rank sets the op's time (benchmarks/
        README.md, vs_limit_s3.py).  So: the set-up's objects are frozen once (never scanned
        again), what the previous op left is collected here, untimed, and automatic collection
        is off from the barrier until every rank agreed the op ended.  Reference counting still
        frees memory at once; only reference cycles wait for the next op's collection.  Before
        the witness's start, so a witnessed op's interval does not carry it (WITNESS-TIMES)."""
        gc.collect()
        if not self.frozen:
            gc.freeze()
            self.frozen = True

    @staticmethod
    def hold_gc() -> bool:
        """Automatic collection off; returns whether it was on (a caller that turned it off keeps
        it off)."""
        was = gc.isenabled()
        gc.disable()
        return was

    @staticmethod
    def release_gc(was: bool) -> None:
        if was:
            gc.enable()

    def _opening(self, pool: str) -> CounterSample | None:
        """The op's barrier and the leader's first counters (None elsewhere).  With ``own_io``
        no rank starts before its host's counters are read (a second barrier): with many ranks per
        core the leader can leave the first tens of ms after the others began moving bytes.  With
        ``requests`` the device is sampled from before the barrier, and the op's requests collected."""
        if self.sampler is not None:
            self.sampler.start()
        self.job.comm.Barrier()
        before = self.probe() if self.probe is not None else None
        if self.written.has("own_io"):
            self.job.comm.Barrier()
        if self.written.has("requests"):
            engine.collect(pool)
        return before

    def __call__(
        self, op: str, index: int, ckpt: int, action: Callable[[], object], nbytes: int, nfiles: int,
        opts: engine.IOOptions,
        seal: Callable[[str], None] | None = None,
    ) -> OpRecord:
        job = self.job
        action, watch, huge = self._before(op, index, ckpt, action, nbytes, seal)
        sent = None
        collecting = self.hold_gc()
        try:
            before = self._opening(opts.pool)
            wall = time.time()
            t0 = time.perf_counter_ns()
            c0 = time.process_time_ns()
            err = _attempt(op, index, job.rank, action)
            t1 = time.perf_counter_ns()
            c1 = time.process_time_ns()
            # Timing is over: tell rank 0's watch that this rank is done.
            if watch is not None:
                watch.own_done()
            elif job.rank != 0 and self.channel is not None:
                sent = self.channel.send_done(index)
            # Ranks that finish first wait asleep: MPI's busy-polling would take CPU from the ranks
            # still in the op and from a storage server on the same host (a local object store).
            job.idle_barrier()
            job.agree(err)
        finally:
            self.release_gc(collecting)  # every rank agreed the op ended (or it raised)
            if watch is not None:
                watch.finish()
            elif sent is not None:
                sent.wait()
        if job.rank == 0:
            job.console.stage(None)
            if self.witness is not None:
                self.witness.end(op, index)
        rec: OpRecord = {
               "op": op, "index": index, "checkpoint": ckpt, "rank": job.rank, "host": job.host,
               "t0_ns": t0, "t1_ns": t1, "wall_start": wall, "bytes": nbytes, "files": nfiles,
               "fsync": bool(op == "write" and opts.fsync), "direct": opts.direct,
               "dontcache": opts.dontcache}
        self._evidence(rec, before, opts.pool)
        if self.written.has("op_cpu"):
            rec["cpu_ns"] = c1 - c0
            if huge is not None and self.state is not None:  # (None: /proc/self/smaps unreadable)
                rec["state_bytes"], rec["state_huge_bytes"] = int(self.state.nbytes), int(huge)
        return rec

    def _before(
        self, op: str, index: int, ckpt: int, action: Callable[[], object], nbytes: int,
        seal: Callable[[str], None] | None,
    ) -> tuple[Callable[[], object], OpWatch | None, int | None]:
        """Everything before the op's barrier, untimed: the collector run, the witness told (a
        write's nonce sealed into its content), the fault seam, the guardian's step, rank 0's watch
        and progress line, and the state's huge pages once per op kind (records' ``op_cpu``)."""
        job = self.job
        self.collect_garbage()
        if self.witness is not None:
            nonce = self.witness.start(op, index)
            if nonce is not None and seal is not None:
                seal(nonce)  # the same numpy stores on every rank: nothing to agree on
        action = job.faults.timed_action(job.rank, op, index, action)
        job.note(step=f"{op} {index}", ckpt=ckpt)
        watch = None
        if job.rank == 0 and self.channel is not None:
            watch = OpWatch(self.channel, job.size, self.timeout_s,
                            lambda late, el: self.on_stall(op, index, ckpt, late, el))
        if job.rank == 0:  # a progress line before the barrier, never inside the timing
            job.console.stage(f"{op} {index}", op_meter(self, op, nbytes))
        huge = None
        if self.written.has("op_cpu") and self.state is not None and op not in self.sampled:
            self.sampled.add(op)
            huge = engine.huge_bytes(self.state)
        return action, watch, huge

    def _evidence(self, rec: OpRecord, before: CounterSample | None, pool: str) -> None:
        """After every rank agreed the op ended: the host's counters (its leader), the device's
        samples through the op, the op's requests and a witnessed op's rank 0 time around it
        (records format 7)."""
        if self.probe is not None and before is not None:
            after = self.probe(closing=True)
            rec["host_counters"] = {"device": self.device, "before": before, "after": after}
            if self.written.has("own_io"):  # the host's CPUs, to weigh other processes' CPU time
                rec["host_counters"]["cpus"] = os.cpu_count() or 1
        if self.sampler is not None:
            samples = self.sampler.stop()
            if "host_counters" in rec:
                rec["host_counters"]["samples"] = samples
        if self.written.has("requests"):
            rec.update(request_fields(engine.collected(pool)))
            host_ns = self.witness.host_ns(rec["t0_ns"], rec["t1_ns"]) if self.witness is not None else None
            if host_ns is not None:
                rec["witness_host_ns"] = host_ns


def request_fields(got: engine.Requests | None) -> RequestFields:
    """Records format 7: the op's requests as a histogram, and its phases (mlckpt/latency.py);
    nothing for an op that issued no request through the engine's timed paths."""
    requests = latency.encode(got.latencies_ns) if got is not None else None
    if got is None or requests is None:
        return {}
    return {"requests": requests, "phases_ns": dict(got.phases_ns)}


def _attempt(op: str, index: int, rank: int, action: Callable[[], object]) -> BaseException | None:
    """Run ``action``; its failure, typed and prefixed with the op, or None."""
    try:
        action()
    except StreamMismatch as exc:
        return VerificationError(
            f"{op} {index}: verification failed reading {exc.path}: {exc.mismatch.describe()}",
            rank=rank,
            file=exc.path,
            offset=exc.mismatch.offset,
        )
    except IOFailure as exc:
        return IOFailure(f"{op} {index}: {exc}", op=exc.op, path=exc.path, errno=exc.errno, offset=exc.offset)
    except MlckptError as exc:
        return exc
    except Exception as exc:
        return InternalError(f"{op} {index}: {type(exc).__name__}: {exc}")
    return None
