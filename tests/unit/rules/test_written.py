"""What a rules version makes the runner write (mlckpt/written.py), against the schemas that judge it."""

from __future__ import annotations

import pytest

from mlckpt import formats
from mlckpt.rules import known_versions
from mlckpt.schemas import validator
from mlckpt.written import FEATURES, Written

FORMATS = {"run": formats.RUN, "records": formats.RECORDS, "summary": formats.SUMMARY}


@pytest.mark.parametrize("version", known_versions())
def test_run_json_gets_a_key_exactly_when_its_rules_schema_knows_it(version: str) -> None:
    written = Written.of(version)
    known = set(validator("run", version).schema["properties"])
    for feature, (document, _, _) in FEATURES.items():
        if document == "run":
            assert (feature in known) == written.has(feature), (feature, version)


@pytest.mark.parametrize("version", known_versions())
def test_the_formats_are_the_ones_the_schemas_pin(version: str) -> None:
    written = Written.of(version)
    run = validator("run", version).schema["properties"]
    assert written.run == run["run_format"]["const"]
    assert written.records == run["records_format"]["const"]
    assert written.summary == validator("summary", version).schema["properties"]["summary_format"]["const"]


def test_each_feature_arrived_with_a_version_in_its_formats_history() -> None:
    for feature, (document, since, what) in FEATURES.items():
        assert since in {v for v, _ in FORMATS[document].history}, feature
        assert what


def test_older_rules_write_less() -> None:
    old, new = Written.of("1.2"), Written.of("1.22")
    assert [f for f in FEATURES if old.has(f)] == []
    assert all(new.has(f) for f in FEATURES)
    assert Written.of("1.8").has("calibration") and not Written.of("1.8").has("content_commitment")
    assert Written.of("1.10").has("requests") and not Written.of("1.10").has("framework")
    assert Written.of("1.12").has("framework") and not Written.of("1.12").has("serving")
    assert Written.of("1.13").has("serving") and not Written.of("1.13").has("load_evidence")
    assert Written.of("1.15").has("load_evidence") and not Written.of("1.15").has("witnessed_loads")
    assert Written.of("1.18").has("witnessed_loads") and not Written.of("1.18").has("tensors")
    assert Written.of("1.19").has("tensors") and not Written.of("1.19").has("barrier_start")
    assert Written.of("1.21").has("resume") and not Written.of("1.21").has("resume_writer")
    with pytest.raises(KeyError):
        new.has("no-such-feature")
