"""A resume run's I/O on every rank (rules 1.21): instead of the writes and the restores, the
checkpoint of the written layout laid out once on the storage (untimed), then ``resume.resumes``
resumes, each cold and each rank timed from leaving a barrier until its shard of the new layout is
in its memory (mlckpt/run/phases/resumes.py), every byte verified after.  Rank 0 gathers the records.

The checkpoint goes in the run folder's ``ckpt-0001/`` (on objects: under the run's prefix), so the
guardian of a run that fails sweeps it as it sweeps a checkpoint.  Every resume is timed, watched
and evidenced by the run's op timer (its barriers, the host's counters around it, the fault seam),
as a checkpoint op is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

from mlckpt import engine
from mlckpt.records import OpRecord, ResumeRecord
from mlckpt.run.collective import Job, OpTimer
from mlckpt.run.phases import outcome, resumes
from mlckpt.run.phases.configure import Configured
from mlckpt.run.phases.folders import Folders, make_folders
from mlckpt.run.phases.gates import Gates
from mlckpt.run.phases.publish import RunId
from mlckpt.run.phases.stalls import LoadFiles
from mlckpt.run.storage.cleanup import Created


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
    laid = [[f.name for rp in run.written.rank_plans if rp.rank % job.size == r for f in rp.files]
            + ([resumes.INDEX_NAME] if r == 0 else []) for r in range(job.size)]
    job.note(names=laid, made=1)  # what the guardian sweeps if the run fails
    created.add_files([store.at(name) for name in laid[job.rank]])  # each rank removes what it laid out
    if store.folders and gates.leader(job.rank):
        created.add_dir(Path(store.at()))
    with job.step("laying out the checkpoint"):
        index_bytes = resumes.lay_out(job.comm, setup)
    with job.step("allocating the new state"):
        prepared = resumes.prepare(setup, job.rank)
    reads = [sorted({store.at(setup.name(rd.writer, rd.index)) for rd in rr}) for rr in run.plan.reads]
    timer = make_timer(folders, LoadFiles(reads, sorted({n for names in laid for n in names})))
    mine: list[ResumeRecord] = []
    for index in range(run.resumes):
        def timed(action: Callable[[], None], index: int = index) -> OpRecord:
            return timer("resume", index, 1, action, prepared.plan.bytes, len(reads[job.rank]), opts)

        rec = resumes.resume(job.comm, setup, prepared, index_bytes, timed)  # every rank raises alike
        with job.step(f"verify resume {index}"):
            verified = resumes.verify(setup, prepared, job.rank)
        # the record's fields are a resume record's own (resumes.resume), checked where records are read
        mine.append(cast(ResumeRecord, {"op": "resume", "index": index, "host": gates.rank_hosts[job.rank],
                                        **rec, "verified_bytes": verified}))
        if job.rank == 0:
            job.say(f"resume {index + 1}/{run.resumes}: {run.ranks} ranks hold their shards")
    everyone = job.gather(mine)
    records = sorted((r for recs in everyone or () for r in recs), key=lambda r: (r["index"], r["rank"]))
    return outcome.Measured(folders.run, records, None, None, folders.key)
