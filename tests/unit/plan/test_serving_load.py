"""Who reads what when replicas load (mlckpt/workload/serving_load.py): every rank ends holding
exactly its shard, and the storage serves what each strategy promises, for layouts, placements and
scales hypothesis draws."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt.errors import ConfigError
from mlckpt.workload.model import ModelShape
from mlckpt.workload.serving import STRATEGIES, Links, ServingLayout, scale_up
from mlckpt.workload.serving_load import PAGE, LoadPlan, Piece, load_plan, placement, scaled_files

L8B = ModelShape(4096, 32, 14336, 128256, 32, 8)
L70B = ModelShape(8192, 80, 28672, 128256, 128, 8)


def covered(plan: LoadPlan, pieces: list[Piece], shard: int) -> Counter[int]:
    """How many times each page-sized unit of ``shard`` the pieces hold (any byte counted)."""
    seen: Counter[int] = Counter()
    base = [sum(plan.shard_files[shard][:i]) for i in range(len(plan.shard_files[shard]))]
    for p in pieces:
        assert p.shard == shard and 0 <= p.offset and p.length > 0
        assert p.offset + p.length <= plan.shard_files[shard][p.file]
        for b in range(base[p.file] + p.offset, base[p.file] + p.offset + p.length):
            seen[b] += 1
    return seen


def exactly_once(plan: LoadPlan, pieces: list[Piece], shard: int) -> bool:
    seen = covered(plan, pieces, shard)
    return set(seen.values()) == {1} and len(seen) == plan.shard_bytes(shard)


layouts = st.builds(
    lambda tp, replicas, gph: ServingLayout("llama3_8b", L8B, tp, replicas, gph, shard_file_bytes=6 << 30),
    tp=st.sampled_from([1, 2, 4, 8]), replicas=st.integers(1, 5), gph=st.sampled_from([1, 2, 4, 8]),
).filter(lambda lay: lay.tp <= lay.gpus_per_host or lay.tp % lay.gpus_per_host == 0)


@settings(max_examples=60, deadline=None)
@given(layout=layouts, strategy=st.sampled_from(STRATEGIES), data=st.data())
def test_every_rank_ends_holding_exactly_its_shard(layout: ServingLayout, strategy: str,
                                                   data: st.DataObject) -> None:
    # scaled down to a few pages a shard, so that every byte can be counted
    scale = data.draw(st.sampled_from([8 * PAGE / layout.shard_bytes(0), 13 * PAGE / layout.shard_bytes(0)]))
    n = layout.replicas * layout.tp
    hosts = data.draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n))
    plan = load_plan(layout, strategy, hosts, scale)
    assert len(plan.ranks) == n
    for r in plan.ranks:
        assert (r.replica, r.shard, r.host) == (r.rank // layout.tp, r.rank % layout.tp, hosts[r.rank])
        if strategy == "direct":
            assert exactly_once(plan, list(r.storage), r.shard) and r.received_bytes == 0
        elif strategy == "nodecache":
            assert exactly_once(plan, list(r.node_tier), r.shard) and r.received_bytes == 0
        else:  # what the shard's holders read together is the shard, and each receives the rest
            group = plan.fanout_group(r.shard)
            assert [plan.ranks[g].replica for g in group] == list(range(layout.replicas))
            assert exactly_once(plan, [p for g in group for p in plan.ranks[g].storage], r.shard)
            assert r.received_bytes == plan.shard_bytes(r.shard) - r.storage_bytes
    if strategy == "nodecache":  # each host's first rank reads each shard its ranks hold, once
        for h in set(hosts):
            mine = [r for r in plan.ranks if r.host == h]
            assert all(not r.storage for r in mine[1:])
            for s in {r.shard for r in mine}:
                assert exactly_once(plan, [p for p in mine[0].storage if p.shard == s], s)
            assert {p.shard for p in mine[0].storage} == {r.shard for r in mine}
    want = {"direct": plan.placed_bytes,
            "fanout": sum(plan.shard_bytes(s) for s in range(layout.tp)),
            "nodecache": sum(plan.shard_bytes(s) for h in set(hosts)
                             for s in {r.shard for r in plan.ranks if r.host == h})}
    assert plan.storage_bytes == want[strategy]
    assert plan.placed_bytes == sum(plan.shard_bytes(r % layout.tp) for r in range(n))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("model", "tp", "replicas", "gph"), [
    (L8B, 1, 16, 8), (L8B, 2, 7, 8), (L8B, 8, 3, 8), (L70B, 8, 4, 8), (L70B, 16, 2, 8), (L70B, 4, 5, 8)])
def test_at_full_size_the_storage_serves_what_the_sizing_model_says(
        model: ModelShape, tp: int, replicas: int, gph: int, strategy: str) -> None:
    layout = ServingLayout("m", model, tp, replicas, gph)
    plan = load_plan(layout, strategy, placement(layout))
    sized = scale_up(layout, 0, replicas, Links(storage=1e9), strategy)  # type: ignore[arg-type]
    assert len(set(placement(layout))) == layout.hosts()
    assert plan.placed_bytes == replicas * layout.replica_bytes
    # The sizing model splits a replica spanning hosts evenly; the plan counts each host's shards.
    assert plan.storage_bytes == pytest.approx(sized.storage_bytes, rel=1e-6)
    if layout.replicas_per_host or strategy != "nodecache":
        assert plan.storage_bytes == sized.storage_bytes


def test_fanout_splits_each_shard_into_near_equal_parts_of_whole_pages_in_rank_order() -> None:
    layout = ServingLayout("m", L8B, 2, 3, 8, shard_file_bytes=2 << 30)
    plan = load_plan(layout, "fanout", placement(layout))
    total = plan.shard_bytes(0)
    pages = -(-total // PAGE)
    parts = [plan.ranks[r].storage_bytes for r in plan.fanout_group(0)]
    assert parts[:2] == [PAGE * (pages // 3 + (i < pages % 3)) for i in range(2)]
    assert sum(parts) == total and max(parts) - min(parts) <= 2 * PAGE
    first, second = plan.ranks[0].storage, plan.ranks[2].storage  # replicas 0 and 1 of shard 0
    assert first[0] == Piece(0, 0, 0, first[0].length)
    assert sum(plan.shard_files[0][:second[0].file]) + second[0].offset == sum(p.length for p in first)
    assert len(plan.shard_files[0]) == 4  # so that the parts cross files


def test_a_scaled_shard_keeps_its_file_count_in_whole_pages() -> None:
    layout = ServingLayout("m", L70B, 2, 1, 8)
    full = layout.shard_files(0)
    small = scaled_files(layout, 0, 0.001)
    assert len(small) == len(full) > 1
    assert all(size % PAGE == 0 and size > 0 for size in small)
    assert abs(sum(small) - layout.shard_bytes(0) * 0.001) <= len(full) * PAGE
    assert scaled_files(layout, 0, 1.0) == full


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"strategy": "p2p"}, "serving.strategy"), ({"hosts": ("a",) * 3}, "ranks"), ({"scale": 0.0}, "scale"),
    ({"scale": 1.5}, "scale")])
def test_what_does_not_fit_is_refused_naming_its_key(kwargs: dict[str, object], key: str) -> None:
    layout = ServingLayout("m", L8B, 2, 2, 8)
    args: dict[str, object] = {"strategy": "direct", "hosts": placement(layout), "scale": 0.5, **kwargs}
    with pytest.raises(ConfigError) as err:
        load_plan(layout, **args)  # type: ignore[arg-type]
    assert err.value.key == key


@settings(max_examples=60, deadline=None)
@given(replicas=st.integers(1, 6), scale=st.sampled_from([0.0005, 0.002, 0.01]),
       chunk=st.sampled_from([PAGE, 65536, 1 << 20, 16 << 20, 1 << 40]))
def test_fanout_rounds_cover_each_part_once_in_whole_pages(replicas: int, scale: float, chunk: int) -> None:
    """Pipelined fan-out: every holder's part in the same number of rounds, each round's chunk whole
    pages (the shard's last byte aside) of at most ``chunk`` (the largest part's), in order, the
    chunks of a part end to end."""
    layout = ServingLayout("llama3_8b", L8B, 2, replicas, 8, shard_file_bytes=6 << 30)
    plan = load_plan(layout, "fanout", ["h"] * (2 * replicas), scale)
    for shard in range(2):
        rounds = plan.fanout_rounds(shard, chunk)
        holders = plan.fanout_group(shard)
        biggest = max(plan.ranks[r].storage_bytes for r in holders)
        assert len(rounds) == max(1, -(-biggest // chunk)) and {len(row) for row in rounds} == {len(holders)}
        for i, r in enumerate(holders):
            mine = [row[i] for row in rounds]
            assert sum(n for _, n in mine) == plan.ranks[r].storage_bytes
            at = mine[0][0]
            for s, n in mine:
                assert s == at and (n % PAGE == 0 or s + n == plan.shard_bytes(shard))
                assert n <= max(chunk, PAGE) or len(rounds) == 1
                at += n
        spans = sorted((s, n) for row in rounds for s, n in row if n)  # together: the shard, once
        assert spans[0][0] == 0 and all(a + m == b for (a, m), (b, _) in pairwise(spans))
        assert spans[-1][0] + spans[-1][1] == plan.shard_bytes(shard)
