"""Whose bytes the checkpoint device moved: the run's own, or another tenant's (records format 6).
Pure: the runner's summary, the checker's rules and the leaderboard read the same numbers.

Each host's leader samples, around every op (``host_counters``, see mlckpt/metrics.py), the
device's own counters (/sys/dev/block/M:m/stat: every byte any process moved on it) beside what
the kernel charged to the host's ranks (/proc/<pid>/io of every rank, all its threads: bytes it
made the block layer read, bytes it wrote or dirtied for writing), and the CPU time of the host
and of its ranks.  Over an op's window::

    device = Δ(read_bytes + written_bytes)            everything the device moved
    own    = Δ(own_read_bytes + own_written_bytes)     what the run's ranks caused
    foreign = max(0, device - own)                     other processes (and the kernel's own
                                                       journal and metadata writes)
    foreign_cpu = max(0, Δcpu_busy_ns - Δown_cpu_ns)   CPU time of everything but the ranks

Only the ops whose bytes cross the device inside their own window are weighed (a sync write to
the durable tier with fsync or O_DIRECT, a restore from the durable tier: ``counted``); a write
left in the page cache reaches the device later, in another window, and would read as foreign.

A host's *span* runs from its first weighed op's opening counters to its last one's closing
counters: the timed ops and the gaps between them.  Its ``foreign_rate_share`` is the rate at which
other processes moved bytes over the span ÷ the highest rate the device reached in one of the
run's windows: how busy another tenant kept the device, at the device's own demonstrated speed.

A phase's ``foreign_share`` is Σ foreign ÷ Σ device over its weighed ops and hosts; its
``foreign_cpu_share`` is Σ foreign CPU time ÷ Σ (CPUs × window), given only when its windows last
``min_cpu_window_ns`` on average: the kernel counts CPU time in ticks (10 ms at the usual 100 Hz),
so a window of 30 ms would be known to ±70 %, one of 0.5 s to ±4 %.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Rec = Mapping[str, Any]
OWN_KEYS = ("own_read_bytes", "own_written_bytes")


@dataclass(frozen=True)
class Window:
    """One host's counters over one op (or between two ops)."""

    device_bytes: int
    own_bytes: int
    window_ns: int
    foreign_cpu_ns: int | None  # None: the CPU counters are missing
    cpus: int

    @property
    def foreign_bytes(self) -> int:
        return max(0, self.device_bytes - self.own_bytes)

    @property
    def foreign_share(self) -> float:
        return self.foreign_bytes / self.device_bytes if self.device_bytes > 0 else 0.0


def _delta(before: Rec, after: Rec, *keys: str) -> int:
    return sum(int(after[k]) - int(before[k]) for k in keys)


def attributed(sample: Rec | None) -> bool:
    """Whether a counters sample splits the device's bytes (records format 6, /proc readable)."""
    return (sample is not None and all(k in sample for k in OWN_KEYS)
            and "read_bytes" in sample and "written_bytes" in sample)


def window(before: Rec | None, after: Rec | None, cpus: int = 1) -> Window | None:
    """The counters between two samples of one host; None when they cannot be attributed."""
    if not (attributed(before) and attributed(after)):
        return None
    assert before is not None and after is not None
    cpu = None
    if all(k in s for s in (before, after) for k in ("own_cpu_ns", "cpu_busy_ns")):
        cpu = max(0, _delta(before, after, "cpu_busy_ns") - _delta(before, after, "own_cpu_ns"))
    return Window(_delta(before, after, "read_bytes", "written_bytes"), _delta(before, after, *OWN_KEYS),
                  int(after["t_ns"]) - int(before["t_ns"]), cpu, max(1, int(cpus)))


def op_window(hc: Rec) -> Window | None:
    """One host's window over one op, from its leader's ``host_counters``."""
    return window(hc.get("before"), hc.get("after"), int(hc.get("cpus", 1)))


@dataclass(frozen=True)
class OpShare:
    op: str
    index: int
    host: str
    window: Window
    device: str = ""  # MAJOR:MINOR


def op_windows(records: Iterable[Rec], counted: Callable[[Rec], bool]) -> list[OpShare]:
    """Every weighed op's window on every host that attributes its device's bytes (one per leader
    record that holds a device), in record order."""
    out = []
    for r in records:
        hc = r.get("host_counters")
        if not hc or hc.get("device") is None or not counted(r):
            continue
        w = op_window(hc)
        if w is not None:
            out.append(OpShare(str(r["op"]), int(r["index"]), str(r["host"]), w, str(hc["device"])))
    return out


def cpu_share(shares: list[OpShare], min_cpu_window_ns: float) -> float | None:
    """Other processes' CPU time over the windows ÷ the CPUs' time, or None: no CPU counters, or
    windows too short on average to tell (module docstring)."""
    cpu = [s.window for s in shares if s.window.foreign_cpu_ns is not None and s.window.window_ns > 0]
    if not cpu or sum(w.window_ns for w in cpu) < min_cpu_window_ns * len(cpu):
        return None
    return sum(w.foreign_cpu_ns or 0 for w in cpu) / sum(w.cpus * w.window_ns for w in cpu)


def cpu_window_s(a: Mapping[str, Any]) -> float:
    """The windows' mean length from which their CPU share is known well enough to judge and show
    (rules data ``attribution.min_cpu_window_s``; before rules 1.9 the share's own
    ``min_window_s``)."""
    return float(a.get("min_cpu_window_s", a["min_window_s"]))


def _phase(shares: list[OpShare], min_cpu_window_ns: float) -> dict[str, object] | None:
    if not shares:
        return None
    device = sum(s.window.device_bytes for s in shares)
    foreign = sum(s.window.foreign_bytes for s in shares)
    cpu = cpu_share(shares, min_cpu_window_ns)
    worst = max(shares, key=lambda s: (s.window.foreign_bytes, -s.index))
    return {
        "ops": len({s.index for s in shares}),
        "device_bytes": device,
        "own_bytes": sum(s.window.own_bytes for s in shares),
        "foreign_bytes": foreign,
        "foreign_share": round(foreign / device, 6) if device > 0 else 0.0,
        "foreign_cpu_share": None if cpu is None else round(cpu, 6),
        "worst": {"index": worst.index, "host": worst.host, "foreign_bytes": worst.window.foreign_bytes,
                  "foreign_share": round(worst.window.foreign_share, 6)},
    }


def phases(records: Iterable[Rec], counted: Callable[[Rec], bool]) -> dict[str, list[OpShare]]:
    """The weighed windows by phase (``write``, ``read``) and, within each, by host."""
    out: dict[str, list[OpShare]] = {"write": [], "read": []}
    for s in op_windows(records, counted):
        out.setdefault(s.op, []).append(s)
    return out


def between_ops(records: Iterable[Rec],
                counted: Callable[[Rec], bool]) -> list[tuple[OpShare, OpShare, Window]]:
    """Each host's consecutive weighed ops and the counters between the end of one and the start
    of the next (writes, then restores, each in index order)."""
    leaders: dict[str, list[Rec]] = {}
    for r in records:
        hc = r.get("host_counters")
        if hc and hc.get("device") is not None and counted(r):
            leaders.setdefault(str(r["host"]), []).append(r)
    out = []
    order = {"write": 0, "read": 1}
    for host, rs in sorted(leaders.items()):
        rs.sort(key=lambda r: (order.get(str(r["op"]), 2), int(r["index"])))
        for a, b in itertools.pairwise(rs):
            ha, hb = a["host_counters"], b["host_counters"]
            w = window(ha.get("after"), hb.get("before"), int(ha.get("cpus", 1)))
            wa, wb = op_window(ha), op_window(hb)
            same = ha.get("device") == hb.get("device")
            if w is not None and wa is not None and wb is not None and same:
                out.append((OpShare(str(a["op"]), int(a["index"]), host, wa),
                            OpShare(str(b["op"]), int(b["index"]), host, wb), w))
    return out


@dataclass(frozen=True)
class Span:
    """One host's counters from its first weighed op's opening to its last one's closing."""

    host: str
    window: Window
    peak_bytes_per_ns: float  # the device's highest rate in one of the host's op windows
    device: str = ""  # MAJOR:MINOR

    @property
    def foreign_rate_share(self) -> float:
        if self.window.window_ns <= 0 or self.peak_bytes_per_ns <= 0:
            return 0.0
        return self.window.foreign_bytes / self.window.window_ns / self.peak_bytes_per_ns


def spans(records: Iterable[Rec], counted: Callable[[Rec], bool]) -> list[Span]:
    """Each attributing host's span (module docstring), hosts in name order."""
    by_host: dict[str, list[Rec]] = {}
    for r in records:
        hc = r.get("host_counters")
        if hc and hc.get("device") is not None and counted(r) and op_window(hc) is not None:
            by_host.setdefault(str(r["host"]), []).append(r)
    out = []
    for host, rs in sorted(by_host.items()):
        rs.sort(key=lambda r: int(r["host_counters"]["before"]["t_ns"]))
        first, last = rs[0]["host_counters"], rs[-1]["host_counters"]
        w = window(first.get("before"), last.get("after"), int(first.get("cpus", 1)))
        wins = [op_window(r["host_counters"]) for r in rs]
        rates = [x.device_bytes / x.window_ns for x in wins if x is not None and x.window_ns > 0]
        if w is not None and first.get("device") == last.get("device"):
            out.append(Span(host, w, max(rates, default=0.0), str(first["device"])))
    return out


@dataclass(frozen=True)
class Background:
    """One host's counters over the window before the first op with the run's ranks asleep (run
    format 9, ``calibration.hosts[].background``): what other processes moved with the run idle."""

    host: str
    device: str
    window: Window

    @property
    def foreign_bytes_per_s(self) -> float:
        return self.window.foreign_bytes / (self.window.window_ns / 1e9) if self.window.window_ns > 0 else 0.0


def watched_rate_share(b: Background, span: Span) -> float:
    """How fast other processes moved bytes over everything a host watched (its background window
    and its span, together), ÷ the device's highest rate in one of the host's ops: one measure
    over a horizon of at least the background window, however short the run's ops."""
    ns = b.window.window_ns + span.window.window_ns
    if ns <= 0 or span.peak_bytes_per_ns <= 0:
        return 0.0
    return (b.window.foreign_bytes + span.window.foreign_bytes) / ns / span.peak_bytes_per_ns


def backgrounds(run: Rec) -> list[Background]:
    """Each host's background window from run.json's ``calibration`` (none before run format 9)."""
    out = []
    for h in (run.get("calibration") or {}).get("hosts", ()):
        b = h.get("background")
        w = window(b.get("before"), b.get("after")) if isinstance(b, Mapping) else None
        if b is not None and w is not None and w.window_ns > 0:
            out.append(Background(str(h["host"]), str(b["device"]), w))
    return out


def foreign_summary(records: Iterable[Rec], counted: Callable[[Rec], bool],
                    min_cpu_window_ns: float) -> dict[str, object] | None:
    """summary.json's ``foreign`` block (summary format 5), or None when no host attributes."""
    records = list(records)
    by_phase = phases(records, counted)
    if not any(by_phase.values()):
        return None
    gaps = between_ops(records, counted)
    busiest = max(spans(records, counted), key=lambda x: x.foreign_rate_share, default=None)
    span = None if busiest is None else {
        "host": busiest.host, "seconds": round(busiest.window.window_ns / 1e9, 6),
        "foreign_bytes": busiest.window.foreign_bytes,
        "foreign_rate_share": round(busiest.foreign_rate_share, 6)}
    return {"write": _phase(by_phase["write"], min_cpu_window_ns),
            "read": _phase(by_phase["read"], min_cpu_window_ns), "span": span,
            "between_ops_bytes": sum(w.foreign_bytes for _, _, w in gaps)}


def foreign_note(foreign: object, at_least: float = 0.005) -> str:
    """``other processes moved 12% of the device's bytes during the writes, 3% during the
    restores`` (summary format 5's ``foreign``), or nothing when they moved (almost) nothing."""
    if not isinstance(foreign, dict):
        return ""
    shares = [(op, (foreign.get(op) or {}).get("foreign_share")) for op in ("write", "read")]
    shown = [(f"{v:.0%}", "writes" if op == "write" else "restores") for op, v in shares
             if isinstance(v, int | float) and not isinstance(v, bool) and v >= at_least]
    if not shown:
        return ""
    rest = "".join(f", {pct} during the {phase}" for pct, phase in shown[1:])
    return f"other processes moved {shown[0][0]} of the device's bytes during the {shown[0][1]}{rest}"
