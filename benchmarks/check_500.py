#!/usr/bin/env python3
"""How long does ``mlckpt-check`` take over a tree of 500 small bundles?  (Target: < 60 s on a
2-core machine.)

    .venv/bin/python benchmarks/check_500.py [--bundles 500] [--jobs N] [--keep DIR]

Builds the tree once in a temporary folder: the real runner makes two bundles (llama3_8b and
llama_7b, open division, scale 0.0005, 4 ranks, one write and one verified restore each); they are
copied 500 times under 5 organisations, each copy with its own run id and folder name, re-signed
with its organisation's key (all registered in the tree's trusted-keys.yaml), every fifth one
packed as ``<run-id>.tar.gz``.  Each copy gets timings of its own (every clock reading moved by
i µs, every op i ns longer, summary.json recomputed), or the checker would rightly call them one
run submitted 500 times (DUPLICATE-CONTENT); the tree lists the installed runner's code digest in
released-runners.yaml.  Then it times the installed ``mlckpt-check ROOT --json FILE``
end to end (interpreter start included) and checks that every bundle passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from lab import bench

from mlckpt import bundle
from mlckpt.bundle import released
from mlckpt.rules import RunData, load_rules, recomputed_summary
from mlckpt.workload.layout import make_plan
from mlckpt.workload.model import workload_from_config

BIN = Path(sys.executable).parent
DESCRIPTION = bench.description("bench-ext4", "Benchmark Org")
ORGS = 5


def make_sources(work: Path) -> dict[str, Path]:
    """Two real bundles from the runner."""
    (work / "bench-ext4.yaml").write_text(DESCRIPTION)
    bundle.generate_key(work / "runner-key.pem")
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "xdg")}
    env.pop("MLCKPT_DEBUG", None)
    proc = subprocess.run(
        [str(BIN / "mlckpt"), "run", "--json", "-m", "workload=llama3_8b,llama_7b", "division=open",
         "scale=0.0005",
         "ranks=4", "checkpoint.num_writes=1", "checkpoint.num_reads=1", "io.direct=false",
         "system=bench-ext4.yaml", "signing.key=runner-key.pem", "output.root=sources"],
        cwd=work, env=env, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"check_500: the runner failed:\n{proc.stderr}")
    paths = [Path(json.loads(ln)["bundle"]) for ln in proc.stdout.splitlines()]
    return {("llama3_8b" if "-llama3_8b-" in p.name else "llama_7b"): p for p in paths}


def disguise(folder: Path, i: int) -> None:
    """Timings of its own for copy ``i`` (nothing any rule judges changes), summary recomputed."""
    recs = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    for r in recs:
        boxes = [r, *r.get("stages", ())]
        if r.get("host_counters"):
            boxes += [r["host_counters"]["before"], r["host_counters"]["after"]]
        for box in boxes:
            for k in ("t0_ns", "t1_ns", "staged_ns", "t_ns"):
                if k in box:
                    box[k] += (i + 1) * 1000
        sync_end = r["op"] == "write" and r["staged_ns"] == r["t1_ns"]
        r["t1_ns"] += i + 1
        if r["op"] == "write":
            r["stages"][-1]["t1_ns"] += i + 1
            r["staged_ns"] += (i + 1) if sync_end else 0
        if r.get("host_counters"):
            r["host_counters"]["after"]["t_ns"] += i + 1
    (folder / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))
    config = yaml.safe_load((folder / "config.yaml").read_text())
    plan = make_plan(workload_from_config(config["workload"]), int(config["ranks"]), float(config["scale"]))
    run = json.loads((folder / "run.json").read_text())
    system = json.loads((folder / "system.json").read_text())
    data = RunData(run, config, {}, recs, system)
    summary = recomputed_summary(load_rules(run["rules_version"]), data, plan)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


def build_tree(root: Path, work: Path, sources: dict[str, Path], count: int) -> None:
    keys = {}
    for i in range(ORGS):
        org = f"org-{i}"
        info = bundle.generate_key(work / "keys" / f"{org}.pem")
        keys[org] = (bundle.load_private_key(info.path), info.public_key)
        systems = root / "open" / org / "systems"
        systems.mkdir(parents=True)
        (systems / "bench-ext4.yaml").write_text(DESCRIPTION)
    (root / "trusted-keys.yaml").write_text(
        'mlckpt_trusted_keys: "1.0"\norganizations:\n'
        + "".join(f'  {org}: ["{pub}"]\n' for org, (_, pub) in keys.items()))
    (root / "released-runners.yaml").write_text(
        'mlckpt_released_runners: "1.0"\nrunners:\n'
        + released.entry("bench", bundle.code_digest(), "2026-11-24"))
    scratch = work / "scratch"
    for i in range(count):
        workload = ("llama3_8b", "llama_7b")[i % 2]
        org = f"org-{i % ORGS}"
        run_id = f"{0xbe000000 + i:016x}"
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(sources[workload], scratch)
        disguise(scratch, i)
        run = json.loads((scratch / "run.json").read_text())
        name = re.sub(r"[0-9a-f]{16}$", run_id, run["name"])
        run.update(run_id=run_id, name=name)
        (scratch / "run.json").write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
        pred = bundle.read_envelope_predicate(scratch)
        pred["run_id"] = run_id
        bundle.sign_bundle(scratch, keys[org][0], pred)
        dest = root / "open" / org / "results" / "bench-ext4" / workload
        dest.mkdir(parents=True, exist_ok=True)
        if i % 5 == 4:
            bundle.pack(scratch, dest / f"{name}.tar.gz")
        else:
            shutil.copytree(scratch, dest / name)
    shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundles", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=None, help="passed to mlckpt-check (default: its own)")
    ap.add_argument("--keep", type=Path, default=None, help="build the tree here and keep it")
    ap.add_argument("--limit", type=float, default=60.0, help="fail above this many seconds")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mlckpt-check500-"))
    try:
        root = args.keep or tmp / "tree"
        if (root / "trusted-keys.yaml").is_file():
            print(f"reusing the tree in {root}")
        else:
            t0 = time.perf_counter()
            build_tree(root, tmp, make_sources(tmp), args.bundles)
            print(f"built {args.bundles} bundles in {time.perf_counter() - t0:.1f} s under {root}")
        cmd = [str(BIN / "mlckpt-check"), str(root), "--json", str(tmp / "report.json"), "--quiet"]
        if args.jobs:
            cmd += ["--jobs", str(args.jobs)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, text=True, capture_output=True, check=False)
        elapsed = time.perf_counter() - t0
        report = json.loads((tmp / "report.json").read_text())
        s = report["summary"]
        print(proc.stdout.strip().splitlines()[-1])
        print(f"mlckpt-check over {s['bundles']} bundles: {elapsed:.2f} s "
              f"({s['bundles'] / elapsed:.0f} bundles/s, {os.cpu_count()} CPUs, exit {proc.returncode})")
        leaves = len(list(root.glob("open/*/results/*/*/*")))
        ok = proc.returncode == 0 and s["valid"] == s["bundles"] == leaves
        if not ok:
            print(f"FAIL: not every bundle passed (exit {proc.returncode})\n{proc.stderr}", file=sys.stderr)
            return 1
        if elapsed > args.limit:
            print(f"FAIL: slower than the {args.limit:.0f} s target", file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
