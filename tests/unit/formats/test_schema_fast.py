"""The checker's fast path through records (mlckpt.schemas.fast_check) says "valid" only where the
strict validator does, and for every strictly valid record without an integral float: tested by
mutating records a real run wrote (tests/fixtures/records-format-7.jsonl: llama3_8b, 2 ranks, with
host counters, device samples and request histograms)."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support import paths

from mlckpt import strict
from mlckpt.schemas import fast_check, has_integral_float, validator

RECORDS = [json.loads(line) for line in
           (paths.FIXTURES / "records-format-7.jsonl").read_text().splitlines()]
STRICT = validator("record", "1.10")
FAST = fast_check("record", "1.10")

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 2.0, -1, 1e16, 1e17, 2**63, 2**63 - 1, "", "x" * 300, "254:0", "write", "durable",
                     [], {}, [1, 2, 3], ["1", 2, 3], {"count": 1, "hist": "AAAA"}]),
    st.text(max_size=20), st.lists(st.integers(0, 10), max_size=4))


def paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            out += paths(v, (*at, i))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    rec = copy.deepcopy(draw(st.sampled_from(RECORDS)))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(rec)[1:]))
        parent = rec
        for step in where[:-1]:
            parent = parent[step]
        how = draw(st.sampled_from(["set", "drop", "add"]))
        if how == "drop":
            del parent[where[-1]]
        elif how == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "t_wall_ns", "requests", "samples"]))] = copy.deepcopy(
                draw(VALUES))  # a copy: the strategy's own lists and dicts must never change
        else:
            parent[where[-1]] = copy.deepcopy(draw(VALUES))
    return rec


def test_the_fixture_is_what_the_runner_writes_and_takes_the_fast_path() -> None:
    assert FAST is not None and len(RECORDS) == 8
    assert all(STRICT.is_valid(r) and FAST(r) for r in RECORDS)
    assert all("requests" in r for r in RECORDS)
    assert any("samples" in r.get("host_counters", {}) for r in RECORDS)


@settings(max_examples=1500, deadline=None)
@given(mutated())
def test_fast_says_valid_exactly_where_the_strict_validator_does(rec: dict[str, Any]) -> None:
    assert FAST is not None
    strict_ok = STRICT.is_valid(rec)
    if FAST(rec):
        assert strict_ok, list(STRICT.iter_errors(rec))[:1]
    elif strict_ok:
        assert "." in json.dumps(rec) and has_integral_float(rec), rec  # only those go the slow way
    # as the checker reads records: the decoder counts the line's integral floats, no walk
    before = strict.integral_floats()
    try:
        doc = strict.loads_json(json.dumps(rec))
    except strict.ParseError:  # an integer past 64 bits: refused before any schema
        return
    integral = strict.integral_floats() != before
    assert integral == has_integral_float(rec)
    assert FAST(doc, integral) == FAST(rec)


def test_what_the_fast_path_cannot_judge_goes_to_the_strict_validator() -> None:
    assert FAST is not None
    rec = copy.deepcopy(RECORDS[0])
    rec["rank"] = 0.0  # an integral float: draft 6 on calls it an integer, our schemas do not
    assert not FAST(rec) and not STRICT.is_valid(rec)
    rec["rank"] = True
    assert not FAST(rec) and not STRICT.is_valid(rec)
    assert fast_check("run", "1.10") is None  # a date-time format: the strict validator's own checker
    assert fast_check("record", "1.12") is not None
