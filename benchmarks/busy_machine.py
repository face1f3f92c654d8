"""Honest runs beside another tenant of the machine: how many come out valid, disturbed, invalid.

Starts benchmarks/lab/tenant.py on the checkpoint disk (a file copy paced to --tenant-mb-s, 0 for flat out,
plus --busy-cores spinning cores), then runs `mlckpt run` --runs times for each preset, under each
rules version named, alternating, and tallies the verdicts, the rules that fired and the foreign
share each run recorded.  The false-alarm rate before and after rules 1.8 is the share of honest
runs called invalid under 1.7 and under 1.8.

    python benchmarks/busy_machine.py --runs 20 --tenant-mb-s 250 --busy-cores 1
    python benchmarks/busy_machine.py --runs 5 --tenant-mb-s 0 --rules 1.8
    python benchmarks/busy_machine.py --runs 5 --tenant-mb-s -1 --presets r64   # no tenant
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MLCKPT = Path(sys.executable).parent / "mlckpt"
TENANT = HERE / "lab" / "tenant.py"
PRESETS = {
    "default": (),  # the README's quick start: the laptop preset
    "tiny": ("division=open", "scale=0.0005", "ranks=4", "checkpoint.num_writes=1", "checkpoint.num_reads=1",
             "io.direct=false"),  # the tests' scale (tests/conftest.py)
    "r16": ("division=open", "scale=0.002", "ranks=16", "checkpoint.num_writes=2", "checkpoint.num_reads=2"),
    "r64": ("division=open", "scale=0.004", "ranks=64", "checkpoint.num_writes=2", "checkpoint.num_reads=2"),
}
FINDING = re.compile(r"^finding: \[([A-Z0-9-]+)\]")


def one_run(work: Path, preset: str, rules: str) -> dict[str, object]:
    args = [str(MLCKPT), "run", *PRESETS[preset], f"rules_version={rules}", "signing.key=none",
            "output.root=results", "checkpoint.folder=ck"]
    t0 = time.monotonic()
    proc = subprocess.run(args, cwd=work, text=True, capture_output=True, timeout=1200, check=False)
    took = round(time.monotonic() - t0, 1)
    out = {"preset": preset, "rules": rules, "status": proc.returncode, "seconds": took,
           "rules_fired": sorted({m.group(1) for ln in proc.stdout.splitlines() if (m := FINDING.match(ln))})}
    bundle = [ln[len("bundle: "):] for ln in proc.stdout.splitlines() if ln.startswith("bundle: ")]
    if bundle:
        run = json.loads((Path(bundle[0]) / "run.json").read_text())
        summary = json.loads((Path(bundle[0]) / "summary.json").read_text())
        out["verdict"] = run["verdict"]
        foreign = summary.get("foreign") or {}
        for key in ("foreign_share", "foreign_cpu_share"):
            out[key] = {op: (foreign.get(op) or {}).get(key) for op in ("write", "read")}
        out["worst_op_share"] = {op: ((foreign.get(op) or {}).get("worst") or {}).get("foreign_share")
                                 for op in ("write", "read")}
        out["write_gib_s"] = summary.get("write_bandwidth_mean_gib_s")
    else:
        out["verdict"] = "no bundle"
        out["error"] = proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else []
    return out


def rejudged(bundle: Path, version: str | None = None) -> dict[str, object]:
    """A kept bundle's verdict under today's result-stage rules of its own version, or of
    ``version`` (its gate findings as recorded), and the summary's foreign block recomputed: to
    try other bounds on the same measurements."""
    import yaml

    from mlckpt.rules import RunData, load_rules, recomputed_summary, verdict
    from mlckpt.rules.engine import Context, Finding
    from mlckpt.workload.layout import make_plan
    from mlckpt.workload.model import workload_from_config

    run = json.loads((bundle / "run.json").read_text())
    config = yaml.safe_load((bundle / "config.yaml").read_text())
    recs = [json.loads(ln) for ln in (bundle / "records.jsonl").read_text().splitlines()]
    system = json.loads((bundle / "system.json").read_text())
    rs = load_rules(version or run["rules_version"])
    workload = workload_from_config(config["workload"])
    plan = make_plan(workload, int(run["ranks"]), float(config["scale"]))
    d = RunData(run, config, {}, recs, system)
    d = RunData(run, config, recomputed_summary(rs, d, plan), recs, system)
    at_result = {r.id for r in rs.rules if "result" in r.stages}
    findings = [Finding(f["rule"], f["severity"], f["message"]) for f in run["findings"]
                if f["rule"] not in at_result]
    findings += rs.evaluate(Context(config, workload, plan=plan, complete=True, run=d), ["result"]).findings
    from mlckpt.attribution import backgrounds, spans, watched_rate_share
    from mlckpt.rules import counted_op

    seen = {b.host: b for b in backgrounds(run)}
    skew = skew_share(rs, d)
    watched = [watched_rate_share(seen[sp.host], sp) for sp in spans(recs, lambda r: counted_op(d, r))
               if sp.host in seen]
    return {"verdict": verdict(findings, run["division"]),
            "rules_fired": sorted({f.rule for f in findings if f.severity != "warning"}),
            "foreign": d.summary.get("foreign"), "watched": max(watched, default=None), "skew_share": skew,
            "training_share": training_share(rs, d)}


def skew_share(rs: Any, d: Any) -> float:
    """The largest barrier skew of any op on any host, as a share of RECORDS-SKEW's bound there."""
    from mlckpt.metrics import group_ops
    from mlckpt.rules import abs_bound_ns

    b = rs.data["evidence"]["start_skew"]
    worst = 0.0
    for recs in group_ops(d.records).values():
        for host in {str(r["host"]) for r in recs}:
            mine = [r for r in recs if str(r["host"]) == host]
            t0 = [int(r["t0_ns"]) for r in mine]
            dur = max(int(r["t1_ns"]) - int(r["t0_ns"]) for r in mine)
            bound = abs_bound_ns(rs, d, host, "skew_ns", float(b["abs_s"])) + float(b["rel"]) * dur
            worst = max(worst, (max(t0) - min(t0)) / bound)
    return worst


def training_share(rs: Any, d: Any) -> float | None:
    """The longest wait from the last rank's training to the next checkpoint's barrier (as
    TRAINING-INTERVAL takes it), as a share of that rule's bound; None under rules without it."""
    from mlckpt.rules import training_waits

    if "training" not in rs.data:
        return None
    b = rs.data["training"]
    return max((wait / (float(b["gap_floor_s"]) * 1e9 + float(b["gap_rel"]) * trained)
                for _, wait, trained in training_waits(d.records)), default=0.0)


def rejudge(folders: list[Path], version: str | None) -> int:
    rows: dict[tuple[int, str], list[dict[str, object]]] = {}
    for folder in folders:
        for b in sorted((folder / "results").glob("*/run.json")):
            run = json.loads(b.read_text())
            judged = f"{run['rules_version']} as {version}" if version else str(run["rules_version"])
            rows.setdefault((int(run["ranks"]), judged), []).append(rejudged(b.parent, version))
    for (ranks, rules), rs in sorted(rows.items()):
        fired = Counter(f for r in rs for f in r["rules_fired"])  # type: ignore[attr-defined]
        blocks: list[dict[str, Any]] = [r["foreign"] for r in rs if r["foreign"]]  # type: ignore[misc]
        shares = [max(b[op]["foreign_share"] for op in ("write", "read") if b.get(op)) for b in blocks]
        rate = [b["span"]["foreign_rate_share"] for b in blocks if b.get("span")]
        watched = [float(r["watched"]) for r in rs if r.get("watched") is not None]  # type: ignore[arg-type]
        trained = [float(str(r["training_share"])) for r in rs if r.get("training_share") is not None]
        print(f"{ranks:3d} ranks, rules {rules}: {dict(Counter(str(r['verdict']) for r in rs))}; rules fired "
              f"{dict(fired)}" + (f"; phase share max {max(shares):.2f}" if shares else "")
              + (f"; span rate share max {max(rate):.2f}" if rate else "")
              + (f"; watched rate share (1.9) max {max(watched):.2f}" if watched else "")
              + f"; barrier skew max {max(float(str(r['skew_share'])) for r in rs):.2f} of its bound"
              + (f"; training gap max {max(trained):.2f} of its bound" if trained else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--presets", default="default,tiny,r16")
    ap.add_argument("--rules", default="1.7,1.8", help="rules versions to alternate")
    ap.add_argument("--tenant-mb-s", type=float, default=250.0, help="-1: no tenant; 0: flat out")
    ap.add_argument("--busy-cores", type=int, default=1)
    ap.add_argument("--bursty", action="store_true", help="the tenant's writes reach the disk at each fsync")
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a new one under /tmp)")
    ap.add_argument("--json", type=Path, default=None, help="write every run's row here")
    ap.add_argument("--rejudge", type=Path, nargs="+", default=None,
                    help="no runs: the bundles kept under these work folders, judged by today's rules "
                         "(of --rejudge-as, if given, instead of each bundle's own version)")
    ap.add_argument("--rejudge-as", default=None, help="with --rejudge: the rules version to judge by")
    a = ap.parse_args(argv)
    if a.rejudge:
        return rejudge(a.rejudge, a.rejudge_as)
    work = a.dir or Path(tempfile.mkdtemp(prefix="mlckpt-busy-"))
    work.mkdir(parents=True, exist_ok=True)
    tenant = None
    if a.tenant_mb_s >= 0:
        tenant = subprocess.Popen([sys.executable, str(TENANT), "--dir", str(work / "tenant"), "--rate-mb-s",
                                   str(a.tenant_mb_s), "--busy-cores", str(a.busy_cores), "--seconds", "7200",
                                   *(["--bursty"] if a.bursty else [])])
        time.sleep(3)  # the tenant's first file is under way
    rows = []
    try:
        for _ in range(a.runs):
            for preset in a.presets.split(","):
                for rules in a.rules.split(","):
                    row = one_run(work, preset, rules)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        if tenant is not None:
            tenant.terminate()
            tenant.wait(timeout=60)
    rate = "none" if a.tenant_mb_s < 0 else ("flat out" if not a.tenant_mb_s else f"{a.tenant_mb_s:.0f} MB/s")
    print(f"\ntenant: {rate}, busy cores {a.busy_cores if a.tenant_mb_s >= 0 else 0}")
    for preset in a.presets.split(","):
        for rules in a.rules.split(","):
            mine = [r for r in rows if r["preset"] == preset and r["rules"] == rules]
            verdicts = Counter(str(r["verdict"]) for r in mine)
            fired = Counter(f for r in mine for f in r["rules_fired"])
            shares = [max(v for v in r.get("foreign_share", {}).values() if v is not None)
                      for r in mine if any(v is not None for v in r.get("foreign_share", {}).values())]
            share = (f", foreign share max {max(shares):.1%} median {sorted(shares)[len(shares) // 2]:.1%}"
                     if shares else "")
            print(f"{preset:8s} rules {rules}: {dict(verdicts)}; rules fired {dict(fired)}{share}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
