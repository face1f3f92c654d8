"""mlckpt on object storage against the client's own limit: `mlckpt run` with
``checkpoint.folder=s3://…`` against the chosen client's raw transfer calls (botocore's
CreateMultipartUpload / UploadPart / CompleteMultipartUpload, PutObject for one-part objects, ranged
GetObject read straight into a buffer), same store, same bytes, same ranks, alternated rounds.

    python benchmarks/vs_limit_s3.py [--ranks 4] [--scale 0.01] [--rounds 3] [--writes 2] [--reads 2]
                                     [--part-mib 16] [--inflight 8] [--bucket mlckpt-bench]

Without ``AWS_ENDPOINT_URL`` in the environment it starts a local Swift store
(``benchmarks/lab/s3local.py``) and uses that.  The raw baseline runs one process per mlckpt rank, each
holding exactly that rank's planned objects (sizes from mlckpt's own plan), with the same part
size and the same number of requests in flight per rank, and the same client settings (path
addressing, no per-request checksums: see mlckpt/engine/objects.py).  Each op starts at a barrier
of all processes; its bandwidth is the bytes of all ranks over the slowest rank's time (mlckpt's
own definition).  Writes put checkpoints 1..W under fresh keys; reads restore them in mlckpt's
order ((k - 1) mod W), every rank reading its own objects (mlckpt runs with rank_shift=0 here);
everything is deleted at the end of a round.  Before each op the raw ranks stay idle as long as
mlckpt's ranks were before that same op in its latest round (content made, restores verified):
the store gets the same time to settle in both.  Both sides' ranks keep Python's cyclic garbage
collector out of their timed ops (mlckpt's OpTimer.collect_garbage and hold_gc; here the same three
calls).  The side that goes first alternates (mlckpt in odd rounds, the raw ranks in even ones).  It
prints every op with the client's CPU seconds per GiB (the rank processes' user + system time over
the op), then the medians and the ratio mlckpt / raw per direction.  A measurement, not a test: the
exit status is 0 whatever the ratios.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lab import bench

GiB = float(1 << 30)
Gaps = dict[tuple[str, int], float]  # mlckpt's idle seconds before each (op, index)
ROOT = Path(__file__).resolve().parent.parent


def client(inflight: int) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        config=Config(
            s3={"addressing_style": "path"},
            max_pool_connections=max(10, 2 * inflight),
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def _requests(sizes: list[int], part: int) -> list[tuple[int, int, int, int]]:
    return [
        (k, n + 1, s, min(s + part, size))
        for k, size in enumerate(sizes)
        for n, s in enumerate(range(0, size, part))
    ]


class RawRank:
    """One raw 'rank': its objects (mlckpt's planned sizes for that rank), botocore's calls."""

    def __init__(self, rank: int, sizes: list[int], a: argparse.Namespace, prefix: str) -> None:

        self.rank, self.sizes, self.a, self.prefix = rank, sizes, a, prefix
        self.c, self.part = client(a.inflight), a.part_mib << 20
        from mlckpt import engine

        self.key = os.urandom(engine.KEY_BYTES)
        self.buf = engine.alloc(sum(sizes) + engine.PAGE)  # page-aligned, pre-touched, as mlckpt's state
        self.back = engine.alloc(len(self.buf))
        self.offs = [sum(sizes[:k]) for k in range(len(sizes))]
        self.pool = ThreadPoolExecutor(a.inflight)
        self.reqs = _requests(sizes, self.part)

    def fill(self, k: int) -> None:
        """Checkpoint k's bytes, untimed, as mlckpt makes them (its content generator: AES-CTR
        pages with their tags, a run key of this round's): the same bytes, and no two checkpoints
        alike.  Rewriting one buffer flattered the baseline here (reads 0.30 against 0.27 GiB/s
        with unique random bytes)."""
        from mlckpt import engine

        for i, n in enumerate(self.sizes):
            part = self.buf[self.offs[i] : self.offs[i] + n]
            engine.fill(part, n, self.key, engine.PageId(7, self.rank, k, i))

    def keys(self, k: int) -> list[str]:
        return [f"{self.prefix}/ckpt-{k:04d}/r{self.rank}-f{i}" for i in range(len(self.sizes))]

    def write(self, k: int) -> None:
        """Checkpoint k: every object's parts in one queue, then the completions."""
        a, c, ks, mv = self.a, self.c, self.keys(k), memoryview(self.buf)
        multi = sorted(i for i, s in enumerate(self.sizes) if s > self.part)
        ids = dict(
            zip(
                multi,
                self.pool.map(
                    lambda i: c.create_multipart_upload(Bucket=a.bucket, Key=ks[i])["UploadId"], multi
                ),
                strict=True,
            )
        )
        etags: dict[tuple[int, int], str] = {}

        def send(r: tuple[int, int, int, int]) -> None:
            i, n, s, e = r
            body = bytes(mv[self.offs[i] + s : self.offs[i] + e])
            if i in ids:
                etags[i, n] = c.upload_part(
                    Bucket=a.bucket, Key=ks[i], UploadId=ids[i], PartNumber=n, Body=body
                )["ETag"]
            else:
                c.put_object(Bucket=a.bucket, Key=ks[i], Body=body)

        def complete(i: int) -> None:
            parts = [
                {"ETag": etags[i, n], "PartNumber": n} for n in range(1, -(-self.sizes[i] // self.part) + 1)
            ]
            c.complete_multipart_upload(
                Bucket=a.bucket, Key=ks[i], UploadId=ids[i], MultipartUpload={"Parts": parts}
            )

        list(self.pool.map(send, self.reqs))
        list(self.pool.map(complete, multi))

    def read(self, k: int) -> None:
        """Checkpoint k back into the buffer: ranged GETs, read in place."""
        a, c, ks, mv = self.a, self.c, self.keys(k), memoryview(self.back)

        def get(r: tuple[int, int, int, int]) -> None:
            i, _n, s, e = r
            body = c.get_object(Bucket=a.bucket, Key=ks[i], Range=f"bytes={s}-{e - 1}")["Body"]
            pos, end = self.offs[i] + s, self.offs[i] + e
            while pos < end:
                n = body._raw_stream.readinto(mv[pos:end])
                if not n:
                    raise OSError(f"short answer for {ks[i]}")
                pos += n
            body.close()

        list(self.pool.map(get, self.reqs))


def _rank(
    rank: int,
    sizes: list[int],
    a: argparse.Namespace,
    prefix: str,
    gaps: Gaps,
    barrier: Any,
    out: Any,
) -> None:
    """W writes then R reads, each op after mlckpt's idle gap before that same op (counted from
    this rank's end of the previous op, its content making and checking included), timed from a
    barrier to this rank's last byte; then the objects are deleted."""
    import gc

    import numpy as np

    me = RawRank(rank, sizes, a, prefix)
    gc.collect()
    gc.freeze()  # as mlckpt's ranks (OpTimer.collect_garbage): no cyclic collection inside a timed op
    times: list[tuple[str, int, float, float]] = []
    ops = [("write", k, k) for k in range(1, a.writes + 1)] + [
        ("read", j, (j - 1) % a.writes + 1) for j in range(1, a.reads + 1)
    ]
    idle = time.perf_counter()
    for op, index, k in ops:
        if op == "write":
            me.fill(k)
        time.sleep(max(0.0, gaps.get((op, index), 0.0) - (time.perf_counter() - idle)))
        gc.collect()
        gc.disable()
        barrier.wait()
        t0, c0 = time.perf_counter(), time.process_time()
        (me.write if op == "write" else me.read)(k)
        idle = time.perf_counter()
        times.append((op, index, idle - t0, time.process_time() - c0))
        gc.enable()
        if op == "read":
            me.fill(k)
            n = sum(sizes)
            assert np.array_equal(me.buf[:n], me.back[:n]), f"checkpoint {k}: the store returned other bytes"
    barrier.wait()
    for k in range(1, a.writes + 1):
        for key in me.keys(k):
            me.c.delete_object(Bucket=a.bucket, Key=key)
    out.put((rank, times))


def gaps_of(recs: list[dict[str, Any]]) -> Gaps:
    """mlckpt's idle time before each op (content made, restores verified): from the last rank's
    end of one op to the first rank's start of the next.  Per op, not per kind: the first restore
    follows the last write at once, later ones follow a verification (0.03 against ~0.2 s here),
    and a median of the two gave the raw ranks a rest mlckpt never had before its first restore."""
    ops = sorted(
        {(r["op"], r["index"]) for r in recs},
        key=lambda o: min(r["t0_ns"] for r in recs if (r["op"], r["index"]) == o),
    )
    got: Gaps = {}
    for prev, nxt in itertools.pairwise(ops):
        end = max(r["t1_ns"] for r in recs if (r["op"], r["index"]) == prev)
        start = min(r["t0_ns"] for r in recs if (r["op"], r["index"]) == nxt)
        got[nxt] = max(0.0, (start - end) / 1e9)
    return got


def raw_round(plan: list[list[int]], a: argparse.Namespace, gaps: Gaps,
              cpu: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(plan)), ctx.Queue()
    prefix = f"raw-{uuid.uuid4().hex[:12]}"
    procs = [
        ctx.Process(target=_rank, args=(r, sizes, a, prefix, gaps, barrier, out))
        for r, sizes in enumerate(plan)
    ]
    for p in procs:
        p.start()
    got = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    total = sum(sum(s) for s in plan)
    ops: dict[tuple[str, int], float] = {}
    for op, k, _, _ in got[0][1]:
        slowest = max(dict(((o, i), t) for o, i, t, _ in times)[(op, k)] for _, times in got)
        ops[op, k] = total / slowest
        cpu[op, k] = sum(dict(((o, i), c) for o, i, _, c in times)[(op, k)] for _, times in got)
    return ops


def mlckpt_round(a: argparse.Namespace, work: Path, gaps: Gaps,
                 cpu: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    args = [
        "preset=none",
        "workload=llama3_8b",
        "division=open",
        f"ranks={a.ranks}",
        f"scale={a.scale}",
        f"checkpoint.num_writes={a.writes}",
        f"checkpoint.num_reads={a.reads}",
        f"checkpoint.folder=s3://{a.bucket}/mlckpt",
        f"storage.s3.part_size={a.part_mib << 20}",
        f"storage.s3.inflight={a.inflight}",
        "signing.key=none",
        f"output.root={work}",
        "checkpoint.rank_shift=0",
    ]
    bundle = bench.run_mlckpt(args)
    gaps.update(gaps_of(bundle.records))
    ops: dict[tuple[str, int], float] = {}
    for key, rs in bundle.ops().items():
        ops[key] = bench.op_bandwidth(rs)
        cpu[key] = sum(r.get("cpu_ns", 0) for r in rs) / 1e9
    return ops


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--writes", type=int, default=2)
    p.add_argument("--reads", type=int, default=2)
    p.add_argument("--part-mib", type=int, default=16)
    p.add_argument("--inflight", type=int, default=8)
    p.add_argument("--bucket", default="mlckpt-bench")
    a = p.parse_args()
    from lab import s3local

    with s3local.endpoint(Path(tempfile.mkdtemp(prefix="mlckpt-s3-bench-"))):
        from mlckpt.plan.config import setup

        s = setup(["workload=llama3_8b", "division=open", f"ranks={a.ranks}", f"scale={a.scale}"])
        plan = [[f.bytes for f in rp.files] for rp in s.plan.rank_plans]
        c = client(a.inflight)
        try:
            c.create_bucket(Bucket=a.bucket)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        total = s.plan.total_bytes
        print(
            f"{a.ranks} ranks, {total / GiB:.2f} GiB per checkpoint, parts of {a.part_mib} MiB, "
            f"{a.inflight} in flight per rank, {a.writes} writes + {a.reads} reads per round, "
            f"endpoint {os.environ['AWS_ENDPOINT_URL']}"
        )
        res: dict[str, dict[str, list[float]]] = {n: {"write": [], "read": []} for n in ("mlckpt", "raw")}
        cpus: dict[str, dict[str, list[float]]] = {n: {"write": [], "read": []} for n in ("mlckpt", "raw")}
        gaps: Gaps = {}  # mlckpt's, from its latest round: the raw ranks idle as long before each op
        with tempfile.TemporaryDirectory() as work:
            for r in range(1, a.rounds + 1):
                # Which goes first alternates: the op after the other's deletions may start on a
                # busier store.  The raw ranks need mlckpt's idle gaps: round 1 starts with mlckpt.
                for name in ("mlckpt", "raw") if r % 2 or not gaps else ("raw", "mlckpt"):
                    cpu: dict[tuple[str, int], float] = {}
                    ops = (mlckpt_round(a, Path(work), gaps, cpu) if name == "mlckpt"
                           else raw_round(plan, a, gaps, cpu))
                    if name == "raw":
                        idle = ", ".join(f"{o} {i} {g:.2f}" for (o, i), g in gaps.items())
                        print(f"round {r} raw idle before each op as mlckpt's latest round, s: {idle}")
                    for (op, k), bw in sorted(ops.items()):
                        res[name][op].append(bw)
                        cpus[name][op].append(cpu[op, k] / (total / GiB))
                        print(f"round {r} {name:6s} {op} {k}: {bw / GiB:.3f} GiB/s, client CPU "
                              f"{cpu[op, k] / (total / GiB):.2f} s/GiB", flush=True)
        print("medians (GiB/s) and the ratio mlckpt / raw client:")
        for op in ("write", "read"):
            m, raw = statistics.median(res["mlckpt"][op]), statistics.median(res["raw"][op])
            mc, rc = (statistics.median(cpus[n][op]) for n in ("mlckpt", "raw"))
            print(f"  {op:5s} mlckpt {m / GiB:.3f}  raw {raw / GiB:.3f}  ratio {m / raw:.3f}   "
                  f"client CPU s/GiB mlckpt {mc:.2f}  raw {rc:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
