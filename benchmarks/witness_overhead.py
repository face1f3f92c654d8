"""What a witness costs a run: the same workload witnessed and unwitnessed, in alternated rounds.

    .venv/bin/python benchmarks/witness_overhead.py [--rounds 6] [--scale 0.01] [--ranks 4]
        [--writes 3] [--reads 3] [--folder DIR] [--buffered]

Starts a real `mlckpt witness serve` on the loopback address (fresh key and journal), then runs
``mlckpt run`` ``--rounds`` times each way, alternating (plain, witnessed, plain, ...: drift in the
machine's state hits both alike).  Each run is a real run (mpiexec, fsync inside timing, cold
verified restores) and signs its bundle with a throwaway key.  The figures are read from each
bundle's summary.json (recomputed from its records by the same code the checker uses); for the
witnessed runs also the witness-conservative bandwidth (bytes over the witness's own interval,
as mlckpt-check reports it).  Prints one line per run, then the means and the ratio
witnessed / plain for write and read bandwidth.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlckpt import bundle
from mlckpt.rules import WitnessFacts, witness_figures

BIN = Path(sys.executable).parent


def start_witness(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    """The witness, trusting the runs' signing key (``tmp/org.pem``, made here if missing)."""
    key = tmp / "witness.pem"
    bundle.generate_key(key)
    if not (tmp / "org.pem").exists():
        bundle.generate_key(tmp / "org.pem")
    org = (tmp / "org.pem.pub").read_text().strip()
    (tmp / "trusted.yaml").write_text(f'mlckpt_trusted_keys: "1.0"\norganizations:\n  org: ["{org}"]\n')
    proc = subprocess.Popen([str(BIN / "mlckpt"), "witness", "serve", "--listen", "127.0.0.1:0", "--key",
                             str(key), "--trusted-keys", str(tmp / "trusted.yaml"), "--journal",
                             str(tmp / "journal"), "--opens-per-minute", "1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    m = re.search(r"listening on (http://\S+)", proc.stdout.readline())
    if not m:
        raise SystemExit(f"the witness did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc, m.group(1)


def one_run(args: argparse.Namespace, tmp: Path, url: str | None) -> dict[str, Any]:
    cmd = [str(BIN / "mlckpt"), "run", "preset=none", "workload=llama3_8b", "division=open",
           f"scale={args.scale}", f"ranks={args.ranks}", f"checkpoint.num_writes={args.writes}",
           f"checkpoint.num_reads={args.reads}", f"checkpoint.folder={args.folder}",
           f"io.direct={'false' if args.buffered else 'true'}", f"signing.key={tmp / 'org.pem'}",
           f"output.root={tmp / 'results'}"]
    if url:
        cmd.append(f"witness.url={url}")
    proc = subprocess.run(cmd, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    folder = Path(next(ln for ln in proc.stdout.splitlines() if ln.startswith("bundle: "))[8:])
    summary = json.loads((folder / "summary.json").read_text())
    out = {"write": summary["write_bandwidth_mean_gib_s"], "read": summary["read_bandwidth_mean_gib_s"]}
    if url:
        run = json.loads((folder / "run.json").read_text())
        env = json.loads((folder / "witness.dsse.json").read_text())
        doc = json.loads(base64.b64decode(env["payload"]))
        recs = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
        f = witness_figures(WitnessFacts(run["witness"], True, transcript=doc, records=recs))
        out["witnessed_write"] = f["write_bandwidth_witnessed_mean_gib_s"]
        out["witnessed_read"] = f["read_bandwidth_witnessed_mean_gib_s"]
        out["rtt_ms"] = f["witness_max_rtt_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--writes", type=int, default=3)
    ap.add_argument("--reads", type=int, default=3)
    ap.add_argument("--folder", default="./mlckpt-checkpoints")
    ap.add_argument("--buffered", action="store_true", help="io.direct=false")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlckpt-witness-overhead-") as t:
        tmp = Path(t)
        bundle.generate_key(tmp / "org.pem")
        witness, url = start_witness(tmp)
        plain: list[dict[str, Any]] = []
        witnessed: list[dict[str, Any]] = []
        try:
            for k in range(args.rounds):
                for kind, sink, u in (("plain", plain, None), ("witnessed", witnessed, url)):
                    r = one_run(args, tmp, u)
                    sink.append(r)
                    extra = (f"  (witness's clock: write {r['witnessed_write']:.3f}, "
                             f"read {r['witnessed_read']:.3f}; max rtt {r['rtt_ms']:.1f} ms)" if u else "")
                    print(f"round {k + 1} {kind:9s} write {r['write']:.3f} GiB/s  "
                          f"read {r['read']:.3f} GiB/s{extra}", flush=True)
        finally:
            witness.terminate()
            witness.wait(timeout=10)
    for op in ("write", "read"):
        a = statistics.mean(r[op] for r in plain)
        b = statistics.mean(r[op] for r in witnessed)
        sa, sb = statistics.stdev(r[op] for r in plain), statistics.stdev(r[op] for r in witnessed)
        c = statistics.mean(r[f"witnessed_{op}"] for r in witnessed)
        pairs = [w[op] / p[op] for p, w in zip(plain, witnessed, strict=True)]
        print(f"{op}: plain {a:.3f} ± {sa:.3f} GiB/s, witnessed {b:.3f} ± {sb:.3f} GiB/s, ratio {b / a:.3f} "
              f"(paired rounds {min(pairs):.3f}..{max(pairs):.3f}, median {statistics.median(pairs):.3f}); "
              f"by the witness's clock {c:.3f} GiB/s "
              f"({c / b:.3f} of the witnessed runs' own figure)")


if __name__ == "__main__":
    main()
