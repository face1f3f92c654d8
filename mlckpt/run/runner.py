"""The MPI runner: the phase sequence, on every rank.

configure → gates → signing key → folders → allocation → writes → eviction → restores → publish.
Each phase returns a small frozen value (or the records); what the run created on the storage is
owned by :class:`~mlckpt.run.storage.cleanup.Created` and removed on the way out, success or failure.

Timing is per rank on its host's monotonic clock between leaving a barrier and its last byte being
durable (writes) or read (reads); metrics take the max over ranks.  Two guards cover ranks that
never get to an agreement: the op watch (a stalled rank, see :mod:`mlckpt.run.collective`) and
rank 0's guardian (a killed rank, see :mod:`mlckpt.run.guardian`).
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from mlckpt import __version__, engine
from mlckpt.engine import frameworks
from mlckpt.errors import ExitStatus, MlckptError, UsageError
from mlckpt.host.facts import SAMPLE_INTERVAL_S, DeviceSampler, block_device, counters_sample
from mlckpt.plan.config import SHIPPED, ConfigSource
from mlckpt.plan.settings import Settings
from mlckpt.records import OpRecord
from mlckpt.rules import gpu_source
from mlckpt.run import outcome_note
from mlckpt.run.collective import Job, OpTimer
from mlckpt.run.console import Console, what_runs
from mlckpt.run.faults import NO_FAULTS, Faults
from mlckpt.run.features.witnessing import Witnessing
from mlckpt.run.guardian import Guardian
from mlckpt.run.phases import gpustate, outcome, resuming, serve
from mlckpt.run.phases.calibrate import calibrate
from mlckpt.run.phases.configure import Configured, configure, mpi_library, resolve_signing_key
from mlckpt.run.phases.folders import Folders, make_folders
from mlckpt.run.phases.gates import Gates, judge, measure_host, measure_object_host
from mlckpt.run.phases.guardians import link_guardians
from mlckpt.run.phases.library import LibraryWrites
from mlckpt.run.phases.publish import (
    RunId,
)
from mlckpt.run.phases.reads import ReadPhase
from mlckpt.run.phases.stalls import LoadFiles, Stalled
from mlckpt.run.phases.writes import WritePhase, WriteState
from mlckpt.run.site_mpi import first_line, foreign_launcher, library_abi, mismatch, speaks
from mlckpt.run.storage.cleanup import Created
from mlckpt.run.storage.kinds import takes_page_cache
from mlckpt.run.watch import MPIDone
from mlckpt.workload.layout import PAGE, pages
from mlckpt.workload.tensors import read_tensors, tensors_of
from mlckpt.written import Written

if TYPE_CHECKING:
    from mlckpt.engine.gpu import DeviceState
    from mlckpt.workload.layout import FileSpec, RestoreRead


def run_name(run: Settings, run_id: int) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{run.workload}-{run.ranks}r-{run_id:016x}"[:80]


def offsets(sizes: Sequence[int]) -> list[int]:
    out = [0]
    for n in sizes:
        out.append(out[-1] + pages(n) * PAGE)
    return out


def gate(job: Job, configured: Configured) -> Gates:
    """Each host's leader measures its host; every rank judges every host (before any I/O)."""
    cfg, run = configured.config, configured.setup.settings
    folder = Path(run.checkpoint.folder).absolute()
    names = job.comm.allgather(job.host)
    # The life pipe: its write end closes when this process dies, which its host's guardian sees
    # at once (it opens the read end through /proc).  Both ends stay open for good.
    life = os.pipe()
    pids = job.comm.allgather((os.getpid(), life[0]))
    job.note(
        ranks=[[r, pid, h, fd] for r, ((pid, fd), h) in enumerate(zip(pids, names, strict=True))],
        host=job.host,
    )
    with job.step("guardians"):
        link_guardians(job, names)
    local = None
    with job.step("host measurement"):
        if names.index(job.host) == job.rank and not takes_page_cache(run.checkpoint.folder):
            local = measure_object_host(job.host, cfg, mpi_library(), run.results)
        elif names.index(job.host) == job.rank:
            local = measure_host(job.host, folder, cfg["io"], configured.pipe.fast, mpi_library(),
                                 run.results, cfg)
        # The other ranks wait asleep: MPI's busy-polling collectives would halve the memory copy
        # rate a leader measures on a host with as many ranks as cores.
        job.idle_barrier()
        if local is not None:  # every host's clock, read on leaving one barrier (HOST-CLOCK-OFFSET)
            local["wall_s"] = time.time()
    measured = [m for m in job.comm.allgather(local) if m]
    with job.step("gates"):
        return judge(configured.setup, names, measured)


def identity(job: Job, run: Settings) -> tuple[RunId, bytes]:
    """This run's content key (rank 0's, broadcast) and the id and name derived from it."""
    key = job.comm.bcast(secrets.token_bytes(engine.KEY_BYTES) if job.rank == 0 else None)
    number = int.from_bytes(key[:8], "little")
    return RunId(number, job.comm.bcast(run_name(run, number) if job.rank == 0 else None)), key


def op_timer(job: Job, configured: Configured, gates: Gates, folders: Folders, created: Created,
             loads: LoadFiles | None = None) -> OpTimer:
    """The run's op timer; rank 0 watches every op against ``io.timeout_s``, and a stall's line
    names and sweeps the checkpoint's files (``loads``: a serving run's weights)."""
    # The op watch calls MPI from a second thread on rank 0: only with MPI_THREAD_MULTIPLE.
    from mpi4py import MPI

    channel = None
    if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
        channel = MPIDone(job.comm.Dup())
    else:
        job.say(
            "warning: this MPI library does not provide MPI_THREAD_MULTIPLE: io.timeout_s is "
            "not enforced (a stalled rank will hang the job)"
        )
    stalled = Stalled(job, configured, gates, folders, created, loads)
    timer = OpTimer(job, configured.setup.settings.io.timeout_s, channel, stalled)
    timer.written = Written.of(configured.setup.rules.version)
    pids = job.comm.allgather(os.getpid())
    if gates.leader(job.rank):  # the host's kernel counters around every op (records format 3)
        timer.device = block_device(Path(folders.durable.at())) if folders.durable.cached else None
        ranks = next(h for h in gates.hosts if job.rank in h.ranks).ranks
        # Records format 6: and what the kernel charged to the host's ranks, to tell the run's
        # own I/O from other tenants' on the same device.
        own = [pids[r] for r in ranks] if timer.written.has("own_io") else ()
        timer.probe = partial(counters_sample, timer.device, own)
        timer.host_ranks = len(ranks)
        every = configured.setup.settings.io.sample_interval_s
        if timer.written.has("requests") and timer.device is not None and every != 0:
            timer.sampler = DeviceSampler(timer.device, every or SAMPLE_INTERVAL_S)
    return timer


def evict_written(job: Job, configured: Configured, folders: Folders, created: Created, leader: bool,
                  nw: int) -> None:
    """After the writes: every file this run wrote leaves the page cache (restores are cold)."""
    fast = folders.fast.root if folders.fast is not None else None
    with job.step("cache eviction after writes"):
        for path in created.files if folders.durable.cached else ():  # a store: no local cache
            # Fast-tier copies no longer kept are gone already; every other file must be there.
            if fast is None or not path.startswith(f"{fast}/") or os.path.exists(path):
                engine.evict(path)
        if configured.setup.settings.drop_system_cache and leader:
            engine.drop_caches()
        if leader and fast is not None:  # every persist is over: drop emptied folders
            for j in set(range(1, nw + 1)) - set(configured.pipe.fast_retained(nw)):
                try:
                    (fast / f"ckpt-{j:04d}").rmdir()
                except OSError:
                    pass
        job.faults.after_writes(job.rank, folders.durable, fast, configured.setup.plan, nw)


def timer_opts(run: Settings) -> engine.IOOptions:
    """The I/O options of every op (object runs: no O_DIRECT, no page cache to skip)."""
    files = takes_page_cache(run.checkpoint.folder)
    return engine.IOOptions(direct=run.io.direct and files, dontcache=run.io.dontcache and files,
                            threads=run.io.threads, block_size=run.io.block_size, fsync=run.checkpoint.fsync)


def phases(job: Job, configured: Configured, gates: Gates, created: Created, ident: tuple[RunId, bytes],
           witness: Witnessing | None) -> outcome.Measured:
    """Folders, allocation, the timing calibration, the writes, eviction, the restores."""
    cfg, plan = configured.config, configured.setup.plan
    folders = make_folders(job, configured, gates, created, *ident)
    timer = op_timer(job, configured, gates, folders, created)
    timer.witness = witness
    mine = plan.rank_plans[job.rank].files
    reads = plan.restore_reads(job.rank, configured.setup.settings.checkpoint.restore, gates.shift)
    stream = configured.setup.settings.residency == "stream"
    with job.step("memory allocation"):
        own, rd_offsets = offsets([f.bytes for f in mine]), offsets([rd.file.bytes for rd in reads])
        arena = engine.alloc(
            configured.setup.settings.stream_buffer_bytes if stream else max(own[-1], rd_offsets[-1], PAGE)
        )
    timer.state = arena
    dev, state = None, None
    if gpu_source(cfg):
        with job.step("GPU state"):
            dev, mine_gpu = gpustate.open_gpu(job, cfg, gates, arena)
        entries = job.gather(mine_gpu["entry"])
        state = gpustate.state_block(mine_gpu, entries) if job.rank == 0 else None
    fw = configured.setup.settings.framework
    if fw.library:  # untimed: PyTorch takes seconds to import; DCP's process group from the MPI world
        with job.step(f"framework library {fw.writer}"):
            frameworks.load_library(fw.writer)
            if fw.spec.collective:
                frameworks.join_process_group(job.comm, len(gates.hosts) == 1)
    idle_s = float(configured.setup.rules.data.get("attribution", {}).get("background_s", 0.0))  # rules 1.9
    calibration = calibrate(timer, background_s=idle_s) if timer.written.has("own_io") else None
    try:
        run_id, records = _io_phases(job, configured, gates, created, folders, timer, arena,
                                     (mine, own, reads, rd_offsets), dev)
        if dev is not None:
            with job.step("GPU copy rates again"):
                entry = gpustate.probed_again(job, gates, dev, arena, mine_gpu["entry"])
            entries = job.gather(entry)
            state = gpustate.state_block(mine_gpu, entries) if job.rank == 0 else None
    finally:
        if dev is not None:
            dev.close()
        if fw.spec.collective:
            frameworks.leave_process_group()
    return outcome.Measured(run_id, records, state, calibration, folders.key)


def _io_phases(job: Job, configured: Configured, gates: Gates, created: Created, folders: Folders,
               timer: OpTimer,
               arena: engine.Buffer,
               layout: tuple[Sequence[FileSpec], list[int], Sequence[RestoreRead], list[int]],
               dev: DeviceState | None) -> tuple[RunId, list[OpRecord]]:
    """The writes, eviction and the restores, from ``arena`` (and ``dev``, a GPU-resident state);
    ``layout``: this rank's files and their offsets, its restore reads and theirs."""
    ck = configured.setup.settings.checkpoint
    mine, own, reads, rd_offsets = layout
    stream = configured.setup.settings.residency == "stream"
    opts = timer_opts(configured.setup.settings)
    if stream:
        job.say(
            "residency=stream: content generation (writes) and verification (reads) run "
            "inside the timed region; results are labelled stream"
        )
    nw, nr = ck.num_writes, ck.num_reads
    leader, fast_direct = gates.leader(job.rank), gates.fast_direct.get(job.host, False)
    records: list[OpRecord] = []
    fw = configured.setup.settings.framework
    # what the library is handed: before rules 1.19 (records format 12), one tensor per file
    structure = fw.tensors if timer.written.has("tensors") else "flat"
    if configured.source is None:
        lib = (LibraryWrites(fw, job.rank, mine, own, created, tensors_of(configured.setup.plan, job.rank,
                                                                           structure),
                             timer.written.has("tensors")) if fw.library else None)
        w = WriteState(folders.durable, folders.fast, mine, own, arena, folders.key, opts, stream, leader,
                       dev=dev, lib=lib)
        writes = WritePhase(job, configured.pipe, w, folders.run.number, timer, created, fast_direct)
        records.extend(writes.run(nw))
        tags = writes.tags
        evict_written(job, configured, folders, created, leader, nw)
    else:  # a read-only invocation restores the write invocation's checkpoints (each restore evicts first)
        nw, tags = configured.source.num_writes, dict(configured.source.tags)
    records += ReadPhase(
        job=job,
        pipe=configured.pipe,
        run_id=int.from_bytes(folders.key[:8], "little"),  # whose content the pages carry
        key=folders.key,
        durable=folders.durable,
        fast=folders.fast,
        reads=reads,
        offsets=rd_offsets,
        arena=arena,
        opts=opts,
        stream=stream,
        timer=timer,
        fast_direct=fast_direct,
        fast_fs=gates.fast_fs,
        writer_hosts=frozenset(gates.rank_hosts[rd.writer] for rd in reads),
        tags=tags,
        dev=dev,
        fw=fw,
        tensors=read_tensors(configured.setup.plan, reads, structure) if fw.library else (),
    ).run(nw, nr)
    return folders.run, records


def measure(job: Job, c: Configured, gates: Gates, created: Created, ident: tuple[RunId, bytes],
            witness: Witnessing | None) -> outcome.Measured:
    """The run's I/O, by its kind: a serving run's loads, a resume run's resumes, or checkpoints."""
    run, timer = c.setup.settings, (lambda f, loads: op_timer(job, c, gates, f, created, loads))
    if run.serving is not None:
        return serve.serving_phases(job, c, gates, created, ident, timer_opts(run), timer, witness)
    if run.resume is not None:
        return resuming.resume_phases(job, c, gates, created, ident, timer_opts(run), timer)
    return phases(job, c, gates, created, ident, witness)


def run(job: Job, overrides: Sequence[str], source: ConfigSource = SHIPPED) -> tuple[Path | None, str]:
    """The whole run on this rank; rank 0 returns the bundle's folder; every rank the verdict."""
    started = outcome.now()
    with job.step("configuration"):
        c = configure(job, overrides, source)
    c = replace(c, source=job.comm.bcast(c.source))  # rank 0 verified the write invocation's bundle
    run = c.setup.settings
    job.say(
        f"mlckpt {__version__}: {run.workload} on {job.size} ranks, division "
        f"{run.division}{', scaled × ' + str(run.scale) if run.scaled else ''}, "
        f"{what_runs(run, c.setup.plan.total_bytes)}"
    )
    if c.source is not None:
        job.say(f"read-only invocation: restoring the {c.source.num_writes} checkpoints of {c.source.name} "
                f"(ended {c.source.ended})")
    gates = gate(job, c)
    key = c.signing_key
    with job.step("signing key"):
        # After the gates (a refused run writes nothing, not even a new key), before any I/O.
        if job.rank == 0 and key is None:
            key = resolve_signing_key(run.signing_key, job.say)
    ident = identity(job, run)
    # Before any I/O: a witness asked for but not reachable refuses the run on every rank.
    witness = Witnessing.open(job, run, c.setup.plan.digest, ident[0].number, ident[0].name, key)
    stage = job.console.stage if job.rank == 0 else (lambda _: None)
    # A read-only invocation removes what it restored only once it is a result: judged first, a
    # disturbed or invalid one keeps the write invocation's checkpoints, to be run again.
    early = c.source is not None and not run.checkpoint.keep
    assessed: outcome.Assessed | None = None
    failure: BaseException | None = None
    with Created(run.checkpoint.keep, between=lambda: final_barrier(job), stage=stage) as created:
        measured = measure(job, c, gates, created, ident, witness)
        if early:
            assessed, failure = outcome.assessed(job, c, gates, measured, started, witness)
            kept = assessed is not None and assessed.manifest["verdict"] in ("disturbed", "invalid")
            if job.comm.bcast(kept if job.rank == 0 else None):
                created.keep = True
                if job.rank == 0 and assessed is not None and c.source is not None:
                    job.say(f"note: the checkpoints of {c.source.name} are kept (verdict "
                            f"{assessed.manifest['verdict']}): run this read-only invocation again; "
                            "the one that restores them as a result removes them")
    if not early:
        assessed, failure = outcome.assessed(job, c, gates, measured, started, witness)
    folder = None
    if job.rank == 0 and assessed is not None:
        try:
            folder = outcome.publish(job, c, assessed, key, witness)
        except BaseException as exc:  # the other ranks wait for the verdict: tell them, then fail
            failure = exc
    verdict = job.comm.bcast(read_verdict(folder) if folder is not None else "no bundle")
    if failure is not None:
        raise failure
    return folder, str(verdict)


def read_verdict(folder: Path) -> str:
    import json

    return str(json.loads((folder / "run.json").read_text())["verdict"])


def final_barrier(job: Job) -> None:
    # From here on ranks may end normally: the guardian no longer blames the first to go.
    job.note(step="cleanup and result", final=True)
    try:
        job.comm.Barrier()
    except Exception:  # the world may be broken already; cleanup is best effort
        pass


def mpi_main(overrides: Sequence[str], faults: Faults = NO_FAULTS, out: TextIO | None = None,
             source: ConfigSource = SHIPPED) -> int:
    """Entry point on every rank under mpiexec (tests pass their own ``faults``)."""
    # Ctrl-C ends a rank at once, by the signal (a KeyboardInterrupt could hang it in MPI while
    # the others are gone): its host's guardian removes the run's files and says so.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    guardian = Guardian.start()  # each host's first rank, before MPI starts (no fork after MPI_Init)
    try:
        import warnings

        # mpi4py warns on every rank of another MPI's launcher; the one line below says it once
        warnings.filterwarnings("ignore", message="suspicious MPI execution environment")
        if foreign_launcher(os.environ, library_abi()):
            import mpi4py

            mpi4py.rc.initialize = mpi4py.rc.finalize = False  # refused without starting MPI
        from mpi4py import MPI

        world = MPI.COMM_WORLD.Get_size() if MPI.Is_initialized() else 1  # a singleton, each
        problem = mismatch(os.environ, world, first_line(MPI.Get_library_version()))
        if problem:  # N singletons of another MPI's launcher: each would run alone on the storage
            if speaks(os.environ):
                print(f"mlckpt: error: {problem}", file=sys.stderr, flush=True)
            return UsageError.exit_status
        job = Job(MPI.COMM_WORLD, Console(out or sys.stdout), guardian, faults)
        try:
            try:
                folder, verdict = run(job, overrides, source)
            finally:
                job.console.close()  # the live bar (on a terminal) goes before the last lines
        except MlckptError as err:
            if job.rank == 0:
                print(f"mlckpt: error: {err}", file=sys.stderr, flush=True)
            return err.exit_status
        if job.rank == 0 and folder is not None:
            print(f"bundle: {folder}", flush=True)
            outcome_note.note(folder, verdict)
        if verdict == "invalid":  # a bundle was written, but it is no valid result: never exit 0
            if job.rank == 0:
                print("mlckpt: error: the run's verdict is invalid (see its findings above and the "
                      "first line of its run.log); the bundle is kept for diagnosis", file=sys.stderr,
                      flush=True)
            return ExitStatus.INVALID
        if verdict == "disturbed":  # nothing wrong with the storage or the run: its host was busy
            if job.rank == 0:
                print("mlckpt: the run was disturbed: other processes used its checkpoint device or its "
                      "CPUs during the timed ops, or its host was too busy around them to be witnessed "
                      "(see the findings above). The bundle is kept and says so, but it is no result: "
                      "quiet the device and the host, and run again",
                      file=sys.stderr, flush=True)
            return ExitStatus.DISTURBED
        return ExitStatus.OK
    finally:
        if guardian is not None:  # the leader got here: its failure was reported and cleaned up
            guardian.end("clean")
