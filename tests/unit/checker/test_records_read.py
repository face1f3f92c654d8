"""records.jsonl read in two invocations, the second in a forked process (checker/records_read.py), gives
exactly what one pass gives: the records, each bad line's messages with its own line number,
where the reading stopped (past the reported messages, at a parse error) and the budget; a
child that dies leaves its half to this process."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import paths

from checker import forked, records_read

VERSION = "1.10"
GOOD = (paths.FIXTURES / "records-format-7.jsonl").read_bytes().splitlines()
RETYPED = json.dumps({**json.loads(GOOD[0]), "rank": "zero"}).encode()  # one schema message
UNKNOWN = json.dumps({**json.loads(GOOD[1]), "rank": -1, "bytes": "x"}).encode()  # two
LINES = {"good": GOOD, "retyped": [RETYPED], "unknown": [UNKNOWN], "unparsable": [b'{"rank": 1,'],
         "integral": [GOOD[2].replace(b'"rank": ', b'"rank": 1.0, "_": ', 1)]}


def never() -> bool:
    return False


@st.composite
def files(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(8, 60))
    kinds = draw(st.lists(st.sampled_from(["good"] * 6 + ["retyped", "unknown", "unparsable", "integral"]),
                          min_size=n, max_size=n))
    lines = [draw(st.sampled_from(LINES[k])) for k in kinds]
    return b"\n".join(lines) + (b"\n" if draw(st.booleans()) else b"")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files())
def test_two_halves_read_as_one_pass(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(forked, "MIN_RECORDS", 4)
    one = records_read.read(data, VERSION, never, workers=1)
    two = records_read.read(data, VERSION, never, workers=2)
    assert two == one
    assert one.messages() == two.messages()


def test_messages_name_their_lines_in_both_halves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "MIN_RECORDS", 4)
    data = b"\n".join([GOOD[0], RETYPED, *GOOD[:6], UNKNOWN, GOOD[1]]) + b"\n"
    got = records_read.read(data, VERSION, never, workers=2)
    assert len(got.records) == 8 and [b.after for b in got.bad] == [1, 7]
    assert [m.split(":")[0] for m in got.messages()] == ["line 2", "line 9", "line 9"], got.messages()
    data = b"\n".join([*GOOD] + [RETYPED] * 12) + b"\n"  # the 11th message is where reading stops
    got = records_read.read(data, VERSION, never, workers=2)
    assert len(got.messages()) == 11 and got.messages()[-1].startswith("line 19: ")


def test_the_budget_in_either_half_ends_the_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "MIN_RECORDS", 4)
    data = b"\n".join(GOOD * 40) + b"\n"  # 320 lines: the budget is looked at every 64
    parent = os.getpid()
    for late in (True, False):  # the second half's process, or this one, runs out
        got = records_read.read(data, VERSION, lambda late=late: (os.getpid() != parent) == late, workers=2)
        assert got.over_budget and len(got.records) == (191 if late else 63), len(got.records)


def test_a_child_that_dies_leaves_its_half_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "MIN_RECORDS", 4)
    data = b"\n".join(GOOD * 40) + b"\n"
    parent = os.getpid()

    def dies() -> bool:
        if os.getpid() != parent:
            os._exit(9)
        return False

    assert records_read.read(data, VERSION, dies, workers=2) == records_read.read(data, VERSION, never)


def test_no_process_to_be_had_means_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "MIN_RECORDS", 4)
    data = b"\n".join([*GOOD, RETYPED, *GOOD]) + b"\n"
    want = records_read.read(data, VERSION, never)

    def refuse() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    assert records_read.read(data, VERSION, never, workers=2) == want and len(want.records) == 16


@pytest.mark.parametrize("end", [b"", b"\n"])
def test_no_line_end_in_the_second_half_means_one_pass(monkeypatch: pytest.MonkeyPatch, end: bytes) -> None:
    """Many short lines, then one line longer than all of them (with or without its newline):
    no second half to hand over."""
    monkeypatch.setattr(forked, "MIN_RECORDS", 4)
    data = b"\n".join(GOOD * 2) + b'\n{"rank": "' + b"x" * 100_000 + b'"}' + end
    want = records_read.read(data, VERSION, never)
    assert records_read.read(data, VERSION, never, workers=2) == want
    assert len(want.records) == 16 and want.messages()[0].startswith("line 17: "), want.messages()


@pytest.mark.parametrize(("config", "bound", "basis"), [
    ({"ranks": 8, "checkpoint": {"num_writes": 10, "num_reads": 10}}, 2 * 8 * 20 + 1024,
     "(num_writes + num_reads)"),
    # a serving run (rules 1.13): its loads, whatever the checkpoint counts say
    ({"ranks": 64, "checkpoint": {"num_writes": 1, "num_reads": 1},
      "serving": {"strategy": "fanout", "loads": 100}}, 2 * 64 * 100 + 1024, "serving.loads"),
    ({"ranks": 64, "checkpoint": {"num_writes": 1, "num_reads": 1},
      "serving": {"strategy": "direct", "loads": None}}, 2 * 64 * 3 + 1024, "serving.loads"),
    ({"ranks": 8, "checkpoint": {"num_writes": -5, "num_reads": 10}}, 2 * 20_480 + 1024, "no counts"),
    ({"ranks": 8, "checkpoint": {}, "serving": "fanout"}, 2 * 20_480 + 1024, "no counts"),
])
def test_the_records_bound_follows_what_the_run_makes(config: dict, bound: int, basis: str) -> None:
    got, why = records_read.records_bound(config)
    assert got == bound and basis in why
