"""Tests of mlckpt.engine: content generation and verification, timed file I/O, page cache."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mlckpt import engine
from mlckpt.engine import (
    PAGE,
    TAG_BYTES,
    FileIO,
    IOOptions,
    PageId,
    alloc,
    decode_tag,
    fill,
    read_files,
    seal,
    verify,
    write_files,
)
from mlckpt.engine import cache as engine_cache
from mlckpt.errors import ConfigError, InternalError, IOFailure

KEY = bytes(range(16))
PID = PageId(run_id=0xDEADBEEF01, rank=3, checkpoint=2, file_index=1)
MiB = 1 << 20


def filled(nbytes: int, pid: PageId = PID, key: bytes = KEY) -> np.ndarray:
    buf = alloc(nbytes)
    fill(buf, nbytes, key, pid)
    return buf


# ---------------------------------------------------------------------------------------------
# alloc


@pytest.mark.parametrize("nbytes", [1, PAGE - 1, PAGE, PAGE + 1, 10 * MiB + 123])
def test_alloc_is_page_aligned_rounded_up_and_zeroed(nbytes: int) -> None:
    buf = alloc(nbytes)
    assert buf.ctypes.data % PAGE == 0
    assert len(buf) == -(-nbytes // PAGE) * PAGE
    assert buf.dtype == np.uint8 and buf.flags.writeable and buf.flags.c_contiguous
    assert not buf.any()


def test_alloc_zero_and_negative() -> None:
    empty = alloc(0)
    assert len(empty) == 0 and empty.ctypes.data % PAGE == 0
    with pytest.raises(ValueError):
        alloc(-1)


# ---------------------------------------------------------------------------------------------
# fill


def test_fill_is_incompressible() -> None:
    buf = filled(4 * MiB)
    raw = buf.tobytes()
    assert len(zlib.compress(raw, 1)) / len(raw) > 0.99


def test_fill_pages_unique_across_checkpoints_ranks_files() -> None:
    nbytes = 64 * PAGE
    whole: set[bytes] = set()
    payloads: set[bytes] = set()  # without tags: proves the keystream itself differs
    for ckpt in (0, 1):
        for rank in (0, 1):
            for file_index in (0, 1):
                pages = filled(nbytes, PageId(7, rank, ckpt, file_index)).reshape(-1, PAGE)
                for page in pages:
                    whole.add(hashlib.blake2b(page.tobytes(), digest_size=16).digest())
                    payloads.add(hashlib.blake2b(page[TAG_BYTES:].tobytes()).digest())
    assert len(whole) == len(payloads) == 2 * 2 * 2 * 64


def test_fill_tags_decode_to_identity_and_page() -> None:
    nbytes = 40 * PAGE + 100  # partial tail of 100 bytes >= TAG_BYTES gets a tag
    buf = filled(nbytes)
    for page in (0, 1, 17, 39, 40):
        assert decode_tag(buf[page * PAGE : min((page + 1) * PAGE, nbytes)]) == (PID, page)
    raw = bytes(buf[PAGE : PAGE + TAG_BYTES])
    assert raw[:4] == b"MLCK"
    assert int.from_bytes(raw[4:6], "little") == engine.TAG_FORMAT_VERSION
    assert int.from_bytes(raw[8:16], "little") == PID.run_id
    assert int.from_bytes(raw[16:20], "little") == PID.rank
    assert int.from_bytes(raw[24:32], "little") == 1
    assert not buf[nbytes:].any()  # O_DIRECT padding is zeroed


def test_fill_short_tail_is_untagged_and_filled() -> None:
    nbytes = 2 * PAGE + TAG_BYTES - 1
    buf = filled(nbytes)
    tail = buf[2 * PAGE : nbytes]
    assert decode_tag(tail) is None and tail.any()
    assert verify(buf, nbytes, KEY, PID) is None


def test_fill_is_deterministic_and_keyed() -> None:
    a, b = filled(3 * PAGE + 77), filled(3 * PAGE + 77)
    assert np.array_equal(a, b)
    c = filled(3 * PAGE + 77, key=bytes(16))
    assert not np.array_equal(a[TAG_BYTES:PAGE], c[TAG_BYTES:PAGE])


def test_fill_prefix_matches_longer_fill() -> None:
    # verify regenerates in pieces; content must not depend on where pieces start or end
    n = 3 * MiB + 40  # tail long enough to be tagged, like the same page of the longer file
    assert np.array_equal(filled(5 * MiB)[:n], filled(n)[:n])


def test_page_id_ranges_checked() -> None:
    with pytest.raises(ConfigError):
        PageId(0, 0, 1 << 16, 0)
    with pytest.raises(ConfigError):
        PageId(-1, 0, 0, 0)


# ---------------------------------------------------------------------------------------------
# verify

VSIZE = 5 * PAGE + 77
VBUF = filled(VSIZE)
SMALL_SCRATCH = alloc(2 * PAGE)  # forces several pieces, so piece boundaries are exercised


@pytest.mark.parametrize("nbytes", [0, 1, TAG_BYTES, PAGE, PAGE + 1, 3 * MiB + 123])
def test_verify_clean_buffer(nbytes: int) -> None:
    assert verify(filled(nbytes), nbytes, KEY, PID) is None
    assert verify(filled(nbytes), nbytes, KEY, PID, alloc(3 * PAGE)) is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offset=st.integers(0, VSIZE - 1), bit=st.integers(0, 7))
@example(offset=0, bit=0)  # magic
@example(offset=6, bit=3)  # reserved field
@example(offset=2 * PAGE + 31, bit=7)  # last tag byte
@example(offset=2 * PAGE + 32, bit=0)  # first payload byte
@example(offset=2 * PAGE - 1, bit=7)  # last byte before a piece boundary of SMALL_SCRATCH
@example(offset=5 * PAGE + 20, bit=1)  # tail tag
@example(offset=VSIZE - 1, bit=5)  # last byte of the file
def test_verify_finds_any_flipped_bit(offset: int, bit: int) -> None:
    buf = VBUF.copy()
    buf[offset] ^= 1 << bit
    for scratch in (None, SMALL_SCRATCH):
        m = verify(buf, VSIZE, KEY, PID, scratch)
        assert m is not None
        assert m.offset == offset
        assert m.expected == PID and m.expected_page == offset // PAGE


def test_verify_reports_other_rank() -> None:
    other = PageId(PID.run_id, 5, PID.checkpoint, PID.file_index)
    m = verify(filled(4 * PAGE, other), 4 * PAGE, KEY, PID)
    assert m is not None and m.offset == 16  # the rank field of page 0's tag
    assert m.found == other and m.found_page == 0
    assert "another rank" in m.describe()
    assert "expected rank 3 ckpt 2 file 1 page 0, found rank 5" in m.describe()


def test_verify_reports_stale_checkpoint() -> None:
    buf = filled(4 * PAGE)
    stale = PageId(PID.run_id, PID.rank, 1, PID.file_index)
    buf[2 * PAGE : 3 * PAGE] = filled(4 * PAGE, stale)[2 * PAGE : 3 * PAGE]
    m = verify(buf, 4 * PAGE, KEY, PID)
    assert m is not None and m.offset == 2 * PAGE + 20 and m.found == stale
    assert "stale checkpoint 1 page" in m.describe()


def test_verify_reports_misplaced_page_and_payload_corruption() -> None:
    buf = filled(4 * PAGE)
    buf[PAGE : 2 * PAGE] = filled(4 * PAGE)[3 * PAGE :]
    m = verify(buf, 4 * PAGE, KEY, PID)
    assert m is not None and m.found_page == 3 and "wrong offset" in m.describe()
    buf = filled(4 * PAGE)
    buf[3 * PAGE + 1000] ^= 0xFF
    m = verify(buf, 4 * PAGE, KEY, PID)
    assert m is not None and m.offset == 3 * PAGE + 1000
    assert "payload corrupted (tag intact)" in m.describe()


def test_verify_reports_zeroed_page() -> None:
    buf = filled(4 * PAGE)
    buf[2 * PAGE : 3 * PAGE] = 0
    m = verify(buf, 4 * PAGE, KEY, PID)
    assert m is not None and m.offset == 2 * PAGE and m.found is None
    assert "not written by mlckpt" in m.describe()
    assert m.describe().startswith(f"byte {2 * PAGE} (page 2): expected rank 3")


# ---------------------------------------------------------------------------------------------
# write_files / read_files

SIZES = [PAGE, PAGE + 1, 10 * MiB + 123]


def _modes() -> list[IOOptions]:
    return [IOOptions(direct=True), IOOptions(direct=False), IOOptions(direct=False, dontcache=True)]


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("mode", ["direct", "buffered", "dontcache"])
def test_round_trip(tmp_path: Path, mode: str, threads: int) -> None:
    if mode == "dontcache" and not engine.probe_dontcache(str(tmp_path)):
        pytest.skip("RWF_DONTCACHE not supported here")
    opts = IOOptions(
        direct=mode == "direct", dontcache=mode == "dontcache", threads=threads, block_size=MiB
    )
    pids = [PageId(9, 1, 0, k) for k in range(len(SIZES))]
    out = [
        FileIO(str(tmp_path / f"f{k}"), filled(n, pids[k]), n) for k, n in enumerate(SIZES)
    ]
    results = write_files(out, opts, dir_fsync=[str(tmp_path)])
    assert [r.nbytes for r in results] == SIZES
    assert all(r.fsynced for r in results)
    assert [r.requests for r in results] == [1, 1, 11]
    for k, n in enumerate(SIZES):
        assert os.path.getsize(out[k].path) == n
    back = [FileIO(f.path, alloc(f.nbytes), f.nbytes) for f in out]
    got = read_files(back, opts)
    assert [r.nbytes for r in got] == SIZES and not any(r.fsynced for r in got)
    for k, f in enumerate(back):
        assert verify(f.buf, f.nbytes, KEY, pids[k]) is None


def test_zero_byte_file_and_no_fsync(tmp_path: Path) -> None:
    f = FileIO(str(tmp_path / "empty"), alloc(0), 0)
    (r,) = write_files([f], IOOptions(fsync=False))
    assert r.nbytes == 0 and not r.fsynced and r.requests == 0
    assert os.path.getsize(f.path) == 0
    assert read_files([f], IOOptions())[0].nbytes == 0


def test_write_refuses_existing_file_and_symlink(tmp_path: Path) -> None:
    existing = tmp_path / "ckpt"
    existing.write_bytes(b"keep me")
    with pytest.raises(IOFailure) as info:
        write_files([FileIO(str(existing), filled(PAGE), PAGE)], IOOptions())
    assert info.value.op == "open" and info.value.errno == errno.EEXIST
    assert str(existing) in str(info.value) and "refusing to overwrite" in str(info.value)
    assert existing.read_bytes() == b"keep me"

    target, link = tmp_path / "target", tmp_path / "link"
    target.write_bytes(b"target")
    link.symlink_to(target)
    with pytest.raises(IOFailure):
        write_files([FileIO(str(link), filled(PAGE), PAGE)], IOOptions(direct=False))
    assert target.read_bytes() == b"target"


@pytest.mark.parametrize("delta", [-1, -PAGE, 1])
def test_read_refuses_wrong_size(tmp_path: Path, delta: int) -> None:
    n = 3 * PAGE + 10
    path = str(tmp_path / "ckpt")
    write_files([FileIO(path, filled(n), n)], IOOptions())
    os.truncate(path, n + delta)
    with pytest.raises(IOFailure) as info:
        read_files([FileIO(path, alloc(n), n)], IOOptions())
    msg = str(info.value)
    assert info.value.op == "size" and path in msg
    assert f"expected {n} bytes, found {n + delta}" in msg


def test_read_missing_file(tmp_path: Path) -> None:
    with pytest.raises(IOFailure) as info:
        read_files([FileIO(str(tmp_path / "nope"), alloc(PAGE), PAGE)], IOOptions())
    assert info.value.op == "open" and info.value.errno == errno.ENOENT


def test_write_error_names_operation_file_and_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwritev

    def failing(fd: int, bufs: list, offset: int, flags: int = 0) -> int:
        if offset >= 2 * MiB:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, bufs, offset, flags)

    monkeypatch.setattr(os, "pwritev", failing)
    path = str(tmp_path / "full")
    # one request in flight: with four, the request at 3 MiB may fail before the one at 2 MiB on
    # a busy machine, and either is the first failure the engine reports
    with pytest.raises(IOFailure) as info:
        write_files([FileIO(path, filled(4 * MiB), 4 * MiB)], IOOptions(block_size=MiB, threads=1))
    err = info.value
    assert err.op == "write" and err.errno == errno.ENOSPC and err.offset == 2 * MiB
    assert str(err) == (
        f"write failed on {path} at offset {2 * MiB}: No space left on device (errno 28)"
    )
    with pytest.raises(IOFailure) as info:
        write_files([FileIO(path + "4", filled(4 * MiB), 4 * MiB)], IOOptions(block_size=MiB, threads=4))
    assert info.value.offset in (2 * MiB, 3 * MiB) and info.value.errno == errno.ENOSPC


def test_short_writes_and_reads_are_continued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_w, real_r = os.pwritev, os.preadv
    calls = {"w": 0, "r": 0}

    def write_invocation(fd: int, bufs: list, offset: int, flags: int = 0) -> int:
        calls["w"] += 1
        mv = memoryview(bufs[0])
        return real_w(fd, [mv[: max(1, len(mv) // 2)]], offset, flags)

    def read_invocation(fd: int, bufs: list, offset: int, flags: int = 0) -> int:
        calls["r"] += 1
        mv = memoryview(bufs[0])
        return real_r(fd, [mv[: max(1, len(mv) // 2)]], offset, flags)

    monkeypatch.setattr(os, "pwritev", write_invocation)
    monkeypatch.setattr(os, "preadv", read_invocation)
    n = 2 * PAGE + 5
    path = str(tmp_path / "short")
    opts = IOOptions(direct=False, threads=2)
    write_files([FileIO(path, filled(n), n)], opts)
    back = alloc(n)
    read_files([FileIO(path, back, n)], opts)
    assert calls["w"] > 1 and calls["r"] > 1
    assert os.path.getsize(path) == n and verify(back, n, KEY, PID) is None


def test_direct_refused_is_reported_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fcntl.fcntl

    def refuse(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refuse)
    path = tmp_path / "d"
    with pytest.raises(IOFailure) as info:
        write_files([FileIO(str(path), filled(PAGE), PAGE)], IOOptions(direct=True))
    assert info.value.op == "open_direct" and "O_DIRECT" in str(info.value)
    assert not path.exists()
    assert engine.probe_direct(str(tmp_path)) is False


def test_io_options_validated() -> None:
    with pytest.raises(ConfigError):
        IOOptions(block_size=PAGE + 1)
    with pytest.raises(ConfigError):
        IOOptions(threads=0)
    with pytest.raises(ConfigError):
        IOOptions(direct=True, dontcache=True)


def test_dir_fsync_failure(tmp_path: Path) -> None:
    f = FileIO(str(tmp_path / "x"), filled(PAGE), PAGE)
    with pytest.raises(IOFailure) as info:
        write_files([f], IOOptions(), dir_fsync=[str(tmp_path / "missing")])
    assert info.value.op == "fsync_dir"


# ---------------------------------------------------------------------------------------------
# page cache


def test_probes_on_ext4(tmp_path: Path) -> None:
    assert engine.probe_direct(str(tmp_path)) is True
    assert isinstance(engine.probe_dontcache(str(tmp_path)), bool)
    assert os.listdir(tmp_path) == []  # probe files removed


def test_evict_and_resident_bytes(tmp_path: Path) -> None:
    n = 8 * MiB + 100
    path = str(tmp_path / "cached")
    write_files([FileIO(path, filled(n), n)], IOOptions(direct=False, fsync=False))
    resident, total = engine.resident_bytes(path)
    assert total == n and resident > n // 2  # just written through the page cache
    engine.evict(path)
    resident, total = engine.resident_bytes(path)
    # DONTNEED is a hint; on ext4 here it drops everything, but allow 1% for pages another
    # process might briefly pin (documented tolerance).
    assert total == n and resident <= n // 100


def test_resident_bytes_empty_file(tmp_path: Path) -> None:
    (tmp_path / "e").write_bytes(b"")
    assert engine.resident_bytes(str(tmp_path / "e")) == (0, 0)


def test_drop_caches_reports_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never drop the real host cache in a test: other jobs share this machine.
    target = tmp_path / "drop_caches"
    target.write_bytes(b"")
    monkeypatch.setattr(engine_cache, "_DROP_CACHES", str(target))
    assert engine.drop_caches() is True and target.read_bytes() == b"3\n"
    monkeypatch.setattr(engine_cache, "_DROP_CACHES", str(tmp_path))  # a folder: open for write fails
    assert engine.drop_caches() is False


# ---------------------------------------------------------------------------------------------
# snapshot (async staging) and drain (fast tier → durable tier, verified)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("nbytes", [PAGE, engine.SNAPSHOT_CHUNK + 5 * PAGE + 7])
def test_snapshot_copies_exactly_the_state(nbytes: int, threads: int) -> None:
    src = filled(nbytes)
    dst = alloc(nbytes + PAGE)
    dst[nbytes:] = 0xAB  # beyond nbytes stays untouched
    engine.snapshot(dst, src, nbytes, threads)
    assert np.array_equal(dst[:nbytes], src[:nbytes])
    assert (dst[nbytes:] == 0xAB).all()
    assert verify(dst, nbytes, KEY, PID) is None


def test_snapshot_refuses_a_small_staging_buffer() -> None:
    with pytest.raises(InternalError):
        engine.snapshot(alloc(PAGE), filled(2 * PAGE), 2 * PAGE, 2)


def _fast_files(folder: Path, sizes: list[int], opts: IOOptions) -> list[engine.StreamFile]:
    pids = [PageId(7, 2, 3, k) for k in range(len(sizes))]
    out = [FileIO(str(folder / f"f{k}"), filled(n, pids[k]), n) for k, n in enumerate(sizes)]
    write_files(out, opts)
    return [engine.StreamFile(f.path, f.nbytes, pid) for f, pid in zip(out, pids, strict=True)]


@pytest.mark.parametrize(("src_direct", "dst_direct"), [(True, True), (False, True), (True, False),
                                                        (False, False)])
def test_drain_copies_and_verifies_every_page(tmp_path: Path, src_direct: bool, dst_direct: bool) -> None:
    (tmp_path / "fast").mkdir()
    (tmp_path / "durable").mkdir()
    sizes = [PAGE, PAGE + 1, 3 * MiB + 123, 0]
    src = IOOptions(direct=src_direct, threads=2, block_size=MiB)
    dst = IOOptions(direct=dst_direct, threads=3, block_size=MiB, pool="background")
    files = _fast_files(tmp_path / "fast", sizes, src)
    targets = [str(tmp_path / "durable" / f"f{k}") for k in range(len(sizes))]
    ring = alloc(2 * dst.threads * dst.block_size)
    res = engine.drain(files, targets, KEY, src, dst, ring, dir_fsync=[str(tmp_path / "durable")])
    assert res.mismatch is None and res.verified_bytes == sum(sizes)
    for f, t in zip(files, targets, strict=True):
        assert Path(t).read_bytes() == Path(f.path).read_bytes()  # exact size, tail included
        assert os.path.getsize(t) == f.nbytes


def test_drain_stops_at_a_corrupt_page_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "fast").mkdir()
    (tmp_path / "durable").mkdir()
    opts = IOOptions(direct=False, threads=2, block_size=MiB)
    files = _fast_files(tmp_path / "fast", [3 * MiB], opts)
    with open(files[0].path, "r+b") as fh:  # one bit, in the last block
        fh.seek(2 * MiB + 5000)
        b = fh.read(1)
        fh.seek(2 * MiB + 5000)
        fh.write(bytes([b[0] ^ 0x10]))
    target = str(tmp_path / "durable" / "f0")
    res = engine.drain(files, [target], KEY, opts, opts, alloc(4 * MiB))
    assert res.verified_bytes == 0 and res.mismatch is not None
    path, m = res.mismatch
    assert path == files[0].path
    assert (m.offset, m.expected_page) == (2 * MiB + 5000, (2 * MiB + 5000) // PAGE)
    assert "payload corrupted" in m.describe()


def test_drain_refuses_a_fast_copy_of_the_wrong_size(tmp_path: Path) -> None:
    (tmp_path / "fast").mkdir()
    opts = IOOptions(direct=False, threads=1, block_size=MiB)
    files = _fast_files(tmp_path / "fast", [MiB], opts)
    os.truncate(files[0].path, MiB - 1)
    with pytest.raises(IOFailure, match="truncated checkpoint file"):
        engine.drain(files, [str(tmp_path / "t")], KEY, opts, opts, alloc(2 * MiB))


def test_seal_binds_a_witness_nonce_into_every_page_tag() -> None:
    """A witnessed write's content: the fill's keystream, its tags restamped with the run id the
    witness's nonce gives (every page, the tail page too); verification against the sealed id
    passes, against the unsealed one names the first page."""
    from mlckpt.witness.protocol import tag_run_id

    key = bytes(range(16))
    nbytes = 5 * PAGE + 100  # a tail page long enough for a tag
    pid = PageId(0x1234, 3, 2, 1)
    buf = alloc(nbytes)
    fill(buf, nbytes, key, pid)
    sealed = tag_run_id(pid.run_id, "0f" * 16)
    assert sealed == 0x1234 ^ 0x0F0F0F0F0F0F0F0F
    seal(buf, nbytes, sealed)
    want = alloc(nbytes)
    fill(want, nbytes, key, PageId(sealed, 3, 2, 1))
    assert np.array_equal(buf[:nbytes], want[:nbytes])
    assert verify(buf, nbytes, key, PageId(sealed, 3, 2, 1)) is None
    bad = verify(buf, nbytes, key, pid)
    assert bad is not None and bad.offset == 8 and "data from another run" in bad.describe()
    assert decode_tag(buf[5 * PAGE:])[0].run_id == sealed  # type: ignore[index]
