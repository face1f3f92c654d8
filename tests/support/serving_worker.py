"""TEST-ONLY: replicas loading a model under mpiexec (mlckpt/run/phases/loads.py), for
tests/mpi/test_serving_load_mpi.py; run as ``python -m mpi4py serving_worker.py``, so that a rank's
exception aborts the whole job instead of leaving the others in a collective.  Prints rank 0's
records of each strategy as JSON; ``--corrupt SHARD:FILE:OFFSET`` flips one byte of a shard file,
``--remove SHARD:FILE`` removes one, after it was laid out."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

from mpi4py import MPI

from mlckpt import engine
from mlckpt.errors import VerificationError
from mlckpt.locations import parse_object_url
from mlckpt.run.phases import loads
from mlckpt.run.storage.backends import Files, Storage
from mlckpt.run.storage.objectstore import Objects
from mlckpt.serving_metrics import held_to_plan
from mlckpt.workload.model import ModelShape
from mlckpt.workload.serving import FANOUT_CHUNK_BYTES, ServingLayout
from mlckpt.workload.serving_load import load_plan

L8B = ModelShape(4096, 32, 14336, 128256, 32, 8)




def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("tier", type=Path)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--scale", type=float, default=0.0005)
    ap.add_argument("--strategies", nargs="+", default=["direct", "fanout", "nodecache"])
    ap.add_argument("--chunk-bytes", type=int, default=None, help="fan-out's round (default: the runner's)")
    ap.add_argument("--corrupt", default=None)
    ap.add_argument("--remove", default=None, metavar="SHARD:FILE", help="a shard file removed after "
                    "it was laid out (the rank that reads it fails)")
    ap.add_argument("--objects", default=None, metavar="URL", help="the storage: s3://bucket/prefix")
    ap.add_argument("--real-hosts", action="store_true", help="each rank's host as MPI names it "
                    "(simulated hosts), not --hosts groups")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    layout = ServingLayout("llama3_8b", L8B, args.tp, n // args.tp, shard_file_bytes=1 << 30)
    hosts = [f"h{r * args.hosts // n}" for r in range(n)]
    if args.real_hosts:
        hosts = comm.allgather(MPI.Get_processor_name())
    key = comm.bcast(secrets.token_bytes(engine.KEY_BYTES) if comm.Get_rank() == 0 else None)
    opts = engine.IOOptions(direct=False, threads=2, block_size=1 << 20, fsync=True)
    storage: Storage = Files(args.folder)
    if args.objects:
        root = parse_object_url(args.objects)
        storage = Objects(root, engine.Store(root.bucket, engine.S3Options(part_size=5 << 20, inflight=4)))
    out = {}
    for i, strategy in enumerate(args.strategies):
        plan = load_plan(layout, strategy, hosts, args.scale)
        tier = Files(args.tier / hosts[comm.Get_rank()])
        s = loads.LoadSetup(plan, storage.below(strategy), tier, key, 7 + i, opts, exchange_evidence=True,
                            chunk_bytes=args.chunk_bytes or FANOUT_CHUNK_BYTES)
        loads.lay_out(comm, s)
        if args.corrupt and comm.Get_rank() == 0 and storage.folders:
            shard, file, offset = map(int, args.corrupt.split(":"))
            with open(s.path(shard, file), "r+b") as f:
                f.seek(offset)
                byte = f.read(1)
                f.seek(offset)
                f.write(bytes([byte[0] ^ 0xFF]))
        if args.remove and comm.Get_rank() == 0:
            os.remove(s.path(*map(int, args.remove.split(":"))))
        comm.Barrier()
        groups = loads.shard_groups(comm, plan)
        try:
            loaded = loads.load(comm, s, groups, loads.barrier_timed(comm))
            rec = {**loaded.record, "verified_bytes": loads.verify(s, comm.Get_rank(), loaded.arena)}
        except VerificationError as exc:
            # Beside stderr, a file: MPI_Abort may end the job before mpiexec forwards the line
            args.folder.mkdir(parents=True, exist_ok=True)
            (args.folder / f"failed-rank{comm.Get_rank()}.txt").write_text(f"{exc}\n")
            print(f"rank {comm.Get_rank()}: {exc}", file=sys.stderr, flush=True)
            comm.Abort(3)
        loads.clear_tier(groups[1], s)
        recs = comm.gather(rec, root=0)
        plan_doc = [{"storage_bytes": r.storage_bytes, "node_tier_bytes": r.node_tier_bytes,
                     "received_bytes": r.received_bytes, "bytes": plan.shard_bytes(r.shard)}
                    for r in plan.ranks]
        out[strategy] = {"records": recs, "plan": plan_doc, "shard_files": plan.shard_files,
                         "problems": held_to_plan(plan, recs) if comm.Get_rank() == 0 else None}
    if comm.Get_rank() == 0:
        json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
