"""Step 7 of a bundle's check (rules 1.4): its witness.  The transcript is opened (the witness's
own signature, then its schema) and the facts go to the WITNESS-* rules
(mlckpt/rules/checks/witness.py), which hold the records against it."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from checker.rulesets import schema_message
from checker.state import State
from mlckpt import bundle
from mlckpt.rules.checks.witness import TRANSCRIPT, WitnessFacts, figures
from mlckpt.schemas import validator
from mlckpt.strict import ParseError
from mlckpt.witness.protocol import TRANSCRIPT_TYPE


def stage_witness(st: State) -> None:
    """Collect the witness facts of a bundle whose rules version knows witnesses."""
    assert st.verified is not None and st.rules is not None and st.folder is not None
    if not any(r.id.startswith("WITNESS-") for r in st.rules.rules):
        return  # an older rules version: run.json has no witness to speak of
    run = st.docs["run.json"]
    claim = run.get("witness")
    present = TRANSCRIPT in st.verified.files
    facts = WitnessFacts(claim, present, run=run, records=st.records, plan_digest=st.plan_digest,
                         trust_list=st.task.witnesses is not None)
    if present and claim and claim.get("status") == "witnessed":
        facts = _opened(st, facts)
    st.witness = facts


def _opened(st: State, facts: WitnessFacts) -> WitnessFacts:
    assert st.verified is not None and st.rules is not None and st.folder is not None
    try:
        data = bundle.read_document(st.folder, TRANSCRIPT, st.verified)
        doc, signer, _ = bundle.open_envelope(data, TRANSCRIPT_TYPE)
    except (ParseError, ValueError) as exc:
        return replace(facts, problem=str(exc))
    errors = list(itertools.islice(validator("witness-transcript", st.rules.version).iter_errors(doc), 1))
    if errors:
        return replace(facts, signer=signer, problem=f"not a witness transcript: {schema_message(errors[0])}")
    trusted = st.task.witnesses.org_for(signer) if st.task.witnesses is not None else None
    return replace(facts, signer=signer, transcript=doc, trusted_as=trusted)


def witness_doc(f: WitnessFacts) -> dict[str, Any]:
    """The report's ``witness`` of a bundle whose run asked for one (witnessed, or lost mid-run)."""
    claim = f.claim or {}
    return {"by": f.trusted_as, "keyid": str(claim.get("keyid")), "endpoint": str(claim.get("endpoint")),
            "status": str(claim.get("status")), "counted": f.witnessed, **figures(f)}
