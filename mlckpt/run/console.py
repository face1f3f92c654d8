"""What rank 0 shows: its lines (printed and kept for ``run.log``), the progress bar of long ops,
and the pure formatting of each op's line and of the final headline."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TextIO

from mlckpt.metrics import from_barrier
from mlckpt.plan.settings import Settings
from mlckpt.units import GiB, fmt_bytes
from mlckpt.workload.pipeline import DURABLE, FAST, MEMORY_FILESYSTEMS

# Without a terminal (mpiexec, Slurm, tee, a log file): a stage line at every stage boundary and,
# within a stage, a line at least this often.  MLCKPT_PROGRESS_S changes it (e.g. 1 or 30).
PROGRESS_EVERY_S = 5.0


def stamp() -> str:
    return datetime.now(timezone.utc).strftime("%H:%M:%S")


def progress_every_s() -> float:
    try:
        return max(0.2, float(os.environ.get("MLCKPT_PROGRESS_S", PROGRESS_EVERY_S)))
    except ValueError:
        return PROGRESS_EVERY_S


@dataclass
class DeviceMeter:
    """An op's progress on this host, from its device's counters (``read``: the kernel's sample,
    ``field``: written_bytes or read_bytes): the host's bytes done so far, out of ``host_bytes``;
    the host's share stands for the job's ``total_bytes``."""

    read: Callable[[], Mapping[str, int]]
    field: str
    host_bytes: int
    total_bytes: int
    start: int | None = None

    def __post_init__(self) -> None:
        self.start = self.read().get(self.field)

    def done(self) -> int | None:
        now = self.read().get(self.field)
        if self.start is None or now is None or self.host_bytes <= 0:
            return None
        return min(max(now - self.start, 0), self.host_bytes)

    def text(self, elapsed: float) -> str:
        done = self.done()
        if done is None or elapsed <= 0:
            return ""
        rate = done / elapsed
        left = (self.host_bytes - done) / rate if rate > 0 else float("inf")
        return (f"{done / self.host_bytes:.0%} of this host's {fmt_bytes(self.host_bytes)} on its device "
                f"(of {fmt_bytes(self.total_bytes)} in all), {rate / GiB:.2f} GiB/s, ~{left:.0f} s left")


@dataclass
class Console:
    """Rank 0's output: every line is printed and kept, time-stamped, for the bundle's run.log.

    It also shows progress, never kept in run.log.  On a terminal: a live bar of the current stage
    (rich), with an op's bytes done on this host's device, its rate and elapsed time.  Without one
    (mpiexec, Slurm, tee, a log file): a time-stamped line at each stage (:meth:`stage`) and, while
    a stage lasts, a line every :func:`progress_every_s` seconds with its elapsed time and the
    same progress.  The device is read by a thread of its own: nothing is added to the I/O path."""

    out: TextIO = field(default=sys.stdout)
    log_lines: list[str] = field(default_factory=list)
    plain: bool | None = None  # None: plain progress unless ``out`` is a terminal
    _stage: tuple[str, float, DeviceMeter | None] | None = field(default=None, repr=False)
    _last: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _beat: threading.Thread | None = field(default=None, repr=False)
    _live: Any = field(default=None, repr=False)  # rich.progress.Progress on a terminal
    _task: object = field(default=None, repr=False)
    _terminal: str = field(default="", repr=False)
    _closed: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        # Under the self-launcher, rank 0's stdout is mpiexec's pipe to the launcher's terminal,
        # whose size the launcher passes on (MLCKPT_TERMINAL=COLUMNSxLINES).  Only that says a
        # person watches: a rank's own stdout being a terminal does not (Open MPI gives every rank
        # a pseudo-terminal, even when mpirun writes to a batch job's log file).
        self._terminal = os.environ.get("MLCKPT_TERMINAL", "")
        if self.plain is None:
            self.plain = not self._terminal

    def _print(self, line: str) -> None:
        with self._lock:
            if self._live is not None:  # above the live bar
                self._live.console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                print(line, file=self.out, flush=True)
            self._last = time.monotonic()

    def say(self, line: str) -> None:
        self.log_lines.append(f"{stamp()} {line}")
        self._print(line)

    def error(self, line: str) -> None:
        """A fatal line on stderr (also kept for the log)."""
        self.log_lines.append(f"{stamp()} error: {line}")
        print(f"mlckpt: error: {line}", file=sys.stderr, flush=True)

    def stage(self, label: str | None, meter: DeviceMeter | None = None) -> None:
        """Enter a stage (None: between stages), with its op's meter if it moves bytes."""
        self._stage = None if label is None else (label, time.monotonic(), meter)
        if self.plain:
            if label is not None:
                self._print(f"{stamp()}   {label}")
        else:
            self._show(label, meter)
        if self._beat is None and label is not None:
            self._beat = threading.Thread(target=self._heartbeat, name="mlckpt-progress", daemon=True)
            self._beat.start()

    def _show(self, label: str | None, meter: DeviceMeter | None) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        with self._lock:
            if self._live is None:
                self._live = Progress(TextColumn("  {task.description}"), BarColumn(),
                                      DownloadColumn(binary_units=True), TransferSpeedColumn(),
                                      TimeElapsedColumn(), transient=True, console=self._rich())
                self._live.start()
            if self._task is not None:
                self._live.remove_task(self._task)
                self._task = None
            if label is not None:
                total = meter.host_bytes if meter is not None and meter.done() is not None else None
                self._task = self._live.add_task(label, total=total)

    def _rich(self) -> Any:
        from rich.console import Console as RichConsole

        cols, _, lines = self._terminal.partition("x")
        if cols.isdigit() and lines.isdigit():
            return RichConsole(file=self.out, force_terminal=True, width=int(cols), height=int(lines))
        return RichConsole(file=self.out)

    def close(self) -> None:
        """Take the live bar down (the run's last line is printed after it); no more progress."""
        self._stage = None
        self._closed = True
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None

    def _heartbeat(self) -> None:
        every = progress_every_s()
        # A line falls due at four fifths of the period: "at least every 5 s" holds with a second
        # to spare for a thread woken late on a busy host (beside a tenant it was woken 1.1 s late).
        due = every * 0.8
        while not self._closed:
            time.sleep(0.25 if not self.plain else min(0.25, every / 8))
            current = self._stage
            if current is None:
                continue
            label, t0, meter = current
            if not self.plain:
                done = meter.done() if meter is not None else None
                with self._lock:
                    if self._live is not None and self._task is not None and done is not None:
                        self._live.update(self._task, completed=done)
                continue
            if time.monotonic() - self._last < due:
                continue
            elapsed = time.monotonic() - t0
            try:
                extra = meter.text(elapsed) if meter is not None else ""
            except Exception:  # progress is a courtesy: never let it break the run
                extra = ""
            self._print(f"{stamp()}   {label}: {elapsed:.0f} s{', ' + extra if extra else ''}")


def op_line(
    recs: Sequence[Mapping[str, Any]], op: str, k: int, n: int, fast_fs: Mapping[str, str | None]
) -> str:
    """One op's line: bytes moved by all ranks, the op's time (slowest rank, each timed from its
    host's first rank to leave the barrier, as the summary does from rules 1.20), the aggregate
    rate, and the slowest rank's own rate; for reads, verification and page-cache residency."""
    recs = from_barrier(recs)
    dur = max(r["t1_ns"] - r["t0_ns"] for r in recs) / 1e9
    moved = sum(r["bytes"] for r in recs)
    slow = min((r["bytes"] / ((r["t1_ns"] - r["t0_ns"]) / 1e9) for r in recs if r["bytes"]), default=0.0)
    extra = ""
    if op == "read":
        cached = sum(r["resident_bytes"] for r in recs)
        tiers = {r.get("tier") for r in recs}
        where = "fast tier" if tiers == {FAST} else "fast and durable tiers" if FAST in tiers else ""
        if where and any(fast_fs.get(r["host"]) in MEMORY_FILESYSTEMS for r in recs if r["tier"] == FAST):
            where += " in memory"
        extra = f", verified, {cached / max(moved, 1):.1%} cached before{', ' + where if where else ''}"
    return (
        f"{op} {k}/{n}: {fmt_bytes(moved)} from {len(recs)} rank{'s' * (len(recs) != 1)} in {dur:.2f} s = "
        f"{moved / dur / GiB:.2f} GiB/s aggregate (slowest rank {slow / GiB:.2f} GiB/s on its own{extra})"
    )


def stall_line(recs: Sequence[Mapping[str, Any]], k: int, n: int, blocking: str) -> str:
    recs = from_barrier(recs)
    stall = max(r["staged_ns"] - r["t0_ns"] for r in recs) / 1e9
    wait = max(r["backpressure_ns"] for r in recs) / 1e9
    return (
        f"checkpoint {k}/{n}: training stalled {stall:.3f} s ({blocking}"
        + (f"; {wait:.3f} s of it waiting for checkpoint {k - 1}" if wait > 0 else "")
        + ")"
    )


def durable_line(recs: Sequence[Mapping[str, Any]], k: int, n: int) -> str:
    recs = from_barrier(recs)
    moved = sum(r["bytes"] for r in recs)
    ttd = max(r["t1_ns"] - r["t0_ns"] for r in recs) / 1e9
    dur = max(st["t1_ns"] - st["t0_ns"] for r in recs for st in r["stages"] if st["tier"] == DURABLE) / 1e9
    return (
        f"checkpoint {k}/{n}: durable {ttd:.2f} s after it was taken; durable-tier write "
        f"{fmt_bytes(moved)} in {dur:.2f} s = {moved / dur / GiB:.2f} GiB/s"
    )


def headline(s: Mapping[str, Any]) -> str:
    if s.get("kind") == "serving":
        return serving_headline(s)
    if s.get("kind") == "resume":
        return resume_headline(s)
    parts = [
        f"write {s['write_bandwidth_mean_gib_s']:.2f} GiB/s mean "
        f"({s['write_duration_mean_s']:.2f} s per checkpoint)"
    ] if "write_bandwidth_mean_gib_s" in s else ["no writes (a read-only invocation)"]
    if s.get("write_overlap_efficiency") is not None:  # something ran behind training
        parts.append(
            f"training stalled {s['write_stall_mean_s']:.3f} s per checkpoint, durable after "
            f"{s['write_time_to_durable_mean_s']:.2f} s, "
            f"overlap {s['write_overlap_efficiency']:.0%}"
        )
    valid = "" if s.get("read_valid", True) else " INVALID"
    for name, label in (("read", "read"), ("read_fast", "read (fast tier)")):
        if f"{name}_bandwidth_mean_gib_s" in s:
            parts.append(
                f"{label} {s[f'{name}_bandwidth_mean_gib_s']:.2f} GiB/s mean "
                f"({s[f'{name}_duration_mean_s']:.2f} s){valid}"
            )
    fw = s.get("framework")
    return "result: " + "; ".join(parts) + (f"\n{framework_line(fw, str(s.get('mode')))}" if fw else "")


def framework_line(fw: Mapping[str, Any], mode: str = "sync") -> str:
    """Summary format 7: a library writer's figures as ratios to the engine's of the same run."""
    ref = fw.get("reference")
    if not ref:
        return (f"framework {fw['writer']}: no engine checkpoints in this run to compare with "
                "(framework.reference=false)")
    parts = [f"{op} {ref[f'{op}_ratio']:.2f}× the engine's {ref[f'{op}_bandwidth_mean_gib_s']:.2f} GiB/s"
             for op in ("write", "read") if ref.get(f"{op}_ratio") is not None]
    if mode == "async" and None not in (fw.get("write_stall_mean_s"), ref.get("write_stall_mean_s")):
        parts.append(f"training stalled {fw['write_stall_mean_s']:.3f} s per checkpoint against the engine's "
                     f"{ref['write_stall_mean_s']:.3f} s")
    return (f"framework {fw['writer']}: " + "; ".join(parts)
            + " (the engine's checkpoints alternated with the library's in this run)")


def serving_headline(s: Mapping[str, Any]) -> str:
    """Summary format 8: a serving run's time until its last replica held verified weights."""
    rate = s["effective_gb_s"]
    return (f"result: {s['replicas']} replicas ({s['strategy']}) ready in {s['ready_s_median']:.3f} s median "
            f"of {s['num_loads']} loads ({s['ready_s_min']:.3f}-{s['ready_s_max']:.3f} s), "
            f"{s['placed_bytes'] / 1e9:.2f} GB placed, {s['storage_bytes'] / 1e9:.2f} GB from the storage"
            + (f", {rate:.2f} GB/s effective" if rate is not None else "")
            + ("" if s["read_cold"] else " INVALID (not cold)"))


def resume_headline(s: Mapping[str, Any]) -> str:
    """Summary format 11: a resume run's time until its last new rank held its verified shard."""
    rate = s["rate_gb_s"]
    parts = ", ".join(f"{p} {s[f'{p}_s_median'] * 1e3:.0f} ms"
                      for p in ("metadata", "planning", "read", "placing"))
    fw = s.get("framework") or {}  # summary format 12: a library's resumes beside the engine's
    ref = fw.get("reference") or {}
    through = f" through {fw['writer']}" if fw else ""
    beside = (f"; the engine {ref['ready_s_median']:.3f} s on the same checkpoint, {fw['writer']} at "
              f"{ref['resume_ratio']:.2f}x its rate" if ref.get("resume_ratio") is not None else "")
    return (f"result: resumed{through} at {s['ranks']} ranks (TP {s['tp']}, PP {s['pp']}) from "
            f"{s['from_ranks']} (TP {s['from_tp']}, PP {s['from_pp']}) in {s['ready_s_median']:.3f} s "
            f"median of {s['num_resumes']} "
            f"({s['ready_s_min']:.3f}-{s['ready_s_max']:.3f} s; slowest rank's {parts}), "
            f"{s['state_bytes'] / 1e9:.2f} GB placed from {s['read_bytes'] / 1e9:.2f} GB read"
            + (f", {rate:.2f} GB/s" if rate is not None else "") + beside
            + ("" if s["read_cold"] else " INVALID (not cold)"))


def what_runs(run: Settings, checkpoint_bytes: int) -> str:
    """The run's opening line's last part: what it will do."""
    serving, resume, ck = run.serving, run.resume, run.checkpoint
    if serving is not None:
        return (f"serving: {serving.replicas} replicas of TP {serving.tp}, {serving.strategy}, "
                f"{serving.loads} loads")
    if resume is not None:
        return (f"resume: from {resume.from_ranks} ranks (TP {resume.from_tensor}, PP "
                f"{resume.from_pipeline}) at TP {resume.tp}, PP {resume.pp}, {resume.resumes} resumes")
    return f"{fmt_bytes(checkpoint_bytes)} per checkpoint, {ck.num_writes} writes, {ck.num_reads} reads"
