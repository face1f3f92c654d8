"""Byte ranges of files read into place (mlckpt/engine/ranges.py): exactly the file's bytes,
buffered and with O_DIRECT where the folder takes it; what cannot be read as asked is refused
before a byte is read."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt import engine
from mlckpt.engine.ranges import RangeIO, read_ranges
from mlckpt.errors import InternalError, IOFailure

PAGE = engine.PAGE
KEY = bytes(range(engine.KEY_BYTES))


def written(folder: Path, sizes: list[int]) -> list[tuple[str, bytes]]:
    out = []
    for i, size in enumerate(sizes):
        buf = engine.alloc(-(-size // PAGE) * PAGE or PAGE)
        engine.fill(buf, size, KEY, engine.PageId(1, 0, 0, i))
        path = folder / f"f{i}"
        path.write_bytes(bytes(buf[:size]))
        out.append((str(path), bytes(buf[:size])))
    return out


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40_000), st.integers(0, 40_000)),
                     max_size=6), threads=st.integers(1, 3))
def test_buffered_ranges_hold_exactly_the_files_bytes(tmp_path_factory: pytest.TempPathFactory,
                                                     cuts: list[tuple[int, int, int]], threads: int) -> None:
    files = written(tmp_path_factory.mktemp("r"), [40_000, 8192, 12_345])
    ranges = []
    for k, a, b in cuts:
        path, data = files[k]
        lo, hi = sorted((min(a, len(data)), min(b, len(data))))
        ranges.append(RangeIO(path, len(data), lo, engine.alloc(max(PAGE, hi - lo)), hi - lo))
    opts = engine.IOOptions(direct=False, threads=threads, block_size=PAGE)
    assert read_ranges(ranges, opts) == sum(r.nbytes for r in ranges)
    for (k, _, _), r in zip(cuts, ranges, strict=True):
        assert bytes(r.buf[: r.nbytes]) == files[k][1][r.offset: r.offset + r.nbytes]


def test_direct_ranges_of_whole_pages_and_a_file_tail(tmp_path: Path) -> None:
    if not engine.probe_direct(str(tmp_path)):
        pytest.skip("this folder's filesystem does not take O_DIRECT")
    [(path, data)] = written(tmp_path, [5 * PAGE + 100])
    head, tail = engine.alloc(2 * PAGE), engine.alloc(4 * PAGE)
    read_ranges([RangeIO(path, len(data), PAGE, head, 2 * PAGE),
                 RangeIO(path, len(data), 3 * PAGE, tail, 2 * PAGE + 100)],
                engine.IOOptions(direct=True, threads=2, block_size=PAGE))
    assert bytes(head) == data[PAGE: 3 * PAGE] and bytes(tail[: 2 * PAGE + 100]) == data[3 * PAGE:]


@pytest.mark.parametrize(("offset", "nbytes", "says"), [
    (PAGE + 1, PAGE, "O_DIRECT reads whole pages"), (0, PAGE + 1, "O_DIRECT reads whole pages"),
    (4 * PAGE, 2 * PAGE, "outside its")])
def test_what_cannot_be_read_as_asked_is_refused_first(tmp_path: Path, offset: int, nbytes: int,
                                                       says: str) -> None:
    [(path, data)] = written(tmp_path, [5 * PAGE])
    buf = engine.alloc(4 * PAGE)
    with pytest.raises(InternalError, match=says):
        read_ranges([RangeIO(path, len(data), offset, buf, nbytes)], engine.IOOptions(direct=True))
    assert not buf.any()


def test_a_file_of_another_size_is_refused_by_its_size(tmp_path: Path) -> None:
    [(path, _)] = written(tmp_path, [3 * PAGE])
    with pytest.raises(IOFailure, match="size check failed"):
        read_ranges([RangeIO(path, 4 * PAGE, 0, engine.alloc(PAGE), PAGE)], engine.IOOptions(direct=False))
