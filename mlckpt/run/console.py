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

from mlckpt.units import GiB, fmt_bytes
from mlckpt.workload.pipeline import DURABLE, FAST, MEMORY_FILESYSTEMS

BAR_AFTER_S = 3.0  # show a progress bar inside an op that takes longer than this
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
class Console:
    """Rank 0's output: every line is printed and kept, time-stamped, for the bundle's run.log.

    Without a terminal it also prints progress, never kept in run.log: a time-stamped line at each
    stage (:meth:`stage`) and, while a stage lasts, a line every :func:`progress_every_s` seconds
    with its elapsed time and, for I/O ops, the bytes this host's device moved so far (read from
    the kernel's counters by a thread of its own: nothing is added to the I/O path)."""

    out: TextIO = field(default=sys.stdout)
    log_lines: list[str] = field(default_factory=list)
    plain: bool | None = None  # None: plain progress unless ``out`` is a terminal
    _stage: tuple[str, float, Callable[[float], str] | None] | None = field(default=None, repr=False)
    _last: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _beat: threading.Thread | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.plain is None:
            self.plain = not (hasattr(self.out, "isatty") and self.out.isatty())

    def _print(self, line: str) -> None:
        with self._lock:
            print(line, file=self.out, flush=True)
            self._last = time.monotonic()

    def say(self, line: str) -> None:
        self.log_lines.append(f"{stamp()} {line}")
        self._print(line)

    def stage(self, label: str | None, progress: Callable[[float], str] | None = None) -> None:
        """Enter a stage (None: between stages).  Plain mode prints its line now and keeps the
        heartbeat going while it lasts; ``progress(elapsed_s)`` adds to the heartbeat lines."""
        if not self.plain:
            return
        self._stage = None if label is None else (label, time.monotonic(), progress)
        if label is not None:
            self._print(f"{stamp()}   {label}")
        if self._beat is None:
            self._beat = threading.Thread(target=self._heartbeat, name="mlckpt-progress", daemon=True)
            self._beat.start()

    def _heartbeat(self) -> None:
        every = progress_every_s()
        while True:
            time.sleep(min(0.5, every / 4))
            current = self._stage
            if current is None or time.monotonic() - self._last < every:
                continue
            label, t0, progress = current
            elapsed = time.monotonic() - t0
            extra = ""
            if progress is not None:
                try:
                    extra = progress(elapsed)
                except Exception:  # progress is a courtesy: never let it break the run
                    extra = ""
            self._print(f"{stamp()}   {label}: {elapsed:.0f} s{', ' + extra if extra else ''}")

    def error(self, line: str) -> None:
        """A fatal line on stderr (also kept for the log)."""
        self.log_lines.append(f"{stamp()} error: {line}")
        print(f"mlckpt: error: {line}", file=sys.stderr, flush=True)


class ProgressBar:
    """A bar on rank 0's terminal for ops longer than BAR_AFTER_S, driven by elapsed time (no
    counters inside the timed I/O path).  Nothing is shown when stderr is not a terminal."""

    def __init__(self, label: str) -> None:
        self.stop_event = threading.Event()
        self.shown = False
        self.thread: threading.Thread | None = None
        if not sys.stderr.isatty():
            return
        self.start = time.monotonic()
        self.label = label
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        spin = 0
        while not self.stop_event.wait(0.5):
            el = time.monotonic() - self.start
            if el < BAR_AFTER_S:
                continue
            spin = (spin + 1) % 20
            bar = "".join("#" if i == spin else "." for i in range(20))
            sys.stderr.write(f"\r  {self.label} [{bar}] {el:6.1f} s")
            sys.stderr.flush()
            self.shown = True

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread:
            self.thread.join()
            if self.shown:
                sys.stderr.write("\r" + " " * 50 + "\r")


def device_progress(read: Callable[[], dict[str, int]], field_name: str, host_bytes: int,
                    total_bytes: int) -> Callable[[float], str]:
    """A progress text for an op from this host's device counters: bytes done here so far, the
    rate, and the time left at that rate (the host's share stands for the job's)."""
    start = read().get(field_name)

    def text(elapsed: float) -> str:
        now = read().get(field_name)
        if start is None or now is None or host_bytes <= 0 or elapsed <= 0:
            return ""
        done = min(max(now - start, 0), host_bytes)
        rate = done / elapsed
        left = (host_bytes - done) / rate if rate > 0 else float("inf")
        return (f"{done / host_bytes:.0%} of this host's {fmt_bytes(host_bytes)} on its device "
                f"(of {fmt_bytes(total_bytes)} in all), {rate / GiB:.2f} GiB/s, ~{left:.0f} s left")
    return text


def op_line(
    recs: Sequence[Mapping[str, Any]], op: str, k: int, n: int, fast_fs: Mapping[str, str | None]
) -> str:
    """One op's line: bytes moved by all ranks, the op's time (slowest rank), the aggregate rate,
    and the slowest rank's own rate; for reads, verification and page-cache residency."""
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
        f"{op} {k}/{n}: {fmt_bytes(moved)} in {dur:.2f} s = {moved / dur / GiB:.2f} GiB/s "
        f"(slowest rank {slow / GiB:.2f} GiB/s{extra})"
    )


def stall_line(recs: Sequence[Mapping[str, Any]], k: int, n: int, blocking: str) -> str:
    stall = max(r["staged_ns"] - r["t0_ns"] for r in recs) / 1e9
    wait = max(r["backpressure_ns"] for r in recs) / 1e9
    return (
        f"checkpoint {k}/{n}: training stalled {stall:.3f} s ({blocking}"
        + (f"; {wait:.3f} s of it waiting for checkpoint {k - 1}" if wait > 0 else "")
        + ")"
    )


def durable_line(recs: Sequence[Mapping[str, Any]], k: int, n: int) -> str:
    moved = sum(r["bytes"] for r in recs)
    ttd = max(r["t1_ns"] - r["t0_ns"] for r in recs) / 1e9
    dur = max(st["t1_ns"] - st["t0_ns"] for r in recs for st in r["stages"] if st["tier"] == DURABLE) / 1e9
    return (
        f"checkpoint {k}/{n}: durable {ttd:.2f} s after it was taken; durable-tier write "
        f"{fmt_bytes(moved)} in {dur:.2f} s = {moved / dur / GiB:.2f} GiB/s"
    )


def headline(s: Mapping[str, Any]) -> str:
    parts = [
        f"write {s['write_bandwidth_mean_gib_s']:.2f} GiB/s mean "
        f"({s['write_duration_mean_s']:.2f} s per checkpoint)"
    ]
    if s["write_overlap_efficiency"] is not None:  # something ran behind training
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
    return "result: " + "; ".join(parts)
