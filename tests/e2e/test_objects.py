"""Object storage without MPI: s3:// locations (pure), the configuration's refusals, the object
engine against a real S3 store (``s3_store``: Swift's all-in-one on the loopback address), and the
sweep that removes a failed run's objects and nothing else."""

from __future__ import annotations

import os
import signal
import socket
import string
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.cli import S3_BUCKET, s3_client

from mlckpt import engine
from mlckpt.engine import alloc, fill
from mlckpt.engine import buckets as bk
from mlckpt.engine import objects as ob
from mlckpt.engine.content import PageId
from mlckpt.errors import ConfigError, IOFailure
from mlckpt.locations import ObjectPath, is_object_url, parse_object_url, s3_settings
from mlckpt.rules.checks.physics import remote_store
from mlckpt.run.storage import backends, kinds, objectstore

# ---------------------------------------------------------------------------------------------
# locations (pure)

BUCKET = st.from_regex(r"\A[a-z0-9][a-z0-9-]{1,20}[a-z0-9]\Z")
SEGMENT = st.text(string.ascii_letters + string.digits + "!_.*'()+,=@-", min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)


@given(BUCKET, st.lists(SEGMENT, max_size=4))
def test_a_url_round_trips(bucket: str, segments: list[str]) -> None:
    url = f"s3://{bucket}" + "".join(f"/{s}" for s in segments)
    loc = parse_object_url(url)
    assert (loc.bucket, loc.key) == (bucket, "/".join(segments))
    assert str(loc) == url and is_object_url(url)
    child = loc / "ckpt-0001" / "model.pt"
    assert str(child) == f"{url}/ckpt-0001/model.pt"
    assert child.key.startswith(loc.prefix) and child.name == "model.pt"


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("s3://A-bucket/x", "'A-bucket' is not a valid S3 bucket name"),
        ("s3://ab/x", "'ab' is not a valid S3 bucket name"),
        ("s3://bucket..x/y", "is not a valid S3 bucket name"),
        ("s3://bucket/a//b", "the key prefix segment '' is not allowed"),
        ("s3://bucket/a/../b", "the key prefix segment '..' is not allowed"),
        ("s3://bucket/a b", "the key prefix segment 'a b' is not allowed"),
        ("/mnt/ckpt", "is not an s3://bucket/prefix URL"),
    ],
)
def test_a_malformed_url_is_a_config_error(url: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_object_url(url)
    assert exc.value.key == "checkpoint.folder" and fragment in str(exc.value)


def test_a_path_segment_is_one_segment() -> None:
    for bad in ("a/b", "", ".", ".."):
        with pytest.raises(ValueError):
            ObjectPath("bucket", "p") / bad
    assert str(ObjectPath("bucket") / "x") == "s3://bucket/x" and ObjectPath("bucket").prefix == ""


def test_settings_fill_nulls_with_the_defaults() -> None:
    assert s3_settings({}) == {
        "endpoint": None,
        "region": None,
        "part_size": 16 << 20,
        "inflight": 8,
        "addressing_style": "path",
        "verify_tls": True,
    }
    got = s3_settings({"storage": {"s3": {"part_size": 8 << 20, "inflight": None, "verify_tls": False}}})
    assert (got["part_size"], got["inflight"], got["verify_tls"]) == (8 << 20, 8, False)


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"part_size": 1 << 20}, "storage.s3.part_size"),
        ({"inflight": 0}, "storage.s3.inflight"),
        ({"addressing_style": "dns"}, "storage.s3.addressing_style"),
    ],
)
def test_engine_options_refuse_what_s3_cannot_do(kw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        ob.S3Options(**kw)
    assert exc.value.key == key


def test_host_physics_holds_a_remote_store_to_the_links_not_a_loopback_one() -> None:
    def facts(source: str) -> dict[str, Any]:
        return {"filesystem": {"fs_type": "s3", "source": source}}

    assert remote_store(facts("s3.example.com")) and remote_store(facts("10.0.0.9:9000"))
    assert not remote_store(facts("127.0.0.1:8080")) and not remote_store(facts("localhost:80"))
    assert not remote_store(facts("[::1]:9000"))
    assert not remote_store({"filesystem": {"fs_type": "ext4", "source": "/dev/vda"}})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["checkpoint.folder=s3://Bad_Bucket/x"],
            "checkpoint.folder: 'Bad_Bucket' is not a valid S3 bucket name",
        ),
        (
            ["checkpoint.folder=s3://ckpt/x", 'rules_version="1.5"'],
            "checkpoint.folder: object storage (s3://ckpt/x) needs rules_version 1.6 or later (got 1.5)",
        ),
        (
            ["checkpoint.folder=s3://ckpt/x", "storage.s3.part_size=1000"],
            "storage.s3.part_size: 1000 is less than the minimum of 5242880",
        ),
        (
            ["checkpoint.folder=s3://ckpt/x", "division=open", "checkpoint.tiers.fast=/tmp/f"],
            "[OBJECT-MODES] a run on object storage is one tier",
        ),
    ],
)
def test_the_command_line_refuses_bad_object_settings(
    run_cli: Callable[..., subprocess.CompletedProcess[str]], args: list[str], message: str
) -> None:
    for cmd in ("plan", "run"):
        proc = run_cli(cmd, *args)
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith(f"mlckpt: error: {message}"), line


# ---------------------------------------------------------------------------------------------
# the engine against a real store


@pytest.fixture
def store(s3_store: Any, monkeypatch: pytest.MonkeyPatch) -> ob.Store:
    for k, v in s3_store.env.items():
        monkeypatch.setenv(k, v)
    return ob.Store(S3_BUCKET, ob.S3Options(part_size=5 << 20, inflight=3))


def content(nbytes: int, rank: int, key: bytes = b"k" * 16) -> np.ndarray:
    buf = alloc(max(4096, -(-nbytes // 4096) * 4096))
    fill(buf, nbytes, key, PageId(7, rank, 1, 0))
    return buf


def test_objects_round_trip_through_parts_single_puts_and_empty_objects(store: ob.Store) -> None:
    root = ObjectPath(S3_BUCKET, f"eng-{uuid.uuid4().hex[:8]}")
    sizes = [(12 << 20) + 12345, 3 << 20, 0, 5 << 20]  # three parts, one PUT, empty, exactly one part
    bufs = [content(n, i) for i, n in enumerate(sizes)]
    objs = [ob.ObjectIO(root / f"f{i}", b, n) for i, (b, n) in enumerate(zip(bufs, sizes, strict=True))]
    res = ob.put_objects(store, objs)
    assert [(r.requests, r.fsynced, r.nbytes) for r in res] == [
        (3, True, sizes[0]),
        (1, True, sizes[1]),
        (1, True, 0),
        (1, True, 5 << 20),
    ]
    assert bk.sizes(store, [o.where for o in objs] + [root / "missing"]) == {
        **{str(o.where): n for o, n in zip(objs, sizes, strict=True)},
        f"{root}/missing": None,
    }
    back = [alloc(len(b)) for b in bufs]
    res = ob.get_objects(store, [ob.ObjectIO(o.where, b, o.nbytes) for o, b in zip(objs, back, strict=True)])
    assert [r.requests for r in res] == [3, 1, 1, 1]
    for a, b, n in zip(bufs, back, sizes, strict=True):
        assert np.array_equal(a[:n], b[:n])
    assert bk.delete_objects(store, [o.where for o in objs] + [root / "missing"]) == (5, [])
    assert s3_client(dict(os.environ)).list_objects_v2(Bucket=S3_BUCKET, Prefix=root.prefix)["KeyCount"] == 0


def test_a_read_names_an_object_of_the_wrong_size_or_a_missing_one(store: ob.Store) -> None:
    root = ObjectPath(S3_BUCKET, f"eng-{uuid.uuid4().hex[:8]}")
    buf = content(6 << 20, 0)
    ob.put_objects(store, [ob.ObjectIO(root / "short", buf, 6 << 20)])
    try:
        with pytest.raises(IOFailure) as exc:
            ob.get_objects(store, [ob.ObjectIO(root / "short", alloc(8 << 20), 7 << 20)])
        assert str(exc.value) == (
            f"size check failed on {root}/short: expected {7 << 20} bytes, found "
            f"{6 << 20} (truncated checkpoint object)"
        )
        assert (exc.value.op, exc.value.path) == ("size", f"{root}/short")
        with pytest.raises(IOFailure) as exc:
            ob.get_objects(store, [ob.ObjectIO(root / "gone", alloc(4096), 100)])
        assert str(exc.value).startswith(f"read failed on {root}/gone at offset 0: NoSuchKey")
    finally:
        bk.delete_objects(store, [root / "short"])


def test_the_sweep_removes_the_run_s_objects_and_uploads_and_nothing_else(
    store: ob.Store, s3_store: Any
) -> None:
    c = s3_client(s3_store.env)
    base = f"sweep-{uuid.uuid4().hex[:8]}"
    run, other = f"{base}/run-a", f"{base}/run-ab"  # a sibling whose name starts like the run's
    for key in (f"{run}/ckpt-0001/f0", f"{run}/ckpt-0002/f1", f"{other}/ckpt-0001/f0", f"{run}/ckpt-0001/x"):
        c.put_object(Bucket=S3_BUCKET, Key=key, Body=b"data")
    mine = c.create_multipart_upload(Bucket=S3_BUCKET, Key=f"{run}/ckpt-0002/f0")["UploadId"]
    theirs = c.create_multipart_upload(Bucket=S3_BUCKET, Key=f"{other}/ckpt-0001/f1")["UploadId"]
    settings = {**s3_settings({}), "part_size": 5 << 20}
    note = kinds.sweep(f"s3://{S3_BUCKET}/{run}", ["f0", "f1"], 2, s3=settings, keep=False)
    assert note == "removed 4 checkpoint objects of this run and aborted 1 unfinished upload"
    left = sorted(o["Key"] for o in c.list_objects_v2(Bucket=S3_BUCKET, Prefix=base)["Contents"])
    assert left == [f"{run}/ckpt-0001/x", f"{other}/ckpt-0001/f0"]  # not planned / not this run's
    uploads = [
        u["UploadId"] for u in c.list_multipart_uploads(Bucket=S3_BUCKET, Prefix=base).get("Uploads", [])
    ]
    assert uploads == [theirs] and mine not in uploads
    kept = objectstore.sweep(f"s3://{S3_BUCKET}/{other}", ["f0"], 1, settings, keep=True)
    assert kept == f"checkpoint.keep=true: checkpoint objects kept under s3://{S3_BUCKET}/{other}"
    c.abort_multipart_upload(Bucket=S3_BUCKET, Key=f"{other}/ckpt-0001/f1", UploadId=theirs)
    for key in left:
        c.delete_object(Bucket=S3_BUCKET, Key=key)


def test_a_sweep_that_cannot_reach_the_store_says_so() -> None:
    settings = {**s3_settings({}), "endpoint": "http://127.0.0.1:9"}
    note = objectstore.sweep("s3://bucket/run", ["f0"], 1, settings, keep=False)
    assert note.startswith("could not remove this run's objects under s3://bucket/run: ")


def test_the_probe_leaves_nothing_and_names_each_problem(
    store: ob.Store, s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = ObjectPath(S3_BUCKET, f"probe-{uuid.uuid4().hex[:8]}") / "p"
    assert bk.probe(store, where) is None
    assert s3_client(s3_store.env).list_objects_v2(Bucket=S3_BUCKET, Prefix=where.key)["KeyCount"] == 0
    endpoint = s3_store.endpoint
    missing = ob.Store("no-such-bucket-x", ob.S3Options())
    assert (
        bk.probe(missing, where)
        == f"the bucket no-such-bucket-x does not exist at {endpoint} (create it first)"
    )
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    refused = bk.probe(ob.Store(S3_BUCKET, ob.S3Options()), where)
    assert refused is not None and refused.startswith(
        f"the S3 credentials are refused by {endpoint} for bucket"
    )
    far = ob.Store(S3_BUCKET, ob.S3Options(endpoint="http://127.0.0.1:9", timeout_s=5))
    assert str(bk.probe(far, where)).startswith("the S3 endpoint http://127.0.0.1:9 cannot be reached")


def test_the_storage_block_names_the_store_without_credentials(store: ob.Store, tmp_path: Path) -> None:
    block = objectstore.Objects(parse_object_url(f"s3://{S3_BUCKET}/a/b"), store).describe()
    assert block["kind"] == "s3" and (block["bucket"], block["prefix"]) == (S3_BUCKET, "a/b")
    assert block["endpoint_host"].startswith("127.0.0.1:") and block["client"].startswith("botocore ")
    assert "testing" not in str(block) and "tester" not in str(block)
    assert backends.Files(tmp_path).describe() == {"kind": "posix"}


@pytest.mark.parametrize("kind", ["posix", "s3"])
def test_each_storage_keeps_the_one_interface_the_phases_use(kind: str, store: ob.Store,
                                                             tmp_path: Path) -> None:
    """The same sequence through Files and Objects: put two files under a checkpoint's folder,
    read them whole and by spans, count and drop what the page cache holds, name and remove
    them.  What differs by nature is a property (``cached``, ``folders``), never a branch."""
    storage: backends.Storage
    if kind == "posix":
        storage = backends.Files(tmp_path / "run")
        (tmp_path / "run" / "ckpt-0001").mkdir(parents=True)
    else:
        url = f"s3://{S3_BUCKET}/iface-{uuid.uuid4().hex[:8]}"
        storage = objectstore.Objects(parse_object_url(url), store)
    assert (storage.kind, storage.cached, storage.folders) == (
        ("posix", True, True) if kind == "posix" else ("s3", False, False))
    ckpt = storage.below("ckpt-0001")
    assert ckpt.at("f0") == storage.at("ckpt-0001/f0") and ckpt.at().endswith("/ckpt-0001")
    sizes = [3 * 4096 + 100, 6 << 20]  # a partial last page; more than one part on the store
    written = [content(n, rank=i) for i, n in enumerate(sizes)]
    opts = engine.IOOptions(direct=False, threads=2, block_size=1 << 20, fsync=True)
    ckpt.put([backends.Piece(f"f{i}", b, n) for i, (b, n) in enumerate(zip(written, sizes, strict=True))],
             opts)
    back = [alloc(b.size) for b in written]
    ckpt.get([backends.Piece(f"f{i}", b, n) for i, (b, n) in enumerate(zip(back, sizes, strict=True))], opts)
    for i, n in enumerate(sizes):
        assert bytes(back[i][:n]) == bytes(written[i][:n])
    span = alloc(8192)
    assert ckpt.get_spans([backends.Span("f1", sizes[1], 4096, span, 8192)], opts) == 8192
    assert bytes(span) == bytes(written[1][4096:12288])
    held = ckpt.resident(["f0", "f1"])
    left = ckpt.evict(["f0", "f1"])
    if kind == "posix":  # just read: cached, then dropped (a quiet test disk drops all of it)
        assert held > 0 and left < held
    else:
        assert held == left == 0
    assert ckpt.remove([ckpt.at("f0"), ckpt.at("f1"), ckpt.at("never-made")]) == []
    with pytest.raises(IOFailure):
        ckpt.get([backends.Piece("f0", back[0], sizes[0])], opts)


def test_the_local_store_command_starts_a_store_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """README's one command for a local try: it prints the AWS_* lines, answers S3, and stops
    (every Swift process gone) on Ctrl-C."""
    from lab import s3local

    if s3local.unavailable():
        pytest.skip(str(s3local.unavailable()))
    proc = subprocess.Popen(
        [sys.executable, str(Path(s3local.__file__)), str(tmp_path / "store"), "--bucket", "by-hand"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [proc.stdout.readline().strip() for _ in range(5)]  # type: ignore[union-attr]
        env = dict(ln.removeprefix("export ").split("=", 1) for ln in lines[:4])
        assert env["AWS_ACCESS_KEY_ID"] == "test:tester" and lines[4].startswith(
            "# an S3 store on http://127.0.0.1:"
        )
        c = s3_client(env)
        assert [b["Name"] for b in c.list_buckets()["Buckets"]] == ["by-hand"]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0  # Swift stops its servers one by one: slow on a busy machine
    port = env["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
