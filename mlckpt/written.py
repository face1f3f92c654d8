"""What a runner judged by a rules version writes: the formats that version's schemas pin, and what
each format brought.  The one place where a rules version becomes the runner's choices: the phases
ask ``Written.of(version).has("calibration")``, never ``run_format >= 8``.  A new rules version that
adds a key adds one line to :data:`FEATURES` (and its format's history in ``mlckpt/formats.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from mlckpt.schemas import pinned

Document = Literal["run", "records", "summary"]

# feature -> (the document that carries it, the format of that document that brought it, what it is)
FEATURES: dict[str, tuple[Document, int, str]] = {
    "restored_from": ("run", 4, "a read-only invocation names the write invocation it restored"),
    "witness": ("run", 5, "who witnessed the run (null: not witnessed)"),
    "storage": ("run", 6, "where the checkpoints went: a folder, or an object store"),
    "state": ("run", 7, "where the state lived (null: host memory; or the GPU source)"),
    "calibration": ("run", 8, "each host's timing, measured before the first op"),
    "content_commitment": ("run", 10, "a write invocation's commitment to its content key, and a read "
                           "invocation's proof (restored_from.content_proof)"),
    "framework": ("run", 11, "the library writer (torch_save, torch_dcp, safetensors) as it ran, or null"),
    "serving": ("run", 12, "a serving run (replicas loading a model's weights) as it ran, or null"),
    "resume": ("run", 13, "a resume run (resuming from a checkpoint written at another layout) as it "
               "ran, or null"),
    "op_cpu": ("records", 4, "each rank's CPU time over an op, and the huge-page share of its state "
               "at the first write and the first restore"),
    "own_io": ("records", 6, "what the kernel charged to the host's ranks beside the device's total, "
               "the host's CPUs, and a second barrier after the counters are read"),
    "requests": ("records", 7, "each op's requests (latency histogram, phases), the device sampled "
                 "through the op, rank 0's own time around a witnessed op"),
    "load_evidence": ("records", 10, "a load's record carries the op timer's evidence (the host's "
                      "counters around it, CPU time) and its node-tier files still in the page cache "
                      "before its ranks read them"),
    "witnessed_loads": ("records", 11, "a serving run's loads reported to a witness, and rank 0's own "
                        "time around each witnessed load"),
    "tensors": ("records", 12, "a library writer is handed the model's named tensors (or flat ones, "
                "as framework.tensors says), and its records count them"),
    "exchange": ("records", 12, "a fan-out load's exchange: its CPU time and the wall time it "
                 "took after the last read"),
    "resume_writer": ("records", 14, "a resume run may resume through DCP beside the engine: each resume "
                      "names its writer, the summary gives both"),
    "what_changes": ("summary", 4, "what changes the figure: the slowest rank's share, stalls"),
    "latency": ("summary", 6, "per-request latency percentiles, IOPS and where time went"),
    "framework_summary": ("summary", 7, "a library writer's figures beside the engine's, and each ratio"),
    "barrier_start": ("summary", 10, "every rank of an op or a load timed from its host's first rank to "
                      "leave the barrier"),
}


@dataclass(frozen=True)
class Written:
    """The formats of what is written under one rules version."""

    rules_version: str
    run: int
    records: int
    summary: int

    @staticmethod
    @functools.cache
    def of(rules_version: str) -> Written:
        return Written(rules_version, int(pinned("run", "run_format", rules_version)),
                       int(pinned("run", "records_format", rules_version)),
                       int(pinned("summary", "summary_format", rules_version)))

    def has(self, feature: str) -> bool:
        document, since, _ = FEATURES[feature]
        return int(getattr(self, document)) >= since


def named_has(rules_version: object, feature: str) -> bool:
    """Whether what a bundle's config or run.json says it was judged by (None: a bundle too old to
    name its rules) carries ``feature``."""
    return rules_version is not None and Written.of(str(rules_version)).has(feature)
