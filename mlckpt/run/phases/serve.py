"""A serving run's I/O on every rank (rules 1.13): instead of the writes and the restores, the
model's weights laid out once on the storage (untimed), then ``serving.loads`` loads, each cold and
each rank timed from leaving a barrier until its shard is in its memory, by the strategy
(mlckpt/run/phases/loads.py), every byte verified after.  Rank 0 gathers the records.

The weights go in the run folder's ``ckpt-0001/`` (on objects: under the run's prefix), so the
guardian of a run that fails sweeps them as it sweeps a checkpoint; the node-local tier of
``nodecache`` is ``serving.node_tier``/mlckpt-tier-RUN/ckpt-0001 on every host, probed once for
O_DIRECT before the first load, emptied after every load, and swept by each host's guardian as a
fast tier is if the run fails.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from mlckpt import engine
from mlckpt.records import LoadRecord, OpRecord
from mlckpt.run.collective import Job, OpTimer
from mlckpt.run.features.witnessing import Witnessing
from mlckpt.run.phases import loads, outcome
from mlckpt.run.phases.configure import Configured
from mlckpt.run.phases.folders import Folders, make_folders
from mlckpt.run.phases.gates import Gates
from mlckpt.run.phases.publish import RunId
from mlckpt.run.phases.stalls import LoadFiles
from mlckpt.run.storage.backends import Files
from mlckpt.run.storage.cleanup import Created
from mlckpt.written import Written


def serving_phases(job: Job, configured: Configured, gates: Gates, created: Created, ident: tuple[RunId,
                                                                                                  bytes],
                   opts: engine.IOOptions, make_timer: Callable[[Folders, LoadFiles], OpTimer],
                   witness: Witnessing | None = None) -> outcome.Measured:
    """The folders, the weights laid out, the loads; rank 0's Measured holds every rank's records.
    ``make_timer``: the run's op timer for these folders and weights (every load is timed, watched
    and evidenced by it, as a checkpoint op is); ``witness``: each load reported to it (rules 1.16)."""
    cfg = configured.config
    run = configured.setup.settings.serving
    assert run is not None
    folders = make_folders(job, configured, gates, created, *ident)
    plan = run.plan(cfg, list(gates.rank_hosts))
    weights = folders.durable.below("ckpt-0001")
    files = [[loads.file_name(r.shard, i) for i in range(len(plan.shard_files[r.shard]))] for r in plan.ranks]
    job.note(names=files, made=1)  # what the guardian sweeps if the run fails
    me = plan.ranks[job.rank]
    if me.replica == 0:  # the ranks that lay the weights out remove them
        created.add_files([weights.at(name) for name in files[job.rank]])
    if weights.folders and gates.leader(job.rank):
        created.add_dir(Path(weights.at()))
    tier = run.tier_path(folders.run.name)
    if tier is not None:  # every host's guardian sweeps its own tier if the run fails
        job.note(fast_run=str(tier), fast_dirs=[], fast_shared=False)
    tier_files = tier / "ckpt-0001" if tier is not None else None
    tier_direct = False
    if tier_files is not None:  # untimed: may the tier be read as the storage is (O_DIRECT)?
        tier_files.mkdir(parents=True, exist_ok=True)
        tier_direct = bool(opts.direct) and engine.probe_direct(str(tier_files))
    written = Written.of(configured.setup.rules.version)
    s = loads.LoadSetup(plan, weights, Files(tier_files) if tier_files is not None else None, folders.key,
                        folders.run.number, opts, tier_direct=tier_direct,
                        load_evidence=written.has("load_evidence"), exchange_evidence=written.has("exchange"))
    with job.step("laying out the weights"):
        loads.lay_out(job.comm, s)
    groups = loads.shard_groups(job.comm, plan)
    stored = [list(dict.fromkeys(weights.at(loads.file_name(q.shard, q.file)) for q in r.storage))
              for r in plan.ranks]
    timer = make_timer(folders, LoadFiles(stored, sorted({n for names in files for n in names}), tier))
    timer.witness = witness
    nfiles = len({(q.shard, q.file) for q in (*me.storage, *me.node_tier)})
    mine: list[LoadRecord] = []
    for index in range(run.loads):
        def timed(action: Callable[[], None], index: int = index) -> OpRecord:
            return timer("load", index, 1, action, plan.shard_bytes(me.shard), nfiles, opts)

        loaded = loads.load(job.comm, s, groups, timed)  # every rank raises alike if one failed
        with job.step(f"verify load {index}"):
            verified = loads.verify(s, job.rank, loaded.arena)
        with job.step("emptying the node tier"):
            loads.clear_tier(groups[1], s)
        mine.append({"op": "load", "index": index, **loaded.record, "verified_bytes": verified})
        if job.rank == 0:
            job.say(f"load {index + 1}/{run.loads}: {run.replicas} replicas ready")
    if tier is not None and groups[1].Get_rank() == 0:
        shutil.rmtree(tier, ignore_errors=True)
    everyone = job.gather(mine)
    records = sorted((r for recs in everyone or () for r in recs), key=lambda r: (r["index"], r["rank"]))
    return outcome.Measured(folders.run, records, None, None, folders.key)
