#!/usr/bin/env python3
"""How long does ``mlckpt-check`` take over one bundle of a large run (1,024 ranks × 20 ops with
host counters), and does the cost grow linearly with the records?

    .venv/bin/python benchmarks/check_large.py [--ranks 8 64 256 1024] [--repeat 3]

The real runner makes one llama3_8b run of 8 ranks with 10 writes and 10 restores (open, scale
0.002, records format 7: host counters, latency histograms, phases).  For each rank count N it is
widened to N ranks on its one host: rank r's records are rank r mod 8's with r's own bytes and
files from the plan for N ranks, config.yaml and run.json say N ranks, summary.json is
recomputed and the bundle re-signed.  The result is coherent enough for every rule to run on all
N × 20 records (its findings, if any, are printed: a laptop's calibration says nothing of 1,024
ranks).  Timed: ``mlckpt-check`` end to end (interpreter start included) with each --jobs,
alternated; best, median and worst of --repeat, with its modules' bytecode compiled first as an
install leaves it (an environment with PYTHONDONTWRITEBYTECODE would otherwise recompile some
sixty modules on every start).  Before each check a fixed pure-Python loop is timed: a shared VM's
single-core speed drifts by a quarter and more, so each --jobs also gets its median time in units
of that loop, and its worst time among the runs where the loop ran within 10 % of its fastest.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from lab import bench

from mlckpt import bundle
from mlckpt.rules import RunData, load_rules, recomputed_summary
from mlckpt.workload.layout import make_plan
from mlckpt.workload.model import workload_from_config

BIN = Path(sys.executable).parent
ORG, SYSTEM = "large-org", "large-ext4"
DESCRIPTION = bench.description("large-ext4", "Large Org")
BASE_RANKS = 8
PACKAGES = [Path(__file__).resolve().parents[1] / p for p in ("mlckpt", "checker")]


def make_source(work: Path) -> Path:
    (work / f"{SYSTEM}.yaml").write_text(DESCRIPTION)
    bundle.generate_key(work / "org.pem")
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "xdg"), "MLCKPT_RETRY_DISTURBED": "3"}
    env.pop("MLCKPT_DEBUG", None)
    proc = subprocess.run(
        [str(BIN / "mlckpt"), "run", "--json", "workload=llama3_8b", "division=open", "scale=0.002",
         f"ranks={BASE_RANKS}", "checkpoint.num_writes=10", "checkpoint.num_reads=10", "io.direct=false",
         f"system={SYSTEM}.yaml", "signing.key=org.pem", "output.root=sources"],
        cwd=work, env=env, text=True, capture_output=True, check=False)
    if proc.returncode not in (0, 6):
        sys.exit(f"check_large: the runner failed:\n{proc.stderr}")
    return Path(json.loads(proc.stdout.splitlines()[-1])["bundle"])  # mlckpt run --json


def widen(source: Path, dest: Path, ranks: int, key: object) -> int:
    """``source`` widened to ``ranks`` ranks in ``dest``, re-signed; the number of records."""
    shutil.copytree(source, dest)
    config = yaml.safe_load((dest / "config.yaml").read_text())
    config["ranks"] = ranks
    plan = make_plan(workload_from_config(config["workload"]), ranks, float(config["scale"]))
    base = [json.loads(line) for line in (dest / "records.jsonl").read_text().splitlines()]
    by_op: dict[tuple[str, int], dict[int, dict]] = {}
    for r in base:
        by_op.setdefault((r["op"], r["index"]), {})[r["rank"]] = r
    recs = []
    for (_, _), ranks_of in by_op.items():
        for rank in range(ranks):
            r = copy.deepcopy(ranks_of[rank % BASE_RANKS])
            r["rank"] = rank
            r["bytes"] = plan.rank_plans[rank].bytes
            r["files"] = len(plan.rank_plans[rank].files)
            for k in ("verified_bytes", "cached_check_bytes"):
                if k in r:
                    r[k] = r["bytes"]
            # The copies of one rank's record get timings of their own: moved by µs, each op ns longer.
            copy_no = rank // BASE_RANKS
            sync_end = r.get("staged_ns") == r["t1_ns"]
            for box in (r, *r.get("stages", ())):
                for k in ("t0_ns", "t1_ns", "staged_ns"):
                    if k in box:
                        box[k] += copy_no * 1000
            r["t1_ns"] += copy_no
            if r.get("stages"):
                r["stages"][-1]["t1_ns"] += copy_no
            if sync_end:
                r["staged_ns"] += copy_no
            if rank != 0:
                r.pop("host_counters", None)
            recs.append(r)
    (dest / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))
    (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = json.loads((dest / "run.json").read_text())
    run["ranks"] = ranks
    run["hosts"] = [{"host": run["hosts"][0]["host"], "ranks": list(range(ranks))}]
    run["name"] = run["name"].replace(f"-{BASE_RANKS}r-", f"-{ranks}r-")
    (dest / "run.json").write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    system = json.loads((dest / "system.json").read_text())
    data = RunData(run, config, {}, recs, system)
    summary = recomputed_summary(load_rules(run["rules_version"]), data, plan)
    (dest / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    pred = bundle.read_envelope_predicate(dest)
    pred.update(name=run["name"], ranks=ranks)
    bundle.sign_bundle(dest, key, pred)
    return len(recs)


REFERENCE_LOOPS = 5_000_000


def reference_s() -> float:
    """The seconds a fixed pure-Python loop takes now: the VM's single-core speed drifts by a
    quarter and more from minute to minute, so each check is set beside this, taken just before it."""
    t0 = time.perf_counter()
    total = 0
    for i in range(REFERENCE_LOOPS):
        total += i
    assert total == REFERENCE_LOOPS * (REFERENCE_LOOPS - 1) // 2
    return time.perf_counter() - t0


def speed_line(times: dict[int, list[float]], speeds: dict[int, list[float]]) -> str:
    """Each --jobs' check time in units of the reference loop taken just before it (median), and
    its times where the loop ran within 10 % of its fastest of the whole series (the VM at full speed)."""
    fastest = min(min(v) for v in speeds.values())
    parts = [f"reference loop {fastest:.2f}-{max(max(v) for v in speeds.values()):.2f} s"]
    for jobs, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, speeds[jobs], strict=True))
        quick = [a for a, b in zip(t, speeds[jobs], strict=True) if b <= 1.1 * fastest]
        at_full = (f", at full speed ({len(quick)} runs) worst {max(quick):.2f} s" if quick else "")
        parts.append(f"--jobs {jobs}: {ratio:.2f} reference loops (median){at_full}")
    return "; ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, os.cpu_count() or 1],
                    help="mlckpt-check --jobs values, alternated (default: 1 and the cores; with one "
                         "bundle, the jobs beyond the first go to its rules)")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="build the trees in DIR and keep them")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="mlckpt-large-"))
    work.mkdir(parents=True, exist_ok=True)
    compiled = subprocess.run([sys.executable, "-m", "compileall", "-q", *map(str, PACKAGES)], check=False)
    assert compiled.returncode == 0
    try:
        source = make_source(work)
        info = bundle.generate_key(work / "check.pem")
        key = bundle.load_private_key(info.path)
        for n in args.ranks:
            root = work / f"tree-{n}"
            (root / "open" / ORG / "systems").mkdir(parents=True)
            (root / "open" / ORG / "systems" / f"{SYSTEM}.yaml").write_text(DESCRIPTION)
            (root / "trusted-keys.yaml").write_text(
                f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {ORG}: ["{info.public_key}"]\n')
            dest = root / "open" / ORG / "results" / SYSTEM / "llama3_8b" / source.name.replace(
                f"-{BASE_RANKS}r-", f"-{n}r-")
            count = widen(source, dest, n, key)
            times: dict[int, list[float]] = {jobs: [] for jobs in args.jobs}
            speeds: dict[int, list[float]] = {jobs: [] for jobs in args.jobs}
            out = None
            for _ in range(args.repeat):
                for jobs in args.jobs:  # alternated, so that the VM's slow spells fall on each
                    speeds[jobs].append(reference_s())
                    t0 = time.monotonic()
                    out = subprocess.run([str(BIN / "mlckpt-check"), str(root), "--jobs", str(jobs), "--json",
                                          str(work / "r.json")], capture_output=True, text=True, check=False)
                    times[jobs].append(time.monotonic() - t0)
            report = json.loads((work / "r.json").read_text())
            [b] = report["bundles"]
            rules = sorted({f["rule"] for f in b["findings"]})
            if os.environ.get("SHOW"):
                for f in {f["rule"]: f for f in b["findings"]}.values():
                    print("   ", f["message"][:400])
            size = (dest / "records.jsonl").stat().st_size / 2**20
            figures = "; ".join(f"--jobs {jobs}: {min(t):.2f} s, median {statistics.median(t):.2f} s, "
                                f"worst {max(t):.2f} s" for jobs, t in times.items())
            print(f"{n:5d} ranks, {count:6d} records ({size:.1f} MiB): {figures}; verdict {b['verdict']}"
                  + (f", findings {', '.join(rules)}" if rules else ""), flush=True)
            print("      " + speed_line(times, speeds), flush=True)
            assert out is not None and out.returncode in (0, 1, 6), out.stderr
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
