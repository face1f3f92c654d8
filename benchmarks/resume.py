#!/usr/bin/env python3
"""How long does a training job take to hold its state again when it resumes, at another scale, from
a checkpoint written at N ranks?  Measured on this machine with real MPI ranks, cold reads, every
byte verified.

    .venv/bin/python benchmarks/resume.py [--workload llama3_8b] [--from-ranks 8] [--ranks 4]
        [--tp 1] [--pp 1] [--scale 0.01] [--repeat 3] [--folder DIR] [--no-direct]

--ranks new ranks under the mpiexec beside this Python.  The N-rank layout's files (DeepSpeed's names,
each stamped with the content of the old rank that writes it) and the checkpoint's index are written
once (untimed, fsynced) in --folder.  Then, for each round, two reads of the same files, alternated:

* **resume**: every old file a rank needs evicted, a barrier, each new rank timed until it holds its
  shard of the new layout (--tp, --pp, DP what is left), in four parts: reading and parsing the
  index, planning its byte ranges from it, reading them (whole pages, merged), placing them in its
  state (mlckpt/run/phases/resumes.py); every byte verified after;
* **whole files**: every old file evicted, a barrier, the new ranks reading the old files whole, in
  turn, as a restore at the writing layout reads them: the storage's own read rate in this run.

With --dcp, a third read, alternated with the two: the same state saved once (untimed) through
PyTorch's Distributed Checkpoint as the --from-ranks ranks would have saved it (each old rank's pieces
of the global tensors in a file of its own, handed to DCP by the new rank ``r % M``), then loaded by
the new ranks through DCP's own resharding planner (buffered reads, as DCP reads; its files evicted
first), every byte verified the same way (mlckpt/engine/dcp_reshard.py).  What a run's bundle
records of it: ``mlckpt run resume.from_ranks=N framework.writer=torch_dcp`` (rules 1.22).

Printed: the time to resume (median of --repeat and the range) and each part's (slowest rank), the
bytes placed and read (the page rounding's amplification), and the resume's rate beside the whole
files' rate, a ratio to the machine's own limit measured in the same run.  Every resume's records are
held to both plans first (``mlckpt.workload.resume.held_to_plan``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def args_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="llama3_8b")
    ap.add_argument("--from-ranks", type=int, default=8, help="the layout the checkpoint was written at")
    ap.add_argument("--from-tp", type=int, default=None, help="its TP (default: the workload's)")
    ap.add_argument("--ranks", type=int, default=4, help="the new layout's ranks (the MPI job's size)")
    ap.add_argument("--tp", type=int, default=None, help="the new TP (default: the old)")
    ap.add_argument("--pp", type=int, default=None, help="the new PP (default: the workload's)")
    ap.add_argument("--scale", type=float, default=0.01, help="of the checkpoint's bytes (default 0.01)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--folder", type=Path, default=None, help="for the checkpoint (default: a temporary "
                    "folder under the current one, on its disk)")
    ap.add_argument("--direct", action=argparse.BooleanOptionalAction, default=True,
                    help="O_DIRECT reads (default; --no-direct: buffered, evicted first)")
    ap.add_argument("--dcp", action="store_true", help="also resume through DCP's resharding load")
    ap.add_argument("--key", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None, metavar="FILE", help="the records, as measured")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap


def old_workload(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    import dataclasses

    from mlckpt.workload.model import workload_from_config

    w = workload_from_config(yaml.safe_load((ROOT / "workloads" / "workload" / f"{args.workload}.yaml")
                                            .read_text()))
    if args.from_tp:
        w = dataclasses.replace(w, parallelism=dataclasses.replace(w.parallelism, tensor=args.from_tp))
    return w


def worker(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from mlckpt import engine
    from mlckpt.engine.content import round_up
    from mlckpt.run.phases import loads, resumes
    from mlckpt.run.storage.backends import Files, Piece
    from mlckpt.workload.layout import make_plan

    comm = MPI.COMM_WORLD
    me, size = comm.Get_rank(), comm.Get_size()
    w = old_workload(args)
    key, run_id = bytes.fromhex(args.key[:32]), int(args.key[32:], 16)
    opts = engine.IOOptions(direct=args.direct, threads=4, block_size=4 << 20, fsync=True)
    storage = Files(args.folder / "files")
    setup = resumes.ResumeSetup(make_plan(w, args.from_ranks, args.scale), w, size,
                                args.tp or w.parallelism.tensor, args.pp or w.parallelism.pipeline,
                                storage, key, run_id, opts)
    dcp_dir = args.folder / "dcp"
    through_dcp = None
    if args.dcp:
        from mlckpt.engine.frameworks import join_process_group, load_library

        load_library("torch_dcp")
        join_process_group(comm, single_host=True)
        resumes.dcp_lay_out(comm, setup, dcp_dir)
        through_dcp = resumes.prepare(setup, me, spread=False)
    index_bytes = resumes.lay_out(comm, setup)
    prepared = resumes.prepare(setup, me)
    files = [(f.name, f.bytes) for rp in setup.old.rank_plans for f in rp.files]
    whole = files[me::size]  # the same files, read whole, split in turn: the storage's own rate
    whole_buf = engine.alloc(max(engine.PAGE, round_up(max((n for _, n in whole), default=0))))
    out = []
    for _ in range(args.repeat):
        rec = resumes.resume(comm, setup, prepared, index_bytes, loads.barrier_timed(comm))
        rec["verified_bytes"] = resumes.verify(setup, prepared, me)
        resumed = comm.gather(rec, root=0)
        storage.evict([n for n, _ in whole])
        comm.Barrier()
        t0 = time.monotonic_ns()
        for name, n in whole:  # one file at a time into one buffer: a restore's reads, not its memory
            storage.get([Piece(name, whole_buf, n)], opts)
        t1 = time.monotonic_ns()
        timed = comm.gather({"rank": me, "t0_ns": t0, "t1_ns": t1, "bytes": sum(n for _, n in whole)}, root=0)
        dcp = None
        if through_dcp is not None:
            rec = resumes.dcp_resume(comm, setup, through_dcp, dcp_dir, loads.barrier_timed(comm))
            rec["verified_bytes"] = resumes.verify(setup, through_dcp, me)
            dcp = comm.gather(rec, root=0)
        if me == 0:
            out.append({"resume": resumed, "whole": timed, "dcp": dcp})
    resumes.remove(comm, setup)
    if me == 0:
        json.dump({"runs": out}, sys.stdout)
    return 0


def report(doc: dict, args: argparse.Namespace) -> None:
    from mlckpt.workload.layout import make_plan
    from mlckpt.workload.resume import (
        PARTS,
        checkpoint_index,
        held_to_plan,
        held_to_whole_pieces,
        resume_plan,
    )

    w = old_workload(args)
    old = make_plan(w, args.from_ranks, args.scale)
    plan = resume_plan(checkpoint_index(old), w, args.ranks, args.tp or w.parallelism.tensor,
                       args.pp or w.parallelism.pipeline)
    whole_pieces = resume_plan(plan.index, w, plan.ranks, plan.tp, plan.pp, spread=False)
    for run in doc["runs"]:
        problems = held_to_plan(plan, run["resume"]) + (
            held_to_whole_pieces(whole_pieces, run["dcp"], DCP_PIECE_OVERHEAD) if run["dcp"] else [])
        if problems:
            sys.exit("resume: a resume's records differ from its plans:\n  " + "\n  ".join(problems))
    figs = [figures(run["resume"]) for run in doc["runs"]]
    whole = [sum(r["bytes"] for r in run["whole"]) / ((max(r["t1_ns"] for r in run["whole"])
                                                       - min(r["t0_ns"] for r in run["whole"])) / 1e9)
             for run in doc["runs"]]
    ready = [f["ready_s"] for f in figs]
    med = statistics.median
    f0 = figs[0]
    print(f"{args.workload}: written at {args.from_ranks} ranks (TP {old.tp}, PP {old.pp}, "
          f"ZeRO {old.zero_stage}), "
          f"resumed at {args.ranks} (TP {plan.tp}, PP {plan.pp}, DP {plan.dp}), scale {args.scale}, "
          f"{'O_DIRECT' if args.direct else 'buffered'} reads, {args.repeat} rounds\n")
    first = doc["runs"][0]["resume"]
    print(f"  state placed      {f0['state_bytes'] / 1e6:10,.1f} MB in {sum(r['tensors'] for r in first):,} "
          f"tensors ({old.total_bytes / 1e6:,.1f} MB written)")
    print(f"  read              {f0['read_bytes'] / 1e6:10,.1f} MB in {sum(r['reads'] for r in first):,} "
          f"ranges ({f0['amplification']:.3f}x the state: whole pages)")
    print(f"  time to resume    {med(ready):10.3f} s (median; {min(ready):.3f}-{max(ready):.3f})")
    for p in PARTS:
        vals = [f[f"{p}_s"] for f in figs]
        print(f"    {p:<15} {med(vals) * 1e3:10.1f} ms (slowest rank, median)")
    rate = med([f["rate_gb_s"] for f in figs])
    print(f"  resume rate       {rate:10.2f} GB/s of state over the time to resume")
    print(f"  whole files       {med(whole) / 1e9:10.2f} GB/s (the same files read whole by the same ranks)")
    print(f"  ratio             {rate / (med(whole) / 1e9):10.2f}")
    if doc["runs"][0]["dcp"]:
        dcp = [figures_dcp(run["dcp"]) for run in doc["runs"]]
        ready_dcp = [f["ready_s"] for f in dcp]
        spread = f"{min(ready_dcp):.3f}-{max(ready_dcp):.3f}"
        first_dcp = doc["runs"][0]["dcp"]
        read_dcp = sum(r["read_bytes"] for r in first_dcp)
        print(f"  through DCP       {med(ready_dcp):10.3f} s (median; {spread}), "
              f"{med(ready) / med(ready_dcp):.2f} of the engine's rate (DCP reads buffered, cold)")
        print(f"    read            {read_dcp / 1e6:10,.1f} MB in {sum(r['reads'] for r in first_dcp):,} "
              f"stored pieces, each whole ({read_dcp / f0['state_bytes']:.3f}x the state)")
        for p in ("metadata", "planning", "read"):
            vals = [f[f"{p}_s"] for f in dcp]
            label = "read and place" if p == "read" else p
            print(f"    {label:<15} {med(vals) * 1e3:10.1f} ms (slowest rank, median)")
    print("  every resume's records held to both plans; every byte of every new state verified")


DCP_PIECE_OVERHEAD = 8192  # rules 1.22's resume.stored_piece_overhead_bytes


def figures(records: list[dict]) -> dict[str, float]:
    """One resume's figures from its records: the time from the first rank to leave the barrier until
    the last holds its shard, each part's slowest rank, the state's and the reads' bytes, and the
    state's rate over the time to resume."""
    from mlckpt.workload.resume import PARTS

    t0 = min(r["t0_ns"] for r in records)
    ready = (max(r["t1_ns"] for r in records) - t0) / 1e9
    state = sum(r["bytes"] for r in records)
    read = sum(r["read_bytes"] for r in records)
    out = {"ready_s": ready, "state_bytes": state, "read_bytes": read, "amplification": read / max(1, state),
           "rate_gb_s": state / ready / 1e9 if ready else 0.0,
           "resident_bytes": max(r["resident_bytes"] for r in records)}
    out.update({f"{p}_s": max(r[f"{p}_ns"] for r in records) / 1e9 for p in PARTS})
    return out


def figures_dcp(records: list[dict]) -> dict[str, float]:
    """A DCP resume's time from the barrier until its last rank held its shard, and each part's
    slowest rank (DCP reads and places in one call)."""
    t0 = min(r["t0_ns"] for r in records)
    out = {"ready_s": (max(r["t1_ns"] for r in records) - t0) / 1e9}
    out.update({f"{p}_s": max(r[f"{p}_ns"] for r in records) / 1e9 for p in ("metadata", "planning", "read")})
    return out


def main() -> int:
    args = args_parser().parse_args()
    if args.worker:
        return worker(args)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="mlckpt-resume-", dir="."))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        key = secrets.token_hex(16) + f"{secrets.randbits(63):x}"  # the content's key and run id
        common = [sys.executable, "-m", "mpi4py", __file__, "--worker", *sys.argv[1:],
                  "--folder", str(folder.resolve()), "--key", key]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([str(BIN / "mpiexec"), "-n", str(args.ranks), *common],
                              capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            sys.exit(f"resume: the ranks failed:\n{proc.stderr[-3000:]}")
        doc = json.loads(proc.stdout)
        if args.json:
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **doc}))
        report(doc, args)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
