"""One run's report in the terminal (the tables of the page) and its ops as CSV."""

from __future__ import annotations

import csv
import io

from tabulate import tabulate

from mlckpt.report.model import OP_COLUMNS, Report
from mlckpt.units import fmt_figure

SHOWN = ("op", "index", "tier", "duration_s", "bandwidth_gib_s", "slowest_rank", "straggler_ratio", "iops",
         "p50_ms", "p99_ms", "max_ms", "open_s", "transfer_s", "fsync_s", "dir_fsync_s")


def _num(v: object) -> object:
    return fmt_figure(v) if isinstance(v, float) else ("" if v is None else v)


def render(rep: Report) -> str:
    out = [f"{rep.title}: verdict {rep.verdict}", ""]
    out.append(tabulate(list(rep.facts), tablefmt="plain"))
    if rep.findings:
        out += ["", "findings:", *(f"  {f}" for f in rep.findings)]
    out += ["", tabulate([[_num(o.get(c)) for c in SHOWN] for o in rep.ops], headers=list(SHOWN),
                         tablefmt="simple", disable_numparse=True)]
    if rep.latency:
        rows = [[kind, int(p["count"]), *(f"{p[k]:.4g}" for k in ("p50", "p90", "p99", "p99_9", "max"))]
                for kind, p in rep.latency.items()]
        out += ["", "request latency (ms, every request of every rank; HdrHistogram, within 1 %):",
                tabulate(rows, headers=["op", "requests", "p50", "p90", "p99", "p99.9", "max"],
                         tablefmt="simple", disable_numparse=True)]
    return "\n".join(out) + "\n"


def csv_text(rep: Report) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(OP_COLUMNS), lineterminator="\n")
    w.writeheader()
    for o in rep.ops:
        w.writerow({c: ("" if o.get(c) is None else o.get(c)) for c in OP_COLUMNS})
    return buf.getvalue()
