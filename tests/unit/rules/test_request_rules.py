"""REQUESTS-PLANNED and REQUESTS-BUSY (rules 1.17) on records built here: the count the engine
must issue, and the least a histogram's requests add up to, against the plan and io.threads."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mlckpt import latency
from mlckpt.engine.content import round_up
from mlckpt.engine.files import RequestPlan
from mlckpt.plan.config import compose
from mlckpt.rules import RunData, load_rules
from mlckpt.rules.engine import Context, Outcome
from mlckpt.workload.layout import file_requests, make_plan
from mlckpt.workload.model import workload_from_config

RS = load_rules("1.17")
MiB = 1 << 20


@given(st.lists(st.integers(1, 64 * MiB), min_size=1, max_size=8), st.integers(1, 64).map(lambda n: n * 4096),
       st.booleans())
def test_the_rules_count_is_the_engines(sizes: list[int], block_size: int, direct: bool) -> None:
    lengths = [round_up(n) if direct else n for n in sizes]  # mlckpt.engine.files.layout
    assert sum(file_requests(n, block_size, direct) for n in sizes) == RequestPlan(lengths, block_size).total


def _run(records: list[dict[str, Any]], **io: int) -> Context:
    config = compose(["division=open", "scale=0.0005", "ranks=4"])
    config["io"].update(io)
    workload = workload_from_config(config["workload"])
    plan = make_plan(workload, 4, 0.0005)
    data = RunData({"records_format": 11, "rank_shift": 0}, config, {}, records, {})
    return Context(config, workload, (), plan, run=data, complete=True)


def _record(rank: int, latencies_ms: list[float], dur_ms: float, *, op: str = "write") -> dict[str, Any]:
    return {"op": op, "index": 1, "checkpoint": 1, "rank": rank, "host": "h", "t0_ns": 0,
            "t1_ns": int(dur_ms * 1e6), "direct": True,
            "requests": latency.encode(int(v * 1e6) for v in latencies_ms)}


def _planned(rank: int, op: str = "write") -> int:
    ctx = _run([])
    assert ctx.plan is not None
    files = ctx.plan.rank_plans[rank].files
    return sum(file_requests(f.bytes, int(ctx.config["io"]["block_size"]), True) for f in files)


def _failures(check: str, ctx: Context) -> list[Outcome]:
    rule = next(r for r in RS.rules if r.check == check)
    return [o for o in RS.checks[check](ctx, RS, rule) if isinstance(o, Outcome) and not o.ok]


def test_the_planned_count_passes_and_a_reencoded_histogram_fails() -> None:
    n = _planned(0)
    assert n >= 2
    honest = _record(0, [20.0] * n, 40.0)
    assert _failures("requests_planned", _run([honest])) == []
    forged = _record(0, [5.0] * (4 * n), 40.0)  # four times the requests at a quarter of the latency
    [failure] = _failures("requests_planned", _run([forged]))
    assert failure.expected.startswith(f"{n} requests (one per io.block_size=4194304 piece")
    assert failure.actual == str(4 * n) and failure.where == "write 1, rank 0"


def test_requests_fit_in_the_op_with_the_threads_in_flight() -> None:
    n = _planned(0)
    # n requests of 20 ms each, 4 in flight: the op lasts at least n / 4 × 20 ms
    fits = _record(0, [20.0] * n, -(-n // 4) * 20.0)
    assert _failures("requests_busy", _run([fits], threads=4)) == []
    cut = _record(0, [20.0] * n, 21.0)  # cut to just above its longest request
    failures = _failures("requests_busy", _run([cut], threads=min(4, n - 1)))
    assert [f.actual.endswith("ms of requests") for f in failures] == [True]
    assert failures[0].expected.startswith(f"requests adding up to at most io.threads={min(4, n - 1)}")


def test_the_floor_is_a_lower_bound_of_the_requests_time() -> None:
    values = [1_000, 12_345, 987_654, 20_000_000, 20_000_000]
    block = latency.encode(values)
    assert block is not None
    facts = latency.block_facts(latency.decode(block))
    assert sum(values) * (1 - latency.RELATIVE_ERROR) <= facts.floor_ns <= sum(values)
