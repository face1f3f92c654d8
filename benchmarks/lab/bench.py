"""The bench: one ``mlckpt run`` and what it left, read the same way by every benchmark.

``run_mlckpt`` launches ``mlckpt run --json`` (or a launcher of the caller's, such as mpiexec on a
rank shim, which prints ``bundle: <folder>``) and returns the :class:`Bundle` it published; a run
that published nothing raises with the last lines it printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def description(system: str, submitter: str) -> str:
    """A complete system description for a bench run on this VM (``system=<file>``)."""
    return f"""\
description_format: 1
system_name: {system}
submitter: {submitter}
availability: available
storage:
  {{product: ext4, type: local-nvme, usable_capacity_tib: 1, max_write_gib_s: 100, max_read_gib_s: 100}}
clients: {{count: 1, model: VM, memory_gib: 24}}
network: {{type: none}}
"""


def load() -> str:
    """The host's load average, to print beside a figure it may have disturbed."""
    return f"load {os.getloadavg()[0]:.1f}"


@dataclass(frozen=True)
class Bundle:
    """One published run: its folder and its documents."""

    path: Path

    @cached_property
    def run(self) -> dict[str, Any]:
        return json.loads((self.path / "run.json").read_text())

    @cached_property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.path / "summary.json").read_text())

    @cached_property
    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.path / "records.jsonl").read_text().splitlines() if line]

    def ops(self, kind: str | None = None) -> dict[tuple[str, int], list[dict[str, Any]]]:
        """The records by (op, index), in op order and rank order within an op; only ``kind``'s
        ops when given."""
        out: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in sorted(self.records, key=lambda r: (r["op"] != "write", int(r["index"]), int(r["rank"]))):
            if kind is None or r["op"] == kind:
                out.setdefault((r["op"], int(r["index"])), []).append(r)
        return out


def op_seconds(records: Sequence[Mapping[str, Any]]) -> float:
    """An op's time: its slowest rank's, barrier to last byte (the metric's definition)."""
    return max(int(r["t1_ns"]) - int(r["t0_ns"]) for r in records) / 1e9


def op_bandwidth(records: Sequence[Mapping[str, Any]]) -> float:
    """An op's bytes per second over its time (:func:`op_seconds`)."""
    return sum(int(r["bytes"]) for r in records) / op_seconds(records)


def bundle_printed(stdout: str) -> Path | None:
    """The folder a run published: ``mlckpt run --json``'s ``bundle``, or a rank launch's
    ``bundle: <folder>`` line."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with_bundle = json.loads(line).get("bundle")
            if with_bundle:
                return Path(with_bundle)
        elif line.startswith("bundle:"):
            return Path(line.removeprefix("bundle:").strip())
    return None


def run_mlckpt(overrides: Sequence[str], *, launcher: Sequence[str] | None = None,
               env: Mapping[str, str] | None = None, cwd: Path | None = None,
               timeout_s: float = 7200, any_status: bool = False) -> Bundle:
    """``mlckpt run --json`` with ``overrides`` (or ``launcher`` + overrides), its bundle; a run
    that published none, or (unless ``any_status``) exited non-zero, raises RuntimeError with its
    last lines."""
    cmd = [*(launcher or [str(BIN / "mlckpt"), "run", "--json"]), *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                          env=None if env is None else dict(env), check=False)
    folder = bundle_printed(proc.stdout)
    if folder is None or (proc.returncode != 0 and not any_status):
        lines = dict.fromkeys(ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip())
        raise RuntimeError(f"mlckpt run failed ({proc.returncode}): " + " | ".join(list(lines)[-3:])[-600:])
    return Bundle(folder)
