"""Rules 1.8's and 1.9's view of a busy machine, without MPI: the device's bytes split into the
run's and other tenants' (mlckpt.attribution, and the kernel's accounting it reads), the bounds each
host's calibration gives, FOREIGN-IO (1.9: judged over a horizon long enough, and the device's
background with the run idle) and the verdict ``disturbed``.  Real runs beside a real tenant are
in tests/mpi/test_environment.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlckpt import attribution
from mlckpt.attribution import foreign_note
from mlckpt.host import facts
from mlckpt.rules import load_rules
from mlckpt.rules.checks.counters import counters_late, device_counters, device_counters_framed
from mlckpt.rules.checks.evidence import start_skew
from mlckpt.rules.checks.foreign_io import foreign_io
from mlckpt.rules.checks.timing import abs_bound_ns
from mlckpt.rules.engine import Context, Finding, NotChecked, Outcome, make_finding, verdict
from mlckpt.rules.rundata import RunData
from mlckpt.run.phases.calibrate import host_samples

MiB = 1 << 20
CONFIG = {
    "checkpoint": {"fsync": True, "mode": "sync", "tiers": {"fast": None}, "num_writes": 2},
    "io": {"direct": True, "dontcache": False},
}


def sample(
    t_ns: int, device: int, own: int, busy_ns: int = 0, own_cpu_ns: int = 0, **extra: int
) -> dict[str, int]:
    """A counters sample: ``device`` bytes written by the device so far, ``own`` by the ranks."""
    return {
        "t_ns": t_ns,
        "read_bytes": 0,
        "written_bytes": device,
        "own_read_bytes": 0,
        "own_written_bytes": own,
        "cpu_busy_ns": busy_ns,
        "own_cpu_ns": own_cpu_ns,
        "cached_bytes": 10 * MiB,
        "shmem_bytes": 0,
        "dirty_bytes": 0,
        "writeback_bytes": 0,
        **extra,
    }


def write(
    rank: int,
    index: int,
    t0: int,
    dur: int,
    nbytes: int,
    counters: dict[str, Any] | None = None,
    host: str = "h",
) -> dict[str, Any]:
    rec = {
        "op": "write",
        "index": index,
        "checkpoint": index,
        "rank": rank,
        "host": host,
        "t0_ns": t0,
        "t1_ns": t0 + dur,
        "staged_ns": t0 + dur,
        "wall_start": 1e9 + t0 / 1e9,
        "bytes": nbytes,
        "files": 1,
        "fsync": True,
        "direct": True,
        "dontcache": False,
        "mode": "sync",
    }
    if counters is not None:
        rec["host_counters"] = {"device": "8:0", "cpus": 2, **counters}
    return rec


def op(
    index: int,
    t0: int,
    dur: int,
    own: int,
    foreign: int,
    base: tuple[int, int],
    cpu: tuple[int, int] = (0, 0),
    ranks: int = 2,
) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    """One write op of ``ranks`` ranks moving ``own`` bytes beside ``foreign`` other bytes; ``base``:
    the device's and the ranks' counters before it.  Returns the records and the counters after."""
    dev0, own0 = base
    before = sample(t0 - 20_000, dev0, own0)
    after = sample(t0 + dur + 2_000_000, dev0 + own + foreign, own0 + own, busy_ns=cpu[0], own_cpu_ns=cpu[1])
    recs = [
        write(
            r,
            index,
            t0 + 1000 * r,
            dur - 1000 * r - 7 * index,
            own // ranks,
            {"before": before, "after": after} if r == 0 else None,
        )
        for r in range(ranks)
    ]
    return recs, (dev0 + own + foreign, own0 + own)


def calibration(
    ranks: int = 2, skew: int = 200_000, head: int = 5_000, tail: int = 3_000_000
) -> dict[str, Any]:
    """run.json's calibration of host ``h``: 16 rounds of the same samples."""
    return {
        "rounds": 16,
        "hosts": [
            {
                "host": "h",
                "ranks": ranks,
                "skew_ns": [skew] * 16,
                "head_ns": [head] * 16,
                "tail_ns": [tail] * 16,
            }
        ],
    }


def background(foreign: int, seconds: float = 1.0, own: int = 0, host: str = "h") -> dict[str, Any]:
    """A host's calibration entry's ``background`` (run format 9): ``foreign`` bytes moved by other
    processes, ``own`` by the ranks, over ``seconds`` of the run asleep."""
    return {"device": "8:0", "before": sample(0, 10**12, 10**11),
            "after": sample(int(seconds * 1e9), 10**12 + foreign + own, 10**11 + own)}


def run_of(records: list[dict[str, Any]], cal: dict[str, Any] | None = None) -> RunData:
    return RunData(
        {"records_format": 6, "calibration": cal or calibration()},
        CONFIG,
        {},
        records,
        {"hosts": [{"hostname": "h", "filesystem": {"fs_type": "ext4"}, "block_device": "8:0"}]},
    )


def failed(check: Any, rule: str, d: RunData, version: str = "1.8") -> list[Outcome | NotChecked]:
    rs = load_rules(version)
    ctx = Context({}, None, (), run=d)  # type: ignore[arg-type]
    return [o for o in check(ctx, rs, rs.rule(rule)) if isinstance(o, NotChecked) or not o.ok]


def two_writes(
    foreign: tuple[int, int],
    between_foreign: int = 0,
    between_own: int = 0,
    cpu: tuple[int, int] = (0, 0),
    dur: int = 400_000_000,
) -> list[dict[str, Any]]:
    a, (dev, own) = op(1, 10**9, dur, 200 * MiB, foreign[0], (0, 0), cpu)
    b, _ = op(
        2,
        2 * 10**9,
        dur,
        200 * MiB,
        foreign[1],
        (dev + between_foreign + between_own, own + between_own),
        cpu,
    )
    return a + b


# ------------------------------------------------------------------------------ attribution
def test_a_window_splits_the_devices_bytes_into_the_runs_and_everyone_elses() -> None:
    w = attribution.window(
        sample(0, 100, 40, busy_ns=0, own_cpu_ns=0),
        sample(10**9, 400, 240, busy_ns=15 * 10**8, own_cpu_ns=5 * 10**8),
        cpus=2,
    )
    assert w is not None
    assert (w.device_bytes, w.own_bytes, w.foreign_bytes) == (300, 200, 100)
    assert w.foreign_share == pytest.approx(1 / 3)
    assert w.foreign_cpu_ns == 10**9 and w.window_ns == 10**9 and w.cpus == 2
    # the ranks' own bytes past the device's (a page dirtied twice, counted once) are no one else's
    assert attribution.window(sample(0, 0, 0), sample(1, 10, 50)).foreign_bytes == 0  # type: ignore[union-attr]
    # a sample without the ranks' accounting (records format 3-5, or /proc unreadable) splits nothing
    plain = {"t_ns": 0, "read_bytes": 0, "written_bytes": 0}
    assert attribution.window(plain, sample(1, 10, 5)) is None


@given(st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**40))
def test_foreign_bytes_are_never_negative_nor_more_than_the_device_moved(
    dev: int, own: int, start: int
) -> None:
    w = attribution.window(sample(0, start, start), sample(10**9, start + dev, start + own))
    assert w is not None and 0 <= w.foreign_bytes <= w.device_bytes and 0 <= w.foreign_share <= 1


def test_the_summary_block_weighs_each_phase_and_names_the_worst_op() -> None:
    recs = two_writes((50 * MiB, 10 * MiB), between_foreign=300 * MiB)
    s = attribution.foreign_summary(recs, lambda r: True, 0)
    assert s is not None and s["read"] is None
    w = s["write"]
    assert (w["ops"], w["own_bytes"], w["foreign_bytes"]) == (2, 400 * MiB, 60 * MiB)
    assert w["foreign_share"] == pytest.approx(60 / 460, abs=1e-6)
    assert w["worst"] == {
        "index": 1,
        "host": "h",
        "foreign_bytes": 50 * MiB,
        "foreign_share": pytest.approx(50 / 250, abs=1e-6),
    }
    assert s["between_ops_bytes"] == 300 * MiB
    assert attribution.foreign_summary(recs, lambda r: False, 0) is None  # no weighed op: nothing to say


# ------------------------------------------------------------------------------ FOREIGN-IO
def test_foreign_io_is_quiet_under_the_share_and_says_disturbed_past_it() -> None:
    share = load_rules("1.8").data["attribution"]["max_foreign_share"]
    own = 200 * MiB
    under = int(own * share / (1 - share) * 0.9)
    over = int(own * share / (1 - share) * 1.2)
    assert failed(foreign_io, "FOREIGN-IO", run_of(two_writes((under, under)))) == []
    [bad] = failed(foreign_io, "FOREIGN-IO", run_of(two_writes((over, over))))
    assert isinstance(bad, Outcome)
    assert (
        f"{2 * over} B" in bad.actual
        and "most during write 1" in bad.actual
        and bad.where == "host h, writes 1-2"
    )
    assert load_rules("1.8").rule("FOREIGN-IO").severity == "disturbed"
    # one op that met a burst does not spoil the phase's mean by itself
    assert failed(foreign_io, "FOREIGN-IO", run_of(two_writes((over, 0)))) == []


def test_foreign_io_counts_other_processes_cpu_time_over_windows_long_enough_to_tell() -> None:
    a = load_rules("1.8").data["attribution"]
    dur = int(a["min_window_s"] * 1.2e9)
    window = dur + 2_020_000  # the op's counters' window
    hog = int(2 * window * (a["max_foreign_cpu_share"] + 0.02))  # both CPUs, past the share, none the ranks'
    [bad] = failed(foreign_io, "FOREIGN-IO", run_of(two_writes((0, 0), cpu=(hog + 10**6, 10**6), dur=dur)))
    assert isinstance(bad, Outcome) and "2 CPUs" in bad.expected
    assert (
        failed(foreign_io, "FOREIGN-IO", run_of(two_writes((0, 0), cpu=(hog, hog), dur=dur))) == []
    )  # the ranks'
    # windows of 40 ms: the kernel's 10 ms ticks cannot tell, so neither judged nor shown
    short = two_writes((0, 0), cpu=(10**9, 0), dur=40_000_000)
    assert failed(foreign_io, "FOREIGN-IO", run_of(short)) == []
    assert (
        attribution.foreign_summary(short, lambda r: True, a["min_window_s"] * 1e9)["write"][
            "foreign_cpu_share"
        ]
        is None
    )


def test_a_share_over_ops_too_short_to_tell_a_burst_is_shown_not_judged() -> None:
    a = load_rules("1.8").data["attribution"]
    short = int(a["min_window_s"] * 1e9 / 4)  # two ops, half the horizon in all
    over = 400 * MiB  # twice the run's own bytes in each op: a share of 2/3
    recs = two_writes((over, over), dur=short)
    assert failed(foreign_io, "FOREIGN-IO", run_of(recs)) == []
    summary = attribution.foreign_summary(recs, lambda r: True, a["min_window_s"] * 1e9)
    assert summary["write"]["foreign_share"] == pytest.approx(2 / 3, abs=1e-3)  # shown all the same
    assert summary["span"]["foreign_bytes"] == 2 * over and summary["span"]["host"] == "h"


def test_a_tenant_that_keeps_the_device_busy_between_the_ops_too_is_disturbing() -> None:
    a = load_rules("1.8").data["attribution"]
    # the device moved 200 MiB in a 0.4 s op at most; another tenant moved 2 GiB over the ~1.4 s span
    recs = two_writes((0, 0), between_foreign=2 << 30)
    [bad] = failed(foreign_io, "FOREIGN-IO", run_of(recs))
    assert isinstance(bad, Outcome) and bad.where == "host h, from the first timed op to the last"
    assert f"{2 << 30} B (2.00 GiB) moved on device 8:0 by other processes in 1.40 s" in bad.actual
    span = attribution.spans(recs, lambda r: True)[0]
    assert span.foreign_rate_share > a["max_foreign_rate_share"]
    # a tenant at a tenth of that rate is shown, and the run stays valid
    calm = two_writes((0, 0), between_foreign=200 << 20)
    assert failed(foreign_io, "FOREIGN-IO", run_of(calm)) == []
    assert 0 < attribution.spans(calm, lambda r: True)[0].foreign_rate_share < a["max_foreign_rate_share"]


def test_foreign_io_says_why_it_cannot_judge_a_run_without_attribution() -> None:
    recs = two_writes((0, 0))
    for r in recs:
        for s in r.get("host_counters", {}).get("before", {}), r.get("host_counters", {}).get("after", {}):
            s.pop("own_written_bytes", None)
    [why] = failed(foreign_io, "FOREIGN-IO", run_of(recs))
    assert isinstance(why, NotChecked) and "object storage" in why.reason


def test_disturbed_ranks_below_invalid_and_above_open() -> None:
    def f(sev: str) -> Finding:
        return Finding("R", sev, "m")

    assert verdict([f("disturbed"), f("open")], "closed") == "disturbed"
    assert verdict([f("disturbed"), f("invalid")], "open") == "invalid"
    assert verdict([f("warning")], "open") == "open"


# ------------------------------------------------------------------------------ FOREIGN-IO, rules 1.9
def with_background(foreign: int, own: int = 0) -> dict[str, Any]:
    """The default calibration of host ``h`` with a background window of one second."""
    cal = calibration()
    return {**cal, "hosts": [{**cal["hosts"][0], "background": background(foreign, own=own)}]}


def test_rules_1_9_judge_a_phases_share_only_over_a_horizon_long_enough() -> None:
    a = load_rules("1.9").data["attribution"]
    assert a["min_window_s"] > load_rules("1.8").data["attribution"]["min_window_s"]
    own = 200 * MiB
    over = int(own * a["max_foreign_share"] / (1 - a["max_foreign_share"]) * 1.6)  # past 1.8's share too
    under = int(own * a["max_foreign_share"] / (1 - a["max_foreign_share"]) * 0.9)
    quiet = with_background(0)
    short = two_writes((over, over))  # 0.8 s of ops: judged under 1.8, a burst's length under 1.9
    assert failed(foreign_io, "FOREIGN-IO", run_of(short, quiet), "1.9") == []
    assert failed(foreign_io, "FOREIGN-IO", run_of(short), "1.8") != []
    long = int(a["min_window_s"] * 1e9 / 2 * 1.1)  # two ops, past the horizon
    [bad] = failed(foreign_io, "FOREIGN-IO", run_of(two_writes((over, over), dur=long), quiet), "1.9")
    assert isinstance(bad, Outcome) and bad.where == "host h, writes 1-2" and f"{2 * over} B" in bad.actual
    assert failed(foreign_io, "FOREIGN-IO", run_of(two_writes((under, under), dur=long), quiet), "1.9") == []


def test_rules_1_9_judge_what_a_host_watched_with_the_run_asleep_and_during_its_ops() -> None:
    a = load_rules("1.9").data["attribution"]
    recs = two_writes((0, 0), dur=50_000_000)  # two 50 ms ops 1 s apart: 200 MiB each, 4 GiB/s at most
    span = attribution.spans(recs, lambda r: True)[0]
    peak, seconds = span.peak_bytes_per_ns * 1e9, 1 + span.window.window_ns / 1e9
    flood = int(peak * seconds * (a["max_watched_rate_share"] + 0.05))  # all of it with the run asleep
    [bad] = failed(foreign_io, "FOREIGN-IO", run_of(recs, with_background(flood)), "1.9")
    assert isinstance(bad, Outcome) and bad.where == "host h, before and during the timed ops"
    assert f"{flood} B" in bad.actual
    assert f"moved on device 8:0 by other processes in {seconds:.2f} s" in bad.actual
    assert "with the run asleep before its first op" in bad.actual
    [bg] = attribution.backgrounds(run_of(recs, with_background(flood)).run)
    share = attribution.watched_rate_share(bg, span)
    assert share == pytest.approx(a["max_watched_rate_share"] + 0.05, rel=1e-3)
    # the same bytes between the ops instead count the same: the horizon is the host's whole watch
    between = two_writes((0, 0), between_foreign=flood, dur=50_000_000)
    assert failed(foreign_io, "FOREIGN-IO", run_of(between, with_background(0)), "1.9") != []
    # a steady tenant at a fifth of the device's peak, and the ranks' own bytes, disturb nothing
    calm = with_background(int(peak / 5), own=flood)
    assert failed(foreign_io, "FOREIGN-IO", run_of(recs, calm), "1.9") == []
    # a bundle whose background window is gone cannot be shown undisturbed (stripping it would
    # hide a tenant); rules 1.8 knew no background and judge the same bundle as they did
    [gone] = failed(foreign_io, "FOREIGN-IO", run_of(recs), "1.9")
    assert isinstance(gone, Outcome) and gone.actual == "none recorded"
    assert failed(foreign_io, "FOREIGN-IO", run_of(recs, with_background(flood)), "1.8") == []


# ------------------------------------------------------------------------------ DEVICE-COUNTERS
def test_another_tenants_bytes_between_ops_are_no_dropped_op_but_the_runs_own_are() -> None:
    assert (
        failed(device_counters, "DEVICE-COUNTERS", run_of(two_writes((0, 0), between_foreign=2 << 30))) == []
    )
    [bad] = failed(device_counters, "DEVICE-COUNTERS", run_of(two_writes((0, 0), between_own=200 * MiB)))
    assert isinstance(bad, Outcome) and "by the ranks between consecutive ops" in bad.expected
    # under rules 1.7 the device's total is the run's: the same tenant was a dropped op
    old = run_of(two_writes((0, 0), between_foreign=2 << 30))
    assert any(
        "by the device between" in str(o.expected)
        for o in failed(device_counters, "DEVICE-COUNTERS", old, "1.7")
    )


def test_the_page_cache_may_grow_by_what_other_processes_moved_not_by_the_runs_bytes() -> None:
    recs = two_writes((300 * MiB, 0))
    hc = recs[0]["host_counters"]
    hc["after"]["cached_bytes"] = hc["before"]["cached_bytes"] + 290 * MiB  # the tenant's reads
    assert failed(device_counters, "DEVICE-COUNTERS", run_of(recs)) == []
    hc["after"]["cached_bytes"] = hc["before"]["cached_bytes"] + 300 * MiB + 200 * MiB  # and the run's own
    [bad] = failed(device_counters, "DEVICE-COUNTERS", run_of(recs))
    assert isinstance(bad, Outcome) and "O_DIRECT" in bad.expected and "other processes" in bad.expected


def test_the_runs_own_bytes_cannot_exceed_the_devices() -> None:
    recs = two_writes((0, 0))
    recs[0]["host_counters"]["after"]["own_written_bytes"] += 100 * MiB  # hides a tenant as the run's own
    assert any(
        "at most the" in str(o.expected) for o in failed(device_counters, "DEVICE-COUNTERS", run_of(recs))
    )


@pytest.mark.parametrize(("side", "field"), [("after", "written_bytes"), ("before", "cached_bytes"),
                                             ("after", "t_ns"), ("before", "read_bytes")])
def test_a_counter_sample_without_a_field_is_a_finding_never_a_checker_fault(side: str, field: str) -> None:
    """A signed bundle whose host counters lack a field the rule reads (the released schemas
    require only t_ns): DEVICE-COUNTERS fails naming it, where it raised KeyError (exit 4)."""
    recs = two_writes((0, 0))
    del recs[0]["host_counters"][side][field]
    found = failed(device_counters, "DEVICE-COUNTERS", run_of(recs))
    assert any(isinstance(o, Outcome) and o.actual == f"{side} sample without {field}" for o in found), found
    recs[0]["host_counters"][side][field] = "12"  # a string where a count belongs: the same
    assert any(isinstance(o, Outcome) and o.actual == f"{side} sample without {field}"
               for o in failed(device_counters, "DEVICE-COUNTERS", run_of(recs)))


def test_a_busy_hosts_late_counters_disturb_under_1_12_and_an_op_outside_them_is_invalid() -> None:
    """Seen beside the tenant and the test suite: an honest run's counters read 182.5 ms after its
    op, past the 166.7 ms its host allows.  1.11 called that invalid; 1.12 calls it disturbed
    (COUNTERS-LATE) with the same figures, and keeps what no busy host explains invalid."""
    recs = two_writes((0, 0))
    first = [r for r in recs if r["index"] == 1]
    last_end = max(r["t1_ns"] for r in first)
    tail_allowed = 0.15e9 + 0.2 * 400_000_000  # the tail floor + tail_rel of the op (calibrated 3 ms)
    recs[0]["host_counters"]["after"]["t_ns"] = last_end + int(tail_allowed) + 20_000_000
    [old] = failed(device_counters, "DEVICE-COUNTERS", run_of(recs), "1.11")
    assert isinstance(old, Outcome) and old.actual == f"{(tail_allowed + 20e6) / 1e6:.1f} ms"
    assert old.expected == f"the op ends at most {tail_allowed / 1e6:.1f} ms before the counters were read"
    assert failed(device_counters_framed, "DEVICE-COUNTERS", run_of(recs), "1.12") == []
    [late] = failed(counters_late, "COUNTERS-LATE", run_of(recs), "1.12")
    assert isinstance(late, Outcome) and (late.expected, late.actual, late.where) == (
        old.expected, old.actual, "write 1 on h")
    rs = load_rules("1.12")
    finding = make_finding(rs.rule("COUNTERS-LATE"), late)
    assert verdict([finding], "open") == "disturbed"
    assert "a host too busy to start or read them in time" in finding.message
    # within the allowance: nothing from either
    recs[0]["host_counters"]["after"]["t_ns"] = last_end + int(tail_allowed) - 20_000_000
    assert failed(counters_late, "COUNTERS-LATE", run_of(recs), "1.12") == []
    # a rank that ended after the counters were read, or a leader that started before its first
    # counters, is no busy host: still invalid, and never COUNTERS-LATE's
    recs[0]["host_counters"]["after"]["t_ns"] = last_end - 5_000_000
    [after] = failed(device_counters_framed, "DEVICE-COUNTERS", run_of(recs), "1.12")
    assert isinstance(after, Outcome) and after.actual == "5.0 ms after"
    assert failed(counters_late, "COUNTERS-LATE", run_of(recs), "1.12") == []
    recs[0]["host_counters"]["after"]["t_ns"] = last_end + 2_000_000
    recs[0]["host_counters"]["before"]["t_ns"] = recs[0]["t0_ns"] + 1_000_000
    [early] = failed(device_counters_framed, "DEVICE-COUNTERS", run_of(recs), "1.12")
    assert isinstance(early, Outcome) and early.actual == "-1.0 ms"
    assert failed(counters_late, "COUNTERS-LATE", run_of(recs), "1.12") == []
    # seen beside the tenant: 64 ranks on 2 cores started 564 ms after their leader's counters,
    # past the 250 ms allowed; 1.11 called it invalid, 1.12 disturbed
    head_allowed = 0.1e9 + 0.2 * 400_000_000  # the head floor + head_rel of the op
    recs[0]["host_counters"]["before"]["t_ns"] = recs[0]["t0_ns"] - int(head_allowed) - 300_000_000
    [old_head] = failed(device_counters, "DEVICE-COUNTERS", run_of(recs), "1.11")
    assert isinstance(old_head, Outcome) and old_head.actual == f"+{(head_allowed + 300e6) / 1e6:.1f} ms"
    assert failed(device_counters_framed, "DEVICE-COUNTERS", run_of(recs), "1.12") == []
    [late_head] = failed(counters_late, "COUNTERS-LATE", run_of(recs), "1.12")
    assert isinstance(late_head, Outcome) and (late_head.expected, late_head.actual) == (
        old_head.expected, old_head.actual)


def test_rules_1_12_and_mlps_r5_change_only_the_late_counters() -> None:
    for old, new in (("1.11", "1.12"), ("mlps-v3.0r4", "mlps-v3.0r5")):
        a, b = load_rules(old), load_rules(new)
        own = {"version", "extends", "rules", "omit", "schemas"}  # what a rules.yaml says of itself
        assert {k: v for k, v in a.data.items() if k not in own} == {
            k: v for k, v in b.data.items() if k not in own}
        before = {r.id: (r.severity, r.check, r.message) for r in a.rules}
        after = {r.id: (r.severity, r.check, r.message) for r in b.rules}
        assert {k for k in after if after[k] != before.get(k)} == {"DEVICE-COUNTERS", "COUNTERS-LATE"}
        assert after["DEVICE-COUNTERS"] == ("invalid", "device_counters_framed", before["DEVICE-COUNTERS"][2])
        assert after["COUNTERS-LATE"][:2] == ("disturbed", "counters_late")
        assert set(before) <= set(after)


# ------------------------------------------------------------------------------ timing
def test_a_hosts_bounds_follow_its_calibration_between_floor_and_cap() -> None:
    rs = load_rules("1.8")
    t = rs.data["timing"]

    def bound(samples: list[int]) -> float:
        cal = {
            "rounds": 16,
            "hosts": [{"host": "h", "ranks": 2, "skew_ns": samples, "head_ns": samples, "tail_ns": samples}],
        }
        return abs_bound_ns(rs, run_of([], cal), "h", "skew_ns", 0.03)

    assert bound([1000] * 16) == t["skew_floor_s"] * 1e9  # a quiet machine: the floor
    assert bound([10_000_000] * 15 + [40_000_000]) == t["margin"] * 40_000_000  # its worst sample × margin
    assert bound([10**10] * 16) == t["cap_s"] * 1e9  # never past the cap
    # rules 1.7 keep their constant, whatever the bundle says
    assert abs_bound_ns(load_rules("1.7"), run_of([]), "h", "skew_ns", 0.03) == pytest.approx(0.03e9)


def test_records_skew_is_judged_by_the_hosts_own_calibration() -> None:
    dur = 400_000_000

    def recs(late_ns: int) -> list[dict[str, Any]]:
        return [write(0, 1, 10**9, dur, MiB), write(1, 1, 10**9 + late_ns, dur - late_ns, MiB)]

    rel = load_rules("1.8").data["evidence"]["start_skew"]["rel"] * dur
    busy = calibration(ranks=64, skew=80_000_000, tail=10**8)
    late = int(100e6 + rel)  # 100 ms past the relative part: beyond 1.7's 30 ms, inside 3 × 80 ms
    assert failed(start_skew, "RECORDS-SKEW", run_of(recs(late), busy)) == []
    quiet = run_of(recs(late))  # the default calibration: 0.2 ms → the floor
    assert any(
        "leave the barrier within" in str(o.expected) for o in failed(start_skew, "RECORDS-SKEW", quiet)
    )
    none = RunData({"records_format": 6, "calibration": None}, CONFIG, {}, recs(0), {})
    assert any(o.actual == "no calibration" for o in failed(start_skew, "RECORDS-SKEW", none))


def test_rules_1_10_raise_only_the_skew_floor_and_mlperf_follows() -> None:
    old, new = load_rules("1.9").data["timing"], load_rules("1.10").data["timing"]
    assert {k for k in old if old[k] != new[k]} == {"skew_floor_s"}
    assert new["skew_floor_s"] == 0.05 > old["skew_floor_s"]
    assert new["witness_floor_s"] == old["witness_floor_s"]  # what a witness allows stays 1.9's
    r3, r4 = load_rules("mlps-v3.0r3"), load_rules("mlps-v3.0r4")
    assert r4.data["timing"] == new and r4.data["training"] == load_rules("1.10").data["training"]
    from mlckpt.witness.client import DEFAULT_TIMEOUT_S  # TRAINING-INTERVAL allows the runner's wait

    assert r4.data["training"]["witness_timeout_default_s"] == DEFAULT_TIMEOUT_S
    # r4: r3's rules unchanged, then 1.10's rules on what the records and run.json say
    added = ["RECORDS-REQUESTS", "WORKLOAD-NAME", "RUN-CLAIMS", "TRAINING-INTERVAL", "SPLIT-EVIDENCE"]
    assert [(r.id, r.severity, r.message) for r in r4.rules][:len(r3.rules)] == [
        (r.id, r.severity, r.message) for r in r3.rules]
    assert [r.id for r in r4.rules][len(r3.rules):] == added
    assert {r.id: r.message for r in r4.rules if r.id in added} == {
        r.id: r.message for r in load_rules("1.10").rules if r.id in added}


def test_a_busy_hosts_barrier_is_honest_under_1_10_and_a_late_claim_past_the_floor_is_not() -> None:
    # Seen beside the tenant: 4 ranks under srun left a barrier 37.2 ms apart after a calibration
    # whose worst round was 3.3 ms (3 × 3.3 ms under 1.9's 10 ms floor).
    dur = 80_000_000
    cal = calibration(ranks=4, skew=3_300_000)

    def recs(late_ns: int) -> list[dict[str, Any]]:
        return [write(r, 1, 10**9 + (late_ns if r == 3 else 0), dur - (late_ns if r == 3 else 0), MiB)
                for r in range(4)]

    rel = load_rules("1.10").data["evidence"]["start_skew"]["rel"] * dur
    seen = recs(37_200_000)
    [bad] = failed(start_skew, "RECORDS-SKEW", run_of(seen, cal), "1.9")
    assert bad.actual == "rank 3 37.2 ms after the first"
    assert failed(start_skew, "RECORDS-SKEW", run_of(seen, cal), "1.10") == []
    past = recs(int(0.05e9 + rel) + 1_000_000)  # 1 ms past 1.10's floor and relative part
    [bad] = failed(start_skew, "RECORDS-SKEW", run_of(past, cal), "1.10")
    assert bad.expected == f"ranks of a host leave the barrier within {(0.05e9 + rel) / 1e6:.1f} ms"


def test_calibration_samples_per_host() -> None:
    # host a: ranks 0 and 1; host b: rank 2 (its own leader); two rounds
    bg = background(5 * MiB)
    rows = [
        ("a", 1, [(105, None, None), (210, None, None)], None),
        ("a", 0, [(100, 90, 150), (200, 195, 260)], bg),
        ("b", 2, [(7, 3, 20), (9, 8, 30)], None),  # no block device: no background
    ]
    a, b = host_samples(rows)
    assert a == {"host": "a", "ranks": 2, "skew_ns": [5, 10], "head_ns": [10, 5], "tail_ns": [45, 50],
                 "background": bg}
    assert b == {"host": "b", "ranks": 1, "skew_ns": [0, 0], "head_ns": [4, 1], "tail_ns": [13, 21]}
    [seen] = attribution.backgrounds({"calibration": {"rounds": 2, "hosts": [a, b]}})
    assert (seen.host, seen.device, seen.window.foreign_bytes) == ("a", "8:0", 5 * MiB)
    assert seen.foreign_bytes_per_s == pytest.approx(5 * MiB)
    assert attribution.backgrounds({"calibration": None}) == []  # before run format 9: none


# ------------------------------------------------------------------------------ the kernel
def test_the_kernel_charges_a_processes_synced_writes_to_it(tmp_path: Path) -> None:
    if facts.block_device(tmp_path) is None:
        pytest.skip(f"{tmp_path} has no block device (tmpfs, overlay): the kernel charges no disk bytes")
    me = [os.getpid()]
    before = facts.processes_io(me)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, os.urandom(8 * MiB))
        os.fsync(fd)
    finally:
        os.close(fd)
    after = facts.processes_io(me)
    assert before is not None and after is not None
    assert after["own_written_bytes"] - before["own_written_bytes"] >= 8 * MiB
    assert facts.processes_io([2**22 + 12345]) is None  # a process that is not there: no guess
    busy = facts.host_cpu_busy_ns()
    assert busy is not None and busy > 0
    s = facts.counters_sample(facts.block_device(tmp_path), me)
    assert {"own_read_bytes", "own_written_bytes", "own_cpu_ns", "cpu_busy_ns", "read_ns"} <= set(s)


# ------------------------------------------------------------------------------ what is shown
def test_the_checker_and_the_leaderboard_show_the_foreign_share() -> None:
    from checker.leaderboard.columns import COLUMN, fmt
    from checker.leaderboard.model import foreign_share

    summary = {"foreign": {"write": {"foreign_share": 0.142}, "read": {"foreign_share": 0.031}}}
    assert foreign_share(summary) == pytest.approx(0.142)
    assert fmt(100 * foreign_share(summary), COLUMN["foreign_pct"]) == "14"
    assert foreign_share({"foreign": None}) != foreign_share({"foreign": None})  # nan: not measured
    assert foreign_note(summary["foreign"]) == (
        "other processes moved 14% of the device's bytes during the writes, 3% during the restores"
    )
    assert foreign_note({"write": {"foreign_share": 0.001}, "read": None}) == ""  # (almost) nothing
