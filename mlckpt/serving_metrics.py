"""Replicas loading a model: the figures of each load, recomputed from its ranks' records
(mlckpt/run/phases/loads.py), and the records held against the plan they claim
(mlckpt/workload/serving_load.py).  Pure.

A load's record per rank: ``rank``, ``replica``, ``shard``, ``host``, ``strategy``, ``t0_ns`` and
``t1_ns`` (the rank's own clock, from leaving the start barrier until its shard was in memory),
``bytes`` (its shard), ``storage_bytes``, ``node_tier_bytes``, ``received_bytes``,
``resident_bytes`` (still in the page cache when the load began), from records format 10
``node_tier_resident_bytes`` (of its node-tier files, still in the page cache just before it read
them), and ``verified_bytes``.

The figures: ``ready_s``, the slowest rank's time from leaving the start barrier until its shard
was in its memory (each rank on its own host's clock, as a checkpoint op is timed: no clock is
compared across hosts); ``storage_bytes``, what the storage served; ``placed_bytes``, what the
replicas hold; ``effective_gb_s`` (placed / ready) and ``storage_gb_s`` (served / ready), in
decimal GB as storage data sheets give them.  :func:`summary` is a serving run's summary.json
(summary format 8; 9 adds each load's ``node_tier_resident_bytes`` and ``node_tier_cold``: null
without a tier, else whether every load's tier reads were cold), which the runner writes and
SERVING-SUMMARY recomputes.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from mlckpt.metrics import from_barrier
from mlckpt.workload.serving_load import LoadPlan
from mlckpt.workload.serving_run import ServingRun

Record = Mapping[str, Any]


TIMING_BASIS = ("each load: every rank from leaving one barrier (its own host's monotonic clock) until "
                "its shard is in its memory; the load's time is the slowest rank's; every byte verified "
                "after, untimed")
# summary format 10: every rank from its host's first rank to leave the barrier (mlckpt.metrics)


def figures(recs: Sequence[Record]) -> dict[str, Any]:
    """One load's figures, from its ranks' records."""
    slowest = max(recs, key=lambda r: (int(r["t1_ns"]) - int(r["t0_ns"]), -int(r["rank"])))
    ready = (int(slowest["t1_ns"]) - int(slowest["t0_ns"])) / 1e9
    served = sum(int(r["storage_bytes"]) for r in recs)
    placed = sum(int(r["bytes"]) for r in recs)
    return {"strategy": str(recs[0]["strategy"]), "ranks": len(recs), "ready_s": ready,
            "slowest_rank": int(slowest["rank"]), "storage_bytes": served, "placed_bytes": placed,
            "received_bytes": sum(int(r["received_bytes"]) for r in recs),
            "node_tier_bytes": sum(int(r["node_tier_bytes"]) for r in recs),
            "effective_gb_s": placed / ready / 1e9 if ready > 0 else None,
            "storage_gb_s": served / ready / 1e9 if ready > 0 else None,
            "resident_bytes": sum(int(r["resident_bytes"]) for r in recs),
            "node_tier_resident_bytes": sum(int(r.get("node_tier_resident_bytes", 0)) for r in recs)}


def by_load(records: Sequence[Record]) -> dict[int, list[Record]]:
    """A serving run's load records by load (``index``), in the order they came."""
    out: dict[int, list[Record]] = {}
    for r in records:
        if r.get("op") == "load":
            out.setdefault(int(r["index"]), []).append(r)
    return dict(sorted(out.items()))


def summary(run: ServingRun, records: Sequence[Record], *, ranks: int, hosts: int,
            max_resident_fraction: float, formats: tuple[int, int]) -> dict[str, object]:
    """A serving run's summary.json (``formats``: its summary and records formats, 8 and 9 under
    rules 1.13, 9 and 10 under 1.14), every figure from the records: each load's, and the median,
    fastest and slowest time to ready over the loads (the rates at the median time)."""
    tiered = formats[0] >= 9 and formats[1] >= 10
    keys = ("ready_s", "slowest_rank", "storage_bytes", "placed_bytes", "received_bytes", "node_tier_bytes",
            "resident_bytes", *(("node_tier_resident_bytes",) if tiered else ()), "effective_gb_s",
            "storage_gb_s")
    loads = []
    for index, recs in by_load(records).items():
        f = figures(from_barrier(recs) if formats[0] >= 10 else recs)
        loads.append({"index": index, **{k: f[k] for k in keys}})
    ready = [f["ready_s"] for f in loads]
    median = statistics.median(ready) if ready else 0.0
    placed = loads[0]["placed_bytes"] if loads else 0
    served = int(statistics.median(f["storage_bytes"] for f in loads)) if loads else 0
    resident = max(((f["resident_bytes"] / f["storage_bytes"] if f["storage_bytes"] else 0.0) for f in loads),
                   default=0.0)
    tier = {"node_tier_cold": _tier_cold(loads, max_resident_fraction)} if tiered else {}
    return {"summary_format": formats[0], "records_format": formats[1],
            "kind": "serving", "workload": run.workload, "strategy": run.strategy, "replicas": run.replicas,
            "tp": run.tp, "ranks": ranks, "num_hosts": hosts, "num_loads": len(loads), "loads": loads,
            "placed_bytes": placed, "storage_bytes": served, "ready_s_median": median,
            "ready_s_min": min(ready, default=0.0), "ready_s_max": max(ready, default=0.0),
            "effective_gb_s": placed / median / 1e9 if median > 0 else None,
            "storage_gb_s": served / median / 1e9 if median > 0 else None,
            "resident_fraction_max": resident, "read_cold": resident <= max_resident_fraction, **tier,
            "read_verified": all(int(r["verified_bytes"]) == int(r["bytes"]) for r in records
                                 if r.get("op") == "load"),
            "mlckpt_timing_basis": TIMING_BASIS}


def _tier_cold(loads: Sequence[Mapping[str, Any]], bound: float) -> bool | None:
    """Whether every load read its node tier cold (its tier files at most ``bound`` resident
    before the ranks read them); None where no load read a tier."""
    tiered = [f for f in loads if f["node_tier_bytes"]]
    if not tiered:
        return None
    return all(f["node_tier_resident_bytes"] <= bound * f["node_tier_bytes"] for f in tiered)


def by_strategy(loads: Sequence[Sequence[Record]]) -> dict[str, dict[str, object]]:
    """Each strategy's loads: the median, fastest and slowest time to ready, the median bytes
    served, the rates at the median time, and how many loads."""
    out: dict[str, dict[str, object]] = {}
    each: dict[str, list[dict[str, Any]]] = {}
    for recs in loads:
        f = figures(recs)
        each.setdefault(f["strategy"], []).append(f)
    for strategy, fs in each.items():
        ready = statistics.median(f["ready_s"] for f in fs)
        served = statistics.median(f["storage_bytes"] for f in fs)
        placed = fs[0]["placed_bytes"]
        out[strategy] = {
            "loads": len(fs), "ready_s": ready, "ready_min_s": min(f["ready_s"] for f in fs),
            "ready_max_s": max(f["ready_s"] for f in fs), "storage_bytes": served, "placed_bytes": placed,
            "effective_gb_s": placed / ready / 1e9 if ready > 0 else None,
            "storage_gb_s": served / ready / 1e9 if ready > 0 else None,
            "resident_bytes_max": max(f["resident_bytes"] for f in fs)}
    return out


def held_to_plan(plan: LoadPlan, recs: Sequence[Record]) -> list[str]:
    """What in one load's records differs from ``plan`` (the layout, strategy and hosts they claim):
    one line each, the first ten.  Every rank once; each its replica, shard, host and strategy; the
    bytes it read from the storage and the tier and received, as planned; its whole shard held and
    verified."""
    problems: list[str] = []
    ranks = sorted(int(r["rank"]) for r in recs)
    if ranks != list(range(len(plan.ranks))):
        problems.append(f"ranks: expected 0..{len(plan.ranks) - 1} once each, got {len(ranks)} records "
                        f"for ranks {sorted(set(ranks))[:8]}")
    for r in recs:
        rank = int(r["rank"])
        if not 0 <= rank < len(plan.ranks):
            continue
        want = plan.ranks[rank]
        shard = plan.shard_bytes(want.shard)
        expected = {"strategy": plan.strategy, "replica": want.replica, "shard": want.shard,
                    "host": want.host, "storage_bytes": want.storage_bytes,
                    "node_tier_bytes": want.node_tier_bytes, "received_bytes": want.received_bytes,
                    "bytes": shard, "verified_bytes": shard}
        problems += [f"rank {rank}: {k} {r.get(k)!r}, expected {v!r}"
                     for k, v in expected.items() if r.get(k) != v]
        if int(r["t1_ns"]) <= int(r["t0_ns"]):
            problems.append(f"rank {rank}: t1_ns {r['t1_ns']} not after t0_ns {r['t0_ns']}")
    return problems[:10]
