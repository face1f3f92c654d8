"""Every persisted format is defined once (mlckpt/formats.py), with its history; what the runner
writes and the released schemas agree with it; the record TypedDicts match real records; a
released rules folder never changes."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import get_type_hints

import pytest
from support import paths

from mlckpt import formats
from mlckpt.records import ReadRecord, StageRecord, WriteRecord
from mlckpt.resources import rules_dir
from mlckpt.rules.engine import DEFAULT_RULES_VERSION
from mlckpt.schemas import schema_folder

FIXTURE = paths.FIXTURES / "tree-v0.1.0-fdb2ed2"

# sha256 over (relative path NUL content) of every file of each released rules folder, sorted.
# A released folder never changes: whatever must change goes into a new version folder.
RELEASED_RULES = {
    "1.0": "1e0d5492d0de07b9b1aedbc240db9e703c5cc66393abb033c6dc539a0025f2bb",
    "1.1": "454689ac70a2500d534fe3de9c45bf85802f596ad7e459b83ffc88c43ff76694",
    "1.2": "f8beab0301662afe7ca104cb97bba35b3216c715a8892a686884b843ceaec8a8",
    "1.3": "6a15d88197117b2aecc49235e41480b8ea8b2d4190c141cec4923ddfd42f5c3f",
    "1.4": "9e787ba6446185da35135e2a41be62071a847957b4ecf00d7ee00aa573c2d9de",
    "1.5": "76fe0f38daa883d437bbf6d229ee83883f76d02ca03cd902c2391aba975bc55f",
    "1.6": "b091441c54ee38eaae7eab28db4260333441eb50189c466179075249b7599c05",
    "1.7": "91b9877d66098a60d75640d45de07a8f7703b4c9eee30554ed842ca06dc875f4",
    "1.8": "1d4f918acea3753fff9e85f3e185379aedf035defa88468116d32bf9192b87e2",
    "1.9": "b0a73127bccac7ef85f6331d58ebbb7dbd698d539c07d8d5dc4d526b3531eb6d",
    "1.10": "820438410128ffecdeaa49ea0c47abf49577821e8d4d8e6758f90cafb4b1f46e",
    "1.11": "48990b2a042d15a54397d14469a6cf4feca1b3b6ed55746cbcf47818564de493",
    "1.12": "9ab5457f50f39d88ec6b2b62e92df946794985398aba58254ec5917b93fd53fe",
    "1.13": "e4b5a2654de0abd777e709053f794559bf45ca3d81c28c6bbb54bb4bd5a8097a",
    "1.14": "f70514c82c2387f47810b4ae82f61d6cc25eaef49b98a071944b84992eff05b7",
    "1.15": "448734cfd8b96a32f7ba696ac13310be336131f49584dacf87678394188b0046",
    "1.16": "faff94d7bd1f08e6e27f57f528ed87cf75c69a8084cbc4dfddc94831a26dece1",
    "1.17": "581ebcf14c7c395a78b50b5329777b12367178acd1c19fd0a11ad928c6bded48",
    "1.18": "706fc7e565cc29730d1211b90294c54179cc72a1ca30433c9fe9a507e4fb8eb5",
    "1.19": "968ad7f2e685bf2d555046df95c44a15f9c8672cc6eb3e5849aabb16db5e0b9e",
    "1.20": "864d4798cbcb522e0e5031e24936d7cee46c6f8f86ccbd97ceb480281175b145",
    "1.21": "a8ddf54ebb9a237393071b599fbe734a4a29456f29e430e78276293302962b7b",
    "1.22": "9e300412a1371ea273af2c8d1859289009973765624dc390179476621920a1cf",
    "mlps-v3.0": "4bb01ebeb340f687cf6a601214b0d95e77e820d10216f4c813bd9edb228b736c",
    "mlps-v3.0r2": "c240ee1376d9231277259d7d12164f634605e08f1837f9c6689bf32b480cbb9c",
    "mlps-v3.0r3": "775fc3280f5ad902e79ad620dcde79dc3124ac97dbca1aa95b87b512efb7da45",
    "mlps-v3.0r4": "0df2aa2bcb53b084fe588e5ed52f2adbb48ecdf4639a20634bd9be5c76a34be6",
    "mlps-v3.0r5": "e072703744fd523ef0876e5f7acddcb04b984354ab741b7caf63deb9b7fbdc3a",
}


def folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("version", sorted(RELEASED_RULES))
def test_released_rules_never_change(version: str) -> None:
    assert folder_digest(rules_dir() / version) == RELEASED_RULES[version]


def test_every_rules_folder_is_pinned() -> None:
    folders = sorted(p.name for p in rules_dir().iterdir() if (p / "rules.yaml").is_file())
    assert folders == sorted(RELEASED_RULES)


def test_a_history_must_end_at_the_current_version() -> None:
    with pytest.raises(ValueError, match="must end at version 3"):
        formats.Format("x", "x.json", 3, (3,), ((1, "a"), (2, "b")))
    with pytest.raises(ValueError, match="must read its own version"):
        formats.Format("x", "x.json", 2, (1,), ((1, "a"), (2, "b")))
    assert len({f.name for f in formats.ALL}) == len(formats.ALL)


def test_the_schemas_pin_the_current_versions() -> None:
    schemas = schema_folder(DEFAULT_RULES_VERSION)  # rules 1.8 have their own (run format 8)
    run = json.loads((schemas / "run.schema.json").read_text())["properties"]
    summary = json.loads((schemas / "summary.schema.json").read_text())["properties"]
    desc = json.loads((schemas / "system-description.schema.json").read_text())["properties"]
    keys = json.loads((schemas / "trusted-keys.schema.json").read_text())["properties"]
    assert run["run_format"]["const"] == formats.RUN.version
    assert run["records_format"]["const"] == summary["records_format"]["const"] == formats.RECORDS.version
    assert summary["summary_format"]["const"] == formats.SUMMARY.version
    assert desc["description_format"]["const"] == formats.SYSTEM_DESCRIPTION.version
    assert keys["mlckpt_trusted_keys"]["const"] == formats.TRUSTED_KEYS.version
    released = json.loads((schemas / "released-runners.schema.json").read_text())["properties"]
    assert released["mlckpt_released_runners"]["const"] == formats.RELEASED_RUNNERS.version


def bundles() -> list[Path]:
    return sorted(p.parent for p in FIXTURE.rglob("run.json"))


def test_what_the_runner_wrote_carries_the_versions() -> None:
    for b in bundles():
        run = json.loads((b / "run.json").read_text())
        summary = json.loads((b / "summary.json").read_text())
        # made by an older runner: versions this code still reads
        assert run["run_format"] in formats.RUN.reads and run["records_format"] in formats.RECORDS.reads
        assert run["data_scheme"] in formats.DATA_SCHEME.reads
        assert summary["summary_format"] in formats.SUMMARY.reads


def test_records_match_their_typed_dicts() -> None:
    stage_keys = set(get_type_hints(StageRecord))
    seen = set()
    for b in bundles():
        for line in (b / "records.jsonl").read_text().splitlines():
            r = json.loads(line)
            td = WriteRecord if r["op"] == "write" else ReadRecord
            hints = set(get_type_hints(td))
            assert td.__required_keys__ <= set(r) <= hints, (r["op"], set(r) ^ hints)
            for st in r.get("stages", []):
                assert set(st) <= stage_keys
            seen.add(r["op"])
    assert seen == {"write", "read"}


@pytest.mark.parametrize("version", sorted(v for v in RELEASED_RULES  # an `extends` set has none
                                           if (rules_dir() / v / "schemas").is_dir()))
def test_every_schema_is_a_valid_draft_2020_12_schema(version: str) -> None:
    from jsonschema import Draft202012Validator

    paths = sorted((rules_dir() / version / "schemas").glob("*.schema.json"))
    # 1.2: released-runners; 1.4: trusted-witnesses, witness-transcript
    assert len(paths) == {"1.0": 8, "1.1": 8, "1.2": 9, "1.3": 9}.get(version, 11)
    for path in paths:
        schema = json.loads(path.read_text())
        Draft202012Validator.check_schema(schema)
        assert schema["$id"] == f"https://mlckpt.dev/rules/{version}/{path.name}"


def test_every_format_a_schema_declares_is_enforced() -> None:
    """jsonschema checks a schema's `format` only when that format's checker is installed: without
    rfc3339-validator a run.json time without its zone passed the schema and faulted the checker."""
    from mlckpt.schemas import validator

    formats_used = set()
    for schema in rules_dir().rglob("*.schema.json"):
        formats_used |= set(re.findall(r'"format":\s*"([^"]+)"', schema.read_text()))
    checker = validator("run", "1.9").format_checker
    assert checker is not None and formats_used <= set(checker.checkers), formats_used - set(checker.checkers)
    field = {"type": "string", "format": "date-time"}
    check = validator("run", "1.9").evolve(schema=field)
    assert check.is_valid("2026-11-26T17:30:51.123Z")
    assert not check.is_valid("2026-11-26T17:30:51") and not check.is_valid("yesterday")
