"""Timed object writes and reads on S3-compatible storage: the second storage backend, beside
``files``.  Same shape as the file engine: every request of one rank's objects in one queue,
``inflight`` workers each issuing blocking requests (botocore releases the GIL while it waits on
the network), buffers written from and read into in place.

The client is botocore's (boto3), chosen by measurement (``benchmarks/s3_clients.py``; the
figures are in ``benchmarks/README.md``): against the same store, in alternated rounds, it moved
the same bytes at least as fast as boto3's transfer manager, obstore and s3dlio, with the lowest
read CPU of the Python clients; it reads the AWS SDKs' own configuration (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and the shared config files).

Semantics (rules 1.6, docs: Object storage):

- A write of an object is durable when the store acknowledged its completion: the single
  PutObject (objects up to one part) or the CompleteMultipartUpload returned.  Both happen inside
  the timed call.  There is no fsync: the acknowledgement is the durability point.
- A read is ranged GETs of ``part_size`` bytes, ``inflight`` in parallel, into the state buffer.
  Each answer's Content-Range must name the object's planned size.
- No call here lists the bucket.  Listing is only for cleanup (:func:`abort_uploads`), after or
  outside the timed operations.

Effects only: no MPI, no printing, no clock.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from mlckpt.engine.content import check_buffer, round_up
from mlckpt.engine.files import FileResult, run_pool
from mlckpt.errors import ConfigError, InternalError, IOFailure
from mlckpt.locations import ObjectPath

MIN_PART = 5 << 20  # S3: every part but the last is at least 5 MiB
MAX_PART = 5 << 30
MAX_PARTS = 10_000
ADDRESSING = ("path", "virtual", "auto")
CLIENT = "botocore"


@dataclass(frozen=True)
class S3Options:
    """``storage.s3.*``: how the client talks to the store.  ``endpoint``/``region`` None: the AWS
    SDK's own chain (``AWS_ENDPOINT_URL``, ``AWS_REGION``, profiles)."""

    part_size: int = 16 << 20
    inflight: int = 8  # requests in flight per rank
    addressing_style: str = "path"
    verify_tls: bool = True
    endpoint: str | None = None
    region: str | None = None
    timeout_s: float = 120.0  # per request (connect and each read)
    pool: str = "main"  # worker pool, as IOOptions.pool

    def __post_init__(self) -> None:
        if not MIN_PART <= self.part_size <= MAX_PART:
            raise ConfigError(
                f"storage.s3.part_size must be between 5 MiB and 5 GiB, got {self.part_size}",
                key="storage.s3.part_size",
            )
        if self.inflight < 1:
            raise ConfigError(
                f"storage.s3.inflight must be >= 1, got {self.inflight}", key="storage.s3.inflight"
            )
        if self.addressing_style not in ADDRESSING:
            raise ConfigError(
                f"storage.s3.addressing_style must be one of {', '.join(ADDRESSING)}, got "
                f"{self.addressing_style!r}",
                key="storage.s3.addressing_style",
            )

    def parts(self, nbytes: int) -> int:
        """Requests that write (or read) an object of ``nbytes``: one PutObject up to a part."""
        return max(1, -(-nbytes // self.part_size))


# eq=False: comparing or hashing a frozen dataclass that holds a numpy buffer is meaningless.
@dataclass(frozen=True, eq=False)
class ObjectIO:
    where: ObjectPath
    buf: np.ndarray  # len >= nbytes rounded up to a page (as for files)
    nbytes: int


def client_version() -> str:
    import botocore

    return f"{CLIENT} {botocore.__version__}"


class Store:
    """One bucket through one botocore client (thread-safe; one per process, shared by the
    workers).  Made lazily: a file run never imports boto3."""

    def __init__(self, bucket: str, opts: S3Options) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ConfigError(
                "checkpoint.folder: s3:// needs the S3 client: pip install 'mlckpt[s3]'",
                key="checkpoint.folder",
            ) from None
        self.bucket, self.opts = bucket, opts
        cfg = Config(
            s3={"addressing_style": opts.addressing_style},
            max_pool_connections=max(10, 2 * opts.inflight),
            connect_timeout=min(opts.timeout_s, 30.0),
            read_timeout=opts.timeout_s,
            retries={"mode": "standard", "max_attempts": 3},
            # Pages are verified end to end on every restore; per-request checksums would only add
            # CPU inside the timed region (the store still checks each request's signature).
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self.session = boto3.session.Session()
        self.client = self.session.client(
            "s3", endpoint_url=opts.endpoint, region_name=opts.region, verify=opts.verify_tls, config=cfg
        )

    def with_pool(self, pool: str) -> Store:
        """The same client, its requests run by another worker pool (a background persist)."""
        other = copy.copy(self)
        other.opts = replace(self.opts, pool=pool)
        return other

    @property
    def endpoint_host(self) -> str:
        """The endpoint's host and port, never credentials (what the bundle records)."""
        parts = urlsplit(str(self.client.meta.endpoint_url))
        return parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else ""

    def credentials_present(self) -> bool:
        return self.session.get_credentials() is not None

    def describe(self) -> dict[str, object]:
        return {
            "client": client_version(),
            "endpoint_host": self.endpoint_host,
            "region": self.client.meta.region_name,
            "bucket": self.bucket,
            "part_size": self.opts.part_size,
            "inflight": self.opts.inflight,
            "addressing_style": self.opts.addressing_style,
            "verify_tls": self.opts.verify_tls,
        }


def failure(op: str, where: ObjectPath | str, exc: BaseException, offset: int | None = None) -> IOFailure:
    """An S3 error as the run reports it: the operation, the object's URL, the store's code."""
    at = f" at offset {offset}" if offset is not None else ""
    err = getattr(exc, "response", {}).get("Error", {}) if hasattr(exc, "response") else {}
    reason = f"{err.get('Code', '?')}: {err.get('Message') or ''}".rstrip(": ") if err else str(exc)
    return IOFailure(f"{op} failed on {where}{at}: {reason}", op=op, path=str(where), offset=offset)


def _check(objs: Sequence[ObjectIO], opts: S3Options, what: str, writable: bool) -> None:
    for o in objs:
        check_buffer(o.buf, round_up(o.nbytes), f"{what} {o.where}", writable=writable)
        if opts.parts(o.nbytes) > MAX_PARTS:
            raise ConfigError(
                f"storage.s3.part_size: {o.where} ({o.nbytes} bytes) would need more than "
                f"{MAX_PARTS} parts of {opts.part_size} bytes; use larger parts",
                key="storage.s3.part_size",
            )


class _Requests:
    """Every request of several objects as one numbered queue: i -> (object, part number, start, end)."""

    def __init__(self, objs: Sequence[ObjectIO], part: int) -> None:
        self.items = [
            (k, n + 1, s, min(s + part, o.nbytes))
            for k, o in enumerate(objs)
            for n, s in enumerate(range(0, max(o.nbytes, 1), part))
        ]


def put_objects(store: Store, objs: Sequence[ObjectIO]) -> list[FileResult]:
    """The timed part of one rank's checkpoint on object storage: every object written and its
    completion acknowledged.  Objects of one part are single PUTs; larger ones multipart uploads
    whose parts share the queue.  On failure, the uploads this call started are aborted (no part
    stays behind); objects already complete are left to the runner's cleanup."""
    opts, c, bucket = store.opts, store.client, store.bucket
    _check(objs, opts, "write", writable=False)
    reqs = _Requests(objs, opts.part_size)
    uploads: dict[int, str] = {}
    etags: dict[tuple[int, int], str] = {}
    views = [memoryview(o.buf) for o in objs]

    def start(k: int) -> None:
        if opts.parts(objs[k].nbytes) > 1:
            try:
                uploads[k] = c.create_multipart_upload(Bucket=bucket, Key=objs[k].where.key)["UploadId"]
            except Exception as exc:
                raise failure("create_upload", objs[k].where, exc) from exc

    def send(i: int) -> None:
        k, n, s, e = reqs.items[i]
        o = objs[k]
        body = bytes(views[k][s:e])  # botocore takes bytes (or a file), not a memoryview
        try:
            if k in uploads:
                etags[k, n] = c.upload_part(
                    Bucket=bucket, Key=o.where.key, UploadId=uploads[k], PartNumber=n, Body=body
                )["ETag"]
            else:
                c.put_object(Bucket=bucket, Key=o.where.key, Body=body)
        except Exception as exc:
            raise failure("write", o.where, exc, s) from exc

    def complete(k: int) -> None:
        if k not in uploads:
            return
        parts = [{"ETag": etags[k, n], "PartNumber": n} for n in range(1, opts.parts(objs[k].nbytes) + 1)]
        try:
            c.complete_multipart_upload(
                Bucket=bucket, Key=objs[k].where.key, UploadId=uploads[k], MultipartUpload={"Parts": parts}
            )
        except Exception as exc:
            raise failure("complete_upload", objs[k].where, exc) from exc
        del uploads[k]

    try:
        run_pool(len(objs), start, opts.inflight, opts.pool)
        run_pool(len(reqs.items), send, opts.inflight, opts.pool)
        run_pool(len(objs), complete, opts.inflight, opts.pool)
    except BaseException:
        for k, upload in list(uploads.items()):
            try:
                c.abort_multipart_upload(Bucket=bucket, Key=objs[k].where.key, UploadId=upload)
            except Exception:
                pass  # the sweep aborts what is left under the run's prefix
        raise
    return [FileResult(str(o.where), o.nbytes, True, opts.parts(o.nbytes), o.nbytes) for o in objs]


def _content_total(where: ObjectPath, resp: dict[str, object], offset: int) -> int:
    text = str(resp.get("ContentRange") or "")
    total = text.rpartition("/")[2]
    if not total.isdigit():
        raise IOFailure(
            f"read failed on {where} at offset {offset}: the store answered a ranged GET "
            f"without a Content-Range ({text!r})",
            op="read",
            path=str(where),
            offset=offset,
        )
    return int(total)


def get_objects(store: Store, objs: Sequence[ObjectIO]) -> list[FileResult]:
    """The timed restore of one rank from object storage: every object read back in place into its
    buffer with ranged GETs.  An object whose size is not the planned one fails, naming it."""
    opts = store.opts
    _check(objs, opts, "read", writable=True)
    reqs = _Requests(objs, opts.part_size)
    views = [memoryview(o.buf) for o in objs]

    def fetch(i: int) -> None:
        k, _n, s, e = reqs.items[i]
        o = objs[k]
        if o.nbytes == 0:
            _check_empty(store, o)
            return
        _get_into(store, o.where, s, e, o.nbytes, views[k], s)

    run_pool(len(reqs.items), fetch, opts.inflight, opts.pool)
    return [FileResult(str(o.where), o.nbytes, False, opts.parts(o.nbytes), o.nbytes) for o in objs]


def _get_into(store: Store, where: ObjectPath, start: int, end: int, size: int, into: memoryview,
              pos: int) -> None:
    """Bytes [start, end) of object ``where`` into ``into`` from ``pos`` by one ranged GET; the
    answer's Content-Range must name an object of ``size`` bytes, the planned one."""
    try:
        resp = store.client.get_object(Bucket=store.bucket, Key=where.key,
                                       Range=f"bytes={start}-{end - 1}")
    except Exception as exc:
        raise failure("read", where, exc, start) from exc
    total = _content_total(where, resp, start)
    if total != size:
        resp["Body"].close()
        how = "truncated" if total < size else "extended"
        raise IOFailure(f"size check failed on {where}: expected {size} bytes, found {total} ({how} "
                        "checkpoint object)", op="size", path=str(where))
    _receive(where, resp["Body"], into, pos, pos + end - start)


# eq=False: a frozen dataclass holding a numpy buffer has no meaningful equality.
@dataclass(frozen=True, eq=False)
class ObjectRange:
    """``nbytes`` of object ``where`` (of ``object_bytes`` in all) from ``offset``, into ``buf``."""

    where: ObjectPath
    object_bytes: int
    offset: int
    buf: np.ndarray
    nbytes: int


def get_ranges(store: Store, ranges: Sequence[ObjectRange]) -> int:
    """Byte ranges of objects read in place (a part of a shard, as a replica loading a model reads
    it: mlckpt/engine/ranges.py is the same for files): ranged GETs of at most ``part_size`` bytes,
    ``inflight`` in parallel, each answer's Content-Range naming the object's planned size.  The
    bytes read."""
    opts = store.opts
    for r in ranges:
        if not (0 <= r.offset and 0 < r.nbytes and r.offset + r.nbytes <= r.object_bytes):
            raise InternalError(f"read {r.where}: range {r.offset}+{r.nbytes} outside its "
                                f"{r.object_bytes} bytes")
        check_buffer(r.buf, r.nbytes, f"read {r.where}", writable=True)
    items = [(k, a, min(a + opts.part_size, r.nbytes)) for k, r in enumerate(ranges)
             for a in range(0, r.nbytes, opts.part_size)]
    views = [memoryview(r.buf) for r in ranges]

    def fetch(i: int) -> None:
        k, a, b = items[i]
        r = ranges[k]
        _get_into(store, r.where, r.offset + a, r.offset + b, r.object_bytes, views[k], a)

    run_pool(len(items), fetch, opts.inflight, opts.pool)
    return sum(r.nbytes for r in ranges)


def _receive(where: ObjectPath, body: Any, mv: memoryview, pos: int, end: int) -> None:
    """Read one answer's body into ``mv[pos:end]`` without an intermediate copy where the HTTP
    layer allows it (urllib3's ``readinto``)."""
    start = pos
    raw = getattr(body, "_raw_stream", None)
    try:
        while pos < end:
            if raw is not None and hasattr(raw, "readinto"):
                n = raw.readinto(mv[pos:end])
            else:
                chunk = body.read(end - pos)
                n = len(chunk)
                mv[pos : pos + n] = chunk
            if not n:
                raise IOFailure(
                    f"read failed on {where} at offset {pos}: the answer ended after "
                    f"{pos - start} of {end - start} bytes",
                    op="read",
                    path=str(where),
                    offset=pos,
                )
            pos += n
    except IOFailure:
        raise
    except Exception as exc:
        raise failure("read", where, exc, pos) from exc
    finally:
        body.close()


def _check_empty(store: Store, o: ObjectIO) -> None:
    try:
        size = int(store.client.head_object(Bucket=store.bucket, Key=o.where.key)["ContentLength"])
    except Exception as exc:
        raise failure("stat", o.where, exc) from exc
    if size:
        raise IOFailure(
            f"size check failed on {o.where}: expected 0 bytes, found {size}", op="size", path=str(o.where)
        )
