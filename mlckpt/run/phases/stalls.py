"""What rank 0 does when an op stalls past ``io.timeout_s``: one line naming the stalled ranks and
what they were doing, this run's planned files removed (unless kept), then MPI_Abort so that
every rank ends (the op watch that calls it is in :mod:`mlckpt.run.collective`)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlckpt.locations import s3_settings
from mlckpt.run.collective import Job
from mlckpt.run.phases.configure import Configured
from mlckpt.run.phases.folders import Folders
from mlckpt.run.phases.gates import Gates
from mlckpt.run.storage.cleanup import Created
from mlckpt.run.storage.kinds import sweep
from mlckpt.workload.frameworks import file_names

ABORT_GRACE_S = 0.5  # between printing the fatal line and MPI_Abort


@dataclass(frozen=True)
class LoadFiles:
    """A serving run's weights as a stall names and sweeps them: the files each rank reads from
    the storage in a load, every weights file's name (under ``ckpt-0001``) and the node tier."""

    paths: Sequence[Sequence[str]]  # by rank (indexed only when a stall line names a rank)
    names: list[str]
    tier: Path | None = None


@dataclass
class Stalled:
    """Rank 0's op watch, at the deadline: one line naming the stalled ranks, this run's planned
    files removed (unless kept), then MPI_Abort so that every rank ends."""

    job: Job
    c: Configured
    gates: Gates
    folders: Folders
    created: Created
    loads: LoadFiles | None = None  # a serving run's

    def op_paths(self, rank: int, op: str, ckpt: int) -> list[str]:
        """The files ``rank`` writes (or reads) in op ``op`` of checkpoint ``ckpt``."""
        if self.loads is not None:
            return list(self.loads.paths[rank])
        at, plan = self.folders.durable.at, self.c.setup.plan
        if op in ("write", "drain"):
            return [at(f"ckpt-{ckpt:04d}/{f.name}") for f in plan.rank_plans[rank].files]
        reads = plan.restore_reads(rank, self.c.setup.settings.checkpoint.restore, self.gates.shift)
        return [at(f"ckpt-{ckpt:04d}/{rd.file.name}") for rd in reads]

    def line(self, op: str, index: int, ckpt: int, ranks: list[int], elapsed: float) -> str:
        hosts = self.gates.rank_hosts
        who = ", ".join(f"{r} on {hosts[r]}" for r in ranks[:8]) + (" …" if len(ranks) > 8 else "")
        files = self.op_paths(ranks[0], op, ckpt)
        doing = "writing" if op == "write" else "reading"
        shown = (
            f", {doing} {files[0]}" + (f" (+{len(files) - 1} more)" if len(files) > 1 else "")
            if files
            else ""
        )
        timeout = f"{self.c.setup.settings.io.timeout_s:g}"
        return (
            f"rank{'s' if len(ranks) > 1 else ''} {who}: {op} {index} did not finish within "
            f"io.timeout_s={timeout} ({elapsed:.1f} s elapsed: a stalled rank or unresponsive "
            f"storage){shown}; aborting the MPI job"
        )

    def sweep(self, op: str, ckpt: int) -> str:
        """Remove this run's planned files: the checkpoints up to ``ckpt`` (a serving run: its
        weights), on the durable tier and on the second one (the fast tier, or this host's node
        tier: every other host's guardian sweeps its own)."""
        run = self.c.setup.settings
        durable, fast = self.folders.durable, self.folders.fast
        if self.loads is not None:
            names, upto, label = self.loads.names, 1, "node tier"
            second = str(self.loads.tier) if self.loads.tier is not None else None
        else:
            names = [n for r, rp in enumerate(self.c.setup.plan.rank_plans)
                     for n in file_names(run.framework, r, [f.name for f in rp.files])]
            upto = ckpt if op == "write" else run.checkpoint.num_writes
            label, second = "fast tier", fast.at() if fast is not None else None
        above = self.created.outside(Path(durable.at())) if durable.folders else []
        keep = run.checkpoint.keep
        note = "; " + sweep(durable.at(), names, upto, keep=keep, s3=s3_settings(self.c.config), dirs=above)
        if second is not None:
            note += f" ({label}: {sweep(second, names, upto, keep=keep).removeprefix('removed ')})"
        return note

    def __call__(self, op: str, index: int, ckpt: int, ranks: list[int], elapsed: float) -> None:
        line = self.line(op, index, ckpt, ranks, elapsed)
        try:
            line += self.sweep(op, ckpt)
        except Exception as exc:  # never let cleanup stop the abort
            line += f"; cleanup failed: {exc}"
        try:
            self.job.console.error(line)
            # MPICH's proxies forward rank output asynchronously; an immediate Abort can tear them
            # down before the line reaches mpiexec (seen under load). Give the forwarding a moment.
            time.sleep(ABORT_GRACE_S)
        finally:
            if self.job.guardian is not None:
                self.job.guardian.end("reported")
            self.job.comm.Abort(1)
            os._exit(1)  # pragma: no cover - Abort does not return
