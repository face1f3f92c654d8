"""The strict JSON reader's shortcut: a line whose text cannot hold what the shape walk refuses
skips the walk, and at the boundaries it is refused or accepted exactly as with the walk."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt import fastjson, strict


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


# ------------------------------------------------------------------------------ the record fast path
def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (1 is not 1.0, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)  # type: ignore[index]
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    return repr(a) == repr(b)


def fast_line(line: bytes) -> object:
    return fastjson.fast_line(line, max_nodes=strict.LINE_NODES, max_depth=strict.MAX_DEPTH)


def _strictly(line: bytes) -> tuple[object, int] | str:
    """What the strict decoder alone makes of ``line`` (and how many integral floats it counted),
    or why it refuses it."""
    before = strict.integral_floats()
    try:
        doc = strict.loads_json(strict.decode_utf8(line), max_nodes=strict.LINE_NODES)
    except strict.ParseError as exc:
        return str(exc)
    return doc, strict.integral_floats() - before


_space = st.sampled_from(["", " ", "  ", "\t"])
_numbers = st.one_of(
    st.integers(-(2**66), 2**66).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["2.0", "1e3", "1E400", "-1e999", "-0.0", "0.1e-400", "12345678901234567.0", "1.5e-05",
                     "1795783814.1062002", "0", "-0", "01", "1.", ".5", "NaN", "Infinity", "true", "false",
                     "null"]),
)
_texts = st.text(st.sampled_from('ab:,{}[] .0e'), max_size=6).map(lambda s: f'"{s}"') | st.sampled_from(
    ['"caf\\u00e9"', '"a\\"b"', '"x\\u0000"', '"é"', '"\x01"'])


def _value(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    keys = st.sampled_from(['"a"', '"b"', '":"', '"a:b"', '""', '"a"'])
    pair = st.tuples(keys, _space, _space, children).map(lambda p: f"{p[0]}{p[1]}:{p[2]}{p[3]}")
    return (st.lists(pair, max_size=4).map(lambda ps: "{" + ",".join(ps) + "}")
            | st.lists(children, max_size=4).map(lambda vs: "[" + ", ".join(vs) + "]"))


_documents = st.recursive(_numbers | _texts, _value, max_leaves=12)


@settings(max_examples=1500, deadline=None)
@given(_documents)
def test_a_line_the_fast_path_takes_reads_exactly_as_the_strict_decoder_reads_it(text: str) -> None:
    """Duplicate keys (with and without spaces before the colon), colons in strings, integral and
    non-finite floats, integers past 64 bits, escapes, bad literals: whatever msgspec accepts, it
    reads exactly as the strict decoder does, and whatever the strict decoder counts or refuses never
    takes the fast path."""
    line = text.encode()
    fast = fast_line(line)
    if fast is None:
        return
    want = _strictly(line)
    assert not isinstance(want, str), f"the fast path took {text!r}, which the strict decoder refuses: {want}"
    doc, integral = want
    assert integral == 0 and _same(fast, doc)


@pytest.mark.parametrize("text", [
    '{"a" :1,"a":2}', '{"a":1, "a":2}', '{"a":":x","a":"y"}', '{"a":{"b":1,"b":1}}', '[{"":1,"":2}]',
    '{"n": 2.0}', '{"n": [1e3]}', '{"n": -0.0}', '{"n": 1e999}', '{"n": 18446744073709551615}',
])
def test_what_the_fast_path_leaves_to_the_strict_decoder(text: str) -> None:
    assert fast_line(text.encode()) is None
    got = _strictly(text.encode())
    assert isinstance(got, str) or got[1] > 0  # refused, or an integral float counted


def test_a_real_record_line_takes_the_fast_path_and_keeps_its_floats(monkeypatch: pytest.MonkeyPatch) -> None:
    line = (b'{"bytes": 221184, "host": "vm", "op": "write", "rank": 3, "requests": {"count": 7, "hist": '
            b'"HISTFAAAADJ4nJNpmSzMwMAgwAABTFCakYGB2c1gxwIG+w8QgWY1pn5GJk6mciZ2JkcmXSYArYcGlg=="}, '
            b'"stages": [{"t0_ns": 3898404283007, "tier": "durable"}], "wall_start": 1795783814.1062002}\n')
    monkeypatch.setattr(strict, "loads_json", lambda *a, **k: pytest.fail("the strict decoder was called"))
    [(_, doc)] = list(strict.iter_jsonl(line * 1))
    assert _same(doc, json.loads(line)) and doc["wall_start"] == 1795783814.1062002
