#!/usr/bin/env python3
"""How long do direct, fan-out and node-cache loading take to bring every replica of a model up,
measured on this machine with real MPI ranks, cold reads and every byte verified?

    .venv/bin/python benchmarks/serving_load.py [--workload llama3_8b] [--tp 2] [--replicas 4]
        [--hosts 2] [--scale 0.01] [--repeat 3] [--folder DIR]

One rank per GPU (replicas × tp ranks) under the mpiexec beside this Python.  The shard files are
written once (untimed, fsynced) in --folder, on the disk the storage stands for.  Then, for each
round, each strategy in turn (alternated, so that the machine's slow spells fall on each): every
file evicted from the page cache, a barrier, each rank timed until it holds its shard, every byte
verified after (mlckpt/run/phases/loads.py).  The ranks are placed in --hosts groups of equal size,
each standing for a host: its node-local tier is a folder of its own in /dev/shm (memory), its
first rank fills it.  The groups share one machine, so the exchange between "hosts" runs over
shared memory and no network bound is measured: fan-out here costs the exchange's memory copies
only.

Printed per strategy: the time from the barrier until the last rank holds its shard (median of
--repeat and the range), the bytes the storage served (measured: what the ranks read), the
storage's read rate, and the effective loading rate (bytes placed in replicas per second), with
each set beside direct loading, whose storage rate is the disk's own under every rank reading.
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
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def args_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="llama3_8b")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=2, help="groups of ranks standing for hosts")
    ap.add_argument("--scale", type=float, default=0.01, help="of the shards' bytes (default 0.01)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chunk-mib", type=int, default=None,
                    help="fan-out's round: what a holder reads and sends at once (default: the runner's 16)")
    ap.add_argument("--folder", type=Path, default=None, help="for the shard files (default: a "
                    "temporary folder under the current one, on its disk)")
    ap.add_argument("--direct", action=argparse.BooleanOptionalAction, default=True,
                    help="O_DIRECT reads from the storage (default; --no-direct: buffered, evicted first)")
    ap.add_argument("--objects", default=None, metavar="URL",
                    help="the storage is objects under s3://bucket/prefix (AWS_* from the environment; "
                         "benchmarks/lab/s3local.py starts a local Swift store); --folder then unused")
    ap.add_argument("--strategies", default=",".join(("direct", "fanout", "nodecache")),
                    help="which to run, comma-separated (default: all three)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE",
                    help="the ranks' raw load records, every figure recomputable from them")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap


def worker(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from mlckpt import engine
    from mlckpt.locations import parse_object_url
    from mlckpt.run.phases import loads
    from mlckpt.run.storage.backends import Files, Storage
    from mlckpt.run.storage.objectstore import Objects
    from mlckpt.workload.model import workload_from_config
    from mlckpt.workload.serving import FANOUT_CHUNK_BYTES, STRATEGIES, ServingLayout
    from mlckpt.workload.serving_load import load_plan

    comm = MPI.COMM_WORLD
    node = yaml.safe_load((ROOT / "workloads" / "workload" / f"{args.workload}.yaml").read_text())
    w = workload_from_config(node)
    layout = ServingLayout(w.name, w.model, args.tp, args.replicas, gpus_per_host=8)
    n = comm.Get_size()
    per = n // args.hosts
    hosts = [f"host{min(r // per, args.hosts - 1)}" for r in range(n)]
    first = comm.Get_rank() == 0
    key, run_id = comm.bcast((secrets.token_bytes(engine.KEY_BYTES), secrets.randbits(63)) if first else None)
    opts = engine.IOOptions(direct=args.direct, threads=4, block_size=4 << 20, fsync=True)
    tier_base = Path(comm.bcast(tempfile.mkdtemp(prefix="mlckpt-tier-", dir="/dev/shm")
                                if comm.Get_rank() == 0 else None))
    chosen = [s for s in STRATEGIES if s in args.strategies.split(",")]
    plans = {s: load_plan(layout, s, hosts, args.scale) for s in {*chosen, "direct"}}
    storage: Storage = Files(args.folder)
    if args.objects:
        root = parse_object_url(args.objects) / f"serving-{run_id:016x}"
        storage = Objects(root, engine.Store(root.bucket, engine.S3Options(part_size=8 << 20, inflight=4)))
    tier = Files(tier_base / hosts[comm.Get_rank()])
    chunk = (args.chunk_mib << 20) if args.chunk_mib else FANOUT_CHUNK_BYTES
    setups = {s: loads.LoadSetup(p, storage, tier, key, run_id, opts, exchange_evidence=True,
                                 chunk_bytes=chunk) for s, p in plans.items()}
    loads.lay_out(comm, setups["direct"])
    groups = loads.shard_groups(comm, plans["direct"])
    out = []
    for _ in range(args.repeat):
        for s in chosen:
            loaded = loads.load(comm, setups[s], groups, loads.barrier_timed(comm))
            rec = {**loaded.record, "verified_bytes": loads.verify(setups[s], comm.Get_rank(), loaded.arena)}
            loads.clear_tier(groups[1], setups[s])
            recs = comm.gather(rec, root=0)
            if comm.Get_rank() == 0:
                out.append(recs)
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(tier_base, ignore_errors=True)
        if isinstance(storage, Objects):  # the shard objects, removed
            client, bucket = storage.store.client, storage.store.bucket
            listed = client.list_objects_v2(Bucket=bucket, Prefix=storage.root.prefix)
            for o in listed.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=o["Key"])
        json.dump({"placed_bytes": plans["direct"].placed_bytes, "runs": out}, sys.stdout)
    return 0


def report(doc: dict, args: argparse.Namespace) -> None:
    """The table, recomputed from the ranks' records, each load first held to the plan it claims."""
    from mlckpt.serving_metrics import by_strategy, held_to_plan
    from mlckpt.workload.model import workload_from_config
    from mlckpt.workload.serving import ServingLayout
    from mlckpt.workload.serving_load import load_plan

    node = yaml.safe_load((ROOT / "workloads" / "workload" / f"{args.workload}.yaml").read_text())
    w = workload_from_config(node)
    layout = ServingLayout(w.name, w.model, args.tp, args.replicas, gpus_per_host=8)
    for recs in doc["runs"]:
        hosts = [r["host"] for r in sorted(recs, key=lambda r: r["rank"])]
        problems = held_to_plan(load_plan(layout, recs[0]["strategy"], hosts, args.scale), recs)
        if problems:
            sys.exit("serving_load: a load's records differ from its plan:\n  " + "\n  ".join(problems))
    figures = by_strategy(doc["runs"])
    placed = figures["direct"]["placed_bytes"]
    ref = figures["direct"]["ready_s"]
    print(f"{args.workload}: {args.replicas} replicas of TP {args.tp} ({args.replicas * args.tp} ranks in "
          f"{args.hosts} groups), scale {args.scale}: {placed / 1e6:,.1f} MB placed in all, "
          f"{'objects' if args.objects else 'O_DIRECT' if args.direct else 'buffered'} reads, "
          f"{args.repeat} rounds\n")
    print("  strategy    ready (median, range)       storage served   storage rate   effective rate"
          "   vs direct")
    for s, f in figures.items():
        print(f"  {s:<10}  {f['ready_s']:7.3f} s ({f['ready_min_s']:.3f}-{f['ready_max_s']:.3f})   "
              f"{f['storage_bytes'] / 1e6:10,.1f} MB   {f['storage_gb_s']:8.2f} GB/s   "
              f"{f['effective_gb_s']:10.2f} GB/s   {ref / f['ready_s']:6.2f}x")
    resident = max(f["resident_bytes_max"] for f in figures.values())
    print(f"\n  resident in the page cache when a load began: at most {resident:,} B")
    fan = [recs for recs in doc["runs"] if recs[0]["strategy"] == "fanout"]
    if fan:  # per load: the ranks' exchange CPU over the bytes they received, the slowest rank's tail
        cpu = [sum(r["exchange_cpu_ns"] for r in recs) / 1e9 / (sum(r["received_bytes"] for r in recs) / 1e9)
               for recs in fan]
        tail = [max(r["exchange_tail_ns"] for r in recs) / 1e6 for recs in fan]
        print(f"  fan-out's exchange: {statistics.median(cpu):.3f} CPU s per GB received (median of "
              f"{len(fan)} loads, {min(cpu):.3f}-{max(cpu):.3f}); wall time after the last read "
              f"{statistics.median(tail):.1f} ms (slowest rank, median; {min(tail):.1f}-{max(tail):.1f})")
    print("  every load's records held to its plan: each rank's bytes from the storage, the tier and the "
          "network as planned, its shard verified")


def main() -> int:
    args = args_parser().parse_args()
    if args.worker:
        return worker(args)
    if args.replicas * args.tp % args.hosts:
        sys.exit("serving_load: the ranks (replicas × tp) must split evenly into --hosts")
    folder = args.folder or Path(tempfile.mkdtemp(prefix="mlckpt-serving-", dir="."))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        # -m mpi4py: an exception on one rank aborts the job rather than leaving the others in a collective
        cmd = [str(BIN / "mpiexec"), "-n", str(args.replicas * args.tp), sys.executable, "-m", "mpi4py",
               __file__, "--worker", *sys.argv[1:], "--folder", str(folder.resolve())]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            sys.exit(f"serving_load: the ranks failed:\n{proc.stderr[-3000:]}")
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
