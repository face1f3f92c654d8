"""FOREIGN-IO (rules 1.8): a run whose timed ops shared its checkpoint device, or its host's CPUs,
with other processes past a declared share is *disturbed*: neither a valid result nor an invalid
one.  Pure; the numbers are mlckpt.attribution's, the shares are ``attribution:`` in rules.yaml.

Two measures, each with its own horizon:
- **the share during the timed ops**, over a phase (every weighed write, or every weighed restore)
  on one host, as the headline is a mean over the phase's ops; judged only where the phase's ops
  last ``min_window_s`` in all: over a few tens of milliseconds a tenant's one burst (a flush, a
  read-ahead) cannot be told from a steady flood, and one op that met a burst is reported
  (summary.json's ``foreign.*.worst``) without spoiling a mean of many;
- **how busy another tenant kept the device** over the host's whole span (the timed ops and the
  gaps between them), against the highest rate the device showed in the run (rules 1.8);
- rules 1.9, instead: the same over everything the host watched, the span **and a window of the
  run asleep before its first op** (run.json's ``calibration.hosts[].background``): a horizon of
  at least that window however short the run's ops.  Over a 50 ms op a steady tenant and a
  flat-out one both take a third of the device; with the run idle one moves a fifth of its peak,
  the other all of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mlckpt.attribution import (
    Background,
    OpShare,
    Span,
    backgrounds,
    cpu_share,
    cpu_window_s,
    phases,
    spans,
    watched_rate_share,
)
from mlckpt.rules.checks.evidence import counted_op
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import run_data
from mlckpt.units import fmt_bytes, fmt_share

NOT_ATTRIBUTED = ("no host's counters split its device's bytes between the run and other processes "
                  "(object storage, no block device, /proc unreadable, or records before format 6)")


def _span(indexes: list[int]) -> str:
    lo, hi = min(indexes), max(indexes)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _host_phase(a: Mapping[str, Any], op: str, host: str, shares: list[OpShare]) -> Iterator[Outcome]:
    device = sum(s.window.device_bytes for s in shares)
    foreign = sum(s.window.foreign_bytes for s in shares)
    share = foreign / device if device > 0 else 0.0
    where = f"host {host}, {op}s {_span([s.index for s in shares])}"
    dev = shares[0].window
    long_enough = sum(s.window.window_ns for s in shares) >= float(a["min_window_s"]) * 1e9
    if long_enough and share > float(a["max_foreign_share"]):
        worst = max(shares, key=lambda s: s.window.foreign_bytes)
        yield Outcome(
            False,
            f"other processes moving at most {float(a['max_foreign_share']):.0%} of the bytes the checkpoint "
            "device moved during the timed ops",
            f"{foreign} B ({fmt_bytes(foreign)}, {fmt_share(share, float(a['max_foreign_share']))} of "
            f"{fmt_bytes(device)}) moved on device "
            f"{shares[0].device} by other processes, most during {op} {worst.index} "
            f"({fmt_bytes(worst.window.foreign_bytes)})",
            where=where,
        )
    cpu = cpu_share(shares, cpu_window_s(a) * 1e9)
    if cpu is not None and cpu > float(a["max_foreign_cpu_share"]):
        yield Outcome(
            False,
            f"other processes using at most {float(a['max_foreign_cpu_share']):.0%} of the host's "
            f"{dev.cpus} CPUs during the timed ops",
            fmt_share(cpu, float(a["max_foreign_cpu_share"])),
            where=where,
        )


def _span_outcome(a: Mapping[str, Any], span: Span) -> Iterator[Outcome]:
    limit = float(a["max_foreign_rate_share"])
    if span.foreign_rate_share <= limit:
        return
    rate = span.window.foreign_bytes / (span.window.window_ns / 1e9)
    yield Outcome(
        False,
        f"other processes keeping the checkpoint device busy at most {limit:.0%} of the highest rate "
        f"it reached in the run ({fmt_bytes(span.peak_bytes_per_ns * 1e9)}/s)",
        f"{span.window.foreign_bytes} B ({fmt_bytes(span.window.foreign_bytes)}) moved on device "
        f"{span.device} by other processes in {span.window.window_ns / 1e9:.2f} s, "
        f"{fmt_bytes(rate)}/s ({fmt_share(span.foreign_rate_share, limit)})",
        where=f"host {span.host}, from the first timed op to the last",
    )


def _watched_outcome(a: Mapping[str, Any], span: Span, b: Background | None) -> Iterator[Outcome]:
    # stripped, it would hide a tenant: no undisturbed run without it
    if b is None or b.device != span.device:
        yield Outcome(False, f"the host's background window on device {span.device} (run.json calibration)",
                      "none recorded", where=f"host {span.host}, before the first timed op")
        return
    limit, share = float(a["max_watched_rate_share"]), watched_rate_share(b, span)
    if share <= limit:
        return
    moved = b.window.foreign_bytes + span.window.foreign_bytes
    seconds = (b.window.window_ns + span.window.window_ns) / 1e9
    yield Outcome(
        False,
        f"other processes moving bytes on the checkpoint device at most {limit:.0%} of the highest rate it "
        f"reached in the run ({fmt_bytes(span.peak_bytes_per_ns * 1e9)}/s), before and during the timed ops",
        f"{moved} B ({fmt_bytes(moved)}) moved on device {span.device} by other processes in {seconds:.2f} s "
        f"({fmt_bytes(b.foreign_bytes_per_s)}/s with the run asleep before its first op), "
        f"{fmt_bytes(moved / seconds)}/s ({fmt_share(share, limit)})",
        where=f"host {span.host}, before and during the timed ops",
    )


def foreign_io(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Per host and phase, what other processes moved on the checkpoint device (and how much of
    the host's CPU time they took) during the weighed timed ops stays within ``attribution:``."""
    d, a = run_data(ctx), ruleset.data["attribution"]
    by_phase = phases(d.records, lambda r: counted_op(d, r))
    if not any(by_phase.values()):
        yield NotChecked(NOT_ATTRIBUTED)
        return
    for op, shares in by_phase.items():
        by_host: dict[str, list[OpShare]] = {}
        for s in shares:
            by_host.setdefault(s.host, []).append(s)
        for host, hs in sorted(by_host.items()):
            yield from _host_phase(a, op, host, hs)
    every = spans(d.records, lambda r: counted_op(d, r))
    if "max_watched_rate_share" not in a:  # rules 1.8: the span alone
        for sp in every:
            yield from _span_outcome(a, sp)
        return
    seen = {b.host: b for b in backgrounds(d.run)}
    for sp in every:
        yield from _watched_outcome(a, sp, seen.get(sp.host))


CHECKS = checks_table(foreign_io)
