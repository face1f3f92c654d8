"""OWN-BYTES (rules 1.18) on records built here: what the kernel charged to a host's ranks over an op,
per direction, against what the host's records say they moved."""

from __future__ import annotations

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
