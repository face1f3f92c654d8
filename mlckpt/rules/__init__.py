"""The rules: one engine (``engine``), check functions by stage (``checks/``) and the registry
that composes them.  The runner's gates and the checker use the same rule set."""

from mlckpt.command_line import override_key
from mlckpt.rules.checks.host import host_checkpoint_bytes, host_memory_need
from mlckpt.rules.engine import (
    DEFAULT_RULES_VERSION,
    SEVERITIES,
    STAGES,
    CheckFn,
    Context,
    Evaluation,
    Finding,
    HostSpec,
    NotChecked,
    Outcome,
    Rule,
    RuleSet,
    host_blocks,
    known_versions,
    make_finding,
    rank_shift,
    verdict,
    version_order,
)
from mlckpt.rules.registry import CHECKS, load_rules

__all__ = [
    "CHECKS", "DEFAULT_RULES_VERSION", "SEVERITIES", "STAGES", "CheckFn", "Context", "Evaluation",
    "Finding", "HostSpec", "NotChecked", "Outcome", "Rule", "RuleSet", "host_blocks",
    "host_checkpoint_bytes", "host_memory_need", "known_versions", "load_rules", "make_finding",
    "override_key", "rank_shift", "verdict", "version_order",
]
