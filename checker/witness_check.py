"""Step 7 of a bundle's check (rules 1.4): its witness.  The transcript is opened (the witness's
own signature, then its schema) and the facts go to the WITNESS-* rules
(mlckpt/rules/checks/witness.py), which hold the records against it."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

from checker.bundle_state import State
from checker.rulesets import schema_message
from mlckpt import bundle, dsse
from mlckpt.errors import EnvelopeError
from mlckpt.rules import TRANSCRIPT, WitnessFacts, witness_figures, witness_too_short
from mlckpt.rules.engine import RuleSet
from mlckpt.schemas import errors as schema_errors
from mlckpt.strict import ParseError
from mlckpt.witness.protocol import TRANSCRIPT_TYPE


def stage_witness(state: State) -> None:
    """Collect the witness facts of a bundle whose rules version knows witnesses."""
    assert state.verified is not None and state.rules is not None and state.folder is not None
    if not any(r.id.startswith("WITNESS-") for r in state.rules.rules):
        return  # an older rules version: run.json has no witness to speak of
    run = state.docs["run.json"]
    claim = run.get("witness")
    present = TRANSCRIPT in state.verified.files
    facts = WitnessFacts(claim, present, run=run, records=state.records, plan_digest=state.plan_digest,
                         trust_list=state.task.witnesses is not None, bundle_signer=state.verified.keyid)
    if present and claim and claim.get("status") == "witnessed":
        facts = _opened(state, facts)
    state.witness = facts


def open_transcript(folder: Path, vb: bundle.VerifiedBundle, version: str
                    ) -> tuple[dict[str, object] | None, str | None, str | None]:
    """The bundle's transcript: (document, signer's key id, None) when the witness's signature
    over it holds and it matches its schema; otherwise (None, signer or None, why not)."""
    try:
        data = bundle.read_document(folder, TRANSCRIPT, vb)
        doc, signer, _ = dsse.open_signed(data, TRANSCRIPT_TYPE)
    except (ParseError, EnvelopeError) as exc:  # unreadable as signed, or not a sound envelope
        return None, None, str(exc)
    errors = list(itertools.islice(schema_errors(doc, "witness-transcript", version), 1))
    if errors:
        return None, signer, f"not a witness transcript: {schema_message(errors[0])}"
    return dict(doc), signer, None


def transcript_of(state: State) -> tuple[dict[str, object] | None, str | None, str | None]:
    """The bundle's transcript opened once (the result rules and the witness stage both read it)."""
    assert state.verified is not None and state.rules is not None and state.folder is not None
    if state.transcript is None:
        state.transcript = open_transcript(state.folder, state.verified, state.rules.version)
    return state.transcript


def _opened(state: State, facts: WitnessFacts) -> WitnessFacts:
    doc, signer, problem = transcript_of(state)
    if doc is None:
        return replace(facts, signer=signer, problem=problem)
    trusted = state.task.witnesses.org_for(str(signer)) if state.task.witnesses is not None else None
    return replace(facts, signer=signer, transcript=doc, trusted_as=trusted)


def compare_side(folder: Path, vb: bundle.VerifiedBundle, run: dict[str, object],
                 records: list[dict[str, object]],
                 witnesses: bundle.TrustedKeys | None) -> dict[str, object] | None:
    """What ``compare`` shows of a bundle's witness (integrity only, as compare is): the claim,
    whether the transcript's signature holds, who signed it, the witness-conservative figures."""
    claim = run.get("witness")
    if not isinstance(claim, dict):
        return None
    out: dict[str, object] = {"status": claim.get("status"), "endpoint": claim.get("endpoint"),
                           "keyid": claim.get("keyid"), "transcript": None, "by": None}
    if claim.get("status") == "witnessed" and TRANSCRIPT in vb.files:
        doc, signer, problem = open_transcript(folder, vb, str(run.get("rules_version")))
        out["transcript"] = problem or ("signature holds" if signer == claim.get("keyid")
                                        else f"signed by {str(signer)[:16]}…, not run.json's witness")
        if doc is not None and signer == claim.get("keyid"):
            out["by"] = witnesses.org_for(str(signer)) if witnesses is not None else None
            out.update(witness_figures(WitnessFacts(claim, True, transcript=doc, records=records)))
    return out


def witness_doc(facts: WitnessFacts, held: bool = True, rules: RuleSet | None = None) -> dict[str, object]:
    """The report's ``witness`` of a bundle whose run asked for one (witnessed, or lost mid-run).
    Counted as witnessed only when the records held against the transcript (``held``: no WITNESS-*
    rule failed).  Rules 1.10: ``unbounded`` names the ops the witness bounds only loosely."""
    claim = facts.claim or {}
    out = {"by": facts.trusted_as, "keyid": str(claim.get("keyid")), "endpoint": str(claim.get("endpoint")),
           "status": str(claim.get("status")), "counted": facts.witnessed and held, **witness_figures(facts)}
    short = witness_too_short(facts, rules) if rules is not None and facts.claimed else []
    if short:
        out["unbounded"] = short
    return out
