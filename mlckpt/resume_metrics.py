"""A resume run's figures from its records (rules 1.21, summary format 11): each resume's time from
the barrier until its last new rank held its verified shard, each part's slowest rank, and the
median over the resumes.  Pure: the runner writes the summary from here and RESUME-SUMMARY
recomputes it.

Each rank is timed from its host's first rank to leave the resume's barrier
(:func:`mlckpt.metrics.from_barrier`), as every op of summary format 10 is.

Summary format 12 (rules 1.22): a run resuming through a library (DCP) beside the engine gives the
library's resumes as its figures, the engine's and the ratio of the two rates under ``framework``,
and each resume the bytes its hosts had to read from the storage (``storage_bytes``): the engine's
O_DIRECT reads are each rank's own, but a library reads through the page cache, where the ranks of a
host that read the same stored piece read it from the storage once.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from mlckpt.metrics import from_barrier
from mlckpt.workload.frameworks import ENGINE
from mlckpt.workload.resume import PARTS, distinct_piece_bytes
from mlckpt.workload.resume_run import ResumeRun

Record = Mapping[str, Any]

TIMING_BASIS = ("each resume: every new rank from its host's first rank leaving one barrier (its host's "
                "monotonic clock) until its shard of the new layout is in its memory (reading the index, "
                "planning, reading, placing); the resume's time is the slowest rank's; every byte verified "
                "after, untimed")


def by_resume(records: Sequence[Record]) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = {}
    for r in records:
        if r.get("op") == "resume":
            out.setdefault(int(r["index"]), []).append(r)
    return dict(sorted(out.items()))


def figures(index: int, recs: Sequence[Record]) -> dict[str, Any]:
    """One resume's figures, from its ranks' records (each timed from its host's barrier)."""
    timed = from_barrier(recs)
    slowest = max(timed, key=lambda r: (int(r["t1_ns"]) - int(r["t0_ns"]), -int(r["rank"])))
    ready = (int(slowest["t1_ns"]) - int(slowest["t0_ns"])) / 1e9
    state = sum(int(r["bytes"]) for r in recs)
    return {"index": index, "ready_s": ready, "slowest_rank": int(slowest["rank"]), "state_bytes": state,
            "read_bytes": sum(int(r["read_bytes"]) for r in recs),
            **{f"{p}_s": max(int(r[f"{p}_ns"]) for r in recs) / 1e9 for p in PARTS},
            "rate_gb_s": state / ready / 1e9 if ready > 0 else None,
            "resident_bytes": sum(int(r["resident_bytes"]) for r in recs)}


def storage_bytes(run: ResumeRun, recs: Sequence[Record]) -> int:
    """What one resume's hosts read from the storage at least: each rank's reads (the engine's:
    O_DIRECT), or each host's distinct stored pieces (a library's: buffered, shared by the host's
    ranks through its page cache), by the plan of its writer."""
    if str(recs[0].get("writer", ENGINE)) == ENGINE:
        return sum(int(r["read_bytes"]) for r in recs)
    plan = run.whole_pieces
    hosts: dict[str, list[int]] = {}
    for r in recs:
        if 0 <= int(r["rank"]) < plan.ranks:
            hosts.setdefault(str(r["host"]), []).append(int(r["rank"]))
    return sum(distinct_piece_bytes(plan, ranks) for ranks in hosts.values())


def summary(run: ResumeRun, records: Sequence[Record], *, hosts: int, max_resident_fraction: float,
            formats: tuple[int, int]) -> dict[str, object]:
    """A resume run's summary.json (``formats``: its summary and records formats)."""
    grouped = by_resume(records)
    if formats[0] < 12:
        each = [figures(i, recs) for i, recs in grouped.items()]
        return _summary(run, each, each, records, hosts, max_resident_fraction, formats)
    each = [{**figures(i, recs), "writer": str(recs[0].get("writer", ENGINE)),
             "storage_bytes": storage_bytes(run, recs)} for i, recs in grouped.items()]
    lib = run.framework.writer if run.framework.library else ENGINE
    mine = [f for f in each if f["writer"] == lib]
    out = _summary(run, mine, each, records, hosts, max_resident_fraction, formats)
    out["writer"] = lib
    out["storage_bytes"] = int(statistics.median(f["storage_bytes"] for f in mine)) if mine else 0
    engine = [f["ready_s"] for f in each if f["writer"] == ENGINE]
    out["framework"] = None
    if lib != ENGINE:
        ref = statistics.median(engine) if engine else None
        mid = float(out["ready_s_median"])  # type: ignore[arg-type]
        out["framework"] = {"writer": lib, "reference": {
            "num_resumes": len(engine), "ready_s_median": ref,
            # the library's rate over the engine's, on the same checkpoint in the same run
            "resume_ratio": ref / mid if ref is not None and mid > 0 else None}}
    return out


def _summary(run: ResumeRun, each: Sequence[dict[str, Any]], every: Sequence[dict[str, Any]],
             records: Sequence[Record], hosts: int, max_resident_fraction: float, formats: tuple[int, int],
             ) -> dict[str, object]:
    """The figures of the resumes ``each`` (the headline writer's); ``every``: all of them (the
    list, and whether each was cold)."""
    ready = [f["ready_s"] for f in each]
    median = statistics.median(ready) if ready else 0.0
    state = each[0]["state_bytes"] if each else 0
    read = int(statistics.median(f["read_bytes"] for f in each)) if each else 0
    resident = max(((f["resident_bytes"] / f["read_bytes"] if f["read_bytes"] else 0.0) for f in every),
                   default=0.0)
    parts = {f"{p}_s_median": statistics.median(f[f"{p}_s"] for f in each) if each else 0.0 for p in PARTS}
    return {"summary_format": formats[0], "records_format": formats[1], "kind": "resume",
            "workload": run.workload.name, "ranks": run.ranks, "tp": run.tp, "pp": run.pp,
            "dp": run.ranks // (run.tp * run.pp), "from_ranks": run.from_ranks, "from_tp": run.from_tensor,
            "from_pp": run.from_pipeline, "num_hosts": hosts,
            "num_resumes": len(each), "resumes": list(every),
            "state_bytes": state, "read_bytes": read, "amplification": read / state if state else None,
            "ready_s_median": median, "ready_s_min": min(ready, default=0.0),
            "ready_s_max": max(ready, default=0.0), **parts,
            "rate_gb_s": state / median / 1e9 if median > 0 else None,
            "resident_fraction_max": resident, "read_cold": resident <= max_resident_fraction,
            "read_verified": all(int(r["verified_bytes"]) == int(r["bytes"]) for r in records
                                 if r.get("op") == "resume"),
            "mlckpt_timing_basis": TIMING_BASIS}
