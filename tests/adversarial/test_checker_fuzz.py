"""Hostile bundles: whatever the bytes, mlckpt-check reports findings and exits 0, 1 or 3.

Each example copies a real runner bundle into a fresh tree, damages one file, and re-signs it with
the organisation's trusted key, so the damage gets past integrity into parsing, schemas and the
rules (archive and systems/*.yaml damage needs no signature).  The checker runs in-process; an
exception escaping it, exit status 4 (an INTERNAL finding), or a parse/schema failure that does not
name the damaged file fails the test.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checker import report as rep
from checker.report import REPORT_SCHEMA
from checker.tree_check import check_tree
from mlckpt import bundle
from mlckpt import strict as loading
from mlckpt.schemas import validator

ORG = "example-org"
SYSTEM = "laptop-ext4"
FILES = ("run.json", "config.yaml", "summary.json", "system.json", "records.jsonl")
# The runs damaged: sync one tier (1 write, 1 read) and async with a fast tier (2 writes, 2 reads).
SOURCES = ("llama3_8b", "async_tiers")
sources = st.sampled_from(SOURCES)
FUZZ = settings(max_examples=60, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


_WORK: dict[str, Path] = {}


@pytest.fixture(scope="module", autouse=True)
def _workspace() -> Iterator[None]:
    """One scratch tree per source bundle, reset before every example (copying is slow here)."""
    yield
    for path in _WORK.values():
        shutil.rmtree(path, ignore_errors=True)
    _WORK.clear()


@contextmanager
def tree(h: dict[str, Path], source: str = "llama3_8b") -> Iterator[tuple[Path, Path]]:
    """A one-bundle tree in its pristine state: (root, the bundle folder)."""
    if source not in _WORK:
        _WORK[source] = Path(tempfile.mkdtemp(prefix="mlckpt-fuzz-"))
    root = _WORK[source] / "tree"
    shutil.rmtree(root, ignore_errors=True)
    systems = root / "open" / ORG / "systems"
    systems.mkdir(parents=True)
    (systems / f"{SYSTEM}.yaml").write_bytes((h["dir"] / "laptop-ext4.yaml").read_bytes())
    workload = json.loads((h[source] / "run.json").read_text())["workload"]
    folder = root / "open" / ORG / "results" / SYSTEM / workload / h[source].name
    folder.mkdir(parents=True)
    for p in h[source].iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    yield root, folder


def resign(h: dict[str, Path], folder: Path) -> None:
    k = bundle.load_private_key(h["dir"] / "keys" / "org.pem")
    bundle.sign_bundle(folder, k, bundle.read_envelope_predicate(folder))


def judge(root: Path, h: dict[str, Path]) -> dict[str, Any]:
    report = check_tree(root, bundle.TrustedKeys.load(h["dir"] / "trusted-keys.yaml"), jobs=1)
    internal = [f for f in report["findings"] if f["rule"] == "INTERNAL"]
    assert not internal, internal
    assert report["exit_status"] in (0, 1, 3), report["exit_status"]
    assert not list(validator("report", REPORT_SCHEMA).iter_errors(report))
    json.dumps(report, allow_nan=False)
    rep.render_text(report).encode("utf-8")  # printable, encodable
    return report


def assert_names(report: dict[str, Any], name: str, rule: str = "BUNDLE-SCHEMA") -> None:
    """A finding of ``rule`` names the damaged file (in its path and its message)."""
    hits = [f for f in report["findings"] if f["rule"] == rule]
    assert hits, [(f["rule"], f["message"]) for f in report["findings"]]
    assert any(f["path"].endswith(name) and name in f["message"] for f in hits), hits


def schema_findings_name_the_file(report: dict[str, Any], name: str) -> None:
    for f in report["findings"]:
        if f["rule"] == "BUNDLE-SCHEMA":
            assert f["path"].endswith(name) and f["message"].startswith(f"{name}: "), f


# ----------------------------------------------------------------------------------------------
# Random byte damage (after which the file is re-signed)

edits = st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate"]),
                           st.floats(0, 1, allow_nan=False), st.integers(0, 255)), min_size=1, max_size=4)


@FUZZ
@given(name=st.sampled_from(FILES), ops=edits, source=sources)
def test_random_byte_damage(honest_bundles: dict[str, Path], name: str, ops: list[Any], source: str) -> None:
    with tree(honest_bundles, source) as (root, folder):
        data = bytearray((folder / name).read_bytes())
        for op, where, byte in ops:
            i = min(int(where * len(data)), max(len(data) - 1, 0))
            if op == "flip" and data:
                data[i] ^= byte or 1
            elif op == "insert":
                data[i:i] = bytes([byte])
            elif op == "delete" and data:
                del data[i]
            elif op == "truncate":
                del data[i:]
        (folder / name).write_bytes(bytes(data))
        resign(honest_bundles, folder)
        report = judge(root, honest_bundles)
        assert report["exit_status"] in (0, 1)  # re-signed: never an integrity failure
        schema_findings_name_the_file(report, name)


# ----------------------------------------------------------------------------------------------
# Structured damage: any JSON-ish value (wrong types, NaN, ±Infinity, huge numbers, nesting)
# at any place of a document

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63 - 2, max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
containers = lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4)  # noqa: E731
values = st.recursive(scalars, containers, max_leaves=8)


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += paths(v, (*prefix, i))
    return out


def put(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    node = doc
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


def dump(name: str, doc: Any) -> str:
    if name == "config.yaml":
        return yaml.safe_dump(doc, sort_keys=False)
    return json.dumps(doc, indent=1, allow_nan=True)


@FUZZ
@given(data=st.data(), name=st.sampled_from(["run.json", "config.yaml", "summary.json", "system.json"]),
       source=sources)
def test_any_value_anywhere(honest_bundles: dict[str, Path], data: st.DataObject, name: str,
                            source: str) -> None:
    with tree(honest_bundles, source) as (root, folder):
        p = folder / name
        doc = yaml.safe_load(p.read_text()) if name.endswith(".yaml") else json.loads(p.read_text())
        where = data.draw(st.sampled_from(paths(doc)))
        value = data.draw(values)
        put(doc, where, value, data.draw(st.booleans().filter(lambda b: not b or isinstance(where[-1], str))))
        p.write_text(dump(name, doc))
        resign(honest_bundles, folder)
        report = judge(root, honest_bundles)
        schema_findings_name_the_file(report, name)


record_fields = {
    "op": st.sampled_from(["write", "read"]), "index": st.integers(1, 4), "checkpoint": st.integers(1, 4),
    "rank": st.integers(0, 9), "host": st.sampled_from(["vm", "other", ""]),
    "t0_ns": st.integers(0, 2**40), "t1_ns": st.integers(0, 2**40), "bytes": st.integers(0, 10**9),
    "files": st.integers(0, 5), "fsync": st.booleans(), "resident_bytes": st.integers(0, 10**9),
    "cached_check_bytes": st.integers(0, 10**9), "verified_bytes": st.integers(0, 10**9),
    "mismatches": st.integers(0, 3),
    # records format 2
    "tier": st.sampled_from(["fast", "durable"]), "mode": st.sampled_from(["sync", "async"]),
    "staged_ns": st.integers(0, 2**40), "backpressure_ns": st.integers(0, 2**34),
    "exposed_ns": st.integers(0, 2**34), "compute_ns": st.integers(0, 2**34),
}
# Fields of a write's stages (their tiers are left alone: see
# test_checker.py::test_stages_differing_between_ranks_are_a_finding_not_a_checker_fault).
stage_fields = {
    "t0_ns": st.integers(0, 2**40), "t1_ns": st.integers(0, 2**40), "bytes": st.integers(0, 10**9),
    "verified_bytes": st.integers(0, 10**9), "mismatches": st.integers(0, 3),
}


@FUZZ
@given(data=st.data(), source=sources)
def test_schema_valid_but_inconsistent_records(honest_bundles: dict[str, Path], data: st.DataObject,
                                               source: str) -> None:
    """Records that pass their schema but make no sense (ranks out of range, duplicate ops, zero or
    negative durations, missing ops, stages out of order, exposed time that is no back-pressure):
    the result rules judge them without crashing."""
    with tree(honest_bundles, source) as (root, folder):
        p = folder / "records.jsonl"
        recs = [json.loads(line) for line in p.read_text().splitlines()]
        for _ in range(data.draw(st.integers(1, 6))):
            action = data.draw(st.sampled_from(["set", "stage", "drop", "duplicate", "requests", "phases",
                                                "samples"]))
            i = data.draw(st.integers(0, len(recs) - 1))
            if action == "set":
                key = data.draw(st.sampled_from(sorted(record_fields)))
                recs[i][key] = data.draw(record_fields[key])
            elif action == "stage" and "stages" in recs[i]:
                stage = data.draw(st.sampled_from(recs[i]["stages"]))
                key = data.draw(st.sampled_from(sorted(stage_fields)))
                stage[key] = data.draw(stage_fields[key])
            elif action == "drop" and len(recs) > 1:
                recs.pop(i)
            elif action in ("requests", "phases", "samples"):
                damage_requests(data, recs, i, action)
            else:
                recs.append(json.loads(json.dumps(recs[i])))
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
        resign(honest_bundles, folder)
        report = judge(root, honest_bundles)
        assert report["exit_status"] in (0, 1)


def damage_requests(data: st.DataObject, recs: list[dict[str, Any]], i: int, what: str) -> None:
    """Records format 7's evidence, damaged within its schema: histograms swapped between records or
    miscounted or dropped, phases and device samples out of all proportion or out of order."""
    r = recs[i]
    if what == "requests" and "requests" in r:
        j = data.draw(st.integers(0, len(recs) - 1))
        how = data.draw(st.sampled_from(["swap", "count", "drop"]))
        if how == "swap" and "requests" in recs[j]:
            r["requests"], recs[j]["requests"] = recs[j]["requests"], r["requests"]
        elif how == "count":
            r["requests"]["count"] = data.draw(st.integers(1, 10**9))
        else:
            del r["requests"]
    elif what == "phases" and r.get("phases_ns"):
        key = data.draw(st.sampled_from(sorted(r["phases_ns"])))
        r["phases_ns"][key] = data.draw(st.sampled_from([0, 1, 2**40, 2**63 - 1]))
    elif what == "samples" and (r.get("host_counters") or {}).get("samples"):
        samples = r["host_counters"]["samples"]
        how = data.draw(st.sampled_from(["reverse", "extreme", "empty"]))
        if how == "reverse":
            samples.reverse()
        elif how == "extreme":
            samples[0] = [2**63 - 1, 0, 10**16]
        else:
            samples.clear()


modes = st.sampled_from(["sync", "async"])
folders = st.sampled_from(["fast-tier", "./mlckpt-checkpoints", "mlckpt-checkpoints/x", "/", "/dev/shm/c",
                           ".."])
filesystems = st.sampled_from(["tmpfs", "ramfs", "ext4", ""])


@FUZZ
@given(data=st.data(), source=sources)
def test_schema_valid_but_inconsistent_run(honest_bundles: dict[str, Path], data: st.DataObject,
                                           source: str) -> None:
    """run.json/config.yaml values within their schemas but against each other and the records."""
    with tree(honest_bundles, source) as (root, folder):
        run = json.loads((folder / "run.json").read_text())
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
        choices = {
            "ranks": lambda: data.draw(st.integers(1, 64)),
            "hosts": lambda: [{"host": data.draw(st.sampled_from(["vm", "x"])),
                               "ranks": data.draw(st.lists(st.integers(0, 70), max_size=6))}
                              for _ in range(data.draw(st.integers(1, 3)))],
            "rank_shift": lambda: data.draw(st.integers(0, 2**62)),
            "scale": lambda: data.draw(st.floats(1e-6, 1)),
            "pipeline": lambda: {"mode": data.draw(modes), "compute_interval_s": data.draw(st.floats(0, 1e6)),
                                 "fast": data.draw(st.none() | folders),
                                 "fast_keep": data.draw(st.integers(0, 10)),
                                 "fast_fs": data.draw(st.dictionaries(st.sampled_from(["vm", "x"]),
                                                                      st.none() | filesystems))},
        }
        for key in data.draw(st.lists(st.sampled_from(sorted(choices)), min_size=1, max_size=3, unique=True)):
            run[key] = choices[key]()
        if data.draw(st.booleans()):
            cfg["ranks"] = data.draw(st.integers(1, 4096))
        if data.draw(st.booleans()):
            cfg["workload"]["parallelism"] = {"tensor": data.draw(st.integers(1, 8)),
                                              "pipeline": data.draw(st.integers(1, 40)),
                                              "zero_stage": data.draw(st.sampled_from([0, 1, 2, 3]))}
        if data.draw(st.booleans()):
            cfg["checkpoint"]["rank_shift"] = data.draw(st.integers(0, 10**8))
        if data.draw(st.booleans()):  # another pipeline than the records follow
            cfg["checkpoint"].update(mode=data.draw(modes), compute_interval_s=data.draw(st.floats(0, 86400)),
                                     num_writes=data.draw(st.integers(1, 5)))
            cfg["checkpoint"]["tiers"] = {"fast": data.draw(st.none() | folders),
                                          "fast_keep": data.draw(st.integers(0, 10))}
        (folder / "run.json").write_text(json.dumps(run))
        (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
        resign(honest_bundles, folder)
        judge(root, honest_bundles)


@pytest.mark.parametrize("t1_minus_t0", [0, -1000])
def test_stage_without_positive_duration_is_judged_not_a_fault(honest_bundles: dict[str, Path],
                                                               t1_minus_t0: int) -> None:
    """Every rank's memory stage of write 1 ends when (or before) it starts: the stage's bandwidth
    is infinite (or meaningless).  The checker judges that (ASYNC-TIMELINE for a stage ending
    before it starts; the summary no longer recomputes) and never faults."""
    with tree(honest_bundles, "async_tiers") as (root, folder):
        p = folder / "records.jsonl"
        recs = [json.loads(line) for line in p.read_text().splitlines()]
        for r in recs:
            if (r["op"], r["index"]) == ("write", 1):
                r["stages"][0]["t1_ns"] = r["stages"][0]["t0_ns"] + t1_minus_t0
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
        resign(honest_bundles, folder)
        report = judge(root, honest_bundles)  # no INTERNAL finding, exit 0, 1 or 3
        assert report["exit_status"] == 1
        rules = {f["rule"] for f in report["findings"]}
        if t1_minus_t0 < 0:
            assert "ASYNC-TIMELINE" in rules, report["findings"]


# ----------------------------------------------------------------------------------------------
# Specific hostile content, each must end as BUNDLE-SCHEMA naming the file


def _deep(n: int) -> str:
    return "[" * n + "]" * n


HOSTILE: list[tuple[str, str, Any]] = [
    ("run.json", "NaN", lambda t: t.replace('"ranks": 4', '"ranks": NaN')),
    ("summary.json", "Infinity", lambda t: t.replace('"num_reads": 1', '"num_reads": -Infinity')),
    ("summary.json", "overflows a double", lambda t: t.replace('"num_reads": 1', '"num_reads": 1e999')),
    ("run.json", "64-bit range", lambda t: t.replace('"ranks": 4', f'"ranks": {2**64}')),
    ("run.json", "64-bit range", lambda t: t.replace('"ranks": 4', '"ranks": ' + "9" * 5000)),
    ("run.json", "duplicate key", lambda t: t.replace('"ranks": 4', '"ranks": 4, "ranks": 4')),
    ("system.json", "nested deeper", lambda t: t.replace('"hosts": [', f'"x": {_deep(100_000)}, "hosts": [')),
    ("system.json", "nested deeper", lambda t: t.replace('"hosts": [', f'"x": {_deep(70)}, "hosts": [')),
    ("run.json", "more than 1000000 values",
     lambda t: t.replace('"overrides": [', '"overrides": [' + "0," * 1_100_000)),
    ("run.json", "got overrides: ['a', 'a', 'a', 'a', 'a', 'a', 'a', 'a',...", lambda t: t.replace(
        '"overrides": [', '"overrides": [' + '"a",' * 2000)),
    ("run.json", "unpaired surrogate", lambda t: t.replace('"status": "complete"', '"status": "\\ud800"')),
    ("run.json", "NUL", lambda t: t.replace('"status": "complete"', '"status": "comp\\u0000lete"')),
    ("config.yaml", "YAML anchor", lambda t: "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n" + t),
    ("config.yaml", "YAML alias", lambda t: t + "again: *nowhere\n"),
    ("config.yaml", "tag", lambda t: t.replace("division: open",
                                               "division: !!python/object/apply:os.system [id]")),
    ("config.yaml", "duplicate key", lambda t: t + "division: open\n"),
    ("config.yaml", "timestamp", lambda t: t + "when: 2026-01-01\n"),
    ("config.yaml", "non-finite", lambda t: t.replace("scale: 0.0005", "scale: .nan")),
    ("config.yaml", "nested deeper", lambda t: t + "deep: " + _deep(200) + "\n"),
    ("records.jsonl", "line 1: non-standard JSON constant",
     lambda t: t.replace('"bytes": ', '"bytes": NaN, "x": ', 1)),
    ("records.jsonl", "line 2: empty line", lambda t: t.replace("\n", "\n\n", 1)),
    ("records.jsonl", "line 1: duplicate key", lambda t: t.replace('{"', '{"rank": 0, "', 1)),
    ("records.jsonl", "no records", lambda t: ""),
]


@pytest.mark.parametrize(("name", "fragment", "edit"), HOSTILE,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(HOSTILE)])
def test_hostile_content_is_a_schema_finding(honest_bundles: dict[str, Path], name: str, fragment: str,
                                             edit: Any) -> None:
    with tree(honest_bundles) as (root, folder):
        p = folder / name
        p.write_text(edit(p.read_text()))
        resign(honest_bundles, folder)
        report = judge(root, honest_bundles)
        assert report["exit_status"] == 1
        assert_names(report, name)
        assert any(fragment in f["message"] for f in report["findings"]), report["findings"]


@pytest.mark.parametrize("name", ["run.json", "config.yaml", "records.jsonl"])
def test_invalid_utf8(honest_bundles: dict[str, Path], name: str) -> None:
    with tree(honest_bundles) as (root, folder):
        p = folder / name
        p.write_bytes(p.read_bytes()[:40] + b"\xff\xfe\xc3" + p.read_bytes()[40:])
        resign(honest_bundles, folder)
        report = judge(root, honest_bundles)
        assert_names(report, name)
        assert any("UTF-8" in f["message"] for f in report["findings"])


def test_size_and_line_caps(honest_bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    with tree(honest_bundles) as (root, _folder):
        monkeypatch.setitem(loading.CAPS, "summary.json", 100)
        monkeypatch.setattr(loading, "MAX_RECORD_LINES", 3)
        report = judge(root, honest_bundles)
        assert_names(report, "summary.json")
        assert_names(report, "records.jsonl")
        assert any("larger than the limit of 100 bytes" in f["message"] for f in report["findings"])
        assert any("more than 3 lines" in f["message"] for f in report["findings"])


# ----------------------------------------------------------------------------------------------
# systems/<system>.yaml (the committee's tree, unsigned) and packed bundles

BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(9))

yaml_texts = st.one_of(
    st.just(BOMB),
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.builds(lambda n: "x: " + "[" * n + "]" * n, st.integers(60, 5000)),
    st.builds(lambda k, v: f"{k}: {v}\n", st.sampled_from(["system_name", "storage", "<<", "? [a]"]),
              st.sampled_from(["!!python/name:os.system", "&x 1", "*x", ".inf", "2020-01-01",
                               "[1, {a: b}]"])),
)


@FUZZ
@given(text=yaml_texts)
def test_hostile_system_description(honest_bundles: dict[str, Path], text: str) -> None:
    with tree(honest_bundles) as (root, _folder):
        target = root / "open" / ORG / "systems" / f"{SYSTEM}.yaml"
        target.write_bytes(text.encode("utf-8", "surrogatepass"))
        report = judge(root, honest_bundles)
        assert report["exit_status"] == 1  # the bundle embeds a description this file does not match
        hits = [f for f in report["findings"] if f["rule"] == "SYSTEM-DESCRIPTION"]
        assert hits and all(f["path"] in (f"open/{ORG}/systems/{SYSTEM}.yaml",) or
                            f["path"].endswith("/system.json") for f in hits), hits


@FUZZ
@given(ops=edits)
def test_damaged_archive(honest_bundles: dict[str, Path], ops: list[Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="mlckpt-fuzz-") as tmp:
        packed = Path(tmp) / "b.tar.gz"
        bundle.pack(honest_bundles["llama_7b"], packed)
        data = bytearray(packed.read_bytes())
        for op, where, byte in ops:
            i = min(int(where * len(data)), len(data) - 1)
            if op in ("flip", "insert"):
                data[i] ^= byte or 1
            elif op == "delete" and len(data) > 1:
                del data[i]
            else:
                del data[max(i, 1):]
        with tree(honest_bundles, "llama_7b") as (root, folder):
            shutil.rmtree(folder)
            (folder.parent / f"{folder.name}.tar.gz").write_bytes(bytes(data))
            report = judge(root, honest_bundles)
            [b] = report["bundles"]
            assert b["verdict"] == "open" or b["integrity"] == "failed" or b["findings"]


def test_fuzz_helpers_reach_the_rules(honest_bundles: dict[str, Path]) -> None:
    """Sanity: the undamaged, re-signed copy passes, so damage is what the fuzzers measure."""
    with tree(honest_bundles) as (root, folder):
        resign(honest_bundles, folder)
        report = judge(root, honest_bundles)
        assert report["exit_status"] == 0 and not math.isnan(report["bundles"][0]["metrics"]["num_writes"])
