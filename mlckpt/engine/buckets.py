"""What a run does to its bucket outside the timed ops: the sizes of its objects, their removal,
the unfinished multipart uploads under its prefix aborted, and the probe each host's leader makes
before any I/O (OBJECT-STORE-USABLE).  The timed writes and reads are :mod:`mlckpt.engine.objects`'s."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from mlckpt.engine.files import run_pool
from mlckpt.engine.objects import Store, failure
from mlckpt.locations import ObjectPath


def sizes(store: Store, paths: Sequence[ObjectPath]) -> dict[str, int | None]:
    """Each object's size (None: missing), by HEAD requests (a restore's check before any I/O)."""
    out: dict[str, int | None] = {}
    for p in paths:
        try:
            out[str(p)] = int(store.client.head_object(Bucket=store.bucket, Key=p.key)["ContentLength"])
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                out[str(p)] = None
            else:
                raise failure("stat", p, exc) from exc
    return out


def delete_objects(store: Store, paths: Sequence[ObjectPath]) -> tuple[int, list[str]]:
    """Delete exactly these objects, one DeleteObject each, ``inflight`` at a time (a missing key
    is no error).  Not DeleteObjects: stores differ on the checksum header it requires (Swift's
    S3 API wants Content-MD5, botocore now sends CRC32).  Returns (deleted, the URLs that could
    not be deleted, each with the store's reason)."""
    left: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            store.client.delete_object(Bucket=store.bucket, Key=paths[i].key)
        except Exception as exc:
            with lock:
                left.append(failure("delete", paths[i], exc).args[0])

    run_pool(len(paths), one, store.opts.inflight, "cleanup")
    return len(paths) - len(left), left


def abort_uploads(store: Store, prefix: str) -> int:
    """Abort every unfinished multipart upload under ``prefix`` (a killed writer's parts); returns
    how many.  Lists uploads, never objects, and only under this run's own prefix."""
    n = 0
    pages = store.client.get_paginator("list_multipart_uploads").paginate(Bucket=store.bucket, Prefix=prefix)
    for page in pages:
        for up in page.get("Uploads") or []:
            if not str(up.get("Key", "")).startswith(prefix):
                continue  # a store that ignores Prefix must not make us touch others' uploads
            store.client.abort_multipart_upload(Bucket=store.bucket, Key=up["Key"], UploadId=up["UploadId"])
            n += 1
    return n


def probe(store: Store, where: ObjectPath) -> str | None:
    """Why this store cannot take the run, or None: credentials present, the endpoint answers, the
    bucket exists, and one small object can be written, read back and deleted (it is deleted
    whatever happens)."""
    if not store.credentials_present():
        return (
            "no S3 credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE "
            "with a shared credentials file)"
        )
    c, body = store.client, b"mlckpt probe\n"
    try:
        c.head_bucket(Bucket=store.bucket)
    except Exception as exc:
        return _probe_problem(store, exc, "bucket")
    try:
        c.put_object(Bucket=store.bucket, Key=where.key, Body=body)
    except Exception as exc:
        return _probe_problem(store, exc, "write")
    try:
        got = c.get_object(Bucket=store.bucket, Key=where.key)["Body"].read()
        if got != body:
            return f"{where}: the probe object read back other bytes than were written"
        return None
    except Exception as exc:
        return _probe_problem(store, exc, "read")
    finally:
        try:
            c.delete_object(Bucket=store.bucket, Key=where.key)
        except Exception:
            pass


def _probe_problem(store: Store, exc: BaseException, step: str) -> str:
    endpoint = store.client.meta.endpoint_url
    code = (
        str(getattr(exc, "response", {}).get("Error", {}).get("Code", "")) if hasattr(exc, "response") else ""
    )
    status = (
        getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        if hasattr(exc, "response")
        else None
    )
    if not code:
        return f"the S3 endpoint {endpoint} cannot be reached ({type(exc).__name__}: {exc})"
    if step == "bucket" and (code in ("404", "NoSuchBucket", "NotFound") or status == 404):
        return f"the bucket {store.bucket} does not exist at {endpoint} (create it first)"
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
        return (
            f"the S3 credentials are refused by {endpoint} for bucket {store.bucket} "
            f"({code}{' on ' + step if step != 'bucket' else ''})"
        )
    return f"the bucket {store.bucket} at {endpoint} refuses the probe's {step} ({code})"
