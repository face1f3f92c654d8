"""`mlckpt goodput BUNDLE --mtbf 3h` (or `--gpus N --gpu-mtbf H`): the checkpoint interval that
maximises goodput for the costs a checkpoint run measured, the goodput it gives, the work a failure
loses, and the shortest interval persisting keeps up with (mlckpt/plan/goodput.py: the model)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlckpt.errors import ExitStatus, UsageError

if TYPE_CHECKING:  # the model loads numpy and the rules: only when the command runs (fast --help)
    from mlckpt.plan.goodput import Goodput, Measured


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "goodput", help="the checkpoint interval that maximises goodput, from a run's measured costs",
        description="From a checkpoint run's records: the mean stall, time to durable and restore per "
        "checkpoint, projected to its workload's full checkpoint at the rates measured; with the job's "
        "mean time between failures, the interval that maximises goodput (Daly's model, solved "
        "exactly), beside Young's and Daly's estimates, the goodput it gives, the work a failure loses, "
        "and the shortest interval persisting keeps up with. Shows its arithmetic.")
    p.add_argument("bundle", type=Path, help="a checkpoint run's result folder (mlckpt run's bundle)")
    p.add_argument("--mtbf", default=None, help="the job's mean time between failures, e.g. 3h")
    p.add_argument("--gpus", type=int, default=None, help="the job's GPUs (with --gpu-mtbf)")
    p.add_argument("--gpu-mtbf", default=None, help="one GPU's mean time between failures (of anything "
                   "that stops the job), e.g. 50000h: the job's is this over --gpus")
    p.add_argument("--interval", default=None, help="also the goodput at this interval, e.g. 30m")
    p.add_argument("--as-run", action="store_true", help="the costs as measured, not projected to the "
                   "full checkpoint (a scaled run's own bytes)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=handle)


def job_mtbf(args: argparse.Namespace) -> tuple[float, str]:
    """The job's MTBF in seconds, and how it was given."""
    from mlckpt.units import fmt_duration, parse_duration

    per_gpu = args.gpus is not None or args.gpu_mtbf is not None
    if (args.mtbf is None) == (not per_gpu) or (per_gpu and (args.gpus is None or args.gpu_mtbf is None)):
        raise UsageError("--mtbf: give the job's MTBF (--mtbf 3h), or --gpus N with --gpu-mtbf H",
                         key="--mtbf")
    flag = "--mtbf" if args.mtbf is not None else "--gpu-mtbf"
    try:
        if args.mtbf is not None:
            mtbf = parse_duration(args.mtbf)
            how = "given"
        else:
            if args.gpus < 1:
                flag = "--gpus"
                raise ValueError(f"the job's GPUs, at least 1 (not {args.gpus})")
            gpu = parse_duration(args.gpu_mtbf)
            mtbf, how = gpu / args.gpus, f"{fmt_duration(gpu)} per GPU ÷ {args.gpus} GPUs"
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}", key=flag) from None
    if mtbf <= 0:
        raise UsageError("--mtbf: the job's MTBF must be positive", key="--mtbf")
    return mtbf, how


def handle(args: argparse.Namespace) -> int:
    from mlckpt.cli.report_cmd import signature_status
    from mlckpt.plan import goodput
    from mlckpt.units import parse_duration

    mtbf, how = job_mtbf(args)
    try:
        interval = parse_duration(args.interval) if args.interval is not None else None
    except ValueError as exc:
        raise UsageError(f"--interval: {exc}", key="--interval") from None
    run, config, records = _read(args.bundle)
    try:
        m = goodput.measured(records, config, run.get("framework"))
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{args.bundle}: {exc}", key="bundle") from None
    costs = m.as_run if args.as_run else m.costs
    g = goodput.best(costs, mtbf)
    at = (interval, goodput.goodput_at(interval, costs, mtbf),
          goodput.lost_per_failure(interval, costs, mtbf)) if interval else None
    signature = signature_status(args.bundle)
    if args.json:
        doc: dict[str, object] = {"bundle": str(args.bundle), "signature": signature, "measured": m.to_dict(),
                               "projected": not args.as_run, "mtbf_how": how, **g.to_dict()}
        if at is not None:
            doc["at_interval"] = {"interval_s": at[0], "goodput": at[1], "lost_per_failure_s": at[2]}
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return ExitStatus.OK
    print(text(args.bundle.name, config, m, g, how, signature, not args.as_run, at), end="")
    return ExitStatus.OK


def text(name: str, config: dict[str, Any], m: Measured, g: Goodput, how: str, signature: str,
         projected: bool, at: tuple[float, float, float] | None) -> str:
    from mlckpt.units import fmt_duration as d

    c = g.costs
    a = m.as_run
    lines = [f"{config['workload']['name']} on {config['ranks']} ranks ({name}): {m.writes} checkpoint(s) "
             f"and {m.reads} restore(s) averaged; signature {signature}",
             f"measured per checkpoint (scale {config['scale']}): stall C = {a.stall_s:.3f} s, safe after "
             f"D = {a.durable_s:.3f} s, restore R = {a.restore_s:.3f} s"]
    if projected:
        lines.append(f"at full size (× {m.write_scale:.4g} of the bytes written, × {m.read_scale:.4g} read, "
                     f"at the measured rates): C = {d(c.stall_s)}, D = {d(c.durable_s)}, "
                     f"R = {d(c.restore_s)}")
    lines += [
        f"job MTBF M = {d(g.mtbf_s)} ({how})",
        f"interval that maximises goodput: τ* = M·(1 + W₀(−e^(−1−C/M))) = {d(g.optimal_s)} "
        f"(Young √(2CM) = {d(g.young_s)}, Daly = {d(g.daly_s)})",
        f"persisting keeps up with any interval from D − C = {d(g.keep_up_s)}"
        + (f": the interval to choose is {d(g.interval_s)}" if g.interval_s > g.optimal_s else ""),
        f"at {d(g.interval_s)}: goodput G = τ / (M·e^((R+D−C)/M)·(e^((τ+C)/M) − 1)) = {g.goodput:.2%}; "
        f"work lost per failure {d(g.lost_per_failure_s)}",
    ]
    if at is not None:
        lines.append(f"at {d(at[0])}: goodput {at[1]:.2%}; work lost per failure {d(at[2])}")
    return "".join(f"  {line}\n" if i else f"{line}\n" for i, line in enumerate(lines))


def _read(folder: Path) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """run.json, config.yaml and the records of a checkpoint run's result folder (UsageError naming
    what is missing, unreadable, or not a checkpoint run's)."""
    from mlckpt import strict

    try:
        run = strict.parse_json((folder / "run.json").read_bytes())
        config = strict.parse_yaml((folder / "config.yaml").read_bytes())
        records = [strict.parse_json(line) for line in (folder / "records.jsonl").read_bytes().splitlines()
                   if line.strip()]
    except (OSError, ValueError) as exc:
        raise UsageError(f"{folder}: not a readable result folder ({exc})", key="bundle") from None
    if not isinstance(run, dict) or not isinstance(config, dict):
        raise UsageError(f"{folder}: run.json and config.yaml must be mappings", key="bundle")
    if run.get("serving") or (config.get("serving") or {}).get("strategy"):
        raise UsageError(f"{folder}: a serving run loads weights and writes no checkpoint; goodput needs a "
                         "checkpoint run's bundle", key="bundle")
    if run.get("verdict") == "invalid":
        raise UsageError(f"{folder}: its verdict is invalid (see mlckpt report); goodput is worth working "
                         "out only from a result", key="bundle")
    return run, config, records
