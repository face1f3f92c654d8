"""Unit tests of mlckpt.metrics: hand-built per-rank records with known numbers, and hypothesis
invariants of ``summarize``."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt.dlio import dlio_compat
from mlckpt.metrics import (
    RECORDS_FORMAT,
    SUMMARY_FORMAT,
    group_ops,
    op_stats,
    summarize,
)
from mlckpt.units import GiB as GIB

S = 1_000_000_000  # ns per second
GiB = 1 << 30
COLD = 0.01


def rec(op: str, index: int, rank: int, t0_s: float, dur_s: float, nbytes: int, *,
        checkpoint: int | None = None, resident: int = 0, checked: int | None = None,
        mismatches: int = 0) -> dict[str, Any]:
    """One raw record in the runner's format (records format 2; writes: sync, one tier)."""
    t0 = round(t0_s * S)
    r: dict[str, Any] = {
        "op": op, "index": index, "checkpoint": index if checkpoint is None else checkpoint,
        "rank": rank, "host": "h0", "t0_ns": t0, "t1_ns": t0 + round(dur_s * S), "bytes": nbytes,
        "files": 2, "fsync": op == "write", "direct": True, "dontcache": False,
    }
    if op == "read":
        r["resident_bytes"] = resident
        r["cached_check_bytes"] = nbytes if checked is None else checked
        r["verified_bytes"] = nbytes
        r["mismatches"] = mismatches
        r["tier"] = "durable"
    else:
        r.update(sync_fields(r))
    return r


def sync_fields(r: dict[str, Any]) -> dict[str, Any]:
    """A sync one-tier write: the stall is the whole op, one durable stage from t0 to t1."""
    return {"mode": "sync", "staged_ns": r["t1_ns"], "backpressure_ns": 0, "exposed_ns": 0, "compute_ns": 0,
            "stages": [{"tier": "durable", "t0_ns": r["t0_ns"], "t1_ns": r["t1_ns"], "bytes": r["bytes"]}]}


# ---------------------------------------------------------------------------------------------
# one op, known numbers


def test_op_stats_known_numbers() -> None:
    # rank 0: 4 GiB in 2 s (2 GiB/s); rank 1: 3 GiB in 1 s (3 GiB/s); rank 2: 1 GiB in 0.25 s.
    recs = [rec("write", 1, 0, 10.0, 2.0, 4 * GiB), rec("write", 1, 1, 10.5, 1.0, 3 * GiB),
            rec("write", 1, 2, 11.0, 0.25, GiB)]
    o = op_stats(recs)
    assert (o.op, o.index, o.checkpoint, o.ranks) == ("write", 1, 1, 3)
    assert o.bytes == 8 * GiB
    assert o.duration_s == 2.0  # max over ranks, not rank 0's and not wall span (10.0 → 12.0)
    assert o.bandwidth_gib_s == 4.0  # 8 GiB / 2 s
    assert (o.slowest_rank, o.slowest_rank_bandwidth_gib_s) == (0, 2.0)
    assert o.straggler_ratio == 2.0  # max 2 s / median 1 s
    assert o.resident_fraction is None and o.mismatches is None


def test_op_duration_is_max_rank_duration_not_wall_span() -> None:
    # Clocks of different hosts are not comparable: only per-rank t1 - t0 counts.
    recs = [rec("write", 1, 0, 0.0, 1.0, GiB), rec("write", 1, 1, 1000.0, 3.0, GiB)]
    o = op_stats(recs)
    assert o.duration_s == 3.0
    assert math.isclose(o.bandwidth_gib_s, 2 / 3, rel_tol=1e-15)
    assert o.slowest_rank == 1 and math.isclose(o.slowest_rank_bandwidth_gib_s, 1 / 3, rel_tol=1e-15)


def test_ranks_without_bytes_are_not_the_slowest_rank() -> None:
    # ZeRO-0 replicas (dp != 0) write nothing: they cannot be the slowest rank by bandwidth,
    # but their time still counts in the op duration.
    recs = [rec("write", 1, 0, 0.0, 1.0, 2 * GiB), rec("write", 1, 1, 0.0, 4.0, 0)]
    o = op_stats(recs)
    assert o.duration_s == 4.0
    assert o.bandwidth_gib_s == 0.5
    assert (o.slowest_rank, o.slowest_rank_bandwidth_gib_s) == (0, 2.0)


def test_op_with_no_bytes_at_all() -> None:
    o = op_stats([rec("write", 1, 0, 0.0, 1.0, 0), rec("write", 1, 1, 0.0, 2.0, 0)])
    assert o.bytes == 0 and o.bandwidth_gib_s == 0.0
    assert (o.slowest_rank, o.slowest_rank_bandwidth_gib_s) == (-1, 0.0)


def test_read_op_residency_and_mismatches() -> None:
    recs = [rec("read", 2, 0, 0.0, 1.0, GiB, checkpoint=1, resident=GiB // 4, checked=GiB),
            rec("read", 2, 1, 0.0, 1.0, GiB, checkpoint=1, resident=0, checked=GiB, mismatches=3)]
    o = op_stats(recs)
    assert (o.op, o.index, o.checkpoint) == ("read", 2, 1)
    assert o.resident_fraction == 0.125  # (GiB/4) / (2 GiB): pooled over ranks
    assert o.mismatches == 3


def test_read_op_without_checked_bytes_has_zero_residency() -> None:
    o = op_stats([rec("read", 1, 0, 0.0, 1.0, 0, checked=0)])
    assert o.resident_fraction == 0.0 and o.mismatches == 0


# ---------------------------------------------------------------------------------------------
# summary, known numbers


def three_writes_two_reads() -> list[dict[str, Any]]:
    """Writes of 6 GiB over two ranks taking 6, 3, 2 s (bandwidths 1, 2, 3 GiB/s); reads of 6 GiB
    taking 2 and 3 s (3 and 2 GiB/s)."""
    out = []
    for k, dur in enumerate((6.0, 3.0, 2.0), 1):
        out += [rec("write", k, 0, 100.0 * k, dur, 4 * GiB), rec("write", k, 1, 100.0 * k, dur / 2, 2 * GiB)]
    for k, dur in enumerate((2.0, 3.0), 1):
        out += [rec("read", k, 0, 1000.0 * k, dur, 3 * GiB, resident=GiB // 1024),
                rec("read", k, 1, 1000.0 * k, dur, 3 * GiB)]
    return out


def test_summary_known_numbers() -> None:
    s = summarize(three_writes_two_reads(), max_resident_fraction=COLD)
    assert s["summary_format"] == SUMMARY_FORMAT and s["records_format"] == RECORDS_FORMAT
    assert (s["num_writes"], s["num_reads"]) == (3, 2)
    # write bandwidths 1, 2, 3 GiB/s
    assert s["write_bandwidth_mean_gib_s"] == 2.0
    assert s["write_bandwidth_median_gib_s"] == 2.0
    assert math.isclose(s["write_bandwidth_stdev_gib_s"], math.sqrt(2 / 3), rel_tol=1e-15)
    assert (s["write_bandwidth_min_gib_s"], s["write_bandwidth_max_gib_s"]) == (1.0, 3.0)
    assert math.isclose(s["write_duration_mean_s"], 11 / 3, rel_tol=1e-15)
    assert s["write_duration_median_s"] == 3.0
    assert (s["write_duration_min_s"], s["write_duration_max_s"]) == (2.0, 6.0)
    # slowest rank of each write: rank 0, 4 GiB in dur (rank 1 ties: 2 GiB in dur/2; lower rank wins)
    assert s["write_slowest_rank_bandwidth_min_gib_s"] == 4 / 6
    assert s["write_slowest_rank_bandwidth_max_gib_s"] == 2.0
    assert math.isclose(s["write_straggler_ratio_max"], 4 / 3, rel_tol=1e-15)  # max / median(d, d/2)
    assert s["write_bytes_per_op"] == 6 * GiB
    # reads: 3 and 2 GiB/s
    assert s["read_bandwidth_mean_gib_s"] == 2.5
    assert s["read_bandwidth_median_gib_s"] == 2.5
    assert s["read_bandwidth_stdev_gib_s"] == 0.5
    assert s["read_duration_mean_s"] == 2.5
    assert s["read_straggler_ratio_max"] == 1.0
    assert s["read_bytes_per_op"] == 6 * GiB
    assert s["read_resident_fraction_max"] == (GiB // 1024) / (6 * GiB)
    assert s["read_cold"] is True
    assert s["read_mismatches"] == 0 and s["read_verified"] is True
    assert [(o["op"], o["index"]) for o in s["ops"]] == [
        ("write", 1), ("write", 2), ("write", 3), ("read", 1), ("read", 2)]
    assert [o["duration_s"] for o in s["ops"]] == [6.0, 3.0, 2.0, 2.0, 3.0]
    assert [o["bytes"] for o in s["ops"]] == [6 * GiB] * 5


def test_summary_does_not_depend_on_record_order() -> None:
    recs = three_writes_two_reads()
    want = summarize(recs, max_resident_fraction=COLD)
    for seed in range(5):
        shuffled = recs[:]
        random.Random(seed).shuffle(shuffled)
        assert summarize(shuffled, max_resident_fraction=COLD) == want


def test_group_ops_orders_writes_then_reads_and_ranks() -> None:
    recs = [rec("read", 2, 1, 0, 1, 1), rec("write", 10, 0, 0, 1, 1), rec("read", 2, 0, 0, 1, 1),
            rec("write", 2, 1, 0, 1, 1), rec("read", 1, 0, 0, 1, 1), rec("write", 2, 0, 0, 1, 1)]
    groups = group_ops(recs)
    assert list(groups) == [("write", 2), ("write", 10), ("read", 1), ("read", 2)]
    assert [r["rank"] for r in groups[("write", 2)]] == [0, 1]
    assert [r["rank"] for r in groups[("read", 2)]] == [0, 1]


@pytest.mark.parametrize(("resident", "cold"), [(0, True), (60, True), (61, False), (6000, False)])
def test_cold_read_bound_is_inclusive(resident: int, cold: bool) -> None:
    # 6000 bytes checked over the op; the bound is 1 %: 60 bytes resident is still cold.
    recs = [rec("write", 1, 0, 0, 1, 6000),
            rec("read", 1, 0, 0, 1, 6000, resident=resident, checked=6000)]
    s = summarize(recs, max_resident_fraction=COLD)
    assert s["read_resident_fraction_max"] == resident / 6000
    assert s["read_cold"] is cold


def test_worst_read_decides_cold_and_mismatches_add_up() -> None:
    recs = [rec("write", 1, 0, 0, 1, 1000)]
    recs += [rec("read", 1, 0, 0, 1, 1000, resident=0), rec("read", 2, 0, 0, 1, 1000, resident=500,
                                                             mismatches=2),
             rec("read", 3, 0, 0, 1, 1000, mismatches=1)]
    s = summarize(recs, max_resident_fraction=COLD)
    assert s["read_resident_fraction_max"] == 0.5 and s["read_cold"] is False
    assert s["read_mismatches"] == 3 and s["read_verified"] is False


def test_writes_only_summary_has_no_read_fields() -> None:
    s = summarize([rec("write", 1, 0, 0, 2, 2 * GiB)], max_resident_fraction=COLD)
    assert (s["num_writes"], s["num_reads"]) == (1, 0)
    assert s["write_bandwidth_mean_gib_s"] == 1.0 and s["write_bandwidth_stdev_gib_s"] == 0.0
    assert not [k for k in s if k.startswith("read_")]


def test_dlio_compat_uses_dlio_names_with_gib_values() -> None:
    s = summarize(three_writes_two_reads(), max_resident_fraction=COLD)
    d = dlio_compat(s, 3 * GiB)
    assert d == {
        "checkpoint_size_GB": 3.0,
        "save_checkpoint_io_mean_GB_per_second": 2.0,
        "save_checkpoint_io_stdev_GB_per_second": s["write_bandwidth_stdev_gib_s"],
        "save_checkpoint_duration_mean_seconds": s["write_duration_mean_s"],
        "save_checkpoint_duration_stdev_seconds": s["write_duration_stdev_s"],
        "load_checkpoint_io_mean_GB_per_second": 2.5,
        "load_checkpoint_io_stdev_GB_per_second": 0.5,
        "load_checkpoint_duration_mean_seconds": 2.5,
        "load_checkpoint_duration_stdev_seconds": 0.5,
    }
    only_writes = summarize([rec("write", 1, 0, 0, 1, GiB)], max_resident_fraction=COLD)
    assert set(dlio_compat(only_writes, GiB)) == {
        "checkpoint_size_GB", "save_checkpoint_io_mean_GB_per_second",
        "save_checkpoint_io_stdev_GB_per_second", "save_checkpoint_duration_mean_seconds",
        "save_checkpoint_duration_stdev_seconds"}


# ---------------------------------------------------------------------------------------------
# invariants


@st.composite
def runs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Records of a run: R ranks, W writes, N reads; per rank start times on unrelated clocks (each
    rank a host of its own: one host's ranks share a clock and leave each barrier together),
    durations from 1 ns to 100 s, bytes from 0 to 1 TiB (at least one rank moves bytes)."""
    ranks = draw(st.integers(1, 10))
    nops = [("write", k) for k in range(1, draw(st.integers(1, 4)) + 1)]
    nops += [("read", k) for k in range(1, draw(st.integers(0, 3)) + 1)]
    out = []
    for op, k in nops:
        sizes = draw(st.lists(st.integers(0, 1 << 40), min_size=ranks, max_size=ranks)
                     .filter(lambda xs: any(xs)))
        for r in range(ranks):
            t0 = draw(st.integers(0, 1 << 62))
            d = draw(st.integers(1, 100 * S))
            checked = sizes[r]
            x = {"op": op, "index": k, "checkpoint": k, "rank": r, "host": f"h{r}",
                 "t0_ns": t0, "t1_ns": t0 + d, "bytes": sizes[r], "files": 1, "fsync": True,
                 "direct": True, "dontcache": False}
            if op == "read":
                x.update(resident_bytes=draw(st.integers(0, checked)), cached_check_bytes=checked,
                         verified_bytes=sizes[r], mismatches=draw(st.sampled_from([0, 0, 0, 1])),
                         tier="durable")
            else:
                x.update(sync_fields(x))
            out.append(x)
    return out


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


@settings(max_examples=100, deadline=None)
@given(runs())
def test_op_invariants(records: list[dict[str, Any]]) -> None:
    s = summarize(records, max_resident_fraction=COLD)
    by_op: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        by_op.setdefault((r["op"], r["index"]), []).append(r)
    assert len(s["ops"]) == len(by_op)
    for o in s["ops"]:
        recs = by_op[(o["op"], o["index"])]
        durs = [(r["t1_ns"] - r["t0_ns"]) / 1e9 for r in recs]
        total = sum(r["bytes"] for r in recs)
        assert o["ranks"] == len(recs)
        assert o["duration_s"] == max(durs)  # duration is the max rank duration
        assert o["bytes"] == total
        assert close(o["bandwidth_gib_s"], total / max(durs) / GIB)
        own = [r["bytes"] / d / GIB for r, d in zip(recs, durs, strict=True) if r["bytes"]]
        # the slowest rank's bandwidth is ≤ every (byte-moving) rank's own bandwidth, and is one of them
        assert all(o["slowest_rank_bandwidth_gib_s"] <= b for b in own)
        assert o["slowest_rank_bandwidth_gib_s"] in own
        slow = recs[o["slowest_rank"]]
        assert slow["rank"] == o["slowest_rank"] and slow["bytes"] > 0
        if all(r["bytes"] for r in recs):
            # the rank that takes longest moves at most the aggregate
            assert o["slowest_rank_bandwidth_gib_s"] <= o["bandwidth_gib_s"] * (1 + 1e-12)
        assert o["straggler_ratio"] >= 1.0
        assert close(o["straggler_ratio"], max(durs) / statistics.median(durs))
        if o["op"] == "read":
            checked = sum(r["cached_check_bytes"] for r in recs)
            assert 0.0 <= o["resident_fraction"] <= 1.0
            assert close(o["resident_fraction"], sum(r["resident_bytes"] for r in recs) / checked)
            assert o["mismatches"] == sum(r["mismatches"] for r in recs)
        else:
            assert o["resident_fraction"] is None and o["mismatches"] is None


@settings(max_examples=100, deadline=None)
@given(runs())
def test_distribution_invariants(records: list[dict[str, Any]]) -> None:
    s = summarize(records, max_resident_fraction=COLD)
    for name in ("write", "read"):
        group = [o for o in s["ops"] if o["op"] == name]
        assert s[f"num_{name}s"] == len(group)
        if not group:
            assert f"{name}_bandwidth_mean_gib_s" not in s
            continue
        for metric, field, unit in (("bandwidth", "bandwidth_gib_s", "gib_s"),
                                    ("duration", "duration_s", "s"),
                                    ("slowest_rank_bandwidth", "slowest_rank_bandwidth_gib_s", "gib_s")):
            values = [o[field] for o in group]
            get = {stat: s[f"{name}_{metric}_{stat}_{unit}"]
                   for stat in ("mean", "median", "stdev", "min", "max")}
            assert get["min"] == min(values) and get["max"] == max(values)
            assert close(get["mean"], statistics.fmean(values))
            assert close(get["median"], statistics.median(values))
            slack = 1e-12 * get["max"]
            assert get["min"] - slack <= get["mean"] <= get["max"] + slack
            assert get["min"] <= get["median"] <= get["max"]
            assert get["stdev"] >= 0.0
            assert get["stdev"] <= (get["max"] - get["min"]) / 2 + slack  # population stdev bound
            if len(set(values)) == 1:
                assert get["stdev"] <= slack
        assert s[f"{name}_straggler_ratio_max"] == max(o["straggler_ratio"] for o in group)
        assert s[f"{name}_bytes_per_op"] == group[0]["bytes"]
    reads = [o for o in s["ops"] if o["op"] == "read"]
    if reads:
        worst = max(o["resident_fraction"] for o in reads)
        assert s["read_resident_fraction_max"] == worst
        assert s["read_cold"] is (worst <= COLD)
        assert s["read_verified"] is (s["read_mismatches"] == 0)
    else:
        assert "read_cold" not in s and "read_verified" not in s


@settings(max_examples=50, deadline=None)
@given(runs(), st.randoms(use_true_random=False))
def test_summary_is_order_independent(records: list[dict[str, Any]], rnd: random.Random) -> None:
    shuffled = records[:]
    rnd.shuffle(shuffled)
    assert summarize(shuffled, max_resident_fraction=COLD) == summarize(records, max_resident_fraction=COLD)


# ---------------------------------------------------------------------------------------------
# asynchronous and tiered checkpoints (records format 2)


def async_write(index: int, rank: int, off_s: float, t0: float, bp: float, snap: float, persist: float,
                exposed: float, compute: float, nbytes: int) -> dict[str, Any]:
    """An async write on a rank whose clock is offset by ``off_s``: the stall is ``bp`` of waiting
    plus a ``snap``-second snapshot, then a ``persist``-second durable write in the background."""
    def ns(x: float) -> int:
        return round((off_s + x) * S)
    staged = t0 + bp + snap
    return {"op": "write", "index": index, "checkpoint": index, "rank": rank, "host": f"h{rank}",
            "t0_ns": ns(t0), "t1_ns": ns(staged + persist), "bytes": nbytes, "files": 1, "fsync": True,
            "direct": True, "dontcache": False, "mode": "async", "staged_ns": ns(staged),
            "backpressure_ns": round(bp * S), "exposed_ns": round(exposed * S),
            "compute_ns": round(compute * S),
            "stages": [{"tier": "memory", "t0_ns": ns(t0 + bp), "t1_ns": ns(staged), "bytes": nbytes},
                       {"tier": "durable", "t0_ns": ns(staged), "t1_ns": ns(staged + persist),
                        "bytes": nbytes}]}


def two_async_checkpoints() -> list[dict[str, Any]]:
    """Two ranks (clocks 1000 s apart), 4 GiB each.  Checkpoint 1 at 0: a 0.5 s snapshot, a 2 s
    persist, 1 s of training.  Checkpoint 2 at 1.5 waits 1 s for checkpoint 1 (back-pressure),
    snapshots 0.5 s, persists 2 s; the final drain waits 1 s."""
    out = []
    for rank, off in ((0, 0.0), (1, 1000.0)):
        out.append(async_write(1, rank, off, 0.0, 0.0, 0.5, 2.0, 1.0, 1.0, 4 * GiB))
        out.append(async_write(2, rank, off, 1.5, 1.0, 0.5, 2.0, 1.0, 1.0, 4 * GiB))
    return out


def test_async_op_stats_known_numbers() -> None:
    recs = two_async_checkpoints()
    o1 = op_stats([r for r in recs if r["index"] == 1])
    o2 = op_stats([r for r in recs if r["index"] == 2])
    assert (o1.stall_s, o1.time_to_durable_s, o1.backpressure_s) == (0.5, 2.5, 0.0)
    assert (o2.stall_s, o2.time_to_durable_s, o2.backpressure_s) == (1.5, 3.5, 1.0)
    # write bandwidth is the durable tier's: 8 GiB in 2 s, not 8 GiB over time to durable
    assert (o1.duration_s, o1.bandwidth_gib_s) == (2.0, 4.0)
    assert o1.stages is not None and o1.stages["memory"].bandwidth_gib_s == 16.0
    assert o1.stages["durable"].duration_s == 2.0
    # background 2 s per rank, of which 1 s was waited for later: half of it hidden
    assert o1.overlap_efficiency == 0.5 and o2.overlap_efficiency == 0.5
    assert o1.compute_s == 1.0 and o1.tier is None


def test_async_summary_known_numbers() -> None:
    s = summarize(two_async_checkpoints(), max_resident_fraction=COLD)
    assert (s["mode"], s["tiers"]) == ("async", ["memory", "durable"])
    assert s["write_stall_mean_s"] == 1.0 and s["write_stall_max_s"] == 1.5
    assert s["write_time_to_durable_mean_s"] == 3.0
    assert s["write_bandwidth_mean_gib_s"] == 4.0 and s["write_duration_mean_s"] == 2.0
    assert s["write_memory_bandwidth_mean_gib_s"] == 16.0 and s["write_memory_duration_mean_s"] == 0.5
    assert (s["write_backpressure_ops"], s["write_backpressure_total_s"]) == (1, 1.0)
    assert s["write_overlap_efficiency"] == 0.5
    assert s["write_compute_mean_s"] == 1.0
    assert "write_fast_bandwidth_mean_gib_s" not in s


def test_sync_summary_has_no_background() -> None:
    s = summarize(three_writes_two_reads(), max_resident_fraction=COLD)
    assert (s["mode"], s["tiers"]) == ("sync", ["durable"])
    assert s["write_overlap_efficiency"] is None  # nothing ran behind training
    assert s["write_stall_mean_s"] == s["write_duration_mean_s"] == s["write_time_to_durable_mean_s"]
    assert s["write_backpressure_ops"] == 0


def test_fast_tier_restores_are_reported_apart() -> None:
    recs = [rec("write", 1, 0, 0, 1, GiB)]
    recs.append(rec("read", 1, 0, 10, 2.0, GiB, resident=GiB // 2))  # durable, half cached: not cold
    fast = rec("read", 2, 0, 20, 0.25, GiB, resident=GiB)  # fast tier (tmpfs): all resident
    fast["tier"] = "fast"
    recs.append(fast)
    s = summarize(recs, max_resident_fraction=COLD)
    assert s["read_bandwidth_mean_gib_s"] == 0.5 and s["read_bytes_per_op"] == GiB
    assert s["read_fast_bandwidth_mean_gib_s"] == 4.0 and s["read_fast_duration_mean_s"] == 0.25
    assert s["num_reads"] == 2
    assert s["read_resident_fraction_max"] == 0.5  # durable restores only
    assert s["read_cold"] is False
    assert [o["tier"] for o in s["ops"] if o["op"] == "read"] == ["durable", "fast"]
    only_fast = summarize([recs[0], fast], max_resident_fraction=COLD)
    assert "read_bandwidth_mean_gib_s" not in only_fast and only_fast["read_cold"] is True


@st.composite
def async_runs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Async runs: R ranks on unrelated clocks, W checkpoints, random stall, persist and training
    times (≥ 1 ns), exposed = the next checkpoint's back-pressure as the runner records it."""
    ranks, nw = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    out = []
    for r in range(ranks):
        off = draw(st.integers(0, 1 << 40)) / S
        t = 0.0
        times = [(draw(st.integers(1, 10 * S)) / S, draw(st.integers(1, 10 * S)) / S,
                  draw(st.integers(0, 10 * S)) / S) for _ in range(nw)]
        waits = []
        for snap, persist, compute in times:
            waits.append(max(0.0, persist - compute))  # what the next stall (or the end) waits
            del snap
        nbytes = draw(st.integers(1, 1 << 40))
        for k, (snap, persist, compute) in enumerate(times, 1):
            bp = waits[k - 2] if k > 1 else 0.0
            out.append(async_write(k, r, off, t, bp, snap, persist, waits[k - 1], compute, nbytes))
            t += bp + snap + compute
    return out


@settings(max_examples=100, deadline=None)
@given(async_runs())
def test_async_invariants(records: list[dict[str, Any]]) -> None:
    s = summarize(records, max_resident_fraction=COLD)
    by_op: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        by_op.setdefault(r["index"], []).append(r)
    for o in s["ops"]:
        recs = by_op[o["index"]]
        stall = max(r["staged_ns"] - r["t0_ns"] for r in recs) / 1e9
        assert o["stall_s"] == stall
        assert o["time_to_durable_s"] == max(r["t1_ns"] - r["t0_ns"] for r in recs) / 1e9
        assert o["stall_s"] <= o["time_to_durable_s"]
        assert o["backpressure_s"] <= o["stall_s"]
        assert 0.0 <= o["overlap_efficiency"] <= 1.0
        # the durable stage is inside [staged, t1], so its duration is at most the time to durable
        assert o["stages"]["durable"]["duration_s"] <= o["time_to_durable_s"]
    background = sum(r["t1_ns"] - r["staged_ns"] for r in records)
    exposed = sum(r["exposed_ns"] for r in records)
    assert math.isclose(s["write_overlap_efficiency"], 1 - exposed / background, abs_tol=1e-9)
    assert s["write_backpressure_ops"] == sum(1 for o in s["ops"] if o["backpressure_s"] > 0)
    assert s["write_stall_max_s"] == max(o["stall_s"] for o in s["ops"])


# ---------------------------------------------------------------------------------------------
# summary format 10: every rank timed from its host's first rank to leave the barrier


@st.composite
def shared_clock_op(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One write and one read on H hosts (clocks unrelated across hosts), each host's ranks on one
    clock, leaving the barrier up to 50 ms apart, each taking 1 ns to 100 s."""
    out = []
    hosts, per_host = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    for op in ("write", "read"):
        for h in range(hosts):
            barrier = draw(st.integers(0, 1 << 50))
            for i in range(per_host):
                t0 = barrier + draw(st.integers(0, 50_000_000))
                x = {"op": op, "index": 1, "checkpoint": 1, "rank": h * per_host + i, "host": f"h{h}",
                     "t0_ns": t0, "t1_ns": t0 + draw(st.integers(1, 100 * S)),
                     "bytes": draw(st.integers(1, 1 << 40)), "files": 1, "fsync": True, "direct": True,
                     "dontcache": False}
                if op == "read":
                    x.update(resident_bytes=0, cached_check_bytes=x["bytes"], verified_bytes=x["bytes"],
                             mismatches=0, tier="durable")
                else:
                    x.update(sync_fields(x))
                out.append(x)
    return out


@settings(max_examples=100, deadline=None)
@given(shared_clock_op(), st.data())
def test_a_start_moved_later_changes_no_figure(records: list[dict[str, Any]], data: st.DataObject) -> None:
    s = summarize(records, max_resident_fraction=COLD)
    assert s["summary_format"] >= 10  # every rank timed from the barrier since format 10
    for o in s["ops"]:
        mine = [r for r in records if r["op"] == o["op"]]
        hosts = {h: [r for r in mine if r["host"] == h] for h in {r["host"] for r in mine}}
        spans = [max(r["t1_ns"] for r in hr) - min(r["t0_ns"] for r in hr) for hr in hosts.values()]
        assert o["duration_s"] == max(spans) / 1e9  # from the host's barrier to its last rank's end
    per_rank = summarize(records, max_resident_fraction=COLD, summary_format=9)
    for new, old in zip(s["ops"], per_rank["ops"], strict=True):
        assert new["duration_s"] >= old["duration_s"]
    # any rank but its host's first says it left later, anywhere before its end: nothing changes
    first: dict[tuple[str, str], int] = {}
    for r in records:
        key = (r["op"], r["host"])
        first[key] = min(first.get(key, r["t0_ns"]), r["t0_ns"])
    edited = []
    for r in records:
        r = {**r, "stages": [dict(st_) for st_ in r.get("stages", ())]} if "stages" in r else dict(r)
        if r["t0_ns"] != first[(r["op"], r["host"])]:
            later = data.draw(st.integers(r["t0_ns"], r["t1_ns"] - 1))
            for st_ in r.get("stages", ()):
                if st_["t0_ns"] == r["t0_ns"]:
                    st_["t0_ns"] = later
            r["t0_ns"] = later
        edited.append(r)
    assert summarize(edited, max_resident_fraction=COLD) == s
