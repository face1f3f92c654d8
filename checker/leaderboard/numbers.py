"""The figures a leaderboard entry keeps from a bundle's summary.json: which keys, flattened how,
and absent or null read as nan (never as zero, which would rank)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from mlckpt.strict import mapping_at


def number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    v = float(value)
    return v if math.isfinite(v) else math.nan


def framework_ratios(summary: Mapping[str, object]) -> dict[str, float]:
    """Summary format 7: the library's write and read bandwidth over the engine's of the same run;
    summary format 12: a resume run's library's rate over the engine's."""
    fw = mapping_at(summary, "framework")
    ref = mapping_at(fw, "reference")
    return {f"framework_{op}_ratio": number(ref.get(f"{op}_ratio")) for op in ("write", "read", "resume")}


def foreign_share(summary: Mapping[str, object]) -> float:
    """The larger of summary format 5's write and read foreign shares (nan: not measured)."""
    f = mapping_at(summary, "foreign")
    v = [number(f[op].get("foreign_share")) for op in ("write", "read") if isinstance(f.get(op), dict)]
    return max(v) if v else math.nan


# Summary numbers an Entry keeps (all optional: absent or null → nan).  ``read``: restores from
# the durable tier; ``read_fast``/``read_mixed``: restores a fast tier served (all or some ranks);
# ``write_memory``/``write_fast``: the stages before the durable one (mlckpt/metrics.py).
STATS = ("mean", "median", "stdev", "min", "max")
IO_GROUPS = ("write", "read", "read_fast", "read_mixed")
SUMMARY_NUMBERS = (
    *(f"{op}_{what}_{stat}_{unit}"
      for op in IO_GROUPS
      for what, unit in (("bandwidth", "gib_s"), ("duration", "s"), ("slowest_rank_bandwidth", "gib_s"))
      for stat in STATS),
    *(f"{op}_straggler_ratio_max" for op in IO_GROUPS),
    *(f"{op}_bytes_per_op" for op in IO_GROUPS),
    *(f"write_{stage}_{what}_{stat}_{unit}"
      for stage in ("memory", "fast")
      for what, unit in (("bandwidth", "gib_s"), ("duration", "s"))
      for stat in STATS),
    *(f"write_{what}_{stat}_s" for what in ("stall", "time_to_durable") for stat in STATS),
    "write_overlap_efficiency", "write_backpressure_ops", "write_backpressure_total_s",
    "write_compute_mean_s", "read_resident_fraction_max", "write_first_bandwidth_gib_s",
    "write_iops_mean", "read_iops_mean",
    # summary format 8: a serving run's
    "ready_s_median", "ready_s_min", "ready_s_max", "effective_gb_s", "storage_gb_s", "storage_bytes",
    "placed_bytes",
    # summary format 11: a resume run's
    "rate_gb_s", "read_bytes", "state_bytes", "amplification", "metadata_s_median", "planning_s_median",
    "read_s_median", "placing_s_median",
)


LATENCY_POINTS = ("p50", "p90", "p99", "p99_9", "max")


def latency_numbers(summary: Mapping[str, object]) -> dict[str, float]:
    """summary.json's request latency percentiles (``write_latency_ms``: {p50, …}) as flat metrics,
    ``write_latency_p50_ms`` and so on."""
    out = {}
    for op in ("write", "read"):
        lat = summary.get(f"{op}_latency_ms")
        lat = lat if isinstance(lat, Mapping) else {}
        for point in LATENCY_POINTS:
            out[f"{op}_latency_{point}_ms"] = number(lat.get(point))
    return out


