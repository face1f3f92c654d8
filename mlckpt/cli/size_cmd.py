"""`mlckpt size`: storage bandwidth for a checkpoint interval and overhead, or the reverse."""

from __future__ import annotations

import argparse
import json
import sys

from mlckpt.cli import hydra_app, serving_flags
from mlckpt.cli.plan_cmd import add_resume_flags, resume_document
from mlckpt.errors import ExitStatus, UsageError
from mlckpt.units import parse_bandwidth, parse_duration, parse_fraction


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "size", help="bandwidth needed for a checkpoint interval (or time for a bandwidth)",
        description="The LLM checkpointing sizer. With --overhead: the write bandwidth that keeps "
        "synchronous checkpointing under that fraction of training time. With --bandwidth: time "
        "per checkpoint, overhead fraction and restore times. Shows its arithmetic.")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="workload overrides, e.g. workload=llama3_405b ranks=512")
    p.add_argument("--interval", default=None, help="time between checkpoints, e.g. 30m, 1h, 600")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--overhead", help="acceptable overhead fraction, e.g. 5%% or 0.05")
    g.add_argument("--bandwidth", help="storage write/read bandwidth, e.g. 100GiB/s or 80GB/s")
    p.add_argument("--mtbf", default=None, help="the job's mean time between failures, e.g. 12h: adds "
                   "the optimal interval (Young/Daly) and the work a failure loses")
    p.add_argument("--stall", default=None, help="asynchronous checkpointing: what training waits per "
                   "checkpoint (e.g. a measured stall, 2s); the checkpoint is safe after the write time")
    p.add_argument("--json", action="store_true")
    hydra_app.add_source_flags(p)
    serving_flags.add_flags(p, "how long to bring serving replicas of the workload's weights from FROM "
                            "(default 0) to TO with --bandwidth of storage, by each loading strategy",
                            metavar="[FROM:]TO")
    add_resume_flags(p, "how long the storage takes, at --bandwidth, to bring M new ranks their state "
                     "from the checkpoint written at the workload's layout")
    g = p.add_argument_group("serving links (each host's; default: not a limit)")
    g.add_argument("--host-link", default=None, metavar="RATE", help="a host's link to the storage")
    g.add_argument("--network", default=None, metavar="RATE", help="a host's network to the other hosts")
    g.add_argument("--node-tier", default=None, metavar="RATE", help="a host's node-local tier, read")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from mlckpt.plan.config import setup  # Hydra and the rules: only when sizing (fast --help)
    from mlckpt.plan.sizer import failure_cost, size

    if args.replicas is not None:
        return _serving(args)
    if args.resume_at is not None:
        return _resume(args)
    if args.interval is None:
        raise UsageError("--interval: give the time between checkpoints (or --replicas to size serving)")
    try:
        interval = parse_duration(args.interval)
        overhead = parse_fraction(args.overhead) if args.overhead is not None else None
        bw = parse_bandwidth(args.bandwidth) if args.bandwidth is not None else None
        mtbf = parse_duration(args.mtbf) if args.mtbf is not None else None
        stall = parse_duration(args.stall) if args.stall is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if stall is not None and mtbf is None:
        raise UsageError("--stall: give --mtbf too (the stall only changes the failure arithmetic)")
    s = setup(hydra_app.aliased(args.overrides), hydra_app.source(args))
    r = size(s.plan, interval, overhead=overhead, bandwidth_bytes_s=bw)
    f = None
    if mtbf is not None:
        f = failure_cost(mtbf, stall if stall is not None else r.write_time_s, r.restore_own_s, interval,
                         durable_after_s=r.write_time_s)
    if args.json:
        doc = r.to_dict()
        if f is not None:
            doc["failures"] = f.to_dict()
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return ExitStatus.OK
    print(f"{s.plan.workload.name} on {s.plan.ranks} ranks, checkpoint every {args.interval}:")
    for step in (*r.steps, *(f.steps if f is not None else ())):
        print(f"  {step}")
    return ExitStatus.OK


def _resume(args: argparse.Namespace) -> int:
    from mlckpt.plan.config import setup
    from mlckpt.plan.resume import resume_text, resume_time_s
    from mlckpt.units import fmt_bytes, fmt_duration

    for flag in ("interval", "overhead", "mtbf", "stall"):
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag}: a checkpoint sizing flag; a resume (--resume-at) takes --bandwidth")
    try:
        bw = parse_bandwidth(args.bandwidth)
    except ValueError as exc:
        raise UsageError(f"--bandwidth: {exc}") from None
    s = setup(hydra_app.aliased(args.overrides), hydra_app.source(args))
    doc = resume_document(args, s.plan)
    seconds = resume_time_s(doc, bw)
    if args.json:
        json.dump({**doc, "bandwidth_bytes_s": bw, "storage_time_s": seconds}, sys.stdout)
        sys.stdout.write("\n")
        return ExitStatus.OK
    print(resume_text(doc))
    ranks, index = doc["resumed"]["ranks"], doc["index_bytes"]
    total = doc["read_bytes"] + ranks * index
    print(f"  the storage's part: ({fmt_bytes(doc['read_bytes'])} + {ranks} x {fmt_bytes(index)} of index) / "
          f"{args.bandwidth} = {fmt_bytes(total)} / {args.bandwidth} = {fmt_duration(seconds)} (at least: "
          "planning and placing add CPU time)")
    return ExitStatus.OK


def _serving(args: argparse.Namespace) -> int:
    from mlckpt.plan.config import setup
    from mlckpt.plan.serving import layout_document, links_document, scale_up_all, scale_up_text
    from mlckpt.workload.serving import Links

    for flag in ("interval", "overhead", "mtbf", "stall"):
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag}: a checkpoint sizing flag; serving (--replicas) takes --bandwidth, "
                             "--host-link, --network and --node-tier")
    start, end = serving_flags.replica_range(args.replicas)
    rates = {}
    for flag in ("bandwidth", "host_link", "network", "node_tier"):
        text = getattr(args, flag)
        try:
            rates[flag] = None if text is None else parse_bandwidth(text)
        except ValueError as exc:
            raise UsageError(f"--{flag.replace('_', '-')}: {exc}") from None
    links = Links(rates["bandwidth"] or 0.0, rates["host_link"], rates["network"], rates["node_tier"])
    s = setup(hydra_app.aliased(args.overrides), hydra_app.source(args))
    layout = serving_flags.layout(args, s.plan.workload, end)
    results = scale_up_all(layout, start, end, links)
    if args.json:
        json.dump({"layout": layout_document(layout), "links": links_document(links), "from_replicas": start,
                   "to_replicas": end, "strategies": [r.to_dict() for r in results]}, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(scale_up_text(layout, results, start, end))
    return ExitStatus.OK
