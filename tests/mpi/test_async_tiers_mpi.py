"""Asynchronous and tiered checkpointing under real MPI: ``checkpoint.mode=async`` and
``checkpoint.tiers.fast``, with real files on both tiers, restores from each tier, and every
page of every checkpoint file checked on disk.

The fast tier here is a folder on the test's filesystem in most runs (so the cold-read rule
applies to its restores too), and tmpfs (/dev/shm) in one run, where a fast-tier restore reads
memory by design and is reported apart.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.runs import COLD_BOUND, Result, assert_same_numbers, bundle_of, error_line, run_mlckpt

from mlckpt.engine import PAGE, decode_tag
from mlckpt.metrics import summarize
from mlckpt.plan.config import setup
from mlckpt.workload.layout import Plan

pytestmark = pytest.mark.mpi

RUN_MARKER = ".mlckpt-run"
BASE = ["workload=llama3_8b", "ranks=4", "division=open"]


@pytest.fixture(scope="module", autouse=True)
def _private_config_home(tmp_path_factory: pytest.TempPathFactory) -> Any:
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config-home")))
    yield
    mp.undo()


@dataclass
class Run:
    overrides: list[str]
    plan: Plan
    cwd: Path
    result: Result
    durable: Path  # this run's checkpoint folder on the durable tier
    fast: Path  # ... and on the fast tier
    stdout: str

    def writes(self) -> list[dict[str, Any]]:
        return [r for r in self.result.records if r["op"] == "write"]

    def reads(self) -> list[dict[str, Any]]:
        return [r for r in self.result.records if r["op"] == "read"]


def launch(cwd: Path, fast: Path, *extra: str) -> Run:
    ovs = [*BASE, f"checkpoint.tiers.fast={fast}", *extra]
    cp = run_mlckpt(["run", *ovs], cwd)
    folder = bundle_of(cp)
    result = Result.load(folder)
    return Run(ovs, setup(ovs).plan, cwd, result, cwd / "mlckpt-checkpoints" / folder.name,
               fast / folder.name, cp.stdout)


def check_pages(path: Path, run_id: int, rank: int, ckpt: int, index: int, nbytes: int) -> int:
    """Every 4 KiB page of ``path`` carries the tag of exactly this run, rank, checkpoint, file and
    page; returns the number of pages checked."""
    data = np.fromfile(path, dtype=np.uint8)
    assert len(data) == nbytes, path
    pages = 0
    for p in range(0, nbytes, PAGE):
        got = decode_tag(data[p:p + PAGE])
        assert got is not None, (path, p)
        pid, page = got
        assert (pid.run_id, pid.rank, pid.checkpoint, pid.file_index, page) == \
            (run_id, rank, ckpt, index, p // PAGE), (path, p)
        pages += 1
    return pages


# ---------------------------------------------------------------------------------------------
# async + tiers, checkpoints kept: both tiers on disk, restores from each tier


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Run:
    cwd = tmp_path_factory.mktemp("async-tiers")
    return launch(cwd, cwd / "fast-tier", "scale=0.002", "checkpoint.mode=async",
                  "checkpoint.compute_interval_s=0.3", "checkpoint.num_writes=3", "checkpoint.num_reads=3",
                  "checkpoint.tiers.fast_keep=1", "checkpoint.keep=true", "io.direct=false")


def test_async_tiers_records_follow_the_pipeline(kept: Run) -> None:
    writes = kept.writes()
    assert len(writes) == 3 * 4
    for r in writes:
        assert r["mode"] == "async"
        assert [s["tier"] for s in r["stages"]] == ["memory", "fast", "durable"]
        assert all(s["bytes"] == r["bytes"] > 0 for s in r["stages"])
        mem, fast, durable = r["stages"]
        # the stall: back-pressure wait, then the snapshot; the rest runs behind training
        assert r["t0_ns"] + r["backpressure_ns"] <= mem["t0_ns"] < mem["t1_ns"] <= r["staged_ns"]
        assert mem["t1_ns"] <= fast["t0_ns"] < fast["t1_ns"] <= durable["t0_ns"]
        assert durable["t0_ns"] < durable["t1_ns"] == r["t1_ns"]
        assert durable["verified_bytes"] == r["bytes"] and durable["mismatches"] == 0
        assert r["compute_ns"] >= 0.3e9  # trained at least the configured interval
        # the timed stall is a memory copy: no request of the durable tier to report
        assert "requests" not in r and "phases_ns" not in r
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in writes:
        by_rank.setdefault(r["rank"], []).append(r)
    for recs in by_rank.values():
        recs.sort(key=lambda r: r["index"])
        for a, b in itertools.pairwise(recs):
            # training waited for a's persist within b's back-pressure, never beyond a's durability
            assert a["exposed_ns"] <= b["backpressure_ns"]
            assert a["exposed_ns"] <= a["t1_ns"] - a["staged_ns"]
            assert a["t1_ns"] <= b["stages"][0]["t0_ns"]  # one staging slot
    s = kept.result.summary
    assert (s["mode"], s["tiers"]) == ("async", ["memory", "fast", "durable"])
    assert 0.0 <= s["write_overlap_efficiency"] <= 1.0
    assert "write_latency_ms" not in s and "read_latency_ms" in s  # restores are timed requests
    assert s["write_stall_mean_s"] < s["write_time_to_durable_mean_s"]
    assert kept.result.run["pipeline"] == {
        "mode": "async", "compute_interval_s": 0.3, "fast": str(kept.fast.parent), "fast_keep": 1,
        "fast_fs": {kept.result.run["hosts"][0]["host"]: kept.result.run["pipeline"]["fast_fs"][
            kept.result.run["hosts"][0]["host"]]}}
    assert kept.result.run["findings"] == [] and kept.result.run["verdict"] == "open"


def test_async_tiers_restore_from_each_tier(kept: Run) -> None:
    reads = kept.reads()
    tiers = {(r["index"], r["checkpoint"]): set() for r in reads}
    for r in reads:
        tiers[(r["index"], r["checkpoint"])].add(r["tier"])
        assert r["verified_bytes"] == r["bytes"] > 0 and r["mismatches"] == 0
        assert r["resident_bytes"] <= COLD_BOUND * r["cached_check_bytes"]  # both tiers on disk: cold
    # checkpoints 1 and 2 left the fast tier once durable (fast_keep=1); 3 is read from it
    assert tiers == {(1, 1): {"durable"}, (2, 2): {"durable"}, (3, 3): {"fast"}}
    s = kept.result.summary
    assert s["read_verified"] and s["read_cold"] and s["read_valid"]
    assert [o["tier"] for o in s["ops"] if o["op"] == "read"] == ["durable", "durable", "fast"]
    assert "read_bandwidth_mean_gib_s" in s and "read_fast_bandwidth_mean_gib_s" in s
    lines = kept.stdout.splitlines()
    assert any(line.startswith("read 3/3:") and line.endswith(", fast tier)") for line in lines)


def test_async_tiers_every_page_on_both_tiers(kept: Run) -> None:
    run_id = int(kept.result.run["run_id"], 16)
    plan = kept.plan
    # durable tier: all three checkpoints; fast tier: only the newest (fast_keep=1)
    want = [RUN_MARKER, "ckpt-0001", "ckpt-0002", "ckpt-0003"]
    assert sorted(p.name for p in kept.durable.iterdir()) == want
    assert sorted(p.name for p in kept.fast.iterdir()) == [RUN_MARKER, "ckpt-0003"]
    pages = 0
    for base, ckpts in ((kept.durable, (1, 2, 3)), (kept.fast, (3,))):
        for k in ckpts:
            cdir = base / f"ckpt-{k:04d}"
            assert {p.name for p in cdir.iterdir()} == {f.name for rp in plan.rank_plans for f in rp.files}
            for rp in plan.rank_plans:
                for i, f in enumerate(rp.files):
                    pages += check_pages(cdir / f.name, run_id, rp.rank, k, i, f.bytes)
    assert pages == 4 * plan.total_bytes // PAGE
    # the durable copy of checkpoint 3 is the fast copy, byte for byte
    for rp in plan.rank_plans:
        for f in rp.files:
            a = (kept.durable / "ckpt-0003" / f.name).read_bytes()
            assert a == (kept.fast / "ckpt-0003" / f.name).read_bytes()


def test_async_tiers_metrics_recompute(kept: Run) -> None:
    res = kept.result
    assert_same_numbers(summarize(res.records, max_resident_fraction=COLD_BOUND), res.summary)
    for o in res.summary["ops"]:
        if o["op"] != "write":
            continue
        recs = [r for r in res.records if r["op"] == "write" and r["index"] == o["index"]]
        start = min(r["t0_ns"] for r in recs)  # the host's first rank to leave the barrier (one host)
        assert o["stall_s"] == max(r["staged_ns"] - start for r in recs) / 1e9
        assert o["time_to_durable_s"] == max(r["t1_ns"] - start for r in recs) / 1e9
        durable = [next(s for s in r["stages"] if s["tier"] == "durable") for r in recs]
        assert o["duration_s"] == max(s["t1_ns"] - s["t0_ns"] for s in durable) / 1e9
        # the first stage starts with its rank's op, so from the barrier too
        first = [(st["t1_ns"], start if st["t0_ns"] == r["t0_ns"] else st["t0_ns"])
                 for r in recs for st in r["stages"][:1]]
        assert o["stages"]["memory"]["duration_s"] == max(t1 - t0 for t1, t0 in first) / 1e9


# ---------------------------------------------------------------------------------------------
# other shapes of the pipeline


def test_sync_tiers_tmpfs_fast_tier_cleaned_up(tmp_path: Path) -> None:
    """sync + a tmpfs fast tier, fast_keep=0: training waits for the fast write only, every restore
    reads the durable tier, and nothing of the run is left on either tier."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    fast = shm / f"mlckpt-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        run = launch(tmp_path, fast, "scale=0.002", "checkpoint.num_writes=2", "checkpoint.num_reads=2",
                     "checkpoint.tiers.fast_keep=0", "checkpoint.compute_interval_s=0.05")
        for r in run.writes():
            assert r["mode"] == "sync"
            assert [s["tier"] for s in r["stages"]] == ["fast", "durable"]
            assert r["stages"][0]["t1_ns"] <= r["staged_ns"] <= r["stages"][1]["t1_ns"] == r["t1_ns"]
        assert {r["tier"] for r in run.reads()} == {"durable"}
        assert run.result.run["pipeline"]["fast_fs"] == {run.result.run["hosts"][0]["host"]: "tmpfs"}
        assert run.result.summary["read_cold"] is True
        assert not fast.exists() or list(fast.iterdir()) == []
        assert not (tmp_path / "mlckpt-checkpoints").exists()
    finally:
        if fast.exists():
            for p in sorted(fast.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            fast.rmdir()


def test_tmpfs_fast_restore_is_labelled_and_exempt_from_cold_rule(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    fast = shm / f"mlckpt-test-{os.getpid()}-{time.monotonic_ns()}"
    run = launch(tmp_path, fast, "scale=0.002", "checkpoint.mode=async", "checkpoint.num_writes=1",
                 "checkpoint.num_reads=1")
    (read,) = {r["tier"] for r in run.reads()}
    assert read == "fast"
    assert run.result.run["findings"] == []  # resident (tmpfs) but not judged as a storage read
    assert "read_bandwidth_mean_gib_s" not in run.result.summary
    assert run.result.summary["read_fast_bandwidth_mean_gib_s"] > 0
    assert "fast tier in memory" in run.stdout
    assert not fast.exists() or list(fast.iterdir()) == []


def test_async_back_pressure_when_training_is_shorter_than_the_persist(tmp_path: Path) -> None:
    """No training between checkpoints: each snapshot must wait for the previous persist."""
    ovs = [*BASE, "scale=0.01", "checkpoint.mode=async", "checkpoint.num_writes=3", "checkpoint.num_reads=0",
           "checkpoint.compute_interval_s=0"]
    res = Result.load(bundle_of(run_mlckpt(["run", *ovs], tmp_path)))
    s = res.summary
    assert s["write_backpressure_ops"] >= 1
    assert s["write_overlap_efficiency"] < 1.0
    ops = {o["index"]: o for o in s["ops"]}
    assert ops[1]["backpressure_s"] == 0.0  # nothing before the first checkpoint
    waited = [r for r in res.records if r["backpressure_ns"] > 0]
    assert waited and all(r["index"] > 1 for r in waited)
    assert res.run["findings"] == []


def test_corrupt_fast_copy_is_caught_by_the_drain(tmp_path: Path) -> None:
    fast = tmp_path / "fast"
    cp = run_mlckpt(["run", *BASE, "scale=0.002", f"checkpoint.tiers.fast={fast}", "checkpoint.num_writes=3",
                     "checkpoint.num_reads=1"], tmp_path, env={"MLCKPT_TEST_FAST_FLIP": "drain:1:2:0:5000"})
    assert cp.returncode == 1
    line = error_line(cp)
    assert "rank 1 on" in line and "drain of checkpoint 2: the fast tier gave back other bytes" in line
    assert "/ckpt-0002/" in line and "byte 5000 (page 1)" in line and "payload corrupted" in line
    assert not (tmp_path / "mlckpt-results").exists() or not [
        p for p in (tmp_path / "mlckpt-results").iterdir() if not p.name.startswith(".")]
    assert not fast.exists() or list(fast.iterdir()) == []  # this run's fast-tier files removed
    assert not (tmp_path / "mlckpt-checkpoints").exists()


def test_corrupt_fast_copy_fails_the_restore(tmp_path: Path) -> None:
    fast = tmp_path / "fast"
    cp = run_mlckpt(["run", *BASE, "scale=0.002", f"checkpoint.tiers.fast={fast}", "checkpoint.num_writes=2",
                     "checkpoint.num_reads=2"], tmp_path, env={"MLCKPT_TEST_FAST_FLIP": "restore:3:2:1:9000"})
    assert cp.returncode == 1
    line = error_line(cp)
    assert "read 2: verification failed reading" in line and str(fast) in line and "/ckpt-0002/" in line
    assert "byte 9000 (page 2)" in line


def test_refusals_before_any_io(tmp_path: Path) -> None:
    """Pipeline rules refuse the run before anything is written, with the rule named."""
    small = ["workload=llama3_8b", "ranks=4", "division=open", "scale=0.001"]
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    cases = [
        ([*small, "checkpoint.mode=async", "residency=stream"], "[ASYNC-RESIDENCY]"),
        ([*small, "checkpoint.tiers.fast=mlckpt-checkpoints/fast"], "[TIERS-DISTINCT]"),
        # a relative durable folder and an absolute fast one: told apart on the host, links resolved
        ([*small, f"checkpoint.tiers.fast={tmp_path / 'mlckpt-checkpoints' / 'fast'}"],
         "[TIER-USABLE] host"),
        ([*small, f"checkpoint.tiers.fast={tmp_path / 'foreign'}"], "[TIER-USABLE]"),
        (["workload=llama3_8b", "ranks=8", "division=closed", "checkpoint.mode=async"],
         "[CLOSED-PARAMS] closed runs keep this parameter at checkpoint.mode=sync; "
         "got checkpoint.mode=async"),
    ]
    for args, want in cases:
        cp = run_mlckpt(["run", *args], tmp_path)
        assert cp.returncode == 2, (args, cp.stderr)
        assert want in error_line(cp), (args, cp.stderr)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign"], args
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "mine"
    assert json.dumps(sorted(os.listdir(tmp_path / "foreign"))) == '["notes.txt"]'
