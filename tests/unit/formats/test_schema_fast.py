"""The fast path (mlckpt.schemas.fast_check) says "valid" exactly where the strict validator does:
tested by mutating records a real run wrote (tests/fixtures/records-format-7.jsonl: llama3_8b, 2
ranks, with host counters, device samples and request histograms) and the documents of the real
runner's bundles (run.json with its date-times, config.yaml, summary.json, system.json with its
``$ref`` to another schema)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import paths

from mlckpt import bundle, strict
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


def places(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += places(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            out += places(v, (*at, i))
    return out


def mutate(draw: st.DrawFn, doc: Any, values: st.SearchStrategy[Any]) -> Any:
    """``doc`` (a copy) with one to three values set, dropped, added, or made an integral float."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        spots = places(doc)[1:]
        if not spots:  # everything dropped (system.json has two keys): nothing left to mutate
            break
        where = draw(st.sampled_from(spots))
        parent = doc
        for step in where[:-1]:
            parent = parent[step]
        how = draw(st.sampled_from(["set", "drop", "add", "float"]))
        if how == "drop":
            del parent[where[-1]]
        elif how == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "t_wall_ns", "requests", "samples"]))] = copy.deepcopy(
                draw(values))  # a copy: the strategy's own lists and dicts must never change
        elif how == "float" and type(parent[where[-1]]) is int:
            parent[where[-1]] = float(parent[where[-1]])
        else:
            parent[where[-1]] = copy.deepcopy(draw(values))
    return doc


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    return mutate(draw, draw(st.sampled_from(RECORDS)), VALUES)  # type: ignore[no-any-return]


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
    assert FAST(rec) == strict_ok or (strict_ok and past_64_bits(rec)), list(STRICT.iter_errors(rec))[:1]
    # as the checker reads records: the decoder counts the line's integral floats, no walk
    before = strict.integral_floats()
    try:
        doc = strict.loads_json(json.dumps(rec))
    except strict.ParseError:  # an integer past 64 bits: refused before any schema
        return
    integral = strict.integral_floats() != before
    assert integral == has_integral_float(rec)
    assert FAST(doc, integral) == FAST(rec)


def past_64_bits(node: Any) -> bool:
    """An integer jsonschema-rs cannot take (the fast path then says no, the strict one decides)."""
    if isinstance(node, dict):
        return any(past_64_bits(v) for v in node.values())
    if isinstance(node, list):
        return any(past_64_bits(v) for v in node)
    return isinstance(node, int) and not isinstance(node, bool) and not -(2**63) <= node < 2**64


def test_an_integral_float_is_no_integer_on_either_path() -> None:
    assert FAST is not None
    rec = copy.deepcopy(RECORDS[0])
    assert FAST(rec, False)
    rec["rank"] = 0.0  # draft 6 on calls it an integer, our schemas do not
    assert not FAST(rec) and not FAST(rec, True) and not STRICT.is_valid(rec)
    rec["rank"] = True
    assert not FAST(rec) and not STRICT.is_valid(rec)
    rec = copy.deepcopy(RECORDS[0])
    rec["t0_ns"] = 1e9  # where the schema takes a number, an integral float is one
    rec["t1_ns"] = 2e9
    assert FAST(rec) == STRICT.is_valid(rec)


def test_date_times_are_judged_by_the_strict_validators_own_function() -> None:
    run = fast_check("run", "1.13")
    assert run is not None and fast_check("record", "1.12") is not None
    strict_run = validator("run", "1.13")
    doc = json.loads((paths.FIXTURES / "tree-v0.1.0-fdb2ed2" / "open" / "example-org" / "results" /
                      "laptop-ext4" / "llama3_8b" / "20261124T152119Z-llama3_8b-4r-f27ac00ef32418d8" /
                      "run.json").read_text())
    fast_10 = fast_check("run", doc["rules_version"])
    assert fast_10 is not None and fast_10(doc) and validator("run", doc["rules_version"]).is_valid(doc)
    for started, ok in (("2026-11-24T15:21:19Z", True), ("2026-11-24t15:21:19.5z", True),
                        ("2026-11-24T15:21:19+01:00", True), ("2026-11-24T15:21:19", False),
                        ("2026-11-24 15:21:19Z", False), ("2026-02-30T15:21:19Z", False), ("soon", False)):
        doc["started"] = started
        assert fast_10(doc) is ok and validator("run", doc["rules_version"]).is_valid(doc) is ok, started
    assert strict_run is validator("run", "1.13")


@pytest.fixture(scope="module")
def documents(honest_bundles: dict[str, Path]) -> list[tuple[str, str, Any]]:
    """(schema, rules version, document) of every document of the real runner's bundles."""
    out = []
    for key in ("llama3_8b", "async_tiers", "serving"):
        folder = honest_bundles[key]
        version = json.loads((folder / "run.json").read_text())["rules_version"]
        for name, schema in bundle.DOCUMENTS:
            out.append((schema, version, bundle.parse_document(name, (folder / name).read_bytes())))
    return out


def test_every_document_of_a_real_bundle_takes_the_fast_path(documents: list[tuple[str, str, Any]]) -> None:
    assert len(documents) == 12
    assert any(has_integral_float(doc) for _, _, doc in documents)  # 1.0 and the like, as numbers
    for schema, version, doc in documents:
        fast = fast_check(schema, version)
        assert fast is not None and fast(doc) and validator(schema, version).is_valid(doc), schema


@st.composite
def mutated_document(draw: st.DrawFn, documents: list[tuple[str, str, Any]]) -> tuple[str, str, Any]:
    schema, version, doc = draw(st.sampled_from(documents))
    times = st.sampled_from(["2026-11-28T02:33:51", "2026-11-28T02:33:51.5+00:00", "2026-13-28T02:33:51Z"])
    return schema, version, mutate(draw, doc, st.one_of(VALUES, times))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fast_judges_documents_exactly_as_the_strict_validator(documents: list[tuple[str, str, Any]],
                                                               data: st.DataObject) -> None:
    schema, version, doc = data.draw(mutated_document(documents))
    fast = fast_check(schema, version)
    assert fast is not None
    strict_ok = validator(schema, version).is_valid(doc)
    if fast(doc):
        assert strict_ok, (schema, list(validator(schema, version).iter_errors(doc))[:1])
    elif strict_ok:
        # The strict validator follows system.json's $ref into the system description's schema
        # with jsonschema's own class, which takes 2.0 as an integer; the fast path does not, and
        # leaves the verdict to the strict one (only a slower path, never another verdict).
        assert past_64_bits(doc) or (schema == "system" and has_integral_float(doc)), doc
