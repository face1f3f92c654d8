"""The one place where the check modules are composed into a rule set's check table (explicitly:
nothing registers itself by being imported)."""

from __future__ import annotations

from functools import cache

from mlckpt.rules.checks import (
    config,
    counters,
    evidence,
    foreign_io,
    frameworks,
    gpu,
    host,
    mlperf,
    objects,
    own_io,
    physics,
    pipeline,
    requests,
    result,
    resume,
    serving,
    split,
    submission,
    witness,
)
from mlckpt.rules.engine import DEFAULT_RULES_VERSION, CheckFn, RuleSet, load_rule_set

CHECKS: dict[str, CheckFn] = {}
_MODULES = (config, host, result, pipeline, evidence, physics, counters, foreign_io, submission, mlperf,
            split, witness, objects, gpu, requests, frameworks, serving, own_io, resume)
for _module in _MODULES:
    _clash = CHECKS.keys() & _module.CHECKS.keys()
    if _clash:  # a defect of the code, caught at import
        raise ImportError(f"check names defined twice: {sorted(_clash)}")
    CHECKS.update(_module.CHECKS)


@cache
def load_rules(version: str = DEFAULT_RULES_VERSION) -> RuleSet:
    """The rule set of ``rules/<version>/`` with every check (cached: rule sets are immutable)."""
    return load_rule_set(version, CHECKS)
