"""Serving layouts and the scale-up model (mlckpt/workload/serving.py), and what `mlckpt plan
--replicas` and `mlckpt size --replicas` print of them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt.errors import ConfigError
from mlckpt.units import GB
from mlckpt.workload.model import ModelShape
from mlckpt.workload.serving import Links, ServingLayout, fanout_round_count, part, scale_up

L8B = ModelShape(4096, 32, 14336, 128256, 32, 8)
L70B = ModelShape(8192, 80, 28672, 128256, 128, 8)  # the canonical (DLIO) shape: 128 heads of 64


def mlckpt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlckpt", *args], capture_output=True, text=True,
                          check=False)


def test_one_gpu_holds_every_parameter_once_in_bf16() -> None:
    lay = ServingLayout("llama3_8b", L8B, tp=1, replicas=1)
    assert lay.shard_params(0) == L8B.num_parameters == 8_030_261_248
    assert lay.replica_bytes == lay.model_bytes == 2 * 8_030_261_248  # 16.06 GB
    assert lay.shard_files(0) == (4_015_130_624,) * 4  # 4 files of at most 5 GB


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16, 32]), st.integers(1, 8), st.integers(1, 6), st.integers(1, 300))
def test_shards_hold_every_parameter_once_but_the_replicated_ones(tp: int, kv_groups: int, layers: int,
                                                                  vocab: int) -> None:
    heads = 32
    kv = heads // kv_groups if heads % kv_groups == 0 else 8
    m = ModelShape(64 * heads, layers, 3 * 64 * heads + 7, 1000 + vocab, heads, kv)
    lay = ServingLayout("m", m, tp=tp, replicas=1, gpus_per_host=max(8, tp))
    shards = sum(lay.shard_params(r) for r in range(tp))
    norms = (tp - 1) * (2 * m.hidden_size * layers + m.hidden_size)  # on every GPU
    kv_extra = 0 if kv >= tp else (tp - kv) * 2 * m.head_dim * m.hidden_size * layers  # one head a GPU
    assert shards == m.num_parameters + norms + kv_extra
    sizes = [lay.shard_bytes(r) for r in range(tp)]
    one_more = (2 * m.hidden_size + 2 * m.head_dim * m.hidden_size) * layers + 2 * m.hidden_size
    assert max(sizes) - min(sizes) <= 2 * one_more  # near-equal: at most one row, column or head more
    for r in range(tp):
        files = lay.shard_files(r)
        assert sum(files) == lay.shard_bytes(r) and max(files) <= lay.shard_file_bytes
        assert len(files) == math.ceil(lay.shard_bytes(r) / lay.shard_file_bytes)


def test_part_splits_exactly() -> None:
    assert [part(10, 3, i) for i in range(3)] == [4, 3, 3]
    assert sum(part(128256, 7, i) for i in range(7)) == 128256


def test_hosts_per_replica_and_per_host_bytes() -> None:
    small = ServingLayout("8b", L8B, tp=2, replicas=10)
    assert (small.replicas_per_host, small.hosts(), small.host_bytes) == (4, 3, 4 * small.replica_bytes)
    big = ServingLayout("70b", L70B, tp=16, replicas=3)
    assert (big.replicas_per_host, big.hosts_per_replica, big.hosts()) == (0, 2, 6)
    assert big.host_bytes == big.replica_bytes // 2 == big.host_distinct_bytes


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"tp": 12}, "tp"), ({"tp": 0}, "tp"), ({"replicas": 0}, "replicas"),
    ({"shard_file_bytes": 0}, "shard_file_bytes"),
    ({"tp": 64, "gpus_per_host": 64}, "tp"),  # 32 heads: at most one GPU a head
])
def test_an_impossible_layout_is_refused_naming_its_key(kwargs: dict[str, int], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        ServingLayout("8b", L8B, **{"tp": 1, "replicas": 1, **kwargs})
    assert exc.value.key == key and exc.value.message.startswith(f"{key}: ")


def test_scale_up_by_strategy_follows_its_bounds() -> None:
    lay = ServingLayout("8b", L8B, tp=2, replicas=64)  # 4 replicas a host
    w = lay.replica_bytes
    links = Links(storage=100 * GB, host_link=25 * GB, network=12.5 * GB, node_tier=50 * GB)
    direct = scale_up(lay, 0, 16, links, "direct")
    assert (direct.new_hosts, direct.storage_bytes) == (4, 16 * w)
    assert direct.seconds == pytest.approx(max(16 * w / (100 * GB), 4 * w / (25 * GB)))
    assert direct.bottleneck == "storage"
    fan = scale_up(lay, 0, 16, links, "fanout")
    assert fan.storage_bytes == w  # each byte read once
    # as the code loads: each host reads its quarter (storage or its link, the slower) while the
    # holders exchange the rest over the network, round by round: one round of the reads is exposed
    read_s, exchange_s = max(w / (100 * GB), (w / 4) / (25 * GB)), (w - w / 4) / (12.5 * GB)
    rounds = fanout_round_count(int(w) // 2, 16)  # a shard's part per holder, in 16 MiB chunks
    assert rounds == -(-(-(-int(w) // 2) // 16) // (16 << 20)) > 1
    assert fan.seconds == pytest.approx(exchange_s + read_s / rounds) and fan.bottleneck == "network"
    cache = scale_up(lay, 0, 16, links, "nodecache")
    assert cache.storage_bytes == 4 * w  # one reader a host
    assert cache.seconds == pytest.approx(max(4 * w / (100 * GB), w / (25 * GB)) + 4 * w / (50 * GB))
    assert cache.bottleneck == "node tier"
    assert fan.placed_bytes_s == pytest.approx(16 * w / fan.seconds)
    # only the new replicas are loaded; without a network bound fan-out is bounded by its reads
    assert scale_up(lay, 12, 16, Links(100 * GB), "fanout").seconds == pytest.approx(w / (100 * GB))
    with pytest.raises(ValueError, match="FROM:TO"):
        scale_up(lay, 16, 16, links, "direct")


def test_size_replicas_prints_each_strategy_and_its_bottleneck() -> None:
    proc = mlckpt("size", "workload=llama3_8b", "--replicas", "4:64", "--bandwidth", "100GB/s", "--host-link",
                  "25GB/s", "--network", "25GB/s", "--node-tier", "10GB/s", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    got = {r["strategy"]: r for r in doc["strategies"]}
    w = doc["layout"]["replica_bytes"]
    assert w == 2 * 8_030_261_248 and doc["layout"]["tp"] == 1  # the workload's TP by default
    assert got["direct"]["storage_bytes"] == 60 * w and got["direct"]["bottleneck"] == "storage"
    assert got["direct"]["seconds"] == pytest.approx(60 * w / 100e9)
    assert got["fanout"]["storage_bytes"] == w and got["fanout"]["bottleneck"] == "network"
    assert got["nodecache"]["storage_bytes"] == 8 * w  # 60 replicas, 8 a host
    assert got["fanout"]["network_bytes"] == pytest.approx(w * 7 / 8, abs=1)  # what each of 8 hosts lacks
    text = mlckpt("size", "workload=llama3_8b", "--replicas", "4:64", "--bandwidth", "100GB/s",
                  "--network", "25GB/s")
    assert "fastest: fanout" in text.stdout and "A model, not a measurement" in text.stdout


BW = ("--bandwidth", "1GB/s")


@pytest.mark.parametrize(("args", "says"), [
    (["--replicas", "9:3", *BW], "--replicas: expected N or FROM:TO with 0 <= FROM < TO, got '9:3'"),
    (["--replicas", "8", *BW, "--interval", "30m"], "--interval: a checkpoint sizing flag"),
    (["--replicas", "8", *BW, "--tp", "12"], "--tp: a replica of 12 GPUs spans whole hosts"),
    (["--replicas", "8", *BW, "--network", "fast"], "--network: not a bandwidth"),
    ([*BW], "--interval: give the time between checkpoints (or --replicas to size serving)"),
])
def test_size_refuses_bad_serving_input_in_one_line(args: list[str], says: str) -> None:
    proc = mlckpt("size", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert says in line, line


def test_plan_replicas_gives_bytes_per_gpu_replica_and_host() -> None:
    proc = mlckpt("plan", "workload=llama3_70b", "--replicas", "3", "--tp", "16", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    lay = ServingLayout("llama3_70b", L70B, tp=16, replicas=3)
    assert doc["replica_bytes"] == lay.replica_bytes and doc["hosts"] == 6 and doc["hosts_per_replica"] == 2
    assert [s["bytes"] for s in doc["shards"]] == [lay.shard_bytes(r) for r in range(16)]
    text = mlckpt("plan", "workload=llama3_70b", "--replicas", "3", "--tp", "16").stdout
    assert "3 replicas of TP 16 (each over 2 hosts of 8 GPUs)" in text
    assert mlckpt("plan", "--replicas", "x").returncode == 2


def test_plan_replicas_gives_what_the_storage_a_host_and_a_gpu_move_per_strategy() -> None:
    proc = mlckpt("plan", "workload=llama3_8b", "--replicas", "6", "--tp", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    lay = ServingLayout("llama3_8b", L8B, tp=2, replicas=6)  # 4 replicas a host: 2 hosts
    w, shard = lay.replica_bytes, lay.shard_bytes(0)
    got = doc["strategies"]
    assert got["direct"] == {"storage_bytes": 6 * w, "host_storage_bytes_max": 4 * w,
                             "gpu_storage_bytes_max": shard, "gpu_received_bytes_max": 0,
                             "gpu_node_tier_bytes_max": 0}
    assert got["fanout"]["storage_bytes"] == w  # each shard once, split over its 6 holders
    pages = -(-shard // 4096)  # split in whole pages: the first parts one page larger, the last cut short
    first5 = sum(4096 * (pages // 6 + (i < pages % 6)) for i in range(5))
    assert got["fanout"]["gpu_storage_bytes_max"] == 4096 * -(-pages // 6)
    assert got["fanout"]["gpu_received_bytes_max"] == first5  # the last holder reads the least
    assert got["nodecache"]["storage_bytes"] == 2 * w  # a copy a host
    assert got["nodecache"]["gpu_storage_bytes_max"] == w  # the host's first GPU reads it all
    assert got["nodecache"]["gpu_node_tier_bytes_max"] == shard
    text = mlckpt("plan", "workload=llama3_8b", "--replicas", "6", "--tp", "2").stdout
    row = next(line for line in text.splitlines() if line.strip().startswith("fanout"))
    assert row.split()[1:3] == [f"{w / GB:,.2f}", "GB"]


def test_the_docs_figures_for_the_canonical_shapes() -> None:
    """docs/src/run/serving.md quotes these."""
    L405B = ModelShape(16384, 126, 53248, 128256, 128, 8)
    big = ServingLayout("llama3_405b", L405B, tp=16, replicas=4)
    assert (round(big.replica_bytes / GB, 1), round(big.model_bytes / GB, 1)) == (820.3, 811.7)
    mid = ServingLayout("llama3_70b", L70B, tp=8, replicas=16)
    assert (round(mid.replica_bytes / GB, 2), round(mid.model_bytes / GB, 2)) == (139.78, 139.77)
    real_kv = 2 * (8 * 128 - 8 * 64) * 8192 * 80 * 2  # the real 70B's k and v: heads of 128, not 64
    assert round((mid.model_bytes + real_kv) / GB) == 141
    table = mlckpt("plan", "workload=llama3_8b", "--replicas", "16", "--tp", "2").stdout
    rows = {line.split()[0]: line.split()[1::2] for line in table.splitlines()[-4:-1]}
    assert rows == {"direct": ["256.98", "64.24", "8.03", "0.00", "0.00"],
                    "fanout": ["16.06", "4.02", "0.50", "7.53", "0.00"],
                    "nodecache": ["64.24", "16.06", "16.06", "0.00", "8.03"]}
    r = scale_up(mid, 0, 64, Links(200 * GB, 50 * GB, 50 * GB, 20 * GB), "fanout")
    # the exchange (2.75 s) hides the reads (0.70 s) but one of 17 rounds of 16 MiB a holder
    assert (round(r.seconds, 2), r.bottleneck, round(r.placed_bytes_s / GB, 1)) == (2.79, "network", 3202.9)
    assert fanout_round_count(int(mid.replica_bytes) // 8, 64) == 17
    assert r.seconds == pytest.approx(2.7521 + 0.6989 / 17, abs=0.001)


def test_plan_of_a_serving_run_gives_its_loads_and_the_rules_verdict(run_cli: Any) -> None:
    proc = run_cli("plan", "workload=llama3_8b", "ranks=8", "serving.strategy=fanout", "serving.tp=2",
                   "scale=0.01", "division=open", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["serving"] == {"strategy": "fanout", "tp": 2, "replicas": 4, "loads": 3,
                              "shard_file_bytes": 5_000_000_000, "node_tier": None}
    # fan-out: the storage serves each shard once, the four replicas hold it four times
    assert doc["per_load"]["placed_bytes"] == 4 * doc["per_load"]["storage_bytes"] > 0
    assert doc["verdict"] == "open" and doc["findings"] == []
    proc = run_cli("plan", "workload=llama3_8b", "ranks=8", "serving.strategy=direct", "serving.tp=2")
    assert proc.returncode == 0 and "[SERVING-CLOSED] (open)" in proc.stdout
    assert "Verdict: open" in proc.stdout
    proc = run_cli("plan", "workload=llama3_8b", "ranks=8", "serving.strategy=direct", "serving.tp=3")
    assert proc.returncode == 2 and "[SERVING-SCOPE]" in proc.stderr and "Traceback" not in proc.stderr
