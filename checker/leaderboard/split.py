"""Split invocations on the leaderboard: a write invocation and the read-only invocation that
restored its checkpoints are one result (mlckpt.rules.checks.split).  Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from checker.leaderboard.model import Entry, Excluded
from checker.split import LONE, LONE_WRITE


def join_splits(entries: Iterable[Entry]) -> tuple[list[Entry], list[Excluded]]:
    """Split invocations as one result: each read-only invocation joined to its write invocation (write
    figures from the one, read figures from the other); a write invocation whose read invocation is not among
    the passing results is not listed (a leaderboard row needs both invocations)."""
    entries = list(entries)
    reads = {(e.division, e.org, e.system, e.workload, e.restored_from): e
             for e in entries if e.restored_from}
    out: list[Entry] = []
    excluded: list[Excluded] = []
    for e in entries:
        if e.restored_from:
            continue  # joined to its write invocation below
        r = reads.get((e.division, e.org, e.system, e.workload, e.run_id)) if e.write_invocation else None
        if r is None:
            if e.write_invocation:
                excluded.append(Excluded(e.path, LONE, (), LONE_WRITE))
            else:
                out.append(e)
            continue
        read_metrics = {k: v for k, v in r.metrics.items() if k.startswith("read")}
        out.append(dataclasses.replace(
            e, metrics={**{k: v for k, v in e.metrics.items() if not k.startswith("read")}, **read_metrics},
            num_reads=r.num_reads, restore_bytes=r.restore_bytes, read_cold=r.read_cold,
            read_verified=r.read_verified, fast_reads=r.fast_reads, invocations=(e.path, r.path)))
    joined = {(e.division, e.org, e.system, e.workload, e.run_id) for e in out if e.invocations}
    for key, r in reads.items():
        if key not in joined:
            excluded.append(Excluded(r.path, LONE, (), "a read-only invocation alone: its write invocation "
                                     "is not among the passing results"))
    return out, excluded
