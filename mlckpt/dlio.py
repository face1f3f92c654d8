"""summary.json in DLIO's shape: the metric block under DLIO's names (its 'GB' are GiB) and the
top-level keys DLIO's summary carries (start, end, accelerators, hosts), completed from
``mlckpt.metrics.summarize``'s block, so that tools reading DLIO's summary read mlckpt's.  What
DLIO's keys do not say is said beside them (``mlckpt_timing_basis``, ``mlckpt_read_guarantee``).
Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlckpt.units import GiB


@dataclass(frozen=True)
class DlioFacts:
    """What DLIO's summary.json states beside its metric block (summary format 3), from run.json
    and system.json: the invocation's start and end (ISO-8601 UTC), the ranks, and each host's
    name, CPU cores and memory, in the run's host order."""

    started: str
    ended: str
    ranks: int
    hosts: tuple[tuple[str, int, int], ...]

    @classmethod
    def of(cls, run: Mapping[str, Any], system: Mapping[str, Any]) -> DlioFacts:
        facts = {str(h.get("hostname")): h for h in system.get("hosts", [])}
        hosts = []
        for h in run.get("hosts", []):
            f = facts.get(str(h["host"]), {})
            hosts.append((str(h["host"]), int(f.get("cpu_cores") or 0),
                          int(f.get("memory_total_bytes") or 0)))
        return cls(str(run["started"]), str(run["ended"]), int(run["ranks"]), tuple(hosts))


def dlio_time(iso_utc: str) -> str:
    """run.json's '2026-07-22T18:57:02.533Z' in DLIO's form, '2026-07-22T18:57:02.533000' (UTC)."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(iso_utc.replace("Z", "+00:00")).strftime("%Y-%m-%dT%H:%M:%S.%f")
    except ValueError:  # a hostile run.json: the mismatch is SUMMARY-EXACT's to report, not a crash
        return iso_utc


def completed(summary: Mapping[str, object], checkpoint_bytes: int, restore_bytes: int,
              facts: DlioFacts | None = None) -> dict[str, object]:
    """summary.json's whole content from ``summarize``'s block: the plan's bytes (given: they come
    from the plan of the run's own workload and scale), the read validity and DLIO's shape: with
    ``facts``, summary format 3 (DLIO's metric block and top-level keys); without, format 2 (the
    block under dlio_compat, as a checker recomputes an older bundle).  A new dict (``summary`` is
    left as it is); see mlckpt.rules.checks.evidence.recomputed_summary."""
    out = dict(summary)
    out["read_valid"] = bool(out.get("read_cold", True) and out.get("read_verified", True))
    out["checkpoint_bytes"] = checkpoint_bytes
    out["restore_bytes"] = restore_bytes
    if facts is None:
        out["dlio_compat"] = dlio_compat(out, checkpoint_bytes)
        return out
    out["metric"] = dlio_compat(out, checkpoint_bytes)
    out.update({
        "start": dlio_time(facts.started), "end": dlio_time(facts.ended),
        "num_accelerators": facts.ranks, "num_hosts": len(facts.hosts),
        "hostname": facts.hosts[0][0] if facts.hosts else "",
        "host_cpu_count": [cores for _, cores, _ in facts.hosts],
        "host_memory_GB": [mem / GiB for _, _, mem in facts.hosts],  # DLIO's 'GB' are GiB
        "epochs": 0,  # a checkpoint-only run trains no epoch (DLIO writes 0 for these too)
        # What DLIO's own keys do not say: each duration ends at the slowest rank's durable end
        # (DLIO times rank 0), and whether every restore started cold and was verified page by page.
        "mlckpt_timing_basis": "slowest_rank",
        "mlckpt_read_guarantee": ("no_reads" if not out.get("num_reads") else
                                  "cold_verified" if out["read_valid"] else "not_cold_or_not_verified"),
    })
    return out


def dlio_compat(summary: Mapping[str, object], checkpoint_bytes: int) -> dict[str, object]:
    """DLIO/MLPerf summary.json metric names, for tools that read them.  DLIO labels these 'GB'
    but computes GiB (2**30); the values here are GiB/s likewise, so they compare like for like."""
    out: dict[str, object] = {"checkpoint_size_GB": checkpoint_bytes / GiB}
    for ours, theirs in (("write", "save"), ("read", "load")):
        if f"{ours}_bandwidth_mean_gib_s" in summary:
            out[f"{theirs}_checkpoint_io_mean_GB_per_second"] = summary[f"{ours}_bandwidth_mean_gib_s"]
            out[f"{theirs}_checkpoint_io_stdev_GB_per_second"] = summary[f"{ours}_bandwidth_stdev_gib_s"]
            out[f"{theirs}_checkpoint_duration_mean_seconds"] = summary[f"{ours}_duration_mean_s"]
            out[f"{theirs}_checkpoint_duration_stdev_seconds"] = summary[f"{ours}_duration_stdev_s"]
    return out
