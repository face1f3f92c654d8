"""What telling the run's I/O from other tenants' costs (rules 1.8): the counters sample with the
ranks' own accounting against the plain one, and the share of an op's time it takes in real runs.

Each host's first rank samples its counters on leaving an op's barrier, before its own t0 (so a
slower sample starts it later), and again once every rank has ended the op (outside every
rank's timing).  Records format 6 keeps how long each sample took (``read_ns``): this script reads
them back from real bundles of the README's default run (8 ranks) and divides by the op's time.
It also times the sample itself in a loop, with and without the accounting of 8 processes, and
what the calibration's 24 rounds spend sampling.

    python benchmarks/attribution_cost.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlckpt.host.facts import block_device, counters_sample

MLCKPT = Path(sys.executable).parent / "mlckpt"


def sample_cost_us(device: str | None, pids: list[int], n: int = 2000) -> float:
    """Median microseconds of one counters sample."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        counters_sample(device, pids)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def op_shares(bundle: Path) -> list[tuple[str, int, float, float]]:
    """(op, index, the leader's sample before t0 ÷ the op's time, both samples ÷ the op's time)."""
    recs = [json.loads(ln) for ln in (bundle / "records.jsonl").read_text().splitlines()]
    out = []
    for key in sorted({(r["op"], r["index"]) for r in recs}):
        mine = [r for r in recs if (r["op"], r["index"]) == key]
        dur = max(r["t1_ns"] - r["t0_ns"] for r in mine)
        [hc] = [r["host_counters"] for r in mine if "host_counters" in r]
        before, after = hc["before"]["read_ns"], hc["after"]["read_ns"]
        out.append((key[0], key[1], before / dur, (before + after) / dur))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mlckpt-attr-"))
    dev = block_device(work)
    # 8 real processes, as a host of 8 ranks: the leader reads each one's /proc files
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(8)]
    try:
        pids = [p.pid for p in sleepers]
        plain, own = sample_cost_us(dev, []), sample_cost_us(dev, pids)
    finally:
        for p in sleepers:
            p.kill()
    print(f"counters sample: {plain:.0f} µs plain, {own:.0f} µs with 8 ranks' accounting "
          f"(+{own - plain:.0f} µs); calibration's 24 rounds sample twice each: {48 * own / 1e3:.1f} ms")
    shares: list[tuple[str, int, float, float]] = []
    for i in range(a.runs):
        args = [str(MLCKPT), "run", "--json", "signing.key=none", f"output.root=r{i}", "checkpoint.folder=ck"]
        proc = subprocess.run(args, cwd=work, text=True, capture_output=True, timeout=600, check=False)
        [outcome] = [json.loads(ln) for ln in proc.stdout.splitlines()]  # mlckpt run --json
        shares += op_shares(Path(outcome["bundle"]))
    for op in ("write", "read"):
        mine = [s for s in shares if s[0] == op]
        print(f"{op}s ({len(mine)} ops of the default run, 8 ranks): the sample before t0 is "
              f"{100 * statistics.median(s[2] for s in mine):.3f} % of the op's time (max "
              f"{100 * max(s[2] for s in mine):.3f} %); both samples "
              f"{100 * statistics.median(s[3] for s in mine):.3f} %")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
