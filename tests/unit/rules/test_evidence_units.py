"""The evidence the runner records (mlckpt.host.facts) and the pure pieces of the checker's
cross-examination (mlckpt.rules.checks.evidence), without MPI.  The checks themselves are judged
on real bundles by tests/adversarial/test_forgeries.py."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlckpt.host import facts
from mlckpt.rules import load_rules
from mlckpt.rules.checks.evidence import fingerprints, start_skew, timing_copies
from mlckpt.rules.engine import Context, Outcome
from mlckpt.rules.rundata import RunData


def read(rank: int, index: int, t0: int, dur: int, host: str = "h") -> dict[str, Any]:
    return {"op": "read", "index": index, "checkpoint": 1, "rank": rank, "host": host, "t0_ns": t0,
            "t1_ns": t0 + dur, "wall_start": 1e9 + t0 / 1e9, "bytes": 4096, "files": 1, "fsync": False,
            "resident_bytes": 0, "cached_check_bytes": 4096, "verified_bytes": 4096, "mismatches": 0,
            "tier": "durable"}


def judge(check: Any, records: list[dict[str, Any]]) -> list[Outcome]:
    rs = load_rules("1.7")  # the constant bounds (1.8's follow each host's calibration: test_attribution)
    ctx = Context({}, None, (), run=RunData({}, {}, {}, records, {}))  # type: ignore[arg-type]
    return [o for o in check(ctx, rs, rs.rule("RECORDS-SKEW")) if isinstance(o, Outcome) and not o.ok]


def test_skew_within_the_bound_passes_beyond_it_fails() -> None:
    b = load_rules("1.7").data["evidence"]["start_skew"]
    dur = 1_000_000_000
    bound = int(b["abs_s"] * 1e9 + b["rel"] * dur)
    ok = [read(0, 1, 0, dur), read(1, 1, bound - 1000, dur - bound + 1000)]
    late = [read(0, 1, 0, dur), read(1, 1, bound + 1000, dur - bound - 1000)]
    assert judge(start_skew, ok) == []
    [bad] = judge(start_skew, late)
    assert "rank 1" in str(bad.actual)
    # on different hosts the clocks are not comparable: no skew to judge
    assert judge(start_skew, [read(0, 1, 0, dur), read(1, 1, 10 * dur, dur, host="other")]) == []


def test_a_copied_record_and_a_copied_op_are_found() -> None:
    honest = [read(r, k, k * 10**9 + 1000 * r + 7 * k, 300_000_000 + 12_345 * r + 999 * k)
              for k in (1, 2) for r in range(4)]
    assert judge(timing_copies, honest) == []
    copied = [dict(r) for r in honest]
    copied[3] = {**copied[2], "rank": 3}  # rank 3's record of read 1 is rank 2's
    assert judge(timing_copies, copied)
    op = [dict(r) for r in honest]
    for a, b in zip(op[:4], op[4:], strict=True):  # read 2 lasts what read 1 lasted, rank by rank
        b["t1_ns"] = b["t0_ns"] + (a["t1_ns"] - a["t0_ns"])
    assert judge(timing_copies, op)


@given(st.lists(st.integers(1, 10**10), min_size=2, max_size=20, unique=True), st.integers(1, 10**15))
def test_fingerprints_survive_a_clock_shift_and_tell_runs_apart(durations: list[int], shift: int) -> None:
    recs = [read(i, 1, 10**12 + i * 10**6, d) for i, d in enumerate(durations)]
    moved = [{**r, "t0_ns": r["t0_ns"] + shift, "t1_ns": r["t1_ns"] + shift} for r in recs]
    a, b = fingerprints(recs), fingerprints(moved)
    assert a[0] == b[0] and a[0].startswith("timings:")  # the same measurements, wherever in time
    assert a[1] != b[1]  # other clock readings
    other = [{**r, "t1_ns": r["t1_ns"] + 1} if i == 0 else r for i, r in enumerate(recs)]
    assert fingerprints(other)[0] != a[0]  # one nanosecond apart: another run


def test_counters_sample_is_the_kernels() -> None:
    dev = facts.block_device(Path("/"))
    before = facts.counters_sample(dev)
    (Path("/tmp") / f"mlckpt-ev-{os.getpid()}").write_bytes(b"x")
    after = facts.counters_sample(dev)
    assert after["t_ns"] > before["t_ns"] and abs(after["t_ns"] - time.perf_counter_ns()) < 10**9
    assert {"cached_bytes", "dirty_bytes"} <= set(after)
    if dev is not None:  # a block device: its counters only grow
        assert after["written_bytes"] >= before["written_bytes"] >= 0 and "busy_ms" in after
    os.unlink(Path("/tmp") / f"mlckpt-ev-{os.getpid()}")


def test_memory_filesystems_have_no_block_device() -> None:
    if not Path("/dev/shm").is_dir() or facts.mount_of(Path("/dev/shm")).get("fs_type") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    assert facts.block_device(Path("/dev/shm")) is None


def test_memory_copy_rate_is_measured() -> None:
    rate = facts.memory_copy_gib_s(threads=1, per_thread_bytes=4 << 20)
    assert 0.05 < rate < 10_000
    assert facts.boot_id() is None or len(facts.boot_id() or "") >= 8


def test_digest_prints_a_paste_ready_released_runners_entry(tmp_path: Path) -> None:
    import subprocess
    import sys

    from mlckpt import bundle
    from mlckpt.bundle.released import load_released

    exe = Path(sys.executable).parent / "mlckpt"
    proc = subprocess.run([str(exe), "digest", "--entry"], text=True, capture_output=True, check=False,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = tmp_path / "released-runners.yaml"
    listed.write_text('mlckpt_released_runners: "1.0"\nrunners:\n' + proc.stdout)
    assert load_released(listed) == frozenset({bundle.code_digest()})
    full = subprocess.run([str(exe), "digest"], text=True, capture_output=True, check=False, timeout=60)
    assert full.stdout.startswith(f"runner_code_sha256: {bundle.code_digest()} (mlckpt ")


@pytest.mark.parametrize(("text", "fragment"), [
    ("runners: []\n", "mlckpt_released_runners"),
    ('mlckpt_released_runners: "1.0"\nrunners:\n  - {version: "1", code_sha256: "ABC"}\n', "code_sha256"),
    ('mlckpt_released_runners: "1.0"\nrunners: []\nrunners: []\n', "cannot parse released runners"),
    ('mlckpt_released_runners: "1.0"\nrunners:\n  - {version: "1", code_sha256: "' + "a" * 64
     + '", signed_by: x}\n', "signed_by"),
])
def test_a_bad_released_runners_file_is_one_line_exit_2(text: str, fragment: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    root = tmp_path / "tree"
    (root / "open").mkdir(parents=True)
    (root / "trusted-keys.yaml").write_text('mlckpt_trusted_keys: "1.0"\norganizations: {}\n')
    (root / "released-runners.yaml").write_text(text)
    exe = Path(sys.executable).parent / "mlckpt-check"
    proc = subprocess.run([str(exe), str(root)], text=True, capture_output=True, check=False, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    [line] = proc.stderr.strip().splitlines()
    assert "released-runners.yaml" in line and fragment in line and "Traceback" not in proc.stderr


def write(rank: int, index: int, t0: int, stall: int, durable: int) -> dict[str, Any]:
    return {"op": "write", "index": index, "checkpoint": index, "rank": rank, "host": "h", "t0_ns": t0,
            "t1_ns": t0 + durable, "staged_ns": t0 + stall, "wall_start": 1e9 + t0 / 1e9, "bytes": 4096,
            "files": 1, "fsync": True, "mode": "async", "backpressure_ns": 0, "exposed_ns": 0,
            "compute_ns": 0, "stages": []}


def test_a_barrier_overlapped_by_background_persists_gets_the_busy_allowance() -> None:
    """Rules 1.4: ranks leaving write 2's barrier while their own persists of checkpoint 1 still
    run may be 0.15 s apart (start_skew_busy); once checkpoint 1 is durable, 30 ms + 15 % again."""
    ms = 1_000_000
    base = [write(0, 1, 0, 10 * ms, 500 * ms), write(1, 1, 0, 10 * ms, 500 * ms)]
    busy = [*base, write(0, 2, 100 * ms, 10 * ms, 500 * ms), write(1, 2, 190 * ms, 10 * ms, 500 * ms)]
    assert judge(start_skew, busy) == []  # 90 ms apart, checkpoint 1 durable only at 500 ms
    idle = [write(0, 1, 0, 10 * ms, 50 * ms), write(1, 1, 0, 10 * ms, 50 * ms),
            write(0, 2, 100 * ms, 10 * ms, 50 * ms), write(1, 2, 190 * ms, 10 * ms, 50 * ms)]
    [bad] = judge(start_skew, idle)  # durable at 50 ms: nothing overlaps write 2's barrier
    assert "rank 1 90.0 ms" in str(bad.actual)
    too_late = [*base, write(0, 2, 100 * ms, 10 * ms, 500 * ms), write(1, 2, 260 * ms, 10 * ms, 500 * ms)]
    assert len(judge(start_skew, too_late)) == 1  # 160 ms: beyond even the busy allowance


def test_a_hosts_rate_is_its_bytes_over_the_window_its_ranks_span() -> None:
    """Two ranks' memory stages of 10 ms each, one after the other: the host moved its bytes in
    20 ms, not in one rank's 10 ms (an honest async run under load staggers them this way)."""
    from mlckpt.rules.checks.physics import host_rates

    def write(rank: int, t0: int) -> dict[str, Any]:
        return {"op": "write", "index": 1, "rank": rank, "host": "h", "t0_ns": 0, "t1_ns": 50_000_000,
                "bytes": 2**30, "stages": [{"tier": "memory", "t0_ns": t0, "t1_ns": t0 + 10_000_000}]}

    [(host, rate, total)] = list(host_rates([write(0, 0), write(1, 10_000_000)], "memory"))
    assert (host, total) == ("h", 2**31) and rate == pytest.approx(2**31 / 0.020)
    [(_, overlapping, _)] = list(host_rates([write(0, 0), write(1, 0)], "memory"))
    assert overlapping == pytest.approx(2**31 / 0.010)
    [(_, op_rate, _)] = list(host_rates([write(0, 0), write(1, 0)]))  # the ops' own [t0, t1]
    assert op_rate == pytest.approx(2**31 / 0.050)
