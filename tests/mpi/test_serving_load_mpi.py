"""Replicas loading a model, for real: mpiexec ranks, shard files on the disk or objects on a real
S3 store, a node tier per host in memory (mlckpt/run/phases/loads.py), on one machine and across
simulated hosts (fan-out's parts over their network).  Every rank ends holding its verified shard,
the storage serves exactly what the plan says each strategy reads, and a flipped byte on the
storage is caught in every replica that received it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.runs import MPIEXEC

WORKER = Path(__file__).parents[1] / "support" / "serving_worker.py"
# Each rank under ``python -m mpi4py``: an exception on one rank aborts the job, never leaving the
# others waiting in a collective for it.
RANK = (sys.executable, "-m", "mpi4py", str(WORKER))


def load(tmp_path: Path, ranks: int, *extra: str) -> subprocess.CompletedProcess[str]:
    tier = Path("/dev/shm") if os.path.isdir("/dev/shm") else tmp_path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    # a tier of this run's own (a name another session's pytest may reuse), gone afterwards even
    # where the job was aborted before emptying it
    where = tier / f"mlckpt-tier-{tmp_path.name}-{uuid.uuid4().hex[:8]}"
    try:
        return subprocess.run([str(MPIEXEC), "-n", str(ranks), *RANK, str(tmp_path / "storage"), str(where),
                               *extra], capture_output=True, text=True, env=env, timeout=180, check=False)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_every_strategy_brings_every_replica_up_verified_reading_what_its_plan_says(tmp_path: Path) -> None:
    proc = load(tmp_path, 6)  # 3 replicas of TP 2 on 2 simulated hosts (the middle replica split)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    for strategy, doc in got.items():
        recs = sorted(doc["records"], key=lambda r: r["rank"])
        assert doc["problems"] == []  # the records held to their plan (mlckpt.serving_metrics)
        assert [r["rank"] for r in recs] == list(range(6))
        for r, want in zip(recs, doc["plan"], strict=True):
            assert r["strategy"] == strategy and r["t1_ns"] > r["t0_ns"]
            assert (r["replica"], r["shard"]) == (r["rank"] // 2, r["rank"] % 2)
            assert r["verified_bytes"] == r["bytes"] == want["bytes"] > 0
            for k in ("storage_bytes", "node_tier_bytes", "received_bytes"):
                assert r[k] == want[k], (strategy, r["rank"], k)
        served = sum(r["storage_bytes"] for r in recs)
        shard = [sum(f) for f in doc["shard_files"]]
        assert served == {"direct": 3 * sum(shard), "fanout": sum(shard),
                          "nodecache": 2 * sum(shard)}[strategy]  # each simulated host holds both shards
        assert all(r["resident_bytes"] == 0 for r in recs) or _on_tmpfs(tmp_path)


def _on_tmpfs(path: Path) -> bool:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True,
                          check=False).stdout.strip() == "tmpfs"


def test_fan_out_sends_each_chunk_while_it_reads_the_next(tmp_path: Path) -> None:
    """Fan-out pipelined: each holder reads its part in 64 KiB rounds (about 20 here), each sent to
    the other holders while the next is read; every replica still ends with its verified shard, the
    storage serving each byte once, and each record says what the exchange cost: the CPU time of
    the thread that drove it and its wall time after the last read, each within the load."""
    proc = load(tmp_path, 6, "--strategies", "fanout", "direct", "--chunk-bytes", "65536")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    doc = got["fanout"]
    assert doc["problems"] == []
    shard = [sum(f) for f in doc["shard_files"]]
    assert min(shard) // 3 > 16 * 65536  # many rounds per part
    recs = doc["records"]
    assert sum(r["storage_bytes"] for r in recs) == sum(shard)
    for r in recs:
        assert r["verified_bytes"] == r["bytes"] > 0
        assert 0 < r["exchange_cpu_ns"] <= r["t1_ns"] - r["t0_ns"] + 1_000_000
        assert 0 <= r["exchange_tail_ns"] <= r["t1_ns"] - r["t0_ns"]
    assert all("exchange_cpu_ns" not in r and "exchange_tail_ns" not in r for r in got["direct"]["records"])


@pytest.mark.parametrize("chunk", [None, 65536])
def test_a_flipped_byte_in_any_round_is_caught_in_every_holder(tmp_path: Path, chunk: int | None) -> None:
    """A byte flipped in the fifth 64 KiB round of rank 1's part: rank 3 received it, in that round."""
    extra = ("--chunk-bytes", str(chunk)) if chunk else ()
    proc = load(tmp_path, 4, "--strategies", "fanout", "--corrupt", "1:0:300000", *extra)
    assert proc.returncode != 0 and not proc.stdout
    said = proc.stderr + "".join(p.read_text() for p in (tmp_path / "storage").glob("failed-rank*.txt"))
    named = set(re.findall(r"load: shard (\d+) file (\d+) on rank (\d+): ", said))
    assert named and named <= {("1", "0", "1"), ("1", "0", "3")}, said[-2000:]


@pytest.mark.parametrize("strategy", ["direct", "fanout", "nodecache"])
def test_a_flipped_byte_on_the_storage_is_caught_in_the_replica_that_holds_it(tmp_path: Path,
                                                                                 strategy: str) -> None:
    proc = load(tmp_path, 4, "--strategies", strategy, "--corrupt", "1:0:5000")
    assert proc.returncode != 0 and not proc.stdout
    # Only the holders of shard 1 (ranks 1 and 3) hold the byte: under fan-out rank 3 received it
    # from rank 1, which read the part of the file that holds it.
    said = proc.stderr + "".join(p.read_text() for p in (tmp_path / "storage").glob("failed-rank*.txt"))
    named = set(re.findall(r"load: shard (\d+) file (\d+) on rank (\d+): ", said))
    assert named and named <= {("1", "0", "1"), ("1", "0", "3")}, said[-2000:]


def test_fanout_and_node_cache_across_simulated_hosts(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two hosts of their own (network, hostname, node-local tmpfs: benchmarks/lab/hostbed.py), one
    replica each: fan-out's parts cross the simulated network, and each host's node cache is its
    own tmpfs, filled by its own first rank."""
    from lab.hostbed import HostBed, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(why)
    bed = HostBed(tmp_path_factory.mktemp("bed"), 2).up()
    try:
        storage = tmp_path_factory.mktemp("storage")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLCKPT_", "PMI_", "HYDRA_"))}
        env["PYTHONPATH"] = str(Path(__file__).parents[1])
        cmd = [*bed.enter("h0", storage), str(MPIEXEC), "-launcher", "ssh",
               "-launcher-exec", str(bed.launcher), "-hosts", "h1,h2", "-n", "4", "-ppn", "2",
               *RANK, str(storage), str(bed.local / "tier"), "--real-hosts"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout)
        for strategy, doc in got.items():
            recs = sorted(doc["records"], key=lambda r: r["rank"])
            assert doc["problems"] == []  # the records held to their plan (mlckpt.serving_metrics)
            assert [r["host"] for r in recs] == ["h1", "h1", "h2", "h2"]
            for r, want in zip(recs, doc["plan"], strict=True):
                assert r["verified_bytes"] == r["bytes"] and r["storage_bytes"] == want["storage_bytes"]
            shards = sum(sum(f) for f in doc["shard_files"])
            served = sum(r["storage_bytes"] for r in recs)
            assert served == {"direct": 2 * shards, "fanout": shards, "nodecache": 2 * shards}[strategy]
            if strategy == "fanout":  # rank 2 (h2) received from rank 0 (h1) what it did not read
                assert recs[2]["received_bytes"] == recs[2]["bytes"] - recs[2]["storage_bytes"] > 0
            if strategy == "nodecache":  # each host's first rank filled its own tier
                assert [r["storage_bytes"] > 0 for r in recs] == [True, False, True, False]
                assert all(r["node_tier_bytes"] == r["bytes"] for r in recs)
        assert not any(bed.run(h, "find", str(bed.local), "-type", "f").stdout for h in ("h1", "h2"))
    finally:
        bed.down()


def test_every_strategy_loads_from_object_storage(tmp_path: Path, s3_store: Any) -> None:
    """The shard files as objects on a real S3 store (OpenStack Swift's S3 API on the loopback):
    ranged GETs of each rank's pieces, the same bytes and verification as from files."""
    from support.cli import S3_BUCKET, s3_client

    prefix = f"serving-{tmp_path.name}"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **s3_store.env,
           "PYTHONPATH": str(Path(__file__).parents[1])}
    tier = Path("/dev/shm") if os.path.isdir("/dev/shm") else tmp_path
    where = tier / f"mlckpt-tier-{tmp_path.name}-{uuid.uuid4().hex[:8]}"
    try:
        proc = subprocess.run([str(MPIEXEC), "-n", "4", *RANK, str(tmp_path / "unused"), str(where),
                               "--objects", f"s3://{S3_BUCKET}/{prefix}"],
                              capture_output=True, text=True, env=env, timeout=180, check=False)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    c = s3_client(s3_store.env)
    listed = c.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"{prefix}/").get("Contents", [])
    keys = [o["Key"] for o in listed]
    for k in keys:
        c.delete_object(Bucket=S3_BUCKET, Key=k)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert len(keys) == sum(len(f) for doc in got.values() for f in doc["shard_files"])
    for strategy, doc in got.items():
        recs = sorted(doc["records"], key=lambda r: r["rank"])
        assert doc["problems"] == []  # the records held to their plan (mlckpt.serving_metrics)
        for r, want in zip(recs, doc["plan"], strict=True):
            assert r["verified_bytes"] == r["bytes"] and r["resident_bytes"] == 0
            for k in ("storage_bytes", "received_bytes", "node_tier_bytes"):
                assert r[k] == want[k], (strategy, r["rank"], k)
        times = {"direct": 2, "fanout": 1, "nodecache": 2}[strategy]  # 2 replicas; 2 groups of one each
        assert sum(r["storage_bytes"] for r in recs) == times * sum(sum(f) for f in doc["shard_files"])
    assert not (tmp_path / "unused").exists()


def test_a_rank_that_fails_ends_the_whole_job_at_once(tmp_path: Path) -> None:
    """A shard file gone from the storage: the ranks that read it fail, and the others, waiting in a
    collective for them, are stopped with them (a load never hangs the job)."""
    t0 = time.monotonic()
    proc = load(tmp_path, 4, "--strategies", "fanout", "--remove", "1:0")
    assert proc.returncode != 0 and not proc.stdout
    assert "shard-0001-00000.bin" in proc.stderr and "No such file" in proc.stderr
    assert time.monotonic() - t0 < 60

