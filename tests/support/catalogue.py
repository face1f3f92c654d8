"""What the forgery suites catch, read from their modules' own ``FORGERIES`` tables (rule IDs as
the keys of a dict, or the items of a tuple) without importing them: the rules-coverage tests ask
every rule to be broken somewhere."""

from __future__ import annotations

import ast

from support.paths import TESTS


def forgery_rules(module: str) -> set[str]:
    """The rule IDs of the module-level ``FORGERIES`` table of the test module named ``module``."""
    [path] = [p for p in TESTS.rglob(module) if "support" not in p.parts]
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "FORGERIES" and node.value is not None:
            value = node.value
            items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
            rules = {ast.literal_eval(k) for k in items if k is not None}
            assert rules and all(isinstance(r, str) for r in rules), f"{path}: FORGERIES has no rule IDs"
            return rules
    raise AssertionError(f"{path} has no module-level FORGERIES table")
