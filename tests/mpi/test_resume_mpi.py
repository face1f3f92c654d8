"""Resuming at another scale with real MPI ranks (mlckpt/run/phases/resumes.py): a checkpoint laid
out as llama3_8b's 8-rank layout resumes at 4 and at 16 ranks (data parallelism changed) and at
TP 2 (tensor parallelism changed); every new rank's state is verified byte for byte against the
content its old files were stamped with, and its records are what both plans give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.runs import MPIEXEC

from mlckpt.workload.layout import make_plan
from mlckpt.workload.model import ModelShape, Parallelism, Workload
from mlckpt.workload.resume import checkpoint_index, figures, held_to_plan, resume_plan

pytestmark = pytest.mark.mpi

WORKER = Path(__file__).parents[1] / "support" / "resume_worker.py"
L8B = ModelShape(4096, 32, 14336, 128256, 32, 8)


def resume(tmp_path: Path, ranks: int, *extra: str) -> list[dict]:
    return json.loads(run_worker(tmp_path, ranks, *extra))


def run_worker(tmp_path: Path, ranks: int, *extra: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", "mpi4py", str(WORKER),
                           str(tmp_path), *extra], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize(("ranks", "tp", "zero", "from_tp"), [(4, 1, 3, 1), (16, 1, 3, 1), (8, 2, 3, 1),
                                                              (4, 4, 1, 2)])
def test_a_checkpoint_written_at_8_ranks_resumes_at_another_layout(tmp_path: Path, ranks: int, tp: int,
                                                                    zero: int, from_tp: int) -> None:
    recs = resume(tmp_path, ranks, "--tp", str(tp), "--zero", str(zero), "--from-tp", str(from_tp))
    w = Workload("llama3_8b", L8B, Parallelism(from_tp, 1, zero), 8)
    plan = resume_plan(checkpoint_index(make_plan(w, 8, 0.001)), w, ranks, tp, 1)
    assert held_to_plan(plan, recs) == []
    assert all("failed" not in r and r["verified_bytes"] == r["bytes"] > 0 for r in recs)
    f = figures(recs)
    assert f["state_bytes"] == plan.state_bytes and f["read_bytes"] == plan.read_bytes
    assert all(r["t0_ns"] + sum(r[f"{p}_ns"] for p in ("metadata", "planning", "read", "placing"))
               <= r["t1_ns"] for r in recs)
    if zero == 3 and tp == 1:  # only DP changed: the new ranks hold the stored tensors once
        assert f["state_bytes"] == plan.index.tensor_bytes
    # a forged resume: bytes, or a rank, the plans do not give
    forged = [dict(r) for r in recs]
    forged[1]["bytes"] += 4096
    assert any("rank 1: bytes" in p for p in held_to_plan(plan, forged))
    assert any("the new layout has" in p for p in held_to_plan(plan, recs[:-1]))


def test_a_flipped_byte_in_an_old_file_is_caught_where_it_lands(tmp_path: Path) -> None:
    w = Workload("llama3_8b", L8B, Parallelism(1, 1, 3), 8)
    plan = resume_plan(checkpoint_index(make_plan(w, 8, 0.001)), w, 4, 1, 1)
    n = plan.rank_resumes[2].needs[5]  # a byte in the middle of a range new rank 2 needs
    offset = n.offset + n.length // 2
    recs = resume(tmp_path, 4, "--corrupt", f"{n.writer}:{n.index}:{offset}")
    failed = {r["rank"]: r.get("failed") for r in recs}
    assert failed[2] is not None and f"byte {offset} of" in failed[2]
    assert all(v is None for k, v in failed.items() if k != 2)


def test_dcp_reshards_a_checkpoint_written_at_8_ranks_to_another_tp(tmp_path: Path) -> None:
    """DCP saves the 8-rank layout's pieces of the global tensors; a load at TP 2 on 4 ranks reads
    what each new shard overlaps, by DCP's own planner; every byte lands where the plans say.  (At 16
    ranks too: benchmarks/resume.py --dcp; 16 PyTorch processes take a minute on 2 cores.)"""
    ranks, tp = 4, 2
    pytest.importorskip("torch.distributed.checkpoint")
    key, run_id = "00112233445566778899aabbccddeeff", 12345
    saved = tmp_path / "dcp"
    common = ("--key", key, "--run-id", str(run_id), "--zero", "3", "--tp", str(tp))
    assert run_worker(tmp_path / "files", 8, *common, "--dcp-save", str(saved)) == ""
    recs = resume(tmp_path / "files", ranks, *common, "--dcp", str(saved))
    w = Workload("llama3_8b", L8B, Parallelism(1, 1, 3), 8)
    plan = resume_plan(checkpoint_index(make_plan(w, 8, 0.001)), w, ranks, tp, 1)
    assert len(recs) == ranks
    assert all("failed" not in r and r["verified_bytes"] == r["bytes"] > 0 for r in recs)
    held = [r["bytes"] for r in sorted(recs, key=lambda r: r["rank"])]
    assert held == [rr.bytes for rr in plan.rank_resumes]
    assert all(r["metadata_ns"] > 0 and r["read_ns"] > 0 for r in recs)
    assert sum(1 for p in saved.iterdir() if p.suffix == ".distcp") == 8  # written by the 8 old ranks
