"""A resume run's I/O on every rank (rules 1.21): instead of the writes and the restores, the
checkpoint of the written layout laid out once on the storage (untimed), then ``resume.resumes``
resumes, each cold and each rank timed from leaving a barrier until its shard of the new layout is
in its memory (mlckpt/run/phases/resumes.py), every byte verified after.  Rank 0 gathers the records.

From rules 1.22, with ``framework.writer=torch_dcp``: the same checkpoint is also saved through DCP,
as its N ranks would have saved it, and the resumes DCP makes (alternating with the engine's, as the
configuration gives: mlckpt/workload/resume_run.py) are DCP's own resharding load of it, timed,
evidenced and verified the same way.

Under rules that judge a resume run by FOREIGN-IO (1.22), the run's timing is calibrated and the
device watched with the run asleep before the first resume, as a checkpoint run's are, so a resume
that another tenant of the device slowed is labelled disturbed.

The checkpoint goes in the run folder's ``ckpt-0001/`` (on objects: under the run's prefix), so the
guardian of a run that fails sweeps it as it sweeps a checkpoint.  Every resume is timed, watched
and evidenced by the run's op timer (its barriers, the host's counters around it, the fault seam),
as a checkpoint op is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast, overload

from mlckpt import engine
from mlckpt.engine import frameworks
from mlckpt.records import OpRecord, ResumeRecord
from mlckpt.run.collective import Job, OpTimer
from mlckpt.run.phases import outcome, resumes
from mlckpt.run.phases.calibrate import calibrate
from mlckpt.run.phases.configure import Configured
from mlckpt.run.phases.folders import Folders, make_folders
from mlckpt.run.phases.gates import Gates
from mlckpt.run.phases.publish import RunId
from mlckpt.run.phases.stalls import LoadFiles
from mlckpt.run.storage.cleanup import Created
from mlckpt.workload.frameworks import DCP_METADATA, ENGINE
from mlckpt.workload.resume import rank_resume
from mlckpt.workload.resume_run import ResumeRun


def _laid_out(run: ResumeRun, size: int) -> list[list[str]]:
    """Each rank's names in the checkpoint folder: the old files it lays out for the engine (rank 0:
    the index too), and the DCP files of the old ranks it saves for (rank 0: DCP's metadata)."""
    from mlckpt.engine.dcp_reshard import file_name

    engine_too, dcp = ENGINE in run.writers, run.framework.library
    return [([f.name for rp in run.written.rank_plans if rp.rank % size == r for f in rp.files]
             + ([resumes.INDEX_NAME] if r == 0 else []) if engine_too else [])
            + ([file_name(w) for w in range(run.from_ranks) if w % size == r]
               + (list(DCP_METADATA) if r == 0 else []) if dcp else [])
            for r in range(size)]


class _OldFiles(Sequence[list[str]]):
    """Each new rank's old files (the engine's and DCP's it reads), as a stall line names them:
    worked out for the rank it names, when it names it.  Every rank working out every rank's plan
    at start-up would cost M plans on each of M ranks (0.74 s a rank at 64 ranks)."""

    def __init__(self, run: ResumeRun, setup: resumes.ResumeSetup) -> None:
        self.run, self.setup = run, setup

    def __len__(self) -> int:
        return self.run.ranks

    @overload
    def __getitem__(self, rank: int) -> list[str]: ...
    @overload
    def __getitem__(self, rank: slice) -> Sequence[list[str]]: ...

    def __getitem__(self, rank: int | slice) -> list[str] | Sequence[list[str]]:
        if isinstance(rank, slice):
            return [self[r] for r in range(self.run.ranks)[rank]]
        from mlckpt.engine.dcp_reshard import file_name

        s, index, run = self.setup, self.setup.index, self.run
        rr = rank_resume(index, s.workload, s.ranks, s.tp, s.pp, rank)
        mine = ({s.name(rd.writer, rd.index) for rd in rr.reads(index.file_bytes)} if ENGINE in run.writers
                else set())
        if run.framework.library:  # and DCP's files of the old ranks it reads
            mine |= {file_name(n.writer) for n in rank_resume(index, s.workload, s.ranks, s.tp, s.pp, rank,
                                                              spread=False).needs}
        return sorted(s.storage.at(n) for n in mine)


def resume_phases(job: Job, configured: Configured, gates: Gates, created: Created,
                  ident: tuple[RunId, bytes], opts: engine.IOOptions,
                  make_timer: Callable[[Folders, LoadFiles], OpTimer]) -> outcome.Measured:
    """The folders, the checkpoint laid out, the resumes; rank 0's Measured holds every rank's
    records.  ``make_timer``: the run's op timer for these folders and files."""
    run = configured.setup.settings.resume
    assert run is not None
    folders = make_folders(job, configured, gates, created, *ident)
    store = folders.durable.below("ckpt-0001")
    setup = resumes.ResumeSetup(run.written, run.workload, run.ranks, run.tp, run.pp, store, folders.key,
                                folders.run.number, opts)
    laid = _laid_out(run, job.size)
    job.note(names=laid, made=1)  # what the guardian sweeps if the run fails
    created.add_files([store.at(name) for name in laid[job.rank] if name != DCP_METADATA[1]])
    if store.folders and gates.leader(job.rank):
        created.add_dir(Path(store.at()))
    fw = run.framework
    if fw.library:  # untimed: PyTorch takes seconds to import; DCP's process group from the MPI world
        with job.step(f"framework library {fw.writer}"):
            frameworks.load_library(fw.writer)
            frameworks.join_process_group(job.comm, len(gates.hosts) == 1)
    try:
        return _resumes(job, configured, setup, folders, gates, laid, make_timer)
    finally:
        if fw.library:
            frameworks.leave_process_group()


def _resumes(job: Job, configured: Configured, setup: resumes.ResumeSetup, folders: Folders, gates: Gates,
             laid: list[list[str]], make_timer: Callable[[Folders, LoadFiles], OpTimer]) -> outcome.Measured:
    run, rules = configured.setup.settings.resume, configured.setup.rules
    assert run is not None
    cdir = Path(setup.storage.at())
    prepared: dict[str, resumes.Prepared] = {}
    index_bytes = 0
    if ENGINE in run.writers:
        with job.step("laying out the checkpoint"):
            index_bytes = resumes.lay_out(job.comm, setup)
        with job.step("allocating the new state"):
            prepared[ENGINE] = resumes.prepare(setup, job.rank)
    if run.framework.library:
        with job.step(f"saving the checkpoint through {run.framework.writer}"):
            resumes.dcp_lay_out(job.comm, setup, cdir)
        with job.step(f"allocating the new state for {run.framework.writer}"):
            prepared[run.framework.writer] = resumes.prepare(setup, job.rank, spread=False)
    timer = make_timer(folders, LoadFiles(_OldFiles(run, setup), sorted({n for ns in laid for n in ns})))
    calibration = None
    if "resume" in rules.rule("FOREIGN-IO").kinds:  # rules 1.22: what the host moves with the run asleep
        calibration = calibrate(timer, background_s=float(rules.data["attribution"]["background_s"]))
    mine: list[ResumeRecord] = []
    for index in range(run.resumes):
        writer = run.writer_of(index)
        ready = prepared[writer]

        # the old files it reads (a library's: one an old rank)
        files = {(n.writer, n.index if writer == ENGINE else 0) for n in ready.plan.needs}

        def timed(action: Callable[[], None], index: int = index, writer: str = writer,
                  nbytes: int = ready.plan.bytes, nfiles: int = len(files)) -> OpRecord:
            o = setup.opts if writer == ENGINE else replace(setup.opts, direct=False, dontcache=False)
            return timer("resume", index, 1, action, nbytes, nfiles, o)

        # every rank raises alike
        rec = (resumes.resume(job.comm, setup, ready, index_bytes, timed) if writer == ENGINE
               else resumes.dcp_resume(job.comm, setup, ready, cdir, timed))
        with job.step(f"verify resume {index}"):
            verified = resumes.verify(setup, ready, job.rank)
        # the record's fields are a resume record's own (resumes.resume), checked where records are read
        fields = {"op": "resume", "index": index, "host": gates.rank_hosts[job.rank], **rec,
                  "verified_bytes": verified}
        if timer.written.has("resume_writer"):
            fields["writer"] = writer
        mine.append(cast(ResumeRecord, fields))
        if job.rank == 0:
            job.say(f"resume {index + 1}/{run.resumes}" + (f" through {writer}" if writer != ENGINE else "")
                    + f": {run.ranks} ranks hold their shards")
    everyone = job.gather(mine)
    records = sorted((r for recs in everyone or () for r in recs), key=lambda r: (r["index"], r["rank"]))
    return outcome.Measured(folders.run, records, None, calibration, folders.key)
