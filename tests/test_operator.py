"""The operator's hour (issue 18), as a person at a customer site meets it: the installed
`mlckpt run`, its exit status and what it leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SMALL = ("workload=llama3_8b", "division=open", "scale=0.0005", "ranks=2", "checkpoint.num_writes=1",
         "checkpoint.num_reads=1", "io.direct=false")


def mlckpt(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "xdg")}
    env.pop("MLCKPT_DEBUG", None)
    return subprocess.run([str(BIN / "mlckpt"), *args], cwd=cwd, env=env, text=True, capture_output=True,
                          check=False, timeout=300)


def test_an_invalid_verdict_exits_5_and_says_so_first(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    folder = shm / f"mlckpt-invalid-{os.getpid()}"
    proc = mlckpt("run", *SMALL, f"checkpoint.folder={folder}", "output.root=results", cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr  # restores from tmpfs are memory reads: COLD-READ
    assert "verdict is invalid" in proc.stderr and "verdict invalid" in proc.stdout
    [bundle] = (tmp_path / "results").iterdir()
    assert (bundle / "run.log").read_text().splitlines()[0] == \
        "INVALID RESULT: the rules find this run invalid (COLD-READ)"
    assert not folder.exists() or not any(folder.iterdir())  # the checkpoints are gone all the same


def test_a_valid_run_exits_0(tmp_path: Path) -> None:
    proc = mlckpt("run", *SMALL, "checkpoint.folder=ck", "output.root=results", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [bundle] = (tmp_path / "results").iterdir()
    assert not (bundle / "run.log").read_text().startswith("INVALID")


def test_a_mistyped_checkpoint_folder_is_refused_at_once(tmp_path: Path) -> None:
    import time

    t0 = time.perf_counter()
    proc = mlckpt("run", *SMALL, "checkpoint.folder=mnt/typo/ckpt", "output.root=results", cwd=tmp_path)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "[FOLDER-USABLE]" in line and f"its parent {tmp_path}/mnt/typo does not exist" in line
    assert "mkdir -p" in line and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing created: no folder, no key
    assert elapsed < 2.0, elapsed  # refused before mpiexec starts (about 0.7 s here)
