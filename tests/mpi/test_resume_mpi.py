"""Resuming at another scale with real MPI ranks, below the runner (mlckpt/run/phases/resumes.py):
a byte flipped in an old file is caught on the new rank it lands on, and DCP's own resharding load
(mlckpt/engine/dcp_reshard.py) brings every byte where the plans say.  The runner's resumes at 4 and
16 ranks and at TP 2, with their bundles and forgeries: tests/mpi/test_resume_run.py."""

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
from mlckpt.workload.resume import checkpoint_index, resume_plan

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


def test_a_flipped_byte_in_an_old_file_is_caught_where_it_lands(tmp_path: Path) -> None:
    w = Workload("llama3_8b", L8B, Parallelism(1, 1, 3), 8)
    plan = resume_plan(checkpoint_index(make_plan(w, 8, 0.001)), w, 4, 1, 1)
    n = plan.rank_resumes[2].needs[5]  # a byte in the middle of a range new rank 2 needs
    offset = n.offset + n.length // 2
    recs = resume(tmp_path, 4, "--corrupt", f"{n.writer}:{n.index}:{offset}")
    failed = {r["rank"]: r.get("failed") for r in recs}
    assert failed[2] is not None and f"byte {offset} of" in failed[2]
    assert all(v is None for k, v in failed.items() if k != 2)


def test_dcp_reshards_a_checkpoint_to_another_tp(tmp_path: Path) -> None:
    """DCP saves a 4-rank layout's pieces of the global tensors; a load at TP 2 on 2 ranks reads what
    each new shard overlaps, by DCP's own planner; every byte lands where the plans say.  (From 8
    ranks to 4 and 16: benchmarks/resume.py --dcp; each PyTorch process takes seconds to start on 2
    cores.)"""
    ranks, tp, old = 2, 2, 4
    pytest.importorskip("torch.distributed.checkpoint")
    key, run_id = "00112233445566778899aabbccddeeff", 12345
    saved = tmp_path / "dcp"
    common = ("--key", key, "--run-id", str(run_id), "--zero", "3", "--tp", str(tp))
    common = (*common, "--from-ranks", str(old))
    assert run_worker(tmp_path / "files", old, *common, "--dcp-save", str(saved)) == ""
    recs = resume(tmp_path / "files", ranks, *common, "--dcp", str(saved))
    w = Workload("llama3_8b", L8B, Parallelism(1, 1, 3), 8)
    plan = resume_plan(checkpoint_index(make_plan(w, old, 0.001)), w, ranks, tp, 1)
    assert len(recs) == ranks
    assert all("failed" not in r and r["verified_bytes"] == r["bytes"] > 0 for r in recs)
    held = [r["bytes"] for r in sorted(recs, key=lambda r: r["rank"])]
    assert held == [rr.bytes for rr in plan.rank_resumes]
    assert all(r["metadata_ns"] > 0 and r["read_ns"] > 0 for r in recs)
    assert sum(1 for p in saved.iterdir() if p.suffix == ".distcp") == old  # one file an old rank
