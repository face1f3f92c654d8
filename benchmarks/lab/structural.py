"""A structural fuzzer of signed bundles: the hostile bundles a vendor with a trusted key can make.

Each case copies a real bundle made by the real runner, applies one to three mutations to its
structure (a key dropped, a value of another type or an extreme one, records repeated, dropped or
reordered, two files' contents swapped, a file added, a link) and re-signs it with the trusted
key, so the damage reaches the checker's deep stages (a link cannot be signed: it is placed after
the signature, as an attacker who edits a tree would).  :func:`check_case` then checks the one
bundle in-process and says what went wrong: a checker fault (an INTERNAL finding, exit 4), a
report that does not hold together, or a check longer than the budget.

Used by tests/adversarial/test_structural_fuzz.py (a short seeded run) and benchmarks/fuzz_checker.py (the
long one); every class found becomes a regression test there.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from checker.tree_check import check_tree
from mlckpt import bundle

JSON_FILES = ("run.json", "summary.json", "system.json")
FILES = (*JSON_FILES, "config.yaml", "records.jsonl")
# Values of every type and at every extreme the schemas and the rules must survive.
ODD_VALUES: tuple[Any, ...] = (None, True, False, 0, -1, 1, 2**31, 2**53 + 1, 2**63, -(2**63), 2**64,
                               1e-300, 1e300, -0.0, 0.5, "", "x" * 5000, "1", "2026-11-27T00:00:00",
                               "é\u202e", [], [None], [1, 2, 3], {}, {"k": 1}, {"": None})
EXTREME_NUMBERS = (0, -1, 1, 2**62, 2**63 - 1, 2**63, -(2**62), 10**30, 1e-9, 1e308, 0.1)


@dataclass
class Doc:
    """One bundle file, parsed, to be mutated and written back."""

    name: str
    value: Any  # JSON/YAML document, or the list of records for records.jsonl


def _load(folder: Path, name: str) -> Doc:
    text = (folder / name).read_text(encoding="utf-8")
    if name == "records.jsonl":
        return Doc(name, [json.loads(ln) for ln in text.splitlines() if ln.strip()])
    if name == "config.yaml":
        return Doc(name, yaml.safe_load(text))
    return Doc(name, json.loads(text))


def _store(folder: Path, doc: Doc) -> None:
    if doc.name == "records.jsonl":
        text = "".join(json.dumps(r) + "\n" for r in doc.value)
    elif doc.name == "config.yaml":
        text = yaml.safe_dump(doc.value, sort_keys=False, allow_unicode=True)
    else:
        text = json.dumps(doc.value, indent=1)
    (folder / doc.name).write_text(text, encoding="utf-8")


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``node`` (dict keys, list indices), the root excluded."""
    out: list[tuple[Any, ...]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out += _paths(v, (*prefix, k))
    return out


def _parent(node: Any, path: tuple[Any, ...]) -> Any:
    for k in path[:-1]:
        node = node[k]
    return node


def drop_key(rng: random.Random, folder: Path) -> str:
    doc = _load(folder, rng.choice(FILES))
    paths = [p for p in _paths(doc.value) if isinstance(_parent(doc.value, p), dict)]
    if not paths:
        return "nothing to drop"
    path = rng.choice(paths)
    del _parent(doc.value, path)[path[-1]]
    _store(folder, doc)
    return f"drop {doc.name}:{'.'.join(map(str, path))}"


def retype(rng: random.Random, folder: Path) -> str:
    doc = _load(folder, rng.choice(FILES))
    paths = _paths(doc.value)
    if not paths:
        return "nothing to retype"
    path = rng.choice(paths)
    new = rng.choice(ODD_VALUES)
    if doc.name == "config.yaml" and isinstance(new, str) and "\u202e" in new:
        new = "odd"
    _parent(doc.value, path)[path[-1]] = new
    _store(folder, doc)
    return f"retype {doc.name}:{'.'.join(map(str, path))}={str(new)[:20]!r}"


def extreme(rng: random.Random, folder: Path) -> str:
    """A number anywhere in a document set to an extreme (a time, a byte count, a rank)."""
    doc = _load(folder, rng.choice(FILES))
    paths = [p for p in _paths(doc.value)
             if isinstance(_parent(doc.value, p)[p[-1]], int | float)
             and not isinstance(_parent(doc.value, p)[p[-1]], bool)]
    if not paths:
        return "no number"
    path = rng.choice(paths)
    _parent(doc.value, path)[path[-1]] = rng.choice(EXTREME_NUMBERS)
    _store(folder, doc)
    return f"extreme {doc.name}:{'.'.join(map(str, path))}"


def repeat_records(rng: random.Random, folder: Path) -> str:
    doc = _load(folder, "records.jsonl")
    times = rng.choice((1, 2, 50, 5000, 60000))
    rec = rng.choice(doc.value)
    doc.value[rng.randrange(len(doc.value) + 1):0] = [rec] * times
    _store(folder, doc)
    return f"repeat a record {times}x"


def reorder_records(rng: random.Random, folder: Path) -> str:
    doc = _load(folder, "records.jsonl")
    rng.shuffle(doc.value)
    _store(folder, doc)
    return "reorder records"


def drop_records(rng: random.Random, folder: Path) -> str:
    doc = _load(folder, "records.jsonl")
    keep = [r for r in doc.value if rng.random() < 0.5]
    doc.value = keep
    _store(folder, doc)
    return f"keep {len(keep)} records"


def retarget_records(rng: random.Random, folder: Path) -> str:
    """Records that name other ops, indices, ranks or hosts than the run has."""
    doc = _load(folder, "records.jsonl")
    r = rng.choice(doc.value)
    if not isinstance(r, dict):  # an earlier mutation made it something else
        raise ValueError("no record to retarget")
    key, value = rng.choice((("op", "read" if r.get("op") == "write" else "write"), ("index", 0),
                             ("index", 10**6), ("rank", 4096), ("rank", -1), ("host", "elsewhere"),
                             ("checkpoint", 99), ("t1_ns", 0), ("t0_ns", 2**62)))
    r[key] = value
    _store(folder, doc)
    return f"record {key}={value}"


def swap_files(rng: random.Random, folder: Path) -> str:
    a, b = rng.sample(FILES, 2)
    da, db = (folder / a).read_bytes(), (folder / b).read_bytes()
    (folder / a).write_bytes(db)
    (folder / b).write_bytes(da)
    return f"swap {a} {b}"


def add_file(rng: random.Random, folder: Path) -> str:
    name = rng.choice(("extra.json", "records.jsonl.bak", "sub/run.json", ".hidden", "summary.json~"))
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(rng.choice((b"{}", b"", b"\x00" * 64, (folder / "run.json").read_bytes())))
    return f"add {name}"


MUTATIONS: tuple[Callable[[random.Random, Path], str], ...] = (
    drop_key, retype, extreme, repeat_records, reorder_records, drop_records, retarget_records,
    swap_files, add_file)


def link(rng: random.Random, folder: Path) -> str:
    """After signing: a file replaced by a link (to another bundle file, or out of the bundle)."""
    name = rng.choice(FILES)
    target = rng.choice(("/etc/hostname", "/dev/zero", "run.json", "../", "/proc/self/environ"))
    (folder / name).unlink()
    os.symlink(target, folder / name)
    return f"link {name} -> {target}"


@dataclass(frozen=True)
class Outcome:
    what: str  # the mutations applied
    verdict: str
    seconds: float
    problem: str | None  # None: the checker did what it must
    rules: frozenset[str] = frozenset()  # the rules of the bundle's findings


def mutate(rng: random.Random, folder: Path, key: Any) -> str:
    """Apply one to three mutations to ``folder`` and re-sign it with ``key`` (a link, one time in
    twelve, after the signature)."""
    done = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        fn = rng.choice(MUTATIONS)
        try:
            done.append(fn(rng, folder))
        except (ValueError, yaml.YAMLError, IndexError, UnicodeDecodeError):  # an earlier one unparsed it
            done.append(f"{fn.__name__}: nothing to parse")
    try:
        bundle.sign_bundle(folder, key, bundle.read_envelope_predicate(folder))
    except Exception as exc:  # a mutation the signer refuses (a file name it never signs)
        done.append(f"unsigned ({type(exc).__name__})")
    if rng.random() < 1 / 12:
        done.append(link(rng, folder))
    return "; ".join(done)


def check_case(root: Path, trusted: bundle.TrustedKeys, budget_s: float, what: str, jobs: int = 1) -> Outcome:
    """Check the one-bundle tree at ``root`` (``jobs`` > 1: its records and rules shared among
    processes, as checker/rule_workers.py does for a large bundle); the problem, if the checker
    misbehaved."""
    t0 = time.monotonic()
    try:
        report = check_tree(root, trusted, jobs=jobs, budget_s=budget_s)
    except Exception as exc:  # the checker must never raise
        return Outcome(what, "raised", time.monotonic() - t0, f"raised {type(exc).__name__}: {exc}")
    took = time.monotonic() - t0
    [b] = report["bundles"]
    internal = [f["message"] for f in report["findings"] if f["rule"] == "INTERNAL"]
    problem = None
    if internal:
        problem = f"checker fault: {internal[0]}"
    elif report["exit_status"] not in (0, 1, 3, 6):
        problem = f"exit status {report['exit_status']}"
    elif took > budget_s + 2.0:  # the budget is checked between stages and every 64 records
        problem = f"took {took:.1f} s, over the {budget_s:g} s budget"
    else:
        json.dumps(report, allow_nan=False)
    return Outcome(what, str(b["verdict"]), took, problem, frozenset(f["rule"] for f in b["findings"]))


def fresh_case(source: Path, root: Path, org: str, system: str, description: bytes) -> Path:
    """A one-bundle tree at ``root`` holding a copy of ``source``; the copy's folder."""
    shutil.rmtree(root, ignore_errors=True)
    systems = root / "open" / org / "systems"
    systems.mkdir(parents=True)
    (systems / f"{system}.yaml").write_bytes(description)
    workload = json.loads((source / "run.json").read_text())["workload"]
    folder = root / "open" / org / "results" / system / workload / source.name
    shutil.copytree(source, folder)
    return folder
