"""A load's figures recomputed from its ranks' records, and the records held to the plan they
claim (mlckpt/serving_metrics.py): honest records pass, and any forged count, strategy, identity or
byte is named."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt.serving_metrics import by_strategy, figures, held_to_plan
from mlckpt.workload.model import ModelShape
from mlckpt.workload.serving import STRATEGIES, ServingLayout
from mlckpt.workload.serving_load import LoadPlan, load_plan

L8B = ModelShape(4096, 32, 14336, 128256, 32, 8)
SCALE = 0.001


def plan_of(strategy: str, replicas: int = 3, tp: int = 2, groups: int = 2) -> LoadPlan:
    layout = ServingLayout("llama3_8b", L8B, tp, replicas)
    n = replicas * tp
    return load_plan(layout, strategy, [f"h{r * groups // n}" for r in range(n)], SCALE)


def honest(plan: LoadPlan, t0: int = 1_000_000_000) -> list[dict[str, Any]]:
    """The records an honest load of ``plan`` leaves: rank r ends 10 ms + r µs after the start."""
    return [{"rank": r.rank, "replica": r.replica, "shard": r.shard, "host": r.host,
             "strategy": plan.strategy, "t0_ns": t0 + r.rank, "t1_ns": t0 + 10_000_000 + 1000 * r.rank,
             "bytes": plan.shard_bytes(r.shard), "storage_bytes": r.storage_bytes,
             "node_tier_bytes": r.node_tier_bytes, "received_bytes": r.received_bytes,
             "resident_bytes": 0, "verified_bytes": plan.shard_bytes(r.shard)} for r in plan.ranks]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_honest_load_is_held_to_its_plan_and_its_figures_recomputed(strategy: str) -> None:
    plan = plan_of(strategy)
    recs = honest(plan)
    assert held_to_plan(plan, recs) == []
    f = figures(recs)
    # the last rank's end less the first rank's start
    assert f["ready_s"] == pytest.approx((10_000_000 + 5000) / 1e9)
    assert f["storage_bytes"] == plan.storage_bytes and f["placed_bytes"] == plan.placed_bytes
    assert f["effective_gb_s"] == pytest.approx(plan.placed_bytes / f["ready_s"] / 1e9)
    both = by_strategy([recs, honest(plan, t0=5)])
    assert both[strategy]["loads"] == 2 and both[strategy]["ready_s"] == pytest.approx(f["ready_s"])


def test_a_forged_strategy_is_named_by_the_bytes_it_could_not_have_read() -> None:
    """Direct loading's records relabelled fan-out: each rank read its whole shard, received nothing."""
    recs = [{**r, "strategy": "fanout"} for r in honest(plan_of("direct"))]
    problems = held_to_plan(plan_of("fanout"), recs)
    assert problems and all("storage_bytes" in p or "received_bytes" in p for p in problems)
    assert any(p.startswith("rank 0: storage_bytes") for p in problems)


def test_a_forged_replica_count_is_named() -> None:
    """Two replicas' records claimed as three (the plan the claim makes has six ranks)."""
    recs = honest(plan_of("direct", replicas=2))
    problems = held_to_plan(plan_of("direct", replicas=3), recs)
    assert problems[0].startswith("ranks: expected 0..5 once each, got 4 records")


@pytest.mark.parametrize(("key", "value", "says"), [
    ("replica", 2, "rank 1: replica 2, expected 0"), ("shard", 0, "rank 1: shard 0, expected 1"),
    ("host", "h1", "rank 1: host 'h1', expected 'h0'"),
    ("verified_bytes", 4096, "rank 1: verified_bytes 4096"),
    ("node_tier_bytes", 1, "rank 1: node_tier_bytes 1, expected 0"),
    ("t1_ns", 0, "rank 1: t1_ns 0 not after")])
def test_a_forged_field_of_one_rank_is_named(key: str, value: object, says: str) -> None:
    recs = honest(plan_of("direct"))
    recs[1][key] = value
    problems = held_to_plan(plan_of("direct"), recs)
    assert len(problems) == 1 and problems[0].startswith(says), problems


def test_a_rank_twice_and_one_missing_is_named() -> None:
    recs = honest(plan_of("fanout"))
    recs[5] = {**recs[4]}
    assert held_to_plan(plan_of("fanout"), recs)[0].startswith("ranks: expected 0..5 once each")


@settings(max_examples=80, deadline=None)
@given(strategy=st.sampled_from(STRATEGIES), replicas=st.integers(1, 4), tp=st.sampled_from([1, 2, 4]),
       rank=st.integers(0, 15),
       key=st.sampled_from(["storage_bytes", "received_bytes", "node_tier_bytes", "bytes"]),
       delta=st.integers(-4096, 4096).filter(bool))
def test_any_byte_count_moved_is_caught(strategy: str, replicas: int, tp: int, rank: int, key: str,
                                        delta: int) -> None:
    plan = plan_of(strategy, replicas, tp)
    recs = honest(plan)
    r = recs[rank % len(recs)]
    r[key] += delta
    assert any(p.startswith(f"rank {r['rank']}: {key}") for p in held_to_plan(plan, recs))
