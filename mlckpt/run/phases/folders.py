"""This run's place on the storage: the run folder (durable tier, fast tier) a write invocation
creates, the write invocation's folder a read-only invocation restores from, or the run's prefix
in a store (rules 1.6).  Everything created is handed to :class:`Created` before it is
made, and the guardian is told first (it can undo all of it)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from mlckpt.errors import ConfigError
from mlckpt.locations import s3_settings
from mlckpt.run.collective import Job
from mlckpt.run.features import split
from mlckpt.run.features.split import keeps_key
from mlckpt.run.phases.configure import Configured
from mlckpt.run.phases.gates import Gates
from mlckpt.run.phases.guardians import tell_shared
from mlckpt.run.phases.publish import RunId
from mlckpt.run.storage import folderlock
from mlckpt.run.storage.backends import Files, Storage
from mlckpt.run.storage.cleanup import RUN_MARKER, Created
from mlckpt.run.storage.kinds import open_durable
from mlckpt.workload.frameworks import file_names


@dataclass(frozen=True)
class Folders:
    """This run's identity, content key and places: its folder (or prefix) on the durable tier's
    storage and its folder on the fast tier."""

    run: RunId
    key: bytes
    durable: Storage
    fast: Files | None = None


def make_folders(job: Job, configured: Configured, gates: Gates, created: Created, run: RunId,
                 key: bytes) -> Folders:
    cfg = configured.config
    if configured.source is not None:
        return restored_folders(job, configured, gates, run, created)
    fw = configured.setup.settings.framework
    names = [file_names(fw, r, [f.name for f in rp.files]) for r,
             rp in enumerate(configured.setup.plan.rank_plans)]
    partial_dir = str(configured.setup.settings.results / f".{run.name}.partial")
    durable = open_durable(cfg, run.name)
    created.storage = durable
    if not durable.folders:
        return prefix(job, configured, run, key, durable, names, partial_dir)
    root = Path(durable.at())
    leader = gates.leader(job.rank)
    with job.step("checkpoint folder"):
        # Folders this run creates (the configured folder too, if missing) are removed at the
        # end when empty; pre-existing ones are never touched.
        missing = created.missing_above(root) if leader else []
        job.note(run=str(root), keep=configured.setup.settings.checkpoint.keep,
                 dirs=[str(d) for d in missing],
                 names=names, partial=partial_dir)  # before the first mkdir: the guardian can undo all of it
        if leader:
            take_lock(job, root, created)
            make_run_folder(root, created, key if keeps_key(cfg) else None)
    tell_shared(job, root, leader, "shared")
    fast_root = None
    if configured.pipe.fast is not None:
        fast_root = Path(configured.pipe.fast).absolute() / run.name
        with job.step("fast-tier folder"):
            missing = created.missing_above(fast_root) if leader else []
            job.note(fast_run=str(fast_root), fast_dirs=[str(d) for d in missing])
            if leader:
                make_run_folder(fast_root, created)
        tell_shared(job, fast_root, leader, "fast_shared")
    return Folders(run, key, durable, Files(fast_root) if fast_root is not None else None)


def prefix(job: Job, configured: Configured, run: RunId, key: bytes, durable: Storage, names: list[list[str]],
           partial_dir: str) -> Folders:
    """The run's prefix in a store that needs no folders: nothing to create, only the guardian to
    tell what to sweep, and with which client settings, if the run fails."""
    with job.step("checkpoint prefix"):
        job.note(run=durable.at(), keep=configured.setup.settings.checkpoint.keep, dirs=[], names=names,
                 partial=partial_dir, s3=s3_settings(configured.config), shared=True)
    return Folders(run, key, durable)


def take_lock(job: Job, root: Path, created: Created) -> None:
    """The checkpoint folder's lock (mlckpt.run.storage.folderlock) for the run folder ``root`` this run
    uses, before any checkpoint I/O: a run already measuring the folder, or still removing its
    files, refuses this one here."""
    root.parent.mkdir(parents=True, exist_ok=True)
    pids = [os.getpid(), *([job.guardian.pid] if job.guardian is not None and job.guardian.pid else [])]
    note = folderlock.acquire(root.parent, root.name, pids, datetime.datetime.now().astimezone().isoformat(
        timespec="seconds"))
    created.locks.append((root.parent, root.name))
    if note:
        job.say(f"checkpoint folder {root.parent}: {note}")


def make_run_folder(root: Path, created: Created, key: bytes | None = None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    # A write invocation to be restored by another leaves its content key in the marker.
    (root / RUN_MARKER).write_text(key.hex() + "\n" if key else "")
    created.add_dir(root, root=True)


def restored_folders(job: Job, configured: Configured, gates: Gates, run: RunId, created: Created) -> Folders:
    """A read-only invocation: the write invocation's run folder under this invocation's
    checkpoint folder (the same storage, possibly remapped), its content key, and every file this
    rank will read there at its size; before any I/O.  Without checkpoint.keep, the checkpoints are
    removed once restored, each rank removing those its writer rank wrote."""
    assert configured.source is not None
    plan = configured.setup.plan
    root = Path(configured.setup.settings.checkpoint.folder).absolute() / configured.source.name
    nw = configured.source.num_writes
    key = None
    job.note(run=str(root), keep=True, dirs=[], names=[],
             partial=str(configured.setup.settings.results / f".{run.name}.partial"))
    with job.step("the write invocation's checkpoints"):  # every rank fails if rank 0 does
        if gates.leader(job.rank):  # the folder is this invocation's while it restores (the
            take_lock(job, root, created)  # lock names the run folder it uses, its write invocation's)
        if job.rank == 0:
            key = split.read_key(root, configured.source)
    key = job.comm.bcast(key)
    with job.step("checking the checkpoints to restore"):
        reads = plan.restore_reads(job.rank, configured.setup.settings.checkpoint.restore, gates.shift)
        want = [(str(root / f"ckpt-{k:04d}" / rd.file.name), rd.file.bytes)
                for k in range(1, nw + 1) for rd in reads]
        problem = split.missing(want)
        if problem:
            raise ConfigError(f"{split.KEY}: {problem}", key=split.KEY)
    created.add_files([str(root / f"ckpt-{k:04d}" / f.name) for k in range(1, nw + 1)
                       for f in plan.rank_plans[job.rank].files])
    for k in range(1, nw + 1):
        created.add_dir(root / f"ckpt-{k:04d}")
    created.add_dir(root, root=True)
    return Folders(run, key, Files(root))
