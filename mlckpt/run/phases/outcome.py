"""A run's outcome on rank 0: what its I/O phases measured (:class:`Measured`), judged by the
checker's own result-stage rules (:func:`assess`), then shown and published as a signed bundle
(:func:`publish`).  Apart from the phases so that a read-only invocation can learn its verdict
before its cleanup (a disturbed or invalid one keeps what it restored, to be run again)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mlckpt.attribution import foreign_note
from mlckpt.errors import RunFailure
from mlckpt.records import LoadRecord, OpRecord, ResumeRecord
from mlckpt.rules import content_commitment
from mlckpt.run.collective import Job
from mlckpt.run.console import headline
from mlckpt.run.features.split import keeps_key
from mlckpt.run.features.witnessing import Witnessing
from mlckpt.run.phases.configure import Configured
from mlckpt.run.phases.gates import Gates
from mlckpt.run.phases.publish import (
    BundleFiles,
    RunId,
    judged,
    manifest_of,
    resume_summary_of,
    serving_summary_of,
    summary_of,
    verdict_line,
    write_bundle,
)
from mlckpt.run.storage.kinds import open_durable


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Measured:
    """What the I/O phases leave for publishing (records, state and calibration: rank 0's)."""

    run: RunId
    records: list[OpRecord] | list[LoadRecord] | list[ResumeRecord]
    state: dict[str, object] | None
    calibration: dict[str, object] | None
    content_key: bytes  # whose content the checkpoints carry: this run's, or its write invocation's


@dataclass(frozen=True)
class Assessed:
    """Rank 0's judgement of the measured run: what the bundle will say."""

    measured: Measured
    manifest: dict[str, object]
    summary: dict[str, object]
    system: dict[str, object]
    findings: tuple[Any, ...]  # the result-stage findings, to show


def assess(job: Job, configured: Configured, gates: Gates, measured: Measured, started: str,
           witness: Witnessing | None = None) -> Assessed:
    """Rank 0: the manifest, the summary and the result-stage rules' verdict."""
    s, cfg = configured.setup, configured.config
    serving, resume = s.settings.serving, s.settings.resume
    system: dict[str, object] = {"hosts": list(gates.facts)}
    if configured.description is not None:
        system["description"] = configured.description
    manifest = manifest_of(
        s,
        gates,
        measured.run,
        ranks=job.size,
        overrides=configured.overrides,
        started=started,
        ended=now(),
        description=configured.description,
        restored_from=configured.source.manifest_entry(measured.content_key) if configured.source else None,
        # a serving run writes nothing: no write carries a witness's nonce
        witness=(witness.block(0 if serving or resume else configured.setup.settings.checkpoint.num_writes)
                 if witness else None),
        storage=open_durable(cfg, "").describe(),
        state=measured.state,
        calibration=measured.calibration,
        content_commitment=content_commitment(measured.content_key) if keeps_key(cfg) else None,
        serving=serving.block(str(serving.tier_path(measured.run.name) or "") or None) if serving else None,
    )
    if serving is not None:
        summary = serving_summary_of(s, serving, measured.records, manifest)
    elif resume is not None:
        summary = resume_summary_of(s, resume, measured.records, manifest)
    else:
        summary = summary_of(s, measured.records, manifest, system)
    found = judged(s, gates, manifest, summary, measured.records, system,
                   witness.document() if witness else None)
    return Assessed(measured, manifest, summary, system, tuple(found))


def publish(job: Job, configured: Configured, a: Assessed, signing_key: Ed25519PrivateKey | None,
            witness: Witnessing | None = None) -> Path:
    """Rank 0: what the judgement found, then the signed bundle."""
    s, cfg = configured.setup, configured.config
    manifest, summary = a.manifest, a.summary
    bound = s.rules.data["cold_read"]["max_resident_fraction"]
    if summary.get("num_reads") and not summary["read_cold"]:
        job.say(
            f"warning: [COLD-READ] {summary['read_resident_fraction_max']:.1%} of the restored "
            f"bytes were in the page cache before a restore (bound {bound:.0%}): read results are invalid"
        )
    for f in a.findings:
        job.say(f"finding: [{f.rule}] ({f.severity}) {f.message}")
    shared = foreign_note(summary.get("foreign"), at_least=0.01)
    if shared:  # a valid run says what it shared the device with, a disturbed one why it is no result
        job.say(f"note: {shared} (summary.json: foreign)")
    job.say(headline(summary) + f"; verdict {manifest['verdict']}")
    log = list(job.console.log_lines)
    if manifest["verdict"] in ("invalid", "disturbed"):  # the first thing anyone opening the bundle reads
        log.insert(0, verdict_line(manifest))
    files = BundleFiles(manifest, cfg, a.measured.records, summary, a.system, log,
                        witness.transcript_bytes() if witness else None)
    root = configured.setup.settings.results
    try:
        final = write_bundle(root, a.measured.run.name, files, signing_key)
    except OSError as exc:  # the results folder changed under the run (removed, replaced, full)
        raise RunFailure(f"output.root: cannot write the bundle in {root}: "
                         f"{exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}") from None
    if signing_key is None:
        print(
            "mlckpt: warning: signing.key=none: the bundle is NOT signed and no checker will accept it",
            file=sys.stderr,
        )
    return final


def assessed(job: Job, configured: Configured, gates: Gates, measured: Measured, started: str,
              witness: Witnessing | None) -> tuple[Assessed | None, BaseException | None]:
    """Rank 0's judgement (the witness told the run ended first), or why it failed; (None, None)
    on the other ranks."""
    if job.rank != 0:
        return None, None
    try:
        if witness is not None:
            witness.close()
        return assess(job, configured, gates, measured, started, witness), None
    except BaseException as exc:  # the other ranks wait for the verdict: tell them, then fail
        return None, exc
