"""What recording each request costs a run: the same workload under rules 1.9 (no request log) and
1.10 (each request timed, phases, the device sampled through each op), in alternated rounds.

    .venv/bin/python benchmarks/report_cost.py [--rounds 8] [--scale 0.01] [--ranks 4]
        [--writes 3] [--reads 3] [--folder DIR] [--block-size 1MiB]

Each run is a real `mlckpt run` (mpiexec, O_DIRECT, fsync inside timing, cold verified restores,
a signed bundle); the two rule sets differ in nothing on the I/O path but the recording (1.10's
other change, a barrier-skew floor, is a checker bound).  Alternating puts the machine's drift on
both alike.  For each run: the mean op duration of writes and of restores, and the CPU seconds the
ranks spent per GiB moved (records' cpu_ns), from the bundle's records.  Prints one line per run,
then per op kind the ratios 1.10 / 1.9 of the mean duration and of CPU per GiB, with the paired
rounds' spread.  The goal: within 1 % of an op's time and of its CPU.

    .venv/bin/python benchmarks/report_cost.py --engine [--rounds 20] [--folder DIR]

The same question without MPI, ranks or the machine's drift between runs: one process writes and
reads a 256 MiB file through the engine (O_DIRECT, 4 threads, 1 MiB requests), with and without
a request collection open, alternated; the wall time and CPU time of each call, medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def one_run(a: argparse.Namespace, tmp: Path, rules: str) -> dict[str, Any]:
    cmd = [str(BIN / "mlckpt"), "run", "--json", "preset=none", "workload=llama3_8b", "division=open",
           f"scale={a.scale}", f"ranks={a.ranks}", f"checkpoint.num_writes={a.writes}",
           f"checkpoint.num_reads={a.reads}", f"checkpoint.folder={a.folder}",
           f"io.block_size={a.block_size}", f"rules_version={rules}", f"signing.key={tmp / 'org.pem'}",
           f"output.root={tmp / 'results'}"]
    proc = subprocess.run(cmd, text=True, capture_output=True, check=False)
    if proc.returncode not in (0, 4, 6):  # valid, open (scaled) or disturbed: all measured
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    folder = Path(json.loads(proc.stdout)["bundle"])  # mlckpt run --json
    recs = [json.loads(x) for x in (folder / "records.jsonl").read_text().splitlines()]
    out: dict[str, Any] = {"rules": rules}
    for op in ("write", "read"):
        mine = [r for r in recs if r["op"] == op]
        by_op: dict[int, list[dict[str, Any]]] = {}
        for r in mine:
            by_op.setdefault(int(r["index"]), []).append(r)
        out[f"{op}_s"] = statistics.fmean(max(r["t1_ns"] - r["t0_ns"] for r in rs) / 1e9
                                          for rs in by_op.values())
        moved = sum(r["bytes"] for r in mine) / 2**30
        out[f"{op}_cpu_s_per_gib"] = sum(r["cpu_ns"] for r in mine) / 1e9 / moved
        out[f"{op}_requests"] = sum(r.get("requests", {}).get("count", 0) for r in mine)
    return out


def engine_cost(a: argparse.Namespace) -> int:
    import os

    from mlckpt import engine

    folder = Path(a.folder) / "report-cost-engine"
    folder.mkdir(parents=True, exist_ok=True)
    n, path = 256 << 20, str(folder / "f")
    buf = engine.alloc(n)
    opts = engine.IOOptions(direct=True, threads=4, block_size=1 << 20, fsync=True)
    out: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for k in range(a.rounds + 2):
        for collecting in ((False, True) if k % 2 == 0 else (True, False)):
            for op in ("write", "read"):
                if op == "write" and os.path.exists(path):
                    os.unlink(path)
                if collecting:
                    engine.collect("main")
                c0, t0 = time.process_time_ns(), time.perf_counter_ns()
                if op == "write":
                    engine.write_files([engine.FileIO(path, buf, n)], opts)
                else:
                    engine.read_files([engine.FileIO(path, buf, n)], opts)
                t1, c1 = time.perf_counter_ns(), time.process_time_ns()
                got = engine.collected("main")
                if k >= 2:  # the first rounds warm the pool and the page tables
                    out.setdefault((op, collecting), []).append(((t1 - t0) / 1e6, (c1 - c0) / 1e6))
                assert (got is not None) == collecting and (not collecting or len(got.latencies_ns) == 256)
    os.unlink(path)
    for op in ("write", "read"):
        off, on = out[(op, False)], out[(op, True)]
        for i, what in ((0, "wall ms"), (1, "CPU ms")):
            a0, a1 = statistics.median(x[i] for x in off), statistics.median(x[i] for x in on)
            print(f"{op} {what}: without {a0:.2f}, with {a1:.2f}, ratio {a1 / a0:.4f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--writes", type=int, default=3)
    ap.add_argument("--reads", type=int, default=3)
    ap.add_argument("--block-size", default="1MiB",
                    help="smaller blocks: more requests per op (the worst case)")
    ap.add_argument("--folder", default="./mlckpt-checkpoints")
    ap.add_argument("--engine", action="store_true", help="the engine alone, in this process")
    a = ap.parse_args()
    if a.engine:
        return engine_cost(a)
    from mlckpt import bundle

    with tempfile.TemporaryDirectory(prefix="mlckpt-report-cost-") as t:
        tmp = Path(t)
        bundle.generate_key(tmp / "org.pem")
        rows: dict[str, list[dict[str, Any]]] = {"1.9": [], "1.10": []}
        for k in range(a.rounds):
            for rules in (("1.9", "1.10") if k % 2 == 0 else ("1.10", "1.9")):
                r = one_run(a, tmp, rules)
                rows[rules].append(r)
                print(json.dumps({k2: round(v, 5) if isinstance(v, float) else v for k2, v in r.items()}),
                      flush=True)
    for op in ("write", "read"):
        for what in ("s", "cpu_s_per_gib"):
            key = f"{op}_{what}"
            old, new = [r[key] for r in rows["1.9"]], [r[key] for r in rows["1.10"]]
            paired = [n / o for o, n in zip(old, new, strict=True)]
            print(f"{key}: 1.9 {statistics.fmean(old):.5f}, 1.10 {statistics.fmean(new):.5f}, ratio "
                  f"{statistics.fmean(new) / statistics.fmean(old):.4f} (paired "
                  f"{min(paired):.3f}..{max(paired):.3f}, median {statistics.median(paired):.4f})")
    first = rows["1.10"][0]
    print(f"requests per run (1.10): write {first['write_requests']}, read {first['read_requests']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
