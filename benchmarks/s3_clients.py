"""Which S3 client should mlckpt's object engine use?  Measured, not assumed.

Every candidate moves the same bytes (``--objects`` objects of ``--object-mib`` MiB, incompressible,
one buffer) to the same store in the same run, in alternated rounds (A B C, A B C, ...), with the
same part size and the same number of requests in flight:

- ``boto3-parts``: botocore's client, one queue of UploadPart / ranged GetObject requests over
  ``--inflight`` threads, ranged reads straight into the buffer (``readinto``);
- ``boto3-transfer``: boto3's transfer manager (s3transfer) upload_fileobj / download_fileobj;
- ``obstore``: obstore (Rust object_store) put with multipart concurrency, get_ranges;
- ``s3dlio``: s3dlio's MultipartUploadWriter and get_range.

A write counts when every object's upload has completed; a read when every byte is in the
buffer, and the bytes are compared with what was written (a client that returns other bytes is
unreliable and reported so).  Without ``AWS_ENDPOINT_URL`` in the environment a local Swift store is
started (``benchmarks/lab/s3local.py``).

    .venv/bin/pip install obstore s3dlio     # the candidates mlckpt does not depend on
    .venv/bin/python benchmarks/s3_clients.py --rounds 3
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

MiB = 1 << 20


class Spec:
    def __init__(self, a: argparse.Namespace, bucket: str) -> None:
        self.bucket = bucket
        self.n = a.objects
        self.size = a.object_mib * MiB
        self.part = a.part_mib * MiB
        self.inflight = a.inflight
        self.endpoint = os.environ["AWS_ENDPOINT_URL"]

    def ranges(self) -> list[tuple[int, int, int]]:
        return [
            (o, s, min(s + self.part, self.size))
            for o in range(self.n)
            for s in range(0, self.size, self.part)
        ]


def boto_client(spec: Spec) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        config=Config(
            s3={"addressing_style": "path"},
            max_pool_connections=spec.inflight * 2,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def boto3_parts(spec: Spec) -> tuple[Callable[..., None], Callable[..., None]]:
    s3 = boto_client(spec)
    pool = ThreadPoolExecutor(spec.inflight)

    def write(keys: list[str], buf: np.ndarray) -> None:
        mv = memoryview(buf)
        ids = [s3.create_multipart_upload(Bucket=spec.bucket, Key=k)["UploadId"] for k in keys]
        etags: dict[tuple[int, int], str] = {}

        def part(r: tuple[int, int, int]) -> None:
            o, s, e = r
            base = o * spec.size
            etags[o, s] = s3.upload_part(
                Bucket=spec.bucket,
                Key=keys[o],
                UploadId=ids[o],
                PartNumber=s // spec.part + 1,
                Body=_BufferFile(mv[base + s : base + e]),
            )["ETag"]

        list(pool.map(part, spec.ranges()))
        for o, k in enumerate(keys):
            parts = [
                {"ETag": etags[o, s], "PartNumber": s // spec.part + 1}
                for s in range(0, spec.size, spec.part)
            ]
            s3.complete_multipart_upload(
                Bucket=spec.bucket, Key=k, UploadId=ids[o], MultipartUpload={"Parts": parts}
            )

    def read(keys: list[str], buf: np.ndarray) -> None:
        mv = memoryview(buf)

        def get(r: tuple[int, int, int]) -> None:
            o, s, e = r
            body = s3.get_object(Bucket=spec.bucket, Key=keys[o], Range=f"bytes={s}-{e - 1}")["Body"]
            raw, pos, end = body._raw_stream, o * spec.size + s, o * spec.size + e
            while pos < end:
                n = raw.readinto(mv[pos:end])
                if not n:
                    raise OSError(f"short read of {keys[o]} at {pos - o * spec.size}")
                pos += n

        list(pool.map(get, spec.ranges()))

    return write, read


class _BufferFile(io.RawIOBase):
    """A seekable, writable/readable file over one slice of the buffer (no copy on write)."""

    def __init__(self, mv: memoryview) -> None:
        self.mv, self.pos = mv, 0

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else len(self.mv) + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        n = min(len(b), len(self.mv) - self.pos)
        b[:n] = self.mv[self.pos : self.pos + n]
        self.pos += n
        return n

    def write(self, b: Any) -> int:
        n = len(b)
        self.mv[self.pos : self.pos + n] = b
        self.pos += n
        return n


def boto3_transfer(spec: Spec) -> tuple[Callable[..., None], Callable[..., None]]:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    s3 = boto_client(spec)
    cfg = TransferConfig(
        multipart_threshold=spec.part,
        multipart_chunksize=spec.part,
        max_concurrency=spec.inflight,
        use_threads=True,
    )
    tm = TransferManager(s3, cfg)

    def write(keys: list[str], buf: np.ndarray) -> None:
        mv = memoryview(buf)
        futs = [
            tm.upload(_BufferFile(mv[o * spec.size : (o + 1) * spec.size]), spec.bucket, k)
            for o, k in enumerate(keys)
        ]
        for f in futs:
            f.result()

    def read(keys: list[str], buf: np.ndarray) -> None:
        mv = memoryview(buf)
        futs = [
            tm.download(spec.bucket, k, _BufferFile(mv[o * spec.size : (o + 1) * spec.size]))
            for o, k in enumerate(keys)
        ]
        for f in futs:
            f.result()

    return write, read


def obstore_client(spec: Spec) -> tuple[Callable[..., None], Callable[..., None]]:
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        spec.bucket,
        endpoint=spec.endpoint,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "pool_max_idle_per_host": str(spec.inflight * 2)},
    )

    def write(keys: list[str], buf: np.ndarray) -> None:
        mv = memoryview(buf)
        for o, k in enumerate(keys):
            obstore.put(
                store,
                k,
                mv[o * spec.size : (o + 1) * spec.size],
                chunk_size=spec.part,
                max_concurrency=spec.inflight,
                use_multipart=True,
            )

    def read(keys: list[str], buf: np.ndarray) -> None:
        for o, k in enumerate(keys):
            starts = list(range(0, spec.size, spec.part))
            ends = [min(s + spec.part, spec.size) for s in starts]
            for s, got in zip(
                starts, obstore.get_ranges(store, k, starts=starts, ends=ends, coalesce=0), strict=True
            ):
                buf[o * spec.size + s : o * spec.size + s + len(got)] = np.frombuffer(
                    memoryview(got), np.uint8
                )

    return write, read


def s3dlio_client(spec: Spec) -> tuple[Callable[..., None], Callable[..., None]]:
    import s3dlio

    s3dlio.configure_s3(endpoint_url=spec.endpoint, region=os.environ.get("AWS_REGION", "us-east-1"))
    pool = ThreadPoolExecutor(spec.inflight)

    def write(keys: list[str], buf: np.ndarray) -> None:
        mv = memoryview(buf)
        for o, k in enumerate(keys):
            w = s3dlio.MultipartUploadWriter(spec.bucket, k, part_size=spec.part, max_in_flight=spec.inflight)
            w.write(mv[o * spec.size : (o + 1) * spec.size])
            w.close()

    def read(keys: list[str], buf: np.ndarray) -> None:
        def get(r: tuple[int, int, int]) -> None:
            o, s, e = r
            got = s3dlio.get_range(f"s3://{spec.bucket}/{keys[o]}", s, e - s)
            buf[o * spec.size + s : o * spec.size + e] = np.frombuffer(memoryview(got), np.uint8)

        list(pool.map(get, spec.ranges()))

    return write, read


CLIENTS: dict[str, Callable[[Spec], tuple[Callable[..., None], Callable[..., None]]]] = {
    "boto3-parts": boto3_parts,
    "boto3-transfer": boto3_transfer,
    "obstore": obstore_client,
    "s3dlio": s3dlio_client,
}


def delete(spec: Spec, keys: list[str]) -> None:
    s3 = boto_client(spec)
    for k in keys:
        s3.delete_object(Bucket=spec.bucket, Key=k)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=8)
    p.add_argument("--object-mib", type=int, default=64)
    p.add_argument("--part-mib", type=int, default=16)
    p.add_argument("--inflight", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--bucket", default="mlckpt-clients")
    a = p.parse_args()
    from lab import s3local

    with s3local.endpoint(Path("/tmp/mlckpt-s3-clients")):
        spec = Spec(a, a.bucket)
        s3 = boto_client(spec)
        try:
            s3.create_bucket(Bucket=spec.bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        names = a.clients.split(",")
        impls = {}
        for n in list(names):
            try:
                impls[n] = CLIENTS[n](spec)
            except ImportError as exc:  # obstore and s3dlio are not mlckpt's dependencies
                print(f"{n}: skipped ({exc.name} is not installed: pip install {exc.name})")
                names.remove(n)
        src = np.random.default_rng(1).integers(0, 256, spec.n * spec.size, dtype=np.uint8)
        dst = np.empty_like(src)
        res: dict[str, dict[str, list[float]]] = {
            n: {"write": [], "read": [], "wcpu": [], "rcpu": []} for n in names
        }
        gib = spec.n * spec.size / (1 << 30)
        print(
            f"{spec.n} objects x {a.object_mib} MiB, parts of {a.part_mib} MiB, {spec.inflight} in flight, "
            f"endpoint {spec.endpoint}"
        )
        for r in range(a.rounds):
            for n in names:
                w, rd = impls[n]
                keys = [f"{n}/{uuid.uuid4().hex}/{o}" for o in range(spec.n)]
                c0, t0 = time.process_time(), time.perf_counter()
                w(keys, src)
                c1, t1 = time.process_time(), time.perf_counter()
                dst[:] = 0
                c2, t2 = time.process_time(), time.perf_counter()
                rd(keys, dst)
                c3, t3 = time.process_time(), time.perf_counter()
                ok = np.array_equal(src, dst)
                delete(spec, keys)
                res[n]["write"].append(gib / (t1 - t0))
                res[n]["read"].append(gib / (t3 - t2))
                res[n]["wcpu"].append((c1 - c0) / gib)
                res[n]["rcpu"].append((c3 - c2) / gib)
                print(
                    f"round {r + 1} {n:15s} write {gib / (t1 - t0):6.3f} GiB/s  "
                    f"read {gib / (t3 - t2):6.3f} GiB/s"
                    f"  client CPU s/GiB write {(c1 - c0) / gib:5.2f} read {(c3 - c2) / gib:5.2f}"
                    f"{'' if ok else '  READ BACK OTHER BYTES'}",
                    flush=True,
                )
                if not ok:
                    res[n]["write"].append(0.0)
        print("median over rounds: GiB/s, and the client's CPU seconds per GiB")
        for n in names:
            m = {k: statistics.median(v) for k, v in res[n].items()}
            print(
                f"  {n:15s} write {m['write']:6.3f} ({m['wcpu']:5.2f} s/GiB)  read {m['read']:6.3f} "
                f"({m['rcpu']:5.2f} s/GiB)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
