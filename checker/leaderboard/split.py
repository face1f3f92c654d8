"""Split invocations on the leaderboard: a write invocation and the read-only invocation that
restored its checkpoints are one result (mlckpt.rules.checks.split).  Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from checker.leaderboard.model import Entry, Excluded
from checker.split import UNPAIRED, UNPAIRED_WRITE


def pair_halves(entries: Iterable[Entry]) -> tuple[list[Entry], list[Excluded]]:
    """Split invocations as one result: each read-only invocation joined to its write half (write
    figures from the one, read figures from the other); a write half whose read half is not among
    the passing results is not listed (a leaderboard row needs both halves)."""
    entries = list(entries)
    reads = {(e.division, e.org, e.system, e.workload, e.restored_from): e
             for e in entries if e.restored_from}
    out: list[Entry] = []
    excluded: list[Excluded] = []
    for e in entries:
        if e.restored_from:
            continue  # joined to its write half below
        r = reads.get((e.division, e.org, e.system, e.workload, e.run_id)) if e.write_half else None
        if r is None:
            if e.write_half:
                excluded.append(Excluded(e.path, UNPAIRED, (), UNPAIRED_WRITE))
            else:
                out.append(e)
            continue
        read_metrics = {k: v for k, v in r.metrics.items() if k.startswith("read")}
        out.append(dataclasses.replace(
            e, metrics={**{k: v for k, v in e.metrics.items() if not k.startswith("read")}, **read_metrics},
            num_reads=r.num_reads, restore_bytes=r.restore_bytes, read_cold=r.read_cold,
            read_verified=r.read_verified, fast_reads=r.fast_reads, halves=(e.path, r.path)))
    joined = {(e.division, e.org, e.system, e.workload, e.run_id) for e in out if e.halves}
    for key, r in reads.items():
        if key not in joined:
            excluded.append(Excluded(r.path, UNPAIRED, (), "unpaired read half: its write half is not among "
                                     "the passing results"))
    return out, excluded
