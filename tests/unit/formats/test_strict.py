"""The strict JSON reader's shortcut: a line whose text cannot hold what the shape walk refuses
skips the walk, and at the boundaries it is refused or accepted exactly as with the walk."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt import strict


def nested(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


@pytest.mark.parametrize("levels", [62, 63, 64, 65, 80])
def test_nesting_is_judged_the_same_with_and_without_the_walk(levels: int) -> None:
    """check_shape refuses a scalar deeper than MAX_DEPTH (64) levels: 63 lists hold one at 64."""
    text = nested(levels)
    walked = True
    try:
        strict.check_shape(strict._decoder.decode(text))
    except strict.ParseError:
        walked = False
    try:
        strict.loads_json(text)
        read = True
    except strict.ParseError as exc:
        assert "nested deeper than 64 levels" in str(exc)
        read = False
    assert read == walked == (levels < strict.MAX_DEPTH)


@pytest.mark.parametrize(("text", "why"), [
    ('{"a": "x\\u0000y"}', "NUL"),
    ('{"a": "\\ud800"}', "unpaired surrogate"),
    ('{"\\u0000": 1}', "NUL"),
    ("[" + ",".join(["1"] * 1001) + "]", "more than 1000 values"),
])
def test_what_only_the_walk_sees_is_still_refused(text: str, why: str) -> None:
    with pytest.raises(strict.ParseError, match=why):
        strict.loads_json(text, max_nodes=1000)


def test_a_plain_record_line_skips_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    walks: list[int] = []
    real = strict.check_shape
    monkeypatch.setattr(strict, "check_shape", lambda doc, **kw: (walks.append(1), real(doc, **kw)))
    strict.loads_json('{"op": "write", "t0_ns": 123, "wall_start": 1764223456.25, "stages": [[1, 2]]}')
    assert walks == []
    strict.loads_json('{"host": "caf\\u00e9"}')  # an escape: walked
    assert walks == [1]


@pytest.mark.parametrize(("text", "integral"), [
    ('{"a": 2.0}', True), ('{"a": 1e3}', True), ('{"a": [1, {"b": -0.0}]}', True), ('{"a": 2.5}', False),
    ('{"a": 2, "b": "2.0"}', False), ('{"a": 1.5e-05}', False), ('{"a": 12345678901234567.0}', True),
])
def test_the_decoder_counts_the_integral_floats_it_reads(text: str, integral: bool) -> None:
    before = strict.integral_floats()
    strict.loads_json(text)
    assert (strict.integral_floats() != before) is integral


@settings(max_examples=400, deadline=None)
@given(st.integers(-(2**70), 2**70), st.sampled_from(['{"n": %s}', '{"a": [1, %s, 2.5]}', '{"s": "%s"}']))
def test_record_lines_read_integers_exactly_or_refuse_them_past_64_bits(n: int, shape: str) -> None:
    """A line without 19 digits in a row is read by the C scanner's own integers, any other by the
    checking hook: either way every integer outside the signed 64-bit range is refused, and every
    other read exactly."""
    line = (shape % n).encode()
    inside = strict.MIN_INT <= n <= strict.MAX_INT or shape.startswith('{"s"')
    try:
        [(_, doc)] = list(strict.iter_jsonl(line))
    except strict.ParseError as exc:
        assert not inside and "signed 64-bit range" in str(exc)
        return
    assert inside and doc == json.loads(line)
