"""Publishing a run: the summary and the manifest (``run.json``) as pure values, the run judged by
the checker's own result-stage rules, then the bundle written to a hidden folder, signed, and
renamed into place (a failed publish leaves no half-made folder that could pass for a bundle)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mlckpt import __version__, bundle, strict
from mlckpt.engine import frameworks
from mlckpt.errors import InternalError
from mlckpt.plan.config import Setup
from mlckpt.rules import (
    DATA_SCHEME,
    Finding,
    RunData,
    recomputed_summary,
    resume_summarized,
    serving_summarized,
    verdict,
)
from mlckpt.run.phases.gates import Gates
from mlckpt.schemas import describe, errors
from mlckpt.workload.frameworks import WRITERS, Framework
from mlckpt.workload.pipeline import Pipeline
from mlckpt.workload.resume_run import ResumeRun
from mlckpt.workload.serving_run import ServingRun
from mlckpt.written import Written


@dataclass(frozen=True)
class RunId:
    """A run's identity: the 64-bit id (also the content key's first bytes) and its folder name."""

    number: int
    name: str

    @property
    def hex(self) -> str:
        return f"{self.number:016x}"


def summary_of(setup: Setup, records: Sequence[Mapping[str, object]], manifest: Mapping[str, object],
               system: Mapping[str, object]) -> dict[str, object]:
    """The summary: every number from the records (mlckpt.metrics), plus the plan's bytes and
    what run.json and system.json say of the invocation and its hosts (DLIO's shape)."""
    # The checker's own recomputation, so what is written is what will be recomputed.
    return recomputed_summary(setup.rules, RunData(manifest, setup.config, {}, list(records), system),
                              setup.plan)


def serving_summary_of(setup: Setup, run: ServingRun, records: Sequence[Mapping[str, object]],
                       manifest: Mapping[str, object]) -> dict[str, object]:
    """A serving run's summary (format 8): the checker's own recomputation, as summary_of's."""
    return serving_summarized(setup.rules, RunData(manifest, setup.config, {}, list(records)), run)


def resume_summary_of(setup: Setup, run: ResumeRun, records: Sequence[Mapping[str, object]],
                      manifest: Mapping[str, object]) -> dict[str, object]:
    """A resume run's summary (format 11): the checker's own recomputation, as summary_of's."""
    return resume_summarized(setup.rules, RunData(manifest, setup.config, {}, list(records)), run)


def manifest_of(
    setup: Setup,
    gates: Gates,
    run: RunId,
    *,
    ranks: int,
    overrides: Sequence[str],
    started: str,
    ended: str,
    description: Mapping[str, object] | None,
    restored_from: Mapping[str, object] | None = None,
    witness: Mapping[str, object] | None = None,
    storage: Mapping[str, object] | None = None,
    state: Mapping[str, object] | None = None,
    calibration: Mapping[str, object] | None = None,
    content_commitment: str | None = None,
    serving: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """run.json before the result-stage rules add their findings (pure), with the keys the rule
    set's run format has (mlckpt.written: rules 1.2 bundles stay run format 3)."""
    cfg, run_settings, resume = setup.config, setup.settings, setup.settings.resume
    written = Written.of(setup.rules.version)
    source = dict(restored_from) if restored_from else None
    if source is not None and not written.has("content_commitment"):
        source.pop("content_proof", None)
    keyed = {
        "restored_from": source,
        "witness": dict(witness) if witness else None,
        "storage": dict(storage) if storage else {"kind": "posix"},
        "state": dict(state) if state else None,
        "calibration": dict(calibration) if calibration else None,
        "content_commitment": content_commitment,
        "framework": framework_block(run_settings.framework),
        "serving": dict(serving) if serving else None, "resume": resume.block() if resume else None,
    }
    return {
        "run_format": written.run,
        **{key: value for key, value in keyed.items() if written.has(key)},
        "run_id": run.hex,
        "name": run.name,
        "status": "complete",
        "mlckpt_version": __version__,
        "rules_version": setup.rules.version,
        "workload": run_settings.workload,
        "division": run_settings.division,
        "scaled": run_settings.scaled,
        "scale": run_settings.scale,
        "ranks": ranks,
        "hosts": [{"host": h.name, "ranks": list(h.ranks)} for h in gates.hosts],
        "rank_shift": gates.shift,
        "verdict": gates.verdict,
        "findings": [f.to_dict() for f in gates.findings],
        "overrides": list(overrides),
        "started": started,
        "ended": ended,
        "records_format": written.records,
        "data_scheme": DATA_SCHEME,
        "system_name": (description or {}).get("system_name"),
        "pipeline": pipeline_block(Pipeline.of(cfg), gates),
    }


def framework_block(framework: Framework) -> dict[str, object] | None:
    """run.json's ``framework`` (rules 1.11): the library writer as it ran, or null for the engine."""
    if not framework.library:
        return None
    return {"writer": framework.writer, "library": WRITERS[framework.writer].library,
            "library_version": frameworks.library_version(framework.writer), "settings": framework.settings(),
            "reference": framework.reference, "synced_by": framework.synced_by()}


def pipeline_block(pipe: Pipeline, gates: Gates) -> dict[str, object]:
    """run.json's ``pipeline``: the checkpoint mode, and the fast tier's filesystem on each host."""
    return {
        "mode": pipe.mode,
        "compute_interval_s": pipe.compute_interval_s,
        "fast": pipe.fast,
        "fast_keep": pipe.fast_keep,
        "fast_fs": ({h.name: gates.fast_fs.get(h.name) for h in gates.hosts} if pipe.tiered else {}),
    }


def verdict_line(manifest: Mapping[str, Any]) -> str:
    """run.log's first line for a run that is no result: why, by which rules."""
    verdict = str(manifest["verdict"])
    rules = ", ".join(sorted({f["rule"] for f in manifest["findings"] if f["severity"] == verdict}))
    if verdict == "disturbed":
        return (f"DISTURBED RESULT: other processes on the host took a share of the checkpoint device or "
                f"the CPUs during the timed ops ({rules}); neither valid nor invalid: re-run on a quiet host")
    return f"INVALID RESULT: the rules find this run invalid ({rules})"


def judged(
    setup: Setup,
    gates: Gates,
    manifest: dict[str, object],
    summary: Mapping[str, object],
    records: Sequence[Mapping[str, object]],
    system: Mapping[str, object],
    witness: Mapping[str, object] | None = None,
) -> tuple[Finding, ...]:
    """Judge the run with the checker's result-stage rules (``witness``: the witness's transcript
    document, for the rules that read it); the manifest gets every finding and the verdict.
    Returns the result-stage findings (to show them)."""
    data = RunData(manifest, setup.config, summary, list(records), system, witness=witness)
    ctx = replace(setup.context(gates.hosts, complete=True, measured=True), run=data)
    result = setup.rules.evaluate(ctx, ["result"]).findings
    manifest["findings"] = [f.to_dict() for f in (*gates.findings, *result)]
    manifest["verdict"] = verdict([*gates.findings, *result], setup.settings.division)
    return result


def write_json(path: Path, doc: object) -> None:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")


@dataclass(frozen=True)
class BundleFiles:
    """Everything a bundle holds, as values."""

    manifest: Mapping[str, Any]
    config: Mapping[str, object]
    records: Sequence[Mapping[str, object]]
    summary: Mapping[str, object]
    system: Mapping[str, object]
    log_lines: Sequence[str]
    transcript: bytes | None = None  # a witnessed run: the witness's signed transcript


def self_check(folder: Path, rules_version: str) -> str:
    """The first thing the checker's strict parse and schemas would refuse in a bundle's
    documents (``system.json: mpi_library: string holds a NUL character``), or nothing: a run
    never publishes a bundle its own checker rejects for its form."""
    for name, schema in (*bundle.DOCUMENTS, ("records.jsonl", "record")):
        try:
            data = strict.read_capped(folder / name, strict.CAPS[name])
            docs = ([doc for _, doc in strict.iter_jsonl(data)] if name.endswith(".jsonl")
                    else [bundle.parse_document(name, data)])
        except strict.ParseError as exc:
            return f"{name}: {exc}"
        for doc in docs:
            err = next(errors(doc, schema, rules_version), None)
            if err is not None:
                return f"{name}: {describe(err)}"
    return ""


def write_bundle(out_root: Path, name: str, files: BundleFiles,
                 signing_key: Ed25519PrivateKey | None) -> Path:
    """Write the bundle to ``out_root/.NAME.partial``, sign it, rename it to ``out_root/NAME``."""
    final, tmp = out_root / name, out_root / f".{name}.partial"
    tmp.mkdir(parents=True)
    m, cfg = files.manifest, files.config
    try:
        write_json(tmp / "run.json", m)
        (tmp / "config.yaml").write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
        with open(tmp / "records.jsonl", "w") as fh:
            for r in files.records:
                fh.write(json.dumps(r, sort_keys=True) + "\n")
        write_json(tmp / "summary.json", files.summary)
        write_json(tmp / "system.json", files.system)
        (tmp / "run.log").write_text("\n".join(files.log_lines) + "\n")
        if files.transcript is not None:
            (tmp / "witness.dsse.json").write_bytes(files.transcript)
        problem = self_check(tmp, str(m["rules_version"]))
        if problem:
            raise InternalError(f"the runner wrote a bundle its checker would refuse ({problem}); the "
                                f"partial bundle is removed, please report this with the run's output")
        if signing_key is not None:
            bundle.sign_bundle(
                tmp,
                signing_key,
                bundle.Predicate(
                    run_id=m["run_id"],
                    mlckpt_version=__version__,
                    runner_code_sha256=bundle.code_digest(),
                    rules_version=m["rules_version"],
                    workload=str(m["workload"]),
                    division=str(m["division"]),
                    started=m["started"],
                    ended=m["ended"],
                    extra={"ranks": m["ranks"], "scaled": m["scaled"], "verdict": m["verdict"]},
                ),
            )
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # no half-made folder that could pass for a bundle
        raise
    return final
