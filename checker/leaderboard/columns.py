"""The leaderboard's columns: what each shows, in which unit, and how a value is printed.  Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Column:
    key: str
    name: str
    kind: str  # "text" | "int" | "num"
    decimals: int = 0
    unit: str = ""
    help: str = ""

    @property
    def label(self) -> str:
        """The header with its unit, as md, csv and json show it."""
        return f"{self.name} ({self.unit})" if self.unit else self.name

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "num")


COLUMNS: tuple[Column, ...] = (
    Column("result_id", "Result ID", "text",
           help="stable ID: derived from organisation, system, workload and run id"),
    Column("organisation", "Organisation", "text"),
    Column("system", "System", "text", help="the system description the result was measured on"),
    Column("division", "Division", "text"),
    Column("hosts", "Hosts", "int", help="client hosts (MLPerf: # client nodes)"),
    Column("ranks", "Ranks", "int", help="MPI ranks, one per simulated accelerator"),
    Column("accelerator", "Accelerator", "text",
           help="declared accelerator (accelerator=), else the system description's"),
    Column("write_gib_s", "Write", "num", 2, "GiB/s",
           help="checkpoint write bandwidth to the durable tier, mean over the writes (all ranks' bytes ÷ "
                "slowest rank's time; async or tiered: the persist that runs behind training)"),
    Column("write_duration_s", "Write duration", "num", 3, "s",
           help="mean time of one checkpoint's write to the durable tier"),
    Column("write_first_gib_s", "First write", "num", 2, "GiB/s", help="the first checkpoint's write "
           "bandwidth alone (file creation, allocation, cold caches fall on it; rules 1.4 on)"),
    Column("read_gib_s", "Read", "num", 2, "GiB/s",
           help="restore bandwidth from the durable tier, mean over those restores (cold, every byte "
                "verified; restores served by a fast tier are not counted)"),
    Column("read_duration_s", "Read duration", "num", 3, "s",
           help="mean time of one restore from the durable tier"),
    Column("stall_s", "Stall", "num", 3, "s",
           help="what training waited per checkpoint, mean over the writes (sync, one tier: the whole write; "
                "async: the copy into host memory; sync with tiers: the fast-tier write; plus any wait "
                "for the previous checkpoint's background work)"),
    Column("time_to_durable_s", "Time to durable", "num", 3, "s",
           help="from the checkpoint request until it is durable on the durable tier, mean over the writes "
                "(sync, one tier: the same as the stall)"),
    Column("write_slowest_rank_gib_s", "Slowest rank write", "num", 3, "GiB/s",
           help="the slowest rank's own write bandwidth to the durable tier, mean over the writes"),
    Column("read_slowest_rank_gib_s", "Slowest rank read", "num", 3, "GiB/s",
           help="the slowest rank's own read bandwidth, mean over the restores from the durable tier"),
    Column("straggler_ratio", "Straggler", "num", 2, "×",
           help="worst op of the run (durable-tier writes and restores): slowest rank's duration ÷ median "
                "rank duration (1 = no straggler)"),
    Column("verification", "Verification", "text",
           help="reads: every byte verified and read cold (page cache emptied, residency measured); "
                "how many restores a fast tier served; witnessed by NAME: a trusted witness timed every "
                "op on its own clock (≥: the bytes over the witness's interval); UNVERIFIED: a published "
                "DLIO / mlpstorage result listed with --published, its figures quoted"),
    Column("foreign_pct", "Foreign I/O", "num", 0, "%", help="the checkpoint device's bytes that other "
           "processes moved during the timed writes or restores, the larger share (rules 1.8 on)"),
    Column("goodput_pct", "Goodput", "num", 1, "%", help="the share of a reference job's time spent "
           "training, checkpointing at the interval that maximises it (mlckpt goodput's model), with this "
           "result's stall, time to durable and durable-tier restore projected to the full checkpoint; the "
           "job is its rules version's (rules 1.18: 16,384 GPUs, a failure every 3.05 h)"),
    Column("mode", "Mode", "text",
           help="checkpoint mode (sync / async; +tiers: written to a fast tier first, drained to the "
                "durable one in the background; +gpu: the state in GPU memory), for async or tiered runs the "
                "training each checkpoint's background work overlapped (measured, mean over the writes), "
                "residency (full state / stream), I/O path (direct / buffered / dontcache), scale"),
)
# A serving class's columns (rules 1.13): replicas loading the model, ranked by the time to ready.
SERVING_COLUMNS: tuple[Column, ...] = (
    *COLUMNS[:7],
    Column("strategy", "Strategy", "text",
           help="serving: how the replicas loaded the weights (direct: every GPU reads its shard from the "
                "storage; fanout: the GPUs holding a shard split its reads and exchange the parts; "
                "nodecache: each host's first GPU fills a node-local tier the others read)"),
    Column("replicas", "Replicas", "int",
           help="serving: replicas brought up at once (ranks ÷ GPUs per replica)"),
    Column("tp", "GPUs per replica", "int", help="serving: tensor parallelism, one shard per GPU"),
    Column("ready_s", "Time to ready", "num", 3, "s",
           help="serving: from the load's start barrier until the last replica held its weights (the slowest "
                "rank's time), median over the loads, each cold"),
    Column("effective_gb_s", "Effective", "num", 2, "GB/s",
           help="serving: bytes placed in the replicas per second of the median load (decimal GB)"),
    Column("storage_gb", "Storage served", "num", 2, "GB",
           help="serving: bytes the storage served per load (direct: every replica's; fan-out: each shard "
                "once; node cache: once per host)"),
    Column("storage_gb_s", "Storage rate", "num", 2, "GB/s",
           help="serving: the storage's bytes per second of the median load"),
    *(c for c in COLUMNS if c.key in ("verification", "mode")),
)
# A resume class's columns (rules 1.21): a job resuming at another layout, ranked by the time to resume.
RESUME_COLUMNS: tuple[Column, ...] = (
    *COLUMNS[:7],
    Column("layouts", "Layouts", "text",
           help="resume: the layout the checkpoint was written at (ranks, TP, PP) → the one it resumed at"),
    Column("resume_s", "Time to resume", "num", 3, "s",
           help="resume: from the resume's start barrier until the last new rank held its verified shard "
                "(reading the index, planning, reading, placing; the slowest rank's time), median over the "
                "resumes, each cold"),
    Column("resume_gb_s", "Resume rate", "num", 2, "GB/s",
           help="resume: bytes of state placed per second of the median resume (decimal GB)"),
    Column("resume_read_gb", "Read", "num", 2, "GB",
           help="resume: bytes the new ranks read, each byte range rounded out to whole pages"),
    Column("amplification", "Read ÷ state", "num", 3, "×",
           help="resume: bytes read over bytes placed (1 = every byte read was needed)"),
    *(c for c in COLUMNS if c.key in ("verification", "mode")),
)
COLUMN = {c.key: c for c in (*COLUMNS, *SERVING_COLUMNS, *RESUME_COLUMNS)}
RESUME_SORT_NOTE = ("sorted by time to resume, fastest first (ties: resume rate, then result ID); "
                    "click a header to sort by another column")
SERVING_SORT_NOTE = ("sorted by time to ready, fastest first (ties: effective rate, then result ID); "
                     "click a header to sort by another column")
SORT_NOTE = ("sorted by write bandwidth, highest first (ties: read bandwidth, then result ID); "
             "click a header to sort by another column")


def fmt(value: Any, col: Column, missing: str = "—") -> str:
    """``value`` as the tables print it: fixed decimals for numbers, ``missing`` for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    if col.kind == "num":
        return f"{float(value):.{col.decimals}f}"
    if col.kind == "int":
        return str(int(value))
    return str(value)


def rounded(value: Any, col: Column) -> Any:
    """The value as published in JSON: exactly what :func:`fmt` prints, as a number."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    if col.kind == "num":
        return float(f"{float(value):.{col.decimals}f}")
    if col.kind == "int":
        return int(value)
    return str(value)
