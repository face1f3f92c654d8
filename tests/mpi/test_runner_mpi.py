"""End-to-end tests of ``mlckpt run`` with real ``mpiexec`` (the `mpich` wheel), real files, real
fsync and verified cold reads, on small scaled open-division workloads.

Every run is a subprocess with a timeout (a hang fails the test instead of blocking the suite).
The runs that leave checkpoints behind (``checkpoint.keep=true``) are module-scoped fixtures shared
by the tests that inspect them.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from support.runs import (
    COLD_BOUND,
    Result,
    assert_same_numbers,
    bundle_of,
    error_line,
    run_mlckpt,
    snapshot,
)

from mlckpt.dlio import dlio_compat
from mlckpt.metrics import summarize
from mlckpt.plan.config import setup
from mlckpt.workload.layout import PAGE, Plan

pytestmark = pytest.mark.mpi

GiB = 1 << 30
TAG_BYTES = 32
RUN_MARKER = ".mlckpt-run"
SMALL = ["division=open", "checkpoint.num_writes=1", "checkpoint.num_reads=1"]


# ---------------------------------------------------------------------------------------------
# helpers


def no_result_left(cwd: Path) -> None:
    results = cwd / "mlckpt-results"
    if results.exists():
        assert not [p for p in results.iterdir() if not p.name.startswith(".")], list(results.iterdir())


# ---------------------------------------------------------------------------------------------
# kept runs: files, bytes, pages, metrics, read results


@dataclass
class Kept:
    name: str
    overrides: list[str]
    plan: Plan
    cwd: Path
    result: Result
    ckpt_root: Path
    elapsed_s: float


KEPT_CASES = {
    # ZeRO 1: rank 0 writes the model file plus its optimizer shard, ranks 1..3 only theirs
    "llama_7b-4r": ["workload=llama_7b", "ranks=4", "scale=0.002"],
    # ZeRO 3: every rank writes a model shard and an optimizer shard
    "llama3_8b-8r": ["workload=llama3_8b", "ranks=8", "scale=0.001"],
}


@pytest.fixture(scope="module", params=list(KEPT_CASES), ids=list(KEPT_CASES))
def kept(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Kept:
    """A self-launched run (no mpiexec on the command line) with two kept checkpoints."""
    ovs = [*KEPT_CASES[request.param], "division=open", "checkpoint.num_writes=2",
           "checkpoint.num_reads=2", "checkpoint.keep=true"]
    cwd = tmp_path_factory.mktemp(request.param)
    t = time.monotonic()
    cp = run_mlckpt(["run", *ovs], cwd)
    elapsed = time.monotonic() - t
    folder = bundle_of(cp)
    assert folder.parent == cwd / "mlckpt-results"
    result = Result.load(folder)
    ckpt_root = cwd / "mlckpt-checkpoints" / folder.name
    return Kept(request.param, ovs, setup(ovs).plan, cwd, result, ckpt_root, elapsed)


def test_kept_files_and_bytes_equal_the_plan(kept: Kept) -> None:
    plan = kept.plan
    expected = {f.name: f.bytes for rp in plan.rank_plans for f in rp.files}
    assert len(expected) == plan.num_files  # file names are unique across ranks
    assert sum(expected.values()) == plan.total_bytes
    if kept.name == "llama_7b-4r":  # the differing ZeRO-1 layout really is in the plan
        assert [len(rp.files) for rp in plan.rank_plans] == [2, 1, 1, 1]
        assert plan.rank_plans[0].model_bytes > 0
        assert all(rp.model_bytes == 0 for rp in plan.rank_plans[1:])
    else:
        assert [len(rp.files) for rp in plan.rank_plans] == [2] * 8
    # only our checkpoint folders and the run marker, nothing else anywhere
    assert [p.name for p in (kept.cwd / "mlckpt-checkpoints").iterdir()] == [kept.ckpt_root.name]
    assert sorted(p.name for p in kept.ckpt_root.iterdir()) == [RUN_MARKER, "ckpt-0001", "ckpt-0002"]
    assert (kept.ckpt_root / RUN_MARKER).stat().st_size == 0
    for k in (1, 2):
        cdir = kept.ckpt_root / f"ckpt-{k:04d}"
        entries = list(os.scandir(cdir))
        assert all(e.is_file(follow_symlinks=False) for e in entries)
        assert {e.name: e.stat().st_size for e in entries} == expected, cdir
    # and the records say the same, rank by rank
    for (op, k), recs in kept.result.ops().items():
        assert sorted(r["rank"] for r in recs) == list(range(plan.ranks)), (op, k)
        for r in recs:
            rp = plan.rank_plans[r["rank"]]
            reads = plan.restore_reads(r["rank"], "own", kept.result.run["rank_shift"])
            want = rp.bytes if op == "write" else sum(rd.file.bytes for rd in reads)
            assert (r["bytes"], r["files"]) == (want, len(rp.files)), (op, k, r["rank"])
            assert r["checkpoint"] == (k if op == "write" else (k - 1) % 2 + 1)


def test_kept_pages_are_unique_and_incompressible(kept: Kept) -> None:
    files = sorted(kept.ckpt_root.glob("ckpt-*/*"))
    assert len(files) == 2 * kept.plan.num_files
    whole: set[bytes] = set()  # sha1 of every 4 KiB page of both checkpoints
    payload: set[bytes] = set()  # sha1 of the bytes after each page's 32-byte tag
    npages = 0
    sample = []
    for f in files:
        data = np.fromfile(f, dtype=np.uint8)
        assert len(data) % PAGE == 0, f  # scaled files are whole pages
        for row in data.reshape(-1, PAGE):
            whole.add(hashlib.sha1(row).digest())
            payload.add(hashlib.sha1(row[TAG_BYTES:]).digest())
        npages += len(data) // PAGE
        if f.parent.name == "ckpt-0001":
            sample.append(data[: 1 << 20].tobytes())
    assert npages == 2 * kept.plan.total_bytes // PAGE
    assert len(whole) == npages, f"{npages - len(whole)} duplicate 4 KiB pages"
    assert len(payload) == npages, f"{npages - len(payload)} duplicate page payloads"
    # incompressible: 1 MiB from every file of checkpoint 1
    joined = b"".join(sample)
    assert len(joined) >= 4 << 20
    ratio = len(zlib.compress(joined, 6)) / len(joined)
    assert 0.99 < ratio < 1.01, ratio


def test_kept_metrics_recompute_from_records(kept: Kept) -> None:
    res, plan = kept.result, kept.plan
    again = summarize(res.records, max_resident_fraction=COLD_BOUND)
    assert_same_numbers(again, res.summary)
    assert res.summary["checkpoint_bytes"] == plan.total_bytes
    assert res.summary["restore_bytes"] == plan.restore_bytes("own")
    assert_same_numbers(dlio_compat(again, plan.total_bytes), res.summary["metric"], "metric")
    # independently, by hand, op by op
    ops = res.ops()
    assert [(o["op"], o["index"]) for o in res.summary["ops"]] == [
        ("write", 1), ("write", 2), ("read", 1), ("read", 2)]
    for o in res.summary["ops"]:
        recs = ops[(o["op"], o["index"])]
        start = {h: min(r["t0_ns"] for r in recs if r["host"] == h) for h in {r["host"] for r in recs}}
        durs = {r["rank"]: (r["t1_ns"] - start[r["host"]]) / 1e9 for r in recs}  # from the host's barrier
        total = sum(r["bytes"] for r in recs)
        assert o["ranks"] == len(recs) == plan.ranks
        assert o["bytes"] == total == plan.total_bytes
        assert math.isclose(o["duration_s"], max(durs.values()), rel_tol=1e-12)
        assert math.isclose(o["bandwidth_gib_s"], total / max(durs.values()) / GiB, rel_tol=1e-12)
        own = {r["rank"]: r["bytes"] / durs[r["rank"]] / GiB for r in recs}
        assert math.isclose(o["slowest_rank_bandwidth_gib_s"], min(own.values()), rel_tol=1e-12)
        assert math.isclose(own[o["slowest_rank"]], min(own.values()), rel_tol=1e-12)
        assert all(o["slowest_rank_bandwidth_gib_s"] <= bw * (1 + 1e-12) for bw in own.values())
    for name in ("write", "read"):
        bws = [o["bandwidth_gib_s"] for o in res.summary["ops"] if o["op"] == name]
        assert math.isclose(res.summary[f"{name}_bandwidth_mean_gib_s"], sum(bws) / 2, rel_tol=1e-12)
        assert res.summary[f"{name}_bandwidth_min_gib_s"] == min(bws)
        assert res.summary[f"{name}_bandwidth_max_gib_s"] == max(bws)
    # timing is real: the runs moved bytes in positive, plausible time
    assert all(0 < o["duration_s"] < kept.elapsed_s for o in res.summary["ops"])


def test_kept_reads_are_cold_and_verified(kept: Kept) -> None:
    s = kept.result.summary
    assert (s["num_writes"], s["num_reads"]) == (2, 2)
    assert s["read_cold"] is True and s["read_verified"] is True and s["read_valid"] is True
    assert s["read_mismatches"] == 0
    assert 0.0 <= s["read_resident_fraction_max"] <= COLD_BOUND
    reads = [r for r in kept.result.records if r["op"] == "read"]
    assert len(reads) == 2 * kept.plan.ranks
    for r in reads:
        assert r["cached_check_bytes"] == r["bytes"] > 0
        assert 0 <= r["resident_bytes"] <= COLD_BOUND * r["cached_check_bytes"]
        assert r["verified_bytes"] == r["bytes"]
        assert r["mismatches"] == 0
        assert r["fsync"] is False
    writes = [r for r in kept.result.records if r["op"] == "write"]
    assert all(r["fsync"] is True and r["direct"] is True for r in writes)


def test_self_launch_runs_the_requested_ranks(kept: Kept) -> None:
    run = kept.result.run
    n = kept.plan.ranks
    assert run["status"] == "complete" and run["ranks"] == n
    assert run["division"] == "open" and run["scaled"] is True
    assert sorted(r for h in run["hosts"] for r in h["ranks"]) == list(range(n))
    assert {r["rank"] for r in kept.result.records} == set(range(n))
    assert len(kept.result.records) == 4 * n  # 2 writes + 2 reads, one record per rank each


# ---------------------------------------------------------------------------------------------
# a corrupted byte between the phases


FLIPS = {
    # payload byte of the only file (optimizer shard) of ZeRO-1 rank 3
    "payload": (["workload=llama_7b", "ranks=4", "scale=0.002"], 3, 0, 2 * PAGE + 1234),
    # page_index field of a page's tag in the model shard of rank 5 of 8
    "tag": (["workload=llama3_8b", "ranks=8", "scale=0.001"], 5, 0, 7 * PAGE + 24),
}


@pytest.mark.parametrize("case", list(FLIPS))
def test_flipped_byte_is_located_and_fails_the_run(case: str, tmp_path: Path) -> None:
    base, rank, index, offset = FLIPS[case]
    ovs = [*base, *SMALL]
    plan = setup(ovs).plan
    name = plan.rank_plans[rank].files[index].name
    assert offset < plan.rank_plans[rank].files[index].bytes
    cp = run_mlckpt(["run", *ovs], tmp_path, env={"MLCKPT_TEST_FLIP": f"{rank}:{index}:{offset}"})
    assert cp.returncode == 1, f"stdout:\n{cp.stdout}\nstderr:\n{cp.stderr}"
    line = error_line(cp)
    assert f"rank {rank} on " in line
    m = re.search(r"verification failed reading (\S+): byte (\d+) ", line)
    assert m, line
    path = Path(m.group(1))
    assert path.name == name and path.parent.name == "ckpt-0001"
    assert path.parent.parent.parent == tmp_path / "mlckpt-checkpoints"
    assert int(m.group(2)) == offset
    assert f"(page {offset // PAGE})" in line
    if case == "payload":
        assert "payload corrupted (tag intact)" in line
    else:
        assert "page written at the wrong offset" in line
    # no result, nothing left behind
    assert "bundle:" not in cp.stdout
    assert "read 1/" not in cp.stdout  # no bandwidth reported for a failed restore
    no_result_left(tmp_path)
    assert not (tmp_path / "mlckpt-checkpoints").exists()


# ---------------------------------------------------------------------------------------------
# gates refuse before writing anything


def test_folder_with_foreign_file_is_refused_untouched(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    foreign = ck / "foreign.txt"
    foreign.write_text("not mlckpt's\n")
    os.utime(foreign, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot(ck, content_limit=None)
    dir_mtime = ck.stat().st_mtime_ns
    cp = run_mlckpt(["run", "workload=llama3_8b", "ranks=4", "scale=0.001", f"checkpoint.folder={ck}",
                     *SMALL], work)
    assert cp.returncode == 2, cp.stderr
    line = error_line(cp)
    assert "[FOLDER-USABLE]" in line and "foreign.txt" in line
    assert snapshot(ck, content_limit=None) == before and ck.stat().st_mtime_ns == dir_mtime
    assert foreign.read_text() == "not mlckpt's\n"
    assert list(work.iterdir()) == []


def test_closed_division_with_two_writes_is_refused(tmp_path: Path) -> None:
    cp = run_mlckpt(["run", "division=closed", "checkpoint.num_writes=2"], tmp_path)
    assert cp.returncode == 2, cp.stderr
    assert "[CLOSED-COUNTS]" in error_line(cp)
    assert "bundle:" not in cp.stdout
    assert list(tmp_path.iterdir()) == []


def test_host_memory_is_refused_fast(tmp_path: Path) -> None:
    t = time.monotonic()
    # preset=none: the workload's own full-scale configuration (the laptop preset would scale it)
    cp = run_mlckpt(["run", "preset=none", "workload=llama3_8b", "ranks=8", "division=open"], tmp_path)
    elapsed = time.monotonic() - t
    assert cp.returncode == 2, cp.stderr
    line = error_line(cp)
    assert "[HOST-MEMORY]" in line and "104.70 GiB" in line
    assert list(tmp_path.iterdir()) == []
    assert elapsed < 20, elapsed


# ---------------------------------------------------------------------------------------------
# launching


def test_explicit_mpiexec_without_ranks(tmp_path: Path) -> None:
    ovs = ["workload=llama3_8b", "scale=0.001", *SMALL]
    res = Result.load(bundle_of(run_mlckpt(["run", *ovs], tmp_path, mpiexec_n=4)))
    assert res.run["ranks"] == 4 and "ranks=4" in res.run["overrides"]
    assert sorted(r["rank"] for r in res.records if r["op"] == "write") == [0, 1, 2, 3]
    assert sorted(r["rank"] for r in res.records if r["op"] == "read") == [0, 1, 2, 3]
    assert res.summary["checkpoint_bytes"] == setup([*ovs, "ranks=4"]).plan.total_bytes
    assert not (tmp_path / "mlckpt-checkpoints").exists()  # keep=false: cleaned up


def test_explicit_mpiexec_with_mismatched_ranks(tmp_path: Path) -> None:
    cp = run_mlckpt(["run", "ranks=8", "workload=llama3_8b", "scale=0.001", *SMALL], tmp_path,
                    mpiexec_n=4)
    assert cp.returncode == 2, cp.stderr
    line = error_line(cp)
    assert "ranks=8" in line and "4 ranks" in line
    assert "bundle:" not in cp.stdout
    assert list(tmp_path.iterdir()) == []


def test_multirun_one_bundle_per_rank_count(tmp_path: Path) -> None:
    cp = run_mlckpt(["run", "-m", "ranks=4,8", "division=open", "scale=0.001",
                     "checkpoint.num_writes=1", "checkpoint.num_reads=1"], tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip().splitlines()[-1].startswith("sweep table: ")  # the sweep ends with its table
    made = [Path(ln[len("bundle: "):]) for ln in cp.stdout.splitlines() if ln.startswith("bundle: ")]
    bundles = list({b.parent: b for b in made}.values())  # a disturbed try run again: its last bundle
    assert len(bundles) == 2 and all(b.is_dir() for b in bundles)
    results = sorted(p.name for p in (tmp_path / "mlckpt-results").iterdir())
    [table] = [n for n in results if n.startswith("sweep-") and n.endswith(".csv")]  # the sweep's table
    # one folder per combination, named by its swept value; Hydra's record of the sweep beside them
    assert [n for n in results if n != table] == ["multirun.yaml", "ranks=4", "ranks=8"]
    assert [(b.parent.name, b.parent.parent) for b in bundles] == [
        ("ranks=4", tmp_path / "mlckpt-results"), ("ranks=8", tmp_path / "mlckpt-results")]
    runs = [Result.load(b) for b in bundles]
    assert [r.run["ranks"] for r in runs] == [4, 8]
    for r, n in zip(runs, (4, 8), strict=True):
        assert {x["rank"] for x in r.records} == set(range(n))
        assert r.summary["checkpoint_bytes"] == setup(
            [f"ranks={n}", "division=open", "scale=0.001"]).plan.total_bytes
        assert r.summary["read_verified"] is True
    assert not (tmp_path / "mlckpt-checkpoints").exists()


@pytest.mark.slow
def test_embedded_default_run(tmp_path: Path) -> None:
    t = time.monotonic()
    cp = run_mlckpt(["run"], tmp_path)
    elapsed = time.monotonic() - t
    res = Result.load(bundle_of(cp))
    plan = setup(["workload=llama3_8b", "division=open", "scale=0.0125", "ranks=8"]).plan
    s = res.summary
    assert res.run["workload"] == "llama3_8b" and res.run["ranks"] == 8 and res.run["division"] == "open"
    assert (s["num_writes"], s["num_reads"]) == (3, 3)
    assert s["checkpoint_bytes"] == plan.total_bytes
    assert math.isclose(plan.total_bytes / GiB, 1.31, abs_tol=0.005)
    assert s["write_bytes_per_op"] == s["read_bytes_per_op"] == plan.total_bytes
    assert {r["rank"] for r in res.records} == set(range(8))
    assert s["read_verified"] is True and s["read_cold"] is True
    assert not (tmp_path / "mlckpt-checkpoints").exists()
    assert elapsed < 90, elapsed


def test_restore_repopulate_reads_the_model_into_every_replica(tmp_path: Path) -> None:
    ovs = ["workload=llama_7b", "ranks=4", "scale=0.002", "checkpoint.restore=repopulate", *SMALL]
    plan = setup(ovs).plan
    want = plan.restore_bytes("repopulate")
    assert want == plan.total_bytes + 3 * plan.rank_plans[0].model_bytes > plan.restore_bytes("own")
    res = Result.load(bundle_of(run_mlckpt(["run", *ovs], tmp_path)))
    s = res.summary
    assert s["read_bytes_per_op"] == want == s["restore_bytes"]
    assert s["write_bytes_per_op"] == plan.total_bytes
    assert s["read_verified"] is True and s["read_cold"] is True
    for r in (x for x in res.records if x["op"] == "read"):
        reads = plan.restore_reads(r["rank"], "repopulate", res.run["rank_shift"])
        assert r["bytes"] == sum(rd.file.bytes for rd in reads) == r["verified_bytes"]
        assert r["files"] == len(reads) == 2  # rank 0: its own two; others: model of rank 0 + own optimizer
    assert not (tmp_path / "mlckpt-checkpoints").exists()
