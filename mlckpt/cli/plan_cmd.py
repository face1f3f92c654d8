"""`mlckpt plan OVERRIDES [--json]`: what a workload writes, where, and whether it is closed."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from mlckpt.cli import hydra_app, serving_flags
from mlckpt.errors import ExitStatus
from mlckpt.workload.layout import Plan
from mlckpt.workload.model import Workload

if TYPE_CHECKING:
    from collections.abc import Mapping

    from mlckpt.rules.engine import Evaluation


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="size a workload and judge it against the rules",
                       description="Size a workload (per-rank files and bytes, totals, memory, "
                       "disk) and give its verdict: closed, open or invalid.")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="Hydra overrides, e.g. workload=llama3_70b ranks=64 hosts=16 accelerator=h100")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--files", action=argparse.BooleanOptionalAction, default=None,
                   help="list each layout's files (default: when there are at most 8 layouts)")
    hydra_app.add_source_flags(p)
    serving_flags.add_flags(p, "plan serving the workload's weights with N replicas instead of training "
                            "it: bytes per GPU, per replica, per host")
    add_resume_flags(p, "plan resuming this workload's checkpoint, written at its ranks, at M new ranks: "
                     "each new rank's state and the byte ranges of old files it reads")
    p.set_defaults(func=handle)


def add_resume_flags(p: argparse.ArgumentParser, help_text: str) -> None:
    """The resume flags `plan` and `size` share."""
    g = p.add_argument_group("resume at another scale (the checkpoint written at the workload's layout)")
    g.add_argument("--resume-at", type=int, default=None, metavar="M", help=help_text)
    g.add_argument("--resume-tp", type=int, default=None, metavar="T",
                   help="the new tensor parallelism (default: the written layout's)")
    g.add_argument("--resume-pp", type=int, default=None, metavar="P",
                   help="the new pipeline parallelism (default: the written layout's)")


def resume_document(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    """The resume ``--resume-at`` asks for, as a document (UsageError naming the flag where the new
    layout cannot be)."""
    from mlckpt.errors import ConfigError, UsageError
    from mlckpt.plan.resume import plan_resume
    from mlckpt.plan.resume import resume_document as document

    for flag in ("resume_at", "resume_tp", "resume_pp"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')}: expected a positive number, got {value}")
    try:
        return document(plan, plan_resume(plan, args.resume_at, args.resume_tp, args.resume_pp))
    except ConfigError as exc:
        flag = {"scale": "scale"}.get(exc.key or "", "--resume-at")
        raise UsageError(f"{flag}: {exc.message.removeprefix('resume: ')}") from None


def handle(args: argparse.Namespace) -> int:
    from mlckpt.plan.config import setup  # Hydra and the rules: only when a plan is made (fast --help)
    from mlckpt.plan.report import plan_document, plan_text

    s = setup(hydra_app.aliased(args.overrides), hydra_app.source(args))
    if args.replicas is not None:
        return _serving(args, s.plan.workload)
    if args.resume_at is not None:
        return _resume(args, s.plan)
    ctx = s.context()
    ev = s.rules.evaluate(ctx, ["config"])
    if ctx.kind == "serving":
        return _serving_run(args, s.config, ev)
    if ctx.kind == "resume":
        return _resume_run(args, s.config, ev)
    doc = plan_document(s.plan, dict(s.config), ev, ctx)
    if args.json:
        json.dump(doc, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        print(plan_text(doc, s.plan, files=args.files))
    # A plan that can never be valid is a rule failure (exit 1); closed and open are answers.
    return ExitStatus.FAILED if doc["verdict"] == "invalid" else ExitStatus.OK


def _resume(args: argparse.Namespace, plan: Plan) -> int:
    from mlckpt.plan.resume import resume_text

    doc = resume_document(args, plan)
    if args.json:
        json.dump(doc, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        print(resume_text(doc))
    return ExitStatus.OK


def _resume_run(args: argparse.Namespace, config: Mapping[str, object], ev: Evaluation) -> int:
    """A resume run's plan (``resume.from_ranks`` set): both layouts, who reads what, and the config
    rules' verdict on it (a run the rules refuse has no plan: the findings say why)."""
    from mlckpt.plan.resume import resume_document as document
    from mlckpt.plan.resume import resume_text
    from mlckpt.rules import verdict
    from mlckpt.workload.resume_run import ResumeRun

    run = ResumeRun.of(config)
    assert run is not None
    found = verdict(ev.findings, str(config["division"]))
    doc = {"resume": run.block(), "verdict": found, "findings": [f.to_dict() for f in ev.findings]}
    if found != "invalid":
        doc.update(document(run.written, run.plan))
    if args.json:
        json.dump(doc, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        if found != "invalid":
            print(resume_text(doc))
        for f in ev.findings:
            print(f"  [{f.rule}] {f.message}")
        print(f"\nVerdict: {found}")
    return ExitStatus.FAILED if found == "invalid" else ExitStatus.OK


def _serving(args: argparse.Namespace, workload: Workload) -> int:
    from mlckpt.errors import UsageError
    from mlckpt.plan.serving import layout_document, layout_text

    try:
        replicas = int(args.replicas)
    except ValueError:
        raise UsageError(f"--replicas: expected a number of replicas, got {args.replicas!r}") from None
    layout = serving_flags.layout(args, workload, replicas)
    if args.json:
        json.dump(layout_document(layout), sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        print(layout_text(layout))
    return ExitStatus.OK


def _serving_run(args: argparse.Namespace, config: Mapping[str, object], ev: Evaluation) -> int:
    """A serving run's plan (``serving.strategy`` set): its layout, who reads what, and the config
    rules' verdict on it."""
    from mlckpt.plan.serving import layout_document, layout_text
    from mlckpt.rules import verdict
    from mlckpt.workload.serving_load import placement
    from mlckpt.workload.serving_run import ServingRun

    run = ServingRun.of(config)
    assert run is not None
    layout = run.layout(config)
    found = verdict(ev.findings, str(config["division"]))
    if args.json:
        planned = run.plan(config, placement(layout))
        doc = {**layout_document(layout), "serving": run.block(), "verdict": found,
               "per_load": {"placed_bytes": planned.placed_bytes, "storage_bytes": planned.storage_bytes},
               "findings": [f.to_dict() for f in ev.findings]}
        json.dump(doc, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        print(layout_text(layout))
        planned = run.plan(config, placement(layout))  # as `size` places them; a run places its own
        print(f"\nserving run: {run.strategy}, {run.loads} loads"
              + (f", scaled ×{run.scale:g} (each file whole pages)" if run.scale != 1 else "")
              + f": {planned.placed_bytes / 1e9:,.3f} GB placed and {planned.storage_bytes / 1e9:,.3f} GB "
              "from the storage per load")
        for f in ev.findings:
            print(f"  finding: [{f.rule}] ({f.severity}) {f.message}")
        print(f"Verdict: {found}")
    return ExitStatus.FAILED if found == "invalid" else ExitStatus.OK
