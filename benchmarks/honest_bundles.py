#!/usr/bin/env python3
"""No false alarms: many honest bundles from the real runner, across modes, rank counts and
scales, checked in one tree with every rule of the default rules (released runners listed).
Prints any finding on any of them (there must be none) and, per bound of rules.yaml's
``evidence``, the largest share of it an honest run used: the margins the bounds were set from.

    .venv/bin/python benchmarks/honest_bundles.py [--keep DIR] [--quick]

Runs 8 modes x 4 rank counts x 2 scales = 64 runs (about 6 minutes on 2 cores); ``--quick`` runs
one rank count and one scale per mode.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab import bench

from mlckpt import bundle
from mlckpt.bundle.released import entry
from mlckpt.rules import load_rules

BIN = Path(sys.executable).parent
DESCRIPTION = bench.description("honest-ext4", "Honest Org")
MODES: dict[str, tuple[str, ...]] = {
    "sync-direct": ("io.direct=true",),
    "sync-buffered": ("io.direct=false",),
    "sync-nofsync": ("io.direct=false", "checkpoint.fsync=false"),
    "sync-stream": ("residency=stream", "io.direct=true"),
    "async": ("checkpoint.mode=async", "checkpoint.compute_interval_s=0.1", "io.direct=true"),
    "tiers": ("checkpoint.tiers.fast=fast", "io.direct=false"),
    "async-tiers": (
        "checkpoint.mode=async",
        "checkpoint.tiers.fast=fast",
        "checkpoint.compute_interval_s=0.1",
    ),
    "repopulate": ("checkpoint.restore=repopulate", "io.direct=true"),
}
RANKS = (1, 2, 4, 8)
SCALES = (0.001, 0.003)


def run_all(work: Path, quick: bool) -> list[Path]:
    (work / "honest-ext4.yaml").write_text(DESCRIPTION)
    bundle.generate_key(work / "key.pem")
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "xdg")}
    env.pop("MLCKPT_DEBUG", None)
    out = []
    combos = [(m, 4, 0.002) for m in MODES] if quick else list(itertools.product(MODES, RANKS, SCALES))
    for mode, ranks, scale in combos:
        cmd = [
            str(BIN / "mlckpt"),
            "run",
            "--json",
            "workload=llama3_8b",
            "division=open",
            f"ranks={ranks}",
            f"scale={scale}",
            "checkpoint.num_writes=3",
            "checkpoint.num_reads=2",
            *MODES[mode],
            "checkpoint.folder=ck",
            "system=honest-ext4.yaml",
            "signing.key=key.pem",
            "output.root=results",
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=work, env=env, text=True, capture_output=True, check=False)
        if proc.returncode != 0:
            print(
                f"  {mode} {ranks} ranks scale {scale}: runner failed ({proc.returncode}): "
                f"{proc.stderr.strip().splitlines()[-1:]}"
            )
            continue
        path = Path(json.loads(proc.stdout)["bundle"])  # mlckpt run --json
        print(f"  {mode:14} {ranks} ranks scale {scale}: {time.perf_counter() - t0:.1f} s  {path.name}")
        out.append(path)
    return out


def margins(paths: list[Path]) -> dict[str, float]:
    """The largest share of each evidence bound an honest run used."""
    b = load_rules().data["evidence"]
    worst: dict[str, float] = {}

    def seen(name: str, share: float) -> None:
        worst[name] = max(worst.get(name, 0.0), share)

    for p in paths:
        recs = [json.loads(line) for line in (p / "records.jsonl").read_text().splitlines()]
        config = json.loads(json.dumps(__import__("yaml").safe_load((p / "config.yaml").read_text())))
        background = config["checkpoint"]["mode"] == "async" or config["checkpoint"]["tiers"]["fast"]
        ops: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in recs:
            ops.setdefault((r["op"], r["index"]), []).append(r)
        offs = [r["wall_start"] - r["t0_ns"] / 1e9 for r in recs]
        seen("clocks.offset_s", (max(offs) - min(offs)) / b["clocks"]["offset_s"])
        for (op, _), group in ops.items():
            end = [(r["staged_ns"] if op == "write" else r["t1_ns"]) for r in group]
            dur = max(e - r["t0_ns"] for e, r in zip(end, group, strict=True))
            t0 = [r["t0_ns"] for r in group]
            s = b["start_skew"]
            seen("start_skew", (max(t0) - min(t0)) / (s["abs_s"] * 1e9 + s["rel"] * dur))
            [lead] = [r for r in group if "host_counters" in r]
            hc, c = lead["host_counters"], b["counters"]
            seen("counters.head_abs_s", (lead["t0_ns"] - hc["before"]["t_ns"]) / (c["head_abs_s"] * 1e9))
            tail = (
                c["tail_abs_s"] * 1e9
                + c["tail_rel"] * dur
                + (c["tail_background_s"] * 1e9 if op == "write" and background else 0)
            )
            seen("counters.tail", (hc["after"]["t_ns"] - max(end)) / tail)
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, default=None, help="work here and keep everything")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="mlckpt-honest-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        paths = run_all(work, args.quick)
        root = work / "tree"
        shutil.rmtree(root, ignore_errors=True)
        (root / "open" / "honest-org" / "systems").mkdir(parents=True)
        (root / "open" / "honest-org" / "systems" / "honest-ext4.yaml").write_text(DESCRIPTION)
        dest = root / "open" / "honest-org" / "results" / "honest-ext4" / "llama3_8b"
        dest.mkdir(parents=True)
        for p in paths:
            shutil.copytree(p, dest / p.name)
        pub = (work / "key.pem.pub").read_text().strip()
        (root / "trusted-keys.yaml").write_text(
            f'mlckpt_trusted_keys: "1.0"\norganizations:\n  honest-org: ["{pub}"]\n'
        )
        (root / "released-runners.yaml").write_text(
            'mlckpt_released_runners: "1.0"\nrunners:\n' + entry("bench", bundle.code_digest(), "2026-11-24")
        )
        proc = subprocess.run(
            [str(BIN / "mlckpt-check"), str(root), "--json", str(work / "report.json"), "--quiet"],
            text=True,
            capture_output=True,
            check=False,
        )
        report = json.loads((work / "report.json").read_text())
        bad = [
            (b["path"].rsplit("/", 1)[-1], [(f["rule"], f["message"][-140:]) for f in b["findings"]])
            for b in report["bundles"]
            if b["findings"] or b["verdict"] != "open"
        ]
        print(
            f"{len(paths)} honest bundles checked: {len(paths) - len(bad)} pass, {len(bad)} with findings "
            f"(mlckpt-check exit {proc.returncode})"
        )
        for name, found in bad:
            print(f"  FALSE ALARM {name}: {found}")
        print("largest share of each evidence bound used by an honest run:")
        for name, share in sorted(margins(paths).items()):
            print(f"  {name:22} {share:6.1%}")
        return 1 if bad else 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
