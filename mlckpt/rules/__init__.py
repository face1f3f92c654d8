"""The rules: one engine (``engine``), check functions by stage (``checks/``) and the registry
that composes them.  The runner's gates and the checker use the same rule set.

This module is the rules' public surface: code outside ``mlckpt/rules`` imports what it needs of
them from here (the run's documents as the rules read them, ``rundata.RunData``; the summaries the
rules recompute; the facts a submission is judged by; the witness's and a split result's proofs),
never from ``checks/`` (an import contract in pyproject.toml holds it).
"""

from mlckpt.command_line import override_key
from mlckpt.rules.checks.evidence import counted_op, fingerprints, recomputed_summary, training_waits
from mlckpt.rules.checks.gpu import gpu_source
from mlckpt.rules.checks.host import host_checkpoint_bytes, host_memory_need
from mlckpt.rules.checks.result import COMPLETE, placeholders
from mlckpt.rules.checks.resume import recomputed as resume_recomputed
from mlckpt.rules.checks.resume import summarized as resume_summarized
from mlckpt.rules.checks.serving import recomputed as serving_recomputed
from mlckpt.rules.checks.serving import summarized as serving_summarized
from mlckpt.rules.checks.split import (
    clock_problems,
    content_commitment,
    content_proof,
    host_clocks,
    proof_matches,
    split_problems,
)
from mlckpt.rules.checks.submission import Problem, SubmissionFacts, Verdicts
from mlckpt.rules.checks.timing import abs_bound_ns
from mlckpt.rules.checks.witness import TRANSCRIPT, WitnessFacts
from mlckpt.rules.checks.witness import figures as witness_figures
from mlckpt.rules.checks.witness import too_short as witness_too_short
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
from mlckpt.rules.rundata import DATA_SCHEME, RunData

__all__ = [
    "CHECKS",
    "COMPLETE",
    "DATA_SCHEME",
    "DEFAULT_RULES_VERSION",
    "SEVERITIES",
    "STAGES",
    "TRANSCRIPT",
    "CheckFn",
    "Context",
    "Evaluation",
    "Finding",
    "HostSpec",
    "NotChecked",
    "Outcome",
    "Problem",
    "Rule",
    "RuleSet",
    "RunData",
    "SubmissionFacts",
    "Verdicts",
    "WitnessFacts",
    "abs_bound_ns",
    "clock_problems",
    "content_commitment",
    "content_proof",
    "counted_op",
    "fingerprints",
    "gpu_source",
    "host_blocks",
    "host_checkpoint_bytes",
    "host_clocks",
    "host_memory_need",
    "known_versions",
    "load_rules",
    "make_finding",
    "override_key",
    "placeholders",
    "proof_matches",
    "rank_shift",
    "recomputed_summary",
    "resume_recomputed",
    "resume_summarized",
    "serving_recomputed",
    "serving_summarized",
    "split_problems",
    "training_waits",
    "verdict",
    "version_order",
    "witness_figures",
    "witness_too_short",
]
