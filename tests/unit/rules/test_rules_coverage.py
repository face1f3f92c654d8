"""Every rule ID of every rules version has a registered check function and a negative test.

Negative tests are found by reading the test sources (never importing them): a module-level
table named in ``NEGATIVE_TABLES`` (``NEGATIVE`` in tests/unit/rules/test_rules.py: (rule ID, context,
messages) rows for the config/host rules; ``NEGATIVE_CASES`` in tests/e2e/test_checker.py: rule ID →
mutated-bundle cases for everything a bundle can break; ``REFUSED`` in tests/e2e/test_mlperf.py: rules that
refuse a configuration before any plan) lists the rule IDs it has failing cases
for.  A rule added to any rules.yaml without a row in one of them fails this suite.
"""

from __future__ import annotations

import ast

import pytest
import yaml
from support import paths

from mlckpt.resources import rules_dir
from mlckpt.rules import CHECKS, load_rules

TESTS = paths.TESTS
NEGATIVE_TABLES = ("NEGATIVE", "NEGATIVE_CASES", "FORGERIES", "REFUSED")


def rule_versions() -> list[str]:
    return sorted(p.name for p in rules_dir().iterdir() if (p / "rules.yaml").is_file())


def raw_rules(version: str) -> list[dict[str, object]]:
    return yaml.safe_load((rules_dir() / version / "rules.yaml").read_text(encoding="utf-8"))["rules"]


def table_rule_ids(source: str) -> set[str]:
    """Rule IDs that head a row of a negative-test table in ``source``: the keys of a dict table,
    the first element of each tuple (or the strings) of a list table."""
    ids: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        else:
            continue
        if value is None or not any(isinstance(t, ast.Name) and t.id in NEGATIVE_TABLES for t in targets):
            continue
        if isinstance(value, ast.Dict):  # rule ID -> cases; an empty literal is no case
            heads = [k for k, v in zip(value.keys, value.values, strict=True)
                     if not (isinstance(v, ast.List | ast.Tuple | ast.Dict) and not
                             (v.keys if isinstance(v, ast.Dict) else v.elts))]
        elif isinstance(value, ast.List | ast.Tuple):
            heads = [e.elts[0] if isinstance(e, ast.Tuple) and e.elts else e for e in value.elts]
        else:
            continue
        ids |= {h.value for h in heads if isinstance(h, ast.Constant) and isinstance(h.value, str)}
    return ids


def negative_ids() -> dict[str, set[str]]:
    return {p.name: table_rule_ids(p.read_text(encoding="utf-8")) for p in sorted(TESTS.rglob("test_*.py"))}


@pytest.mark.parametrize("version", rule_versions())
def test_every_rule_has_a_registered_check(version: str) -> None:
    load_rules(version)  # registers every check module
    missing = [(r["id"], r["check"]) for r in raw_rules(version) if r["check"] not in CHECKS]
    assert not missing, f"rules/{version}: rules naming no registered check function: {missing}"


@pytest.mark.parametrize("version", rule_versions())
def test_every_rule_has_a_negative_test(version: str) -> None:
    covered = set().union(*negative_ids().values())
    ids = [str(r["id"]) for r in raw_rules(version)]
    missing = sorted(set(ids) - covered)
    assert not missing, (f"rules/{version}: no negative test for {missing}; add a failing case to "
                         "NEGATIVE (tests/unit/rules/test_rules.py) or NEGATIVE_CASES "
                         "(tests/e2e/test_checker.py)")


def test_negative_tables_name_only_real_rules() -> None:
    known = {str(r["id"]) for v in rule_versions() for r in raw_rules(v)}
    for name, ids in negative_ids().items():
        assert ids <= known, f"{name}: negative cases for unknown rule IDs {sorted(ids - known)}"


def test_both_tables_are_found() -> None:
    found = negative_ids()
    assert found.get("test_checker.py"), "NEGATIVE_CASES not found in tests/e2e/test_checker.py"
    assert found.get("test_rules.py"), "NEGATIVE not found in tests/unit/rules/test_rules.py"
    assert {"DISK-SPACE", "FOLDER-USABLE"} <= found["test_rules.py"]  # no data in a bundle for these


def test_the_scanner_can_fail() -> None:
    """The table reader sees rows, not mere mentions of a rule ID."""
    src = '''
NEGATIVE: list = [("RANKS-MULTIPLE", f, ["m"]), ("SCALE-RANGE", g, [])]
NEGATIVE_CASES = {"BUNDLE-KEY": [case], "BUNDLE-FILES": []}
POSITIVE = [("HOST-MEMORY", h)]
def helper():
    NEGATIVE = [("DISK-SPACE", x)]  # not module level
COMMENT = "CLOSED-RANKS is mentioned but not tested"
'''
    assert table_rule_ids(src) == {"RANKS-MULTIPLE", "SCALE-RANGE", "BUNDLE-KEY"}
