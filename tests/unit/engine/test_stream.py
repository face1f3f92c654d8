"""residency=stream: bounded-ring writes and verified restores (engine level and real MPI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlckpt import engine

KEY = bytes(range(16))


def _files(tmp_path: Path, sizes: list[int], ckpt: int = 1) -> list[engine.StreamFile]:
    return [engine.StreamFile(str(tmp_path / f"f{i}"), n, engine.PageId(99, 3, ckpt, i))
            for i, n in enumerate(sizes)]


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("threads", [1, 3])
def test_stream_content_equals_full_residency_content(tmp_path: Path, direct: bool, threads: int) -> None:
    opts = engine.IOOptions(direct=direct, threads=threads, block_size=1 << 20)
    files = _files(tmp_path, [(3 << 20) + 123, 4096, 1 << 20, 40])
    ring = engine.alloc(engine.stream_ring_bytes(opts, reading=True))
    engine.write_stream(files, KEY, opts, ring, dir_fsync=[str(tmp_path)])
    for f in files:
        assert os.path.getsize(f.path) == f.nbytes
        full = engine.alloc(f.nbytes)
        engine.fill(full, f.nbytes, KEY, f.pid)
        assert Path(f.path).read_bytes() == full[: f.nbytes].tobytes()
    engine.read_stream(files, KEY, opts, ring)  # verifies every block; raises on a difference


@pytest.mark.parametrize("offset", [0, 31, 4096 + 7, (2 << 20) + 5000, (3 << 20) + 122])
def test_stream_read_locates_a_flipped_byte(tmp_path: Path, offset: int) -> None:
    opts = engine.IOOptions(direct=True, threads=2, block_size=1 << 20)
    files = _files(tmp_path, [(3 << 20) + 123])
    ring = engine.alloc(engine.stream_ring_bytes(opts, reading=True))
    engine.write_stream(files, KEY, opts, ring)
    fd = os.open(files[0].path, os.O_RDWR)
    b = os.pread(fd, 1, offset)
    os.pwrite(fd, bytes([b[0] ^ 0x10]), offset)
    os.close(fd)
    with pytest.raises(engine.StreamMismatch) as info:
        engine.read_stream(files, KEY, opts, ring)
    assert info.value.mismatch.offset == offset
    assert info.value.path == files[0].path


def test_stream_read_names_a_stale_checkpoint(tmp_path: Path) -> None:
    opts = engine.IOOptions(direct=True, threads=1, block_size=1 << 20)
    old = _files(tmp_path, [1 << 20], ckpt=1)
    ring = engine.alloc(engine.stream_ring_bytes(opts, reading=True))
    engine.write_stream(old, KEY, opts, ring)
    expected_newer = [engine.StreamFile(old[0].path, old[0].nbytes, engine.PageId(99, 3, 2, 0))]
    with pytest.raises(engine.StreamMismatch, match="stale checkpoint 1"):
        engine.read_stream(expected_newer, KEY, opts, ring)


def test_ring_too_small_is_refused(tmp_path: Path) -> None:
    opts = engine.IOOptions(direct=True, threads=4, block_size=1 << 20)
    with pytest.raises(Exception, match="ring"):
        engine.write_stream(_files(tmp_path, [8 << 20]), KEY, opts, engine.alloc(1 << 20))


@pytest.mark.mpi
def test_stream_run_stays_under_its_memory_cap(tmp_path: Path) -> None:
    """A 4-rank run whose state (~560 MiB per rank) is far above the 32 MiB ring: every page is
    verified and each rank's peak RSS stays far below its state size."""
    exe = Path(sys.executable).parent / "mlckpt"
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    args = [str(exe), "run", "ranks=4", "division=open", "scale=0.02", "residency=stream",
            "stream_buffer_bytes=33554432", "checkpoint.num_writes=1", "checkpoint.num_reads=1"]
    # Measure in a fresh process whose only descendants are this run's: RUSAGE_CHILDREN of the
    # pytest process would carry the peak of every earlier test's subprocesses.
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
             "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
             "sys.exit(r.returncode)")
    out = subprocess.run([sys.executable, "-c", probe, *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    bundle = Path(out.stdout.strip().splitlines()[-1].removeprefix("bundle: "))
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["read_verified"] and summary["read_mismatches"] == 0
    state_per_rank = summary["checkpoint_bytes"] / 4
    assert state_per_rank > 500 << 20
    # ru_maxrss (KiB) of the largest child: a rank holds the ring plus the interpreter, not its state.
    peak = int(out.stderr.split("maxrss_kib")[-1].split()[0]) * 1024
    assert peak < 0.5 * state_per_rank, (peak, state_per_rank)
    assert np.isfinite(summary["write_bandwidth_mean_gib_s"])
