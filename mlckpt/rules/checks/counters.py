"""The DEVICE-COUNTERS check: each host's kernel counters, which the runner samples around every
op (records format 3), against the records.  Pure.  Split from ``evidence`` (same bounds, under
``evidence.counters`` in rules.yaml)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from mlckpt.attribution import attributed, op_window
from mlckpt.rules.checks.evidence import Rec, counted_op, evidence_bounds, host_facts, op_end
from mlckpt.rules.checks.timing import abs_bound_ns, calibration_outcomes
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import RunData, run_data
from mlckpt.workload.pipeline import MEMORY_FILESYSTEMS

# What a check judges of the counters: everything (rules 1.2 to 1.11), all but the window's ends
# past the host's allowances ("framed": DEVICE-COUNTERS restated in 1.12), or those ends alone
# ("late": COUNTERS-LATE, disturbed: a host too busy to start after its counters or read them
# after the op in time cannot be told from an op recorded as starting later or ending earlier than
# it did; either way no result, never invalid for a busy host).  A start before the counters and
# an end after them stay DEVICE-COUNTERS': no busy host explains them.
Part = Literal["all", "framed", "late"]

BLOCK_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "f2fs", "jfs", "reiserfs"})


def _window(
    ruleset: RuleSet, data: RunData, b: Mapping[str, Any], key: tuple[str,
                                                                      int], hr: Sequence[Rec], leader: Rec,
    op_dur: int, part: Part = "all",
) -> Iterator[Outcome]:
    """The counters' window against the records: read on leaving the barrier right before the
    leader's own start, and again soon after the host's last rank ended (the wait for other hosts'
    slower ranks allowed).  The absolute allowances are the host's own calibration's (rules 1.8).
    ``part``: see :data:`Part`."""
    hc = leader["host_counters"]
    c0, c1 = int(hc["before"]["t_ns"]), int(hc["after"]["t_ns"])
    host = str(leader["host"])
    where = f"{key[0]} {key[1]} on {host}"
    last = max(op_end(r) for r in hr)
    head = int(leader["t0_ns"]) - c0
    # rules 1.8: the host's calibration, plus a share of the op (the other allowances have theirs)
    head_max = abs_bound_ns(ruleset, data, host, "head_ns", b["head_abs_s"]) + (
        float(ruleset.data["timing"]["head_rel"]) * op_dur if "timing" in ruleset.data else 0)
    if (head < 0 and part != "late") or (head > head_max and part != "framed"):
        yield Outcome(
            False,
            f"the leader's start at most {head_max / 1e6:.0f} ms after its counters",
            f"{head / 1e6:+.1f} ms",
            where=where,
        )
    host_dur = max(op_end(r) - int(r["t0_ns"]) for r in hr)
    tail = (abs_bound_ns(ruleset, data, host, "tail_ns", b["tail_abs_s"]) + b["tail_rel"] * op_dur
            + (op_dur - host_dur))
    if key[0] == "write" and data.pipeline.background:
        tail += b["tail_background_s"] * 1e9  # the ranks' background stages compete for the CPUs
    if last > c1 and part != "late":
        yield Outcome(
            False,
            "every rank of the host ended before the counters were read",
            f"{(last - c1) / 1e6:.1f} ms after",
            where=where,
        )
    elif last <= c1 and c1 - last > tail and part != "framed":
        yield Outcome(
            False,
            f"the op ends at most {tail / 1e6:.1f} ms before the counters were read",
            f"{(c1 - last) / 1e6:.1f} ms",
            where=where,
        )


def _memory_restores(counted: Sequence[Rec], facts: Mapping[str, Any], where: str) -> Iterator[Outcome]:
    """Restores from a folder in a memory filesystem: nothing in it is ever "cold"."""
    total = sum(int(r["bytes"]) for r in counted)
    if total and (facts.get("filesystem") or {}).get("fs_type") in MEMORY_FILESYSTEMS:
        resident = sum(int(r.get("resident_bytes", 0)) for r in counted)
        if resident < total:
            yield Outcome(False, "restores from a memory filesystem resident in memory",
                          f"{total - resident} B claimed cold on {facts['filesystem']['fs_type']}",
                          where=where)


def _device(
    data: RunData,
    b: Mapping[str, Any],
    attr: Mapping[str, object] | None,
    key: tuple[str, int],
    hr: Sequence[Rec],
    leader: Rec,
    facts: Mapping[str, object],
) -> Iterator[Outcome]:
    """The device and the page cache during the window against the op's bytes and mode."""
    hc = leader["host_counters"]
    before, after = hc["before"], hc["after"]
    where = f"{key[0]} {key[1]} on {leader['host']}"
    op = key[0]
    counted = [r for r in hr if counted_op(data, r)]
    if op == "read":
        yield from _memory_restores(counted, facts, where)
    claimed_direct = [r for r in counted if r.get("direct")]
    if claimed_direct and "cached_bytes" in after and "cached_bytes" in before:
        grew = (int(after["cached_bytes"]) - int(before["cached_bytes"])) - (
            int(after.get("shmem_bytes", 0)) - int(before.get("shmem_bytes", 0))
        )
        direct_bytes = sum(int(r["bytes"]) for r in claimed_direct)
        others = _others_cache_bytes(hc) if attr is not None else 0
        allowed = b["direct_cache_fraction"] * direct_bytes + others
        if grew > allowed:
            besides = f" plus the {others} B other processes read or dirtied" if others else ""
            yield Outcome(
                False,
                f"O_DIRECT: the page cache grows by less than "
                f"{b['direct_cache_fraction']:.0%} of {direct_bytes} B{besides}",
                f"it grew by {grew} B",
                where=where,
            )
    # busy_ms is recorded but judges nothing: the kernel's io_ticks ran up to 35 % ahead of the
    # wall clock in honest O_DIRECT runs here (and 2.5x in an unsynced one).
    if hc.get("device") is None:
        return
    if counted:
        field = "written_bytes" if op == "write" else "read_bytes"
        moved = int(after[field]) - int(before[field])
        need = sum(
            int(r["bytes"]) - (int(r.get("resident_bytes", 0)) if op == "read" else 0) for r in counted
        )
        if moved < b["bytes_fraction"] * need:
            yield Outcome(
                False,
                f"at least {b['bytes_fraction']:.0%} of {need} B {field.split('_')[0]} "
                f"by device {hc['device']}",
                f"{moved} B",
                where=where,
            )
        yield from _own(attr, hc, where)


def _others_cache_bytes(hc: Mapping[str, Any]) -> int:
    """How much other processes can have grown the page cache over an op (rules 1.8, attributed
    counters; 0 otherwise): what the device read and wrote for them (a buffered read fills the
    cache, a written page was cached first) and what is dirty or under writeback since."""
    w = op_window(hc)
    if w is None:
        return 0
    before, after = hc["before"], hc["after"]
    dirty = sum(int(after.get(k, 0)) - int(before.get(k, 0)) for k in ("dirty_bytes", "writeback_bytes"))
    return w.foreign_bytes + max(0, dirty)


def _own(attr: Mapping[str, Any] | None, hc: Mapping[str, Any], where: str) -> Iterator[Outcome]:
    """Rules 1.8: what the kernel charged to the host's ranks is part of what the device moved
    (the run cannot have moved more than its device did: an inflated share of its own would hide
    another tenant)."""
    w = op_window(hc) if attr is not None else None
    if w is None:
        return
    assert attr is not None
    slack = attr["own_slack_fraction"] * w.device_bytes + attr["own_slack_bytes"]
    if w.own_bytes > w.device_bytes + slack:
        yield Outcome(False,
                      f"the ranks' own bytes at most the {w.device_bytes} B device {hc['device']} moved",
                      f"{w.own_bytes} B", where=where)


def _between(
    b: Mapping[str, Any], attr: Mapping[str, Any] | None, host: str,
    windows: Sequence[tuple[tuple[str, int], Rec, int]],
) -> Iterator[Outcome]:
    """Between two consecutive counted ops of a host, no checkpoint's worth of bytes moved that no
    op accounts for (an op dropped and the rest renumbered).  Where the counters attribute the
    device's bytes (rules 1.8), the run's own bytes are judged, and another tenant's are not."""
    for (ka, la, bytes_a), (kb, lb, bytes_b) in itertools.pairwise(windows):
        ha, hb = la["host_counters"], lb["host_counters"]
        if ha.get("device") != hb.get("device"):
            continue
        after, before = ha["after"], hb["before"]
        own = attr is not None and attributed(after) and attributed(before)
        for field in ("written_bytes", "read_bytes"):
            key = f"own_{field}" if own else field
            if key in after and key in before:
                gap = int(before[key]) - int(after[key])
                limit = max(b["between_fraction"] * min(bytes_a, bytes_b), b["between_abs_bytes"])
                if gap < 0 or gap > limit:
                    whose = "the ranks" if own else "the device"
                    yield Outcome(
                        False,
                        f"at most {limit:.0f} B {field.split('_')[0]} by {whose} between "
                        "consecutive ops (counters only grow)",
                        f"{gap} B",
                        where=f"between {ka[0]} {ka[1]} and {kb[0]} {kb[1]} on {host}",
                    )
                    return


def _missing_fields(hc: Rec) -> str:
    """What a host's counter samples lack of what the checks read ('' when nothing)."""
    device = ("read_bytes", "written_bytes") if hc.get("device") is not None else ()
    need = ("t_ns", "cached_bytes", *device)
    for side in ("before", "after"):
        sample = hc.get(side)
        if not isinstance(sample, dict):
            return f"no {side} sample"
        lacking = [k for k in need if not isinstance(sample.get(k), int) or isinstance(sample.get(k), bool)]
        if lacking:
            return f"{side} sample without {', '.join(lacking)}"
    return ""


def device_counters(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """The kernel's counters of each host, sampled around every op, agree with the records: the
    window frames the op; a durable write put at least its bytes on the device, a cold restore
    read at least the bytes not resident, and no op's worth of bytes moved between ops; O_DIRECT
    did not fill the page cache; a memory filesystem is never cold, and a block filesystem has its
    device."""
    yield from _judge(ctx, ruleset, "all")


def device_counters_framed(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """As :func:`device_counters`, less a window tail past the host's allowance (rules 1.12: that
    is COUNTERS-LATE's)."""
    yield from _judge(ctx, ruleset, "framed")


def counters_late(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Each host read its counters within its allowance after the op's last rank ended (a sample
    the other checks cannot read is DEVICE-COUNTERS' to name)."""
    yield from _judge(ctx, ruleset, "late")


def _judge(ctx: Context, ruleset: RuleSet, part: Part) -> Iterator[Outcome | NotChecked]:
    d, b, attr = run_data(ctx), evidence_bounds(ruleset)["counters"], ruleset.data.get("attribution")
    if int(d.run.get("records_format", 0)) < 3:
        yield NotChecked("the records carry no kernel counters (records format 2)")
        return
    facts = host_facts(d)
    whole = part != "late"
    for host, f in sorted(facts.items()):
        fs = (f.get("filesystem") or {}).get("fs_type")
        if whole and fs in BLOCK_FILESYSTEMS and f.get("block_device") is None:
            yield Outcome(
                False, f"the block device of the {fs} checkpoint folder", "none", where=f"host {host}"
            )
    ops = d.grouped()
    if whole:
        yield from calibration_outcomes(ruleset, d, sorted(d.hosts()), ("head_ns", "tail_ns"))
    windows: dict[str, list[tuple[tuple[str, int], Rec, int]]] = {}
    for key, recs in ops.items():  # writes first, each in index order
        op_dur = max(op_end(r) - int(r["t0_ns"]) for r in recs)
        for host, hr in sorted(d.hosts(recs).items()):
            where = f"{key[0]} {key[1]} on {host}"
            leaders = [r for r in hr if "host_counters" in r]
            if len(leaders) != 1 or leaders[0]["host_counters"]["before"] is None:
                if whole:
                    yield Outcome(False, "one record with the host's counters", f"{len(leaders)}",
                                  where=where)
                continue
            missing = _missing_fields(leaders[0]["host_counters"])
            if missing:  # released schemas require only t_ns of a sample: never a checker fault
                if whole:
                    yield Outcome(False, "counter samples with every field the rule reads", missing,
                                  where=where)
                continue
            yield from _window(ruleset, d, b, key, hr, leaders[0], op_dur, part)
            if not whole:
                continue
            yield from _device(d, b, attr, key, hr, leaders[0], facts.get(host, {}))
            counted = sum(int(r["bytes"]) for r in hr if counted_op(d, r))
            if counted and leaders[0]["host_counters"].get("device") is not None:
                windows.setdefault(host, []).append((key, leaders[0], counted))
    for host, ws in sorted(windows.items()):
        yield from _between(b, attr, host, ws)


CHECKS = checks_table(device_counters, device_counters_framed, counters_late)
