"""TEST-ONLY: new ranks resuming from a checkpoint of another layout under mpiexec
(mlckpt/run/phases/resumes.py), for tests/mpi/test_resume_mpi.py; run as ``python -m mpi4py
resume_worker.py``, so that a rank's exception aborts the whole job.  Prints rank 0's gathered records
as JSON; ``--corrupt WRITER:FILE:OFFSET`` flips one byte of an old file after it was laid out.
``--dcp`` saves the checkpoint through DCP, as the old layout's ranks would have saved it, in
``FOLDER/dcp``, and resumes from it through DCP's own resharding load instead of the engine's;
records what DCP read and the names of the files it saved."""

from __future__ import annotations

import argparse
import dataclasses
import json
import secrets
import sys
from pathlib import Path

from mpi4py import MPI

from mlckpt import engine
from mlckpt.errors import VerificationError
from mlckpt.run.phases import loads, resumes
from mlckpt.run.storage.backends import Files
from mlckpt.workload.layout import make_plan
from mlckpt.workload.model import ModelShape, Parallelism, Workload

L8B = ModelShape(4096, 32, 14336, 128256, 32, 8)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--from-ranks", type=int, default=8)
    ap.add_argument("--from-tp", type=int, default=1)
    ap.add_argument("--zero", type=int, default=3)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--scale", type=float, default=0.001)
    ap.add_argument("--corrupt", default=None)
    ap.add_argument("--buffered", action="store_true")
    ap.add_argument("--dcp", action="store_true")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    w = Workload("llama3_8b", L8B, Parallelism(a.from_tp, 1, a.zero), 8)
    fresh = (secrets.token_bytes(engine.KEY_BYTES), secrets.randbits(63))
    key, run_id = comm.bcast(fresh if me == 0 else None)
    opts = engine.IOOptions(direct=not a.buffered, threads=2, block_size=1 << 20, fsync=True)
    setup = resumes.ResumeSetup(make_plan(w, a.from_ranks, a.scale), dataclasses.replace(w), comm.Get_size(),
                                a.tp, 1, Files(a.folder), key, run_id, opts)
    if a.dcp:
        return through_dcp(comm, setup, a.folder / "dcp")
    index_bytes = resumes.lay_out(comm, setup)
    if a.corrupt and me == 0:
        writer, index, offset = (int(x) for x in a.corrupt.split(":"))
        with open(setup.storage.at(setup.name(writer, index)), "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0x5A]))
    comm.Barrier()
    prepared = resumes.prepare(setup, me)
    rec = resumes.resume(comm, setup, prepared, index_bytes, loads.barrier_timed(comm))
    try:
        rec["verified_bytes"] = resumes.verify(setup, prepared, me)
    except VerificationError as exc:
        rec["failed"] = str(exc)
    recs = comm.gather(rec, root=0)
    resumes.remove(comm, setup)
    if me == 0:
        json.dump(recs, sys.stdout)
    return 0


def through_dcp(comm: MPI.Intracomm, setup: resumes.ResumeSetup, cdir: Path) -> int:
    from mlckpt.engine.frameworks import join_process_group, leave_process_group

    join_process_group(comm, single_host=True)
    try:
        resumes.dcp_lay_out(comm, setup, cdir)
        prepared = resumes.prepare(setup, comm.Get_rank(), spread=False)
        rec = resumes.dcp_resume(comm, setup, prepared, cdir, loads.barrier_timed(comm))
        rec["saved"] = sorted(p.name for p in cdir.iterdir())
        try:
            rec["verified_bytes"] = resumes.verify(setup, prepared, comm.Get_rank())
        except VerificationError as exc:
            rec["failed"] = str(exc)
        recs = comm.gather(rec, root=0)
        if comm.Get_rank() == 0:
            json.dump(recs, sys.stdout)
        return 0
    finally:
        leave_process_group()


if __name__ == "__main__":
    sys.exit(main())
