"""OWN-BYTES (rules 1.18) on records built here: what the kernel charged to a host's ranks over an op,
per direction, against what the host's records say they moved."""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mlckpt.plan.config import compose
from mlckpt.rules import RunData, load_rules
from mlckpt.rules.engine import Context, NotChecked, Outcome

RS = load_rules("1.18")
RULE = RS.rule("OWN-BYTES")
MiB = 1 << 20
SLACK = int(RULE.params["slack_bytes"])
FRACTION = float(RULE.params["fraction"])


def _ctx(records: list[dict[str, Any]], records_format: int = 11) -> Context:
    config = compose(["division=open", "scale=0.0005", "ranks=2"])
    data = RunData({"records_format": records_format}, config, {}, records, {})
    return Context(config, None, (), None, run=data, complete=True)


def _sample(t_ns: int, rd: int, wr: int) -> dict[str, int]:
    return {"t_ns": t_ns, "read_bytes": rd, "written_bytes": wr, "own_read_bytes": rd,
            "own_written_bytes": wr}


def _op(op: str, per_rank: int, *, own_read: int, own_written: int, direct: bool = True,
        device: str | None = "8:0", host: str = "h", resident: int = 0) -> list[dict[str, Any]]:
    """Two ranks' records of one op on one host, the first carrying the host's counters (the device
    moved what the ranks were charged)."""
    recs: list[dict[str, Any]] = []
    for rank in (0, 1):
        r: dict[str, Any] = {"op": op, "index": 1, "checkpoint": 1, "rank": rank, "host": host,
                             "t0_ns": 1000, "t1_ns": 2000 + rank, "bytes": per_rank, "direct": direct,
                             "fsync": True}
        if op == "read":
            r.update(tier="durable", resident_bytes=resident)
        recs.append(r)
    recs[0]["host_counters"] = {"device": device, "before": _sample(0, 10, 10),
                                "after": _sample(3000, 10 + own_read, 10 + own_written)}
    return recs


def _failures(records: list[dict[str, Any]]) -> list[Outcome]:
    return [o for o in RS.checks["own_bytes"](_ctx(records), RS, RULE) if isinstance(o, Outcome) and not o.ok]


@given(st.integers(64 * MiB, 4096 * MiB), st.integers(0, 2 * MiB), st.sampled_from(["write", "read"]))
def test_an_honest_op_passes_whatever_its_size(per_rank: int, noise: int, op: str) -> None:
    """The ranks' own bytes in the op's direction (plus a little metadata), none the other way."""
    moved = 2 * per_rank + noise
    own = ({"own_written": moved, "own_read": 0} if op == "write"
           else {"own_read": moved, "own_written": noise})
    assert _failures(_op(op, per_rank, **own)) == []


def test_another_tenants_bytes_charged_to_the_ranks_are_caught() -> None:
    per_rank = 100 * MiB
    [f] = _failures(_op("write", per_rank, own_written=2 * per_rank, own_read=203 * MiB))
    allowance = FRACTION * 2 * per_rank + SLACK
    assert f.expected == f"the host's ranks read at most {allowance:.0f} B during a write of {2 * per_rank} B"
    assert f.actual == f"{203 * MiB} B" and f.where == "write 1 on h"
    [f] = _failures(_op("read", per_rank, own_read=2 * per_rank, own_written=134 * MiB))
    assert f.expected.startswith("the host's ranks wrote at most") and f.actual == f"{134 * MiB} B"


def test_a_dropped_ranks_bytes_left_in_the_accounting_are_caught() -> None:
    """Three ranks wrote; the records say two did (the slowest dropped)."""
    per_rank = 100 * MiB
    [f] = _failures(_op("write", per_rank, own_written=3 * per_rank, own_read=0))
    assert f.expected.startswith(f"the host's ranks wrote at most the {2 * per_rank} B their records moved")


def test_an_op_the_ranks_did_not_move_is_caught_for_writes_and_direct_reads_only() -> None:
    per_rank = 100 * MiB
    [f] = _failures(_op("write", per_rank, own_written=per_rank, own_read=0))
    assert f.expected.startswith(f"the host's ranks wrote at least the {2 * per_rank} B")
    [f] = _failures(_op("read", per_rank, own_read=0, own_written=0))
    assert f.expected.startswith(f"the host's ranks read at least the {2 * per_rank} B")
    # resident pages before a restore are not read (COLD-READ judges how many may be)
    assert _failures(_op("read", per_rank, own_read=per_rank, own_written=0, resident=per_rank // 2)) == []
    # a buffered restore may find another rank's readahead in the cache: only bounded above
    assert _failures(_op("read", per_rank, own_read=0, own_written=0, direct=False)) == []


def test_what_the_kernel_does_not_account_is_not_judged() -> None:
    far_off = {"own_read": 999 * MiB, "own_written": 0}
    assert _failures(_op("write", 100 * MiB, device=None, **far_off)) == []  # object storage, tmpfs
    unattributed = _op("write", 100 * MiB, **far_off)
    for s in unattributed[0]["host_counters"].values():
        if isinstance(s, dict):
            s.pop("own_read_bytes")
    assert _failures(unattributed) == []
    old = _ctx(_op("write", 100 * MiB, **far_off), records_format=5)
    outcomes = list(RS.checks["own_bytes"](old, RS, RULE))
    assert [type(o) for o in outcomes] == [NotChecked]


# ------------------------------------------------------------------------------ rules 1.20
R20 = load_rules("1.20")


@functools.cache
def _config(mode: str) -> Any:
    return compose(["division=open", "scale=0.0005", "ranks=2", f"checkpoint.mode={mode}"])


def _outcomes(check: str, rule: str, records: list[dict[str, Any]], **run: Any) -> list[Outcome]:
    config = _config("async" if any(r.get("mode") == "async" for r in records) else "sync")
    data = RunData({"records_format": 12, **run}, config, {}, records, {})
    ctx = Context(data.config, None, (), None, run=data, complete=True)
    return [o for o in R20.checks[check](ctx, R20, R20.rule(rule)) if isinstance(o, Outcome) and not o.ok]


def test_a_buffered_restore_from_the_durable_tier_is_held_to_its_bytes_from_rules_1_20() -> None:
    """Each rank reads its own files (restore=own): a cold buffered read brings every byte through
    the block layer, so a restore that read nothing there (served from memory) is caught."""
    per_rank = 100 * MiB
    nothing = _op("read", per_rank, own_read=0, own_written=0, direct=False)
    [f] = _outcomes("own_bytes", "OWN-BYTES", nothing)
    assert f.expected.startswith(f"the host's ranks read at least the {2 * per_rank} B")
    assert _outcomes("own_bytes", "OWN-BYTES",
                     _op("read", per_rank, own_read=2 * per_rank, own_written=0, direct=False)) == []
    # pages resident before it are not read; a library's restore is judged above only
    assert _outcomes("own_bytes", "OWN-BYTES", _op("read", per_rank, own_read=0, own_written=0, direct=False,
                                                   resident=per_rank)) == []
    library = _op("read", per_rank, own_read=0, own_written=0, direct=False)
    for r in library:
        r["writer"] = "torch_save"
    assert _outcomes("own_bytes", "OWN-BYTES", library) == []


def _async_write(per_rank: int, *, own_written: int, stage_ms: tuple[int, int], direct: bool = True,
                 window_ms: tuple[int, int] = (0, 100)) -> list[dict[str, Any]]:
    """Two ranks' async write of one host: the stall ends at 100 ms; the durable stage from
    ``stage_ms``; the counters read over ``window_ms``."""
    ms = 1_000_000
    recs: list[dict[str, Any]] = []
    for rank in (0, 1):
        recs.append({"op": "write", "index": 1, "checkpoint": 1, "rank": rank, "host": "h", "t0_ns": 0,
                     "staged_ns": 100 * ms, "t1_ns": stage_ms[1] * ms, "bytes": per_rank, "direct": direct,
                     "fsync": True, "mode": "async",
                     "stages": [{"tier": "memory", "t0_ns": 0, "t1_ns": 100 * ms, "bytes": per_rank},
                                {"tier": "durable", "t0_ns": stage_ms[0] * ms, "t1_ns": stage_ms[1] * ms,
                                 "bytes": per_rank, "direct": direct}]})
    recs[0]["host_counters"] = {"device": "8:0", "before": _sample(window_ms[0] * ms, 0, 0),
                                "after": _sample(window_ms[1] * ms, 0, own_written)}
    return recs


def test_an_asynchronous_write_wrote_what_its_persist_had_time_for() -> None:
    per_rank = 500 * MiB
    # honest: the persist began at 100 ms and runs to 1100 ms; 10 % of it is inside the window
    # (90-200 ms), and the ranks wrote about that
    honest = _async_write(per_rank, own_written=100 * MiB, stage_ms=(100, 1100), window_ms=(0, 200))
    assert _outcomes("stall_writes", "STALL-WRITES", honest, mode="async") == []
    # a synchronous write presented as asynchronous: every byte written before the counters were read
    [f] = _outcomes("stall_writes", "STALL-WRITES",
                    _async_write(per_rank, own_written=2 * per_rank, stage_ms=(100, 1100),
                                 window_ms=(0, 110)))
    assert f.expected.startswith("the host's ranks wrote at most 3 × the 10485760 B their stages to files")
    assert f.actual == f"{2 * per_rank} B" and f.where == "write 1 on h"
    # the persist was said to run inside the window, but the ranks wrote nothing there
    [f] = _outcomes("stall_writes", "STALL-WRITES",
                    _async_write(per_rank, own_written=0, stage_ms=(0, 100), window_ms=(0, 110)))
    assert f.expected.startswith("the host's ranks wrote at least 1/3 of the 1048576000 B")


def test_a_buffered_persist_may_be_charged_at_once() -> None:
    """The page cache takes a buffered persist's bytes at memory speed: all of it may be charged
    as soon as it began, none of it need be."""
    per_rank = 500 * MiB
    for written in (0, 2 * per_rank):
        recs = _async_write(per_rank, own_written=written, stage_ms=(100, 1100), direct=False,
                            window_ms=(0, 110))
        assert _outcomes("stall_writes", "STALL-WRITES", recs, mode="async") == []
    before = _async_write(per_rank, own_written=2 * per_rank, stage_ms=(200, 1100), direct=False,
                          window_ms=(0, 110))
    [f] = _outcomes("stall_writes", "STALL-WRITES", before)  # not before it began
    assert f.expected.startswith("the host's ranks wrote at most 3 × the 0 B")


@given(st.integers(64 * MiB, 4096 * MiB), st.integers(0, 3), st.integers(0, 2 * MiB))
def test_an_object_op_charged_through_the_block_layer_is_caught(per_rank: int, case: int, noise: int) -> None:
    op = "write" if case % 2 else "read"
    honest = _op(op, per_rank, own_read=noise, own_written=noise, device=None)
    assert _outcomes("object_bytes", "OBJECT-BYTES", honest, storage={"kind": "s3"}) == []
    files = _op(op, per_rank, own_read=2 * per_rank if op == "read" else 0,
                own_written=2 * per_rank if op == "write" else 0, device=None)
    [f] = _outcomes("object_bytes", "OBJECT-BYTES", files, storage={"kind": "s3"})
    assert f.actual == f"{2 * per_rank} B" and "through the block layer" in f.expected
    assert _outcomes("object_bytes", "OBJECT-BYTES", files, storage={"kind": "posix"}) == []
