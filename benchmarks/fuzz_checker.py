#!/usr/bin/env python3
"""The structural fuzzer's long run: does ``mlckpt-check`` judge every signed hostile bundle
without a fault and within its budget?

    .venv/bin/python benchmarks/fuzz_checker.py [--cases 10000] [--seed 1] [--budget 60] [--split]

The real runner makes seven bundles (llama3_8b and llama_7b, sync, 1 write + 1 restore; llama3_8b
asynchronous with a fast tier, 2 + 2; a serving run of llama3_8b, 2 replicas of TP 2 loading by
fan-out twice; llama3_8b by each framework writer, torch.save, PyTorch DCP and safetensors, 1 + 1;
open division, scale 0.0005, 4 ranks).  Each case copies
one, applies one to three structural mutations (benchmarks/lab/structural.py: keys dropped, values of
another type or extreme, records repeated up to 60,000 times, dropped, reordered or retargeted,
files swapped or added, links), re-signs it with the trusted key and checks it in-process (with
--split, its records and its rules on two processes each, as a large bundle's are).  It
prints the verdicts, the checker faults, the checks over the budget and the slowest ones, and
exits 1 if any case faulted or ran over.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from lab import (
    bench,
    structural,  # benchmarks/lab/structural.py
)

from checker import forked
from mlckpt import bundle

BIN = Path(sys.executable).parent
ORG, SYSTEM = "fuzz-org", "fuzz-ext4"
DESCRIPTION = bench.description("fuzz-ext4", "Fuzz Org").encode()


def make_sources(work: Path) -> list[Path]:
    """Seven real bundles, signed with ``work/org.pem`` (``work/trusted-keys.yaml`` trusts it)."""
    (work / f"{SYSTEM}.yaml").write_bytes(DESCRIPTION)
    info = bundle.generate_key(work / "org.pem")
    (work / "trusted-keys.yaml").write_text(f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {ORG}: '
                                            f'["{info.public_key}"]\n')
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "xdg")}
    env.pop("MLCKPT_DEBUG", None)
    common = ["division=open", "scale=0.0005", "ranks=4", f"system={SYSTEM}.yaml",
              "signing.key=org.pem", "output.root=sources"]
    buffered = "io.direct=false"  # checkpoint runs; a serving run reads its weights with O_DIRECT
    runs = [["-m", "workload=llama3_8b,llama_7b", "checkpoint.num_writes=1", "checkpoint.num_reads=1",
             buffered],
            ["workload=llama3_8b", "checkpoint.num_writes=2", "checkpoint.num_reads=2",
             "checkpoint.mode=async", f"checkpoint.tiers.fast={work / 'fast'}",
             "checkpoint.compute_interval_s=0.5", buffered],
            ["workload=llama3_8b", "serving.strategy=fanout", "serving.tp=2", "serving.loads=2"],
            ["-m", "workload=llama3_8b", "framework.writer=torch_save,torch_dcp,safetensors",
             "checkpoint.num_writes=1", "checkpoint.num_reads=1", buffered]]
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("safetensors") is None:
        print("fuzz_checker: PyTorch or safetensors is not installed: no framework bundles among the sources")
        runs.pop()
    paths: list[Path] = []
    for extra in runs:
        proc = subprocess.run([str(BIN / "mlckpt"), "run", "--json", *extra, *common], cwd=work, env=env,
                              text=True, capture_output=True, check=False)
        if proc.returncode not in (0, 6):  # a disturbed run (a busy host) is as real a source
            sys.exit(f"fuzz_checker: the runner failed:\n{proc.stderr}")
        paths += [Path(json.loads(ln)["bundle"]) for ln in proc.stdout.splitlines()]
    return paths


Job = tuple[int, int, int, float, list[Path], Path, Path, bool]
Result = tuple[int, str, float, str, str | None]


def run_cases(job: Job) -> list[Result]:
    """Cases ``first``, ``first + step``, … below ``count`` (each with a generator of its own, so
    case i is the same whatever the number of workers): (i, verdict, seconds, what, problem)."""
    first, step, count, budget, sources, keyfile, workdir, split = job
    if split:  # every case's records and rules on two processes, however few its records
        forked.MIN_RECORDS = 0
    trusted = bundle.TrustedKeys.load(workdir / "trusted-keys.yaml")
    key = bundle.load_private_key(keyfile)
    out = []
    for i in range(first, count, step):
        rng = random.Random(f"{SEED}-{i}")
        root = workdir / f"case-{first}"
        folder = structural.fresh_case(rng.choice(sources), root, ORG, SYSTEM, DESCRIPTION)
        what = structural.mutate(rng, folder, key)
        o = structural.check_case(root, trusted, budget, what, jobs=2 if split else 1)
        out.append((i, o.verdict, o.seconds, what, o.problem))
        if o.problem:
            print(f"case {i}: {o.problem} after {what}", flush=True)
        if (i // step + 1) % 500 == 0 and first == 0:
            print(f"{i + 1} cases", flush=True)
    return out


SEED = 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--budget", type=float, default=60.0, help="the checker's per-bundle budget, s")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="cases checked in parallel")
    ap.add_argument("--split", action="store_true",
                    help="check every case with its records and rules on two processes "
                         "(checker/records_read.py, checker/rule_workers.py), whatever its size")
    args = ap.parse_args()
    global SEED
    SEED = args.seed
    work = Path(tempfile.mkdtemp(prefix="mlckpt-fuzz-"))
    try:
        t0 = time.monotonic()
        sources = make_sources(work)
        print(f"made {len(sources)} source bundles in {time.monotonic() - t0:.1f} s", flush=True)
        verdicts: Counter[str] = Counter()
        t0 = time.monotonic()
        jobs = [(w, args.jobs, args.cases, args.budget, sources, work / "org.pem", work, args.split)
                for w in range(args.jobs)]
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = [r for part in pool.map(run_cases, jobs) for r in part]
        bad = [r for r in results if r[4]]
        times = [(r[2], r[3]) for r in results]
        verdicts.update(r[1] for r in results)
        times.sort(reverse=True)
        print(f"{args.cases} signed hostile bundles in {time.monotonic() - t0:.0f} s ({args.jobs} workers, "
              f"seed {args.seed}{', split' if args.split else ''}): "
              + ", ".join(f"{n} {v}" for v, n in verdicts.most_common()))
        print(f"checker faults or over budget: {len(bad)}; slowest checks: "
              + "; ".join(f"{s:.2f} s ({w})" for s, w in times[:3]))
        print(f"median check {times[len(times) // 2][0] * 1e3:.0f} ms, "
              f"p99 {times[len(times) // 100][0]:.2f} s")
        return 1 if bad else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
