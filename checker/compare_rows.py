"""The rows ``mlckpt-check compare`` shows (checker/compare.py): which figures, labelled how, read
from a leaderboard entry; a checkpoint run's, a serving run's (rules 1.13) and a resume run's
(rules 1.21), each kind's after the run's own rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from checker.leaderboard import BundleDocs, Entry
from checker.leaderboard.numbers import LATENCY_POINTS
from mlckpt.units import GiB, MiB


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str
    decimals: int | None  # None: text
    get: Callable[[Entry, BundleDocs], object]
    optional: bool = False  # shown only when either side has a value


def _opt(key: str, label: str, unit: str, decimals: int | None) -> Row:
    return Row(key, label, unit, decimals, _m(key), optional=True)


def _m(key: str) -> Callable[[Entry, BundleDocs], object]:
    return lambda e, d: e.m(key)


def _gb(key: str) -> Callable[[Entry, BundleDocs], object]:
    return lambda e, d: e.m(key) / 1e9


# The I/O settings that change the numbers: two runs at 4 MiB × 4 and 1 MiB × 16 are not alike.
IO_ROWS = (
    Row("io_mode", "I/O mode", "", None, lambda e, d: e.io_mode),
    Row("io_block_mib", "I/O request size", "MiB", 3,
        lambda e, d: None if e.io_block_size is None else e.io_block_size / MiB),
    Row("io_threads", "I/O requests in flight per rank", "", 0, lambda e, d: e.io_threads),
)


def _rows() -> tuple[Row, ...]:
    rows = [
        Row("workload", "workload", "", None, lambda e, d: e.workload),
        Row("division", "division", "", None, lambda e, d: e.division),
        Row("class", "leaderboard class", "", None, lambda e, d: e.class_key.id),
        Row("system", "system", "", None, lambda e, d: d.run.get("system_name") or "—"),
        Row("verdict", "verdict (recorded by the runner)", "", None, lambda e, d: d.run.get("verdict")),
        Row("mode", "mode", "", None, lambda e, d: e.mode),
        Row("pipeline", "checkpoint mode", "", None, lambda e, d: e.pipeline),
        Row("tiers", "write stages", "", None, lambda e, d: " → ".join(e.tiers)),
        Row("fast_fs", "fast tier filesystem", "", None, lambda e, d: ", ".join(e.fast_fs) or None,
            optional=True),
        Row("verification", "verification", "", None, lambda e, d: e.verification),
        *IO_ROWS,
        Row("ranks", "ranks", "", 0, lambda e, d: e.ranks),
        Row("hosts", "hosts", "", 0, lambda e, d: e.hosts),
        Row("num_writes", "checkpoint writes", "", 0, lambda e, d: e.num_writes),
        Row("num_reads", "restores", "", 0, lambda e, d: e.num_reads),
        Row("checkpoint_gib", "checkpoint size", "GiB", 3, lambda e, d: e.checkpoint_bytes / GiB),
        Row("restore_gib", "bytes read per restore", "GiB", 3, lambda e, d: e.restore_bytes / GiB),
        Row("fast_reads", "restores served by a fast tier", "", 0,
            lambda e, d: e.fast_reads if e.pipeline.endswith("+tiers") else None, optional=True),
        Row("compute_interval_s", "training interval (configured)", "s", 3,
            lambda e, d: e.compute_interval_s),
        Row("write_compute_mean_s", "training interval (measured, mean)", "s", 3, _m("write_compute_mean_s"),
            optional=True),
        # rules 1.11: a library writer, and its figures over the engine's of the same run
        Row("framework", "framework writer", "", None, lambda e, d: e.framework, optional=True),
        _opt("framework_write_ratio", "write bandwidth / the engine's in the same run", "×", 2),
        _opt("framework_read_ratio", "read bandwidth / the engine's in the same run", "×", 2),
    ]
    for op in ("write", "read"):
        rows += _op_rows(op)
        if op == "write":
            rows += _pipeline_rows()
    for tier in ("fast", "mixed"):
        name, label = f"read_{tier}", f"read ({tier} tier)" if tier == "fast" else "read (mixed tiers)"
        for stat in ("mean", "median", "min", "max", "stdev"):
            rows.append(_opt(f"{name}_bandwidth_{stat}_gib_s", f"{label} bandwidth {stat}", "GiB/s", 2))
        for stat in ("mean", "median", "min", "max"):
            rows.append(_opt(f"{name}_duration_{stat}_s", f"{label} duration {stat}", "s", 3))
        for stat in ("mean", "min"):
            rows.append(_opt(f"{name}_slowest_rank_bandwidth_{stat}_gib_s",
                             f"{label} slowest rank bandwidth {stat}", "GiB/s", 3))
        rows.append(_opt(f"{name}_straggler_ratio_max", f"{label} straggler ratio max", "×", 2))
    return tuple(rows)


def _op_rows(op: str) -> list[Row]:
    """One op kind's figures: bandwidth and duration, the slowest rank, bytes, IOPS and latency."""
    rows = [Row(f"{op}_bandwidth_{stat}_gib_s", f"{op} bandwidth {stat}", "GiB/s", 2,
                _m(f"{op}_bandwidth_{stat}_gib_s")) for stat in ("mean", "median", "min", "max", "stdev")]
    rows += [Row(f"{op}_duration_{stat}_s", f"{op} duration {stat}", "s", 3, _m(f"{op}_duration_{stat}_s"))
             for stat in ("mean", "median", "min", "max")]
    for stat in ("mean", "min"):
        key = f"{op}_slowest_rank_bandwidth_{stat}_gib_s"
        rows.append(Row(key, f"{op} slowest rank bandwidth {stat}", "GiB/s", 3, _m(key)))
    rows.append(Row(f"{op}_straggler_ratio_max", f"{op} straggler ratio max", "×", 2,
                    _m(f"{op}_straggler_ratio_max")))
    rows.append(Row(f"{op}_gib_per_op", f"{op} bytes per op", "GiB", 3,
                    lambda e, d: e.m(f"{op}_bytes_per_op") / GiB))
    rows.append(_opt(f"{op}_iops_mean", f"{op} IOPS (requests per second), mean", "/s", 0))
    rows += [_opt(f"{op}_latency_{point}_ms", f"{op} request latency {point.replace('_', '.')}", "ms", 3)
             for point in LATENCY_POINTS]
    return rows


def _pipeline_rows() -> list[Row]:
    """What training saw of the checkpoints, and the stages before the durable one."""
    rows = []
    for what, label in (("stall", "write stall"), ("time_to_durable", "write time to durable")):
        for stat in ("mean", "median", "min", "max"):
            rows.append(_opt(f"write_{what}_{stat}_s", f"{label} {stat}", "s", 3))
    rows += [
        Row("goodput_pct", "goodput at the rules version's reference job (mlckpt goodput)", "%", 1,
            lambda e, d: 100 * e.m("goodput"), optional=True),
        _opt("write_overlap_efficiency", "write overlap efficiency", "", 3),
        _opt("write_backpressure_ops", "writes that waited for the previous one (back-pressure)", "", 0),
        _opt("write_backpressure_total_s", "write back-pressure total", "s", 3),
        _opt("write_compute_mean_s", "training interval measured, mean", "s", 3),
    ]
    for stage in ("memory", "fast"):
        for stat in ("mean", "min", "max"):
            rows.append(_opt(f"write_{stage}_bandwidth_{stat}_gib_s", f"write {stage} stage bandwidth {stat}",
                             "GiB/s", 2))
        for stat in ("mean", "max"):
            rows.append(_opt(f"write_{stage}_duration_{stat}_s", f"write {stage} stage duration {stat}",
                             "s", 3))
    return rows


ROWS = _rows()


# What a serving or resume result shares with a checkpoint run's rows: the run, its I/O settings.
RUN_KEYS = ("workload", "division", "class", "system", "verdict", "mode", "verification", "ranks", "hosts",
            *(r.key for r in IO_ROWS))


def _serving_rows() -> tuple[Row, ...]:
    """Two serving results (rules 1.13): the run, then the loads' figures."""
    def serving(i: int) -> Callable[[Entry, BundleDocs], object]:
        return lambda e, d: e.serving[i] if e.serving else None

    return (*(r for r in ROWS if r.key in RUN_KEYS),
            Row("strategy", "loading strategy", "", None, serving(0)),
            Row("replicas", "replicas", "", 0, serving(1)),
            Row("tp", "GPUs per replica", "", 0, serving(2)),
            *(Row(f"ready_s_{k}", f"time to ready, {what}", "s", 3, _m(f"ready_s_{k}"))
              for k, what in (("median", "median"), ("min", "fastest load"), ("max", "slowest load"))),
            Row("effective_gb_s", "effective loading rate", "GB/s", 2, _m("effective_gb_s")),
            Row("placed_gb", "bytes placed in the replicas per load", "GB", 3, _gb("placed_bytes")),
            Row("storage_gb", "bytes the storage served per load", "GB", 3, _gb("storage_bytes")),
            Row("storage_gb_s", "storage rate", "GB/s", 2, _m("storage_gb_s")))


SERVING_ROWS = _serving_rows()


# Two resume results (rules 1.21): the run, then the resumes' figures (rules 1.22: a library's).
RESUME_ROWS: tuple[Row, ...] = (
    *(r for r in ROWS if r.key in RUN_KEYS),
    Row("layouts", "layouts (written → resumed)", "", None, lambda e, d: e.layouts or None),
    Row("framework", "resumed through (with the engine's resumes beside it)", "", None,
        lambda e, d: e.framework, optional=True),
    _opt("framework_resume_ratio", "resume rate / the engine's in the same run", "×", 2),
    *(Row(f"resume_s_{k}", f"time to resume, {what}", "s", 3, _m(f"ready_s_{k}"))
      for k, what in (("median", "median"), ("min", "fastest"), ("max", "slowest"))),
    *(Row(f"{p}_s_median", f"{p}, slowest rank, median", "s", 4, _m(f"{p}_s_median"))
      for p in ("metadata", "planning", "read", "placing")),
    Row("rate_gb_s", "resume rate (state placed per second)", "GB/s", 2, _m("rate_gb_s")),
    Row("state_gb", "state placed per resume", "GB", 3, _gb("state_bytes")),
    Row("read_gb", "bytes read per resume", "GB", 3, _gb("read_bytes")),
    Row("amplification", "bytes read ÷ state placed", "×", 3, _m("amplification")),
    Row("storage_gb", "bytes the hosts read from the storage, at least", "GB", 3, _gb("storage_bytes"),
        optional=True))
