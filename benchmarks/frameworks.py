"""What a training framework's own checkpoint writer gets from this storage, against mlckpt's engine.

Each invocation is a real ``mlckpt run`` with ``framework.writer=W`` (rules 1.11): W's checkpoints
alternate with the engine's (O_DIRECT, ``io.threads`` in flight) round by round in the same run, on
the same files and ranks, every restore cold and verified, so each ratio below is measured against
the storage's best case under the same conditions.  The writers are run in alternated order (A B C
D, A B C D, ...) and every figure is the run's own summary (``summary.json`` ``framework``),
recomputed by the checker from the records.

    .venv/bin/python benchmarks/frameworks.py --ranks 4 --scale 0.01 --rounds 3 --repeat 2

Prints one markdown table (mean over repetitions; min–max where they differ) and writes every
run's figures to ``--out`` (JSON).  CPU per GiB is the ranks' own CPU time (user + system, all
threads) over the bytes each op moved: what the library costs the training processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MLCKPT = Path(sys.executable).parent / "mlckpt"
# Each writer is handed the model's named tensors (framework.tensors=model, rules 1.19: 781 per rank
# for llama3_8b at ZeRO 3) and, in the "flat" cases, one uint8 tensor per planned file (its best case).
CASES = {
    "torch_save": ["framework.writer=torch_save"],
    "torch_save flat": ["framework.writer=torch_save", "framework.tensors=flat"],
    "safetensors": ["framework.writer=safetensors"],
    "safetensors flat": ["framework.writer=safetensors", "framework.tensors=flat"],
    "torch_dcp": ["framework.writer=torch_dcp"],
    "torch_dcp flat": ["framework.writer=torch_dcp", "framework.tensors=flat"],
    "torch_dcp (4 threads)": ["framework.writer=torch_dcp", "framework.threads=4"],
    "torch_dcp async_save": ["framework.writer=torch_dcp", "checkpoint.mode=async"],
    "torch_dcp async_save flat": ["framework.writer=torch_dcp", "checkpoint.mode=async",
                                  "framework.tensors=flat"],
}
FIGURES = ("write_bandwidth_mean_gib_s", "read_bandwidth_mean_gib_s", "write_cpu_s_per_gib",
           "read_cpu_s_per_gib", "write_stall_mean_s")


def one(case: str, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    n = 2 * a.rounds
    args = [str(MLCKPT), "run", "workload=llama3_8b", "division=open", f"scale={a.scale}", f"ranks={a.ranks}",
            f"checkpoint.num_writes={n}", f"checkpoint.num_reads={n}", f"checkpoint.folder={a.folder}",
            f"output.root={work / 'results'}", "signing.key=none", *CASES[case]]
    if "checkpoint.mode=async" in CASES[case]:
        args.append(f"checkpoint.compute_interval_s={a.compute_s}")
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "xdg"), "MLCKPT_RETRY_DISTURBED": "2"}
    t0 = time.monotonic()
    proc = subprocess.run(args, text=True, capture_output=True, env=env, check=False)
    bundle = [ln.split("bundle: ", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("bundle: ")]
    if proc.returncode not in (0, 6) or not bundle:
        sys.exit(f"{case}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run = json.loads((Path(bundle[-1]) / "run.json").read_text())
    summary = json.loads((Path(bundle[-1]) / "summary.json").read_text())
    fw = summary["framework"]
    records = [json.loads(line) for line in (Path(bundle[-1]) / "records.jsonl").read_text().splitlines()]
    tensors = max(r.get("tensors", 0) for r in records if r.get("writer") not in (None, "mlckpt"))
    return {"case": case, "tensors": tensors, "verdict": run["verdict"], "seconds": time.monotonic() - t0,
            "library_version": run["framework"]["library_version"], "bundle": bundle[-1],
            "library": {k: fw.get(k) for k in FIGURES},
            "engine": {k: (fw["reference"] or {}).get(k) for k in (*FIGURES, "write_ratio", "read_ratio")}}


def cell(values: list[float | None], fmt: str) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "—"
    mean = format(statistics.fmean(v), fmt)
    if min(v) == max(v):
        return mean
    return f"{mean} ({format(min(v), fmt)}–{format(max(v), fmt)})"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| writer | tensors/rank | write GiB/s | engine's | write ratio | read GiB/s | engine's | "
            "read ratio | CPU s/GiB write (engine) | CPU s/GiB read (engine) | stall s (engine) |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        if not mine:
            continue
        lib = {k: [r["library"][k] for r in mine] for k in FIGURES}
        eng = {k: [r["engine"][k] for r in mine] for k in (*FIGURES, "write_ratio", "read_ratio")}
        stall = (f"{cell(lib['write_stall_mean_s'], '.3f')} ({cell(eng['write_stall_mean_s'], '.3f')})"
                 if "async" in case else "—")
        out.append(
            f"| {case} | {max(r['tensors'] for r in mine)} | "
            f"{cell(lib['write_bandwidth_mean_gib_s'], '.2f')} | "
            f"{cell(eng['write_bandwidth_mean_gib_s'], '.2f')} | {cell(eng['write_ratio'], '.2f')} | "
            f"{cell(lib['read_bandwidth_mean_gib_s'], '.2f')} | "
            f"{cell(eng['read_bandwidth_mean_gib_s'], '.2f')} | "
            f"{cell(eng['read_ratio'], '.2f')} | {cell(lib['write_cpu_s_per_gib'], '.2f')} "
            f"({cell(eng['write_cpu_s_per_gib'], '.2f')}) | {cell(lib['read_cpu_s_per_gib'], '.2f')} "
            f"({cell(eng['read_cpu_s_per_gib'], '.2f')}) | {stall} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=3, help="library/engine pairs of checkpoints per run")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each writer, in alternated order")
    ap.add_argument("--compute-s", type=float, default=2.0, help="training between async checkpoints")
    ap.add_argument("--folder", default="./mlckpt-checkpoints", help="checkpoint folder (the storage)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--out", default="frameworks.json")
    a = ap.parse_args()
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlckpt-frameworks-") as tmp:
        for rep in range(a.repeat):
            for case in cases:
                row = one(case, a, Path(tmp))
                rows.append(row)
                print(f"[{rep + 1}/{a.repeat}] {case}: write ×{row['engine']['write_ratio']:.2f}, "
                      f"read ×{row['engine']['read_ratio']:.2f} ({row['verdict']}, {row['seconds']:.0f} s)",
                      flush=True)
    Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{a.ranks} ranks, llama3_8b × {a.scale}, {a.rounds} library + {a.rounds} engine checkpoints "
          f"per run, {a.repeat} runs per writer; ratio = the library's bandwidth / the engine's in the "
          "same run\n")
    print(table(rows))


if __name__ == "__main__":
    main()
