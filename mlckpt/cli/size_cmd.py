"""`mlckpt size`: storage bandwidth for a checkpoint interval and overhead, or the reverse."""

from __future__ import annotations

import argparse
import json
import sys

from mlckpt.errors import UsageError
from mlckpt.plan.config import setup
from mlckpt.plan.sizer import size
from mlckpt.units import parse_bandwidth, parse_duration, parse_fraction


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "size", help="bandwidth needed for a checkpoint interval (or time for a bandwidth)",
        description="The LLM checkpointing sizer. With --overhead: the write bandwidth that keeps "
        "synchronous checkpointing under that fraction of training time. With --bandwidth: time "
        "per checkpoint, overhead fraction and restore times. Shows its arithmetic.")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="workload overrides, e.g. workload=llama3_405b ranks=512")
    p.add_argument("--interval", required=True, help="time between checkpoints, e.g. 30m, 1h, 600")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--overhead", help="acceptable overhead fraction, e.g. 5%% or 0.05")
    g.add_argument("--bandwidth", help="storage write/read bandwidth, e.g. 100GiB/s or 80GB/s")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    try:
        interval = parse_duration(args.interval)
        overhead = parse_fraction(args.overhead) if args.overhead is not None else None
        bw = parse_bandwidth(args.bandwidth) if args.bandwidth is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    s = setup(args.overrides)
    r = size(s.plan, interval, overhead=overhead, bandwidth_bytes_s=bw)
    if args.json:
        json.dump(r.to_dict(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    print(f"{s.plan.workload.name} on {s.plan.ranks} ranks, checkpoint every {args.interval}:")
    for step in r.steps:
        print(f"  {step}")
    return 0
