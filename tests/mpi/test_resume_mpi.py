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
from mlckpt.workload.resume import checkpoint_index, held_to_whole_pieces, resume_plan

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


def test_dcp_reshards_a_checkpoint_to_more_ranks_and_another_tp(tmp_path: Path) -> None:
    """Four new ranks save, through DCP, the checkpoint a 2-rank layout (TP 1)
    would have saved (new ranks 2 and 3 hold no old rank's pieces and save nothing), then load it at
    TP 2 through DCP's own planner: the files are the old layout's, one an old rank, each new rank
    read every stored piece its shard overlaps, whole, and every byte lands where the plans say.
    (Fewer new ranks than old, each saving several old ranks' pieces: tests/mpi/test_resume_run.py.)"""
    pytest.importorskip("torch.distributed.checkpoint")
    ranks, tp, old = 4, 2, 2
    recs = resume(tmp_path, ranks, "--zero", "3", "--tp", str(tp), "--from-ranks", str(old), "--dcp")
    w = Workload("llama3_8b", L8B, Parallelism(1, 1, 3), 8)
    index = checkpoint_index(make_plan(w, old, 0.001))
    plan = resume_plan(index, w, ranks, tp, 1, spread=False)
    assert len(recs) == ranks
    assert all("failed" not in r and r["verified_bytes"] == r["bytes"] > 0 for r in recs)
    assert held_to_whole_pieces(plan, recs, 8192) == []
    assert all(r["metadata_ns"] > 0 and r["read_ns"] > 0 and r["reads"] > 0 for r in recs)
    assert recs[0]["saved"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # an old rank's file each
