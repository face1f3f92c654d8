"""The LLM checkpointing sizer (the seed talk's "LLM Checkpointing Sizer").  Pure arithmetic.

Synchronous checkpointing stalls training for the checkpoint's write time, so with a checkpoint
every ``interval`` seconds the overhead fraction is ``write_time / interval``.  Solving for the
bandwidth that keeps overhead at ``f``: ``bandwidth = checkpoint_bytes / (f · interval)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlckpt.units import GB, GiB, fmt_bytes, fmt_duration
from mlckpt.workload.layout import Plan


@dataclass(frozen=True)
class SizerResult:
    checkpoint_bytes: int
    interval_s: float
    bandwidth_bytes_s: float
    write_time_s: float
    overhead_fraction: float
    restore_own_bytes: int
    restore_repopulate_bytes: int
    restore_own_s: float
    restore_repopulate_s: float
    steps: tuple[str, ...]  # the arithmetic, line by line

    def to_dict(self) -> dict[str, object]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "steps"}
        d["bandwidth_gib_s"] = self.bandwidth_bytes_s / GiB
        d["bandwidth_gb_s"] = self.bandwidth_bytes_s / GB
        d["steps"] = list(self.steps)
        return d


def size(plan: Plan, interval_s: float, *, overhead: float | None = None,
         bandwidth_bytes_s: float | None = None) -> SizerResult:
    """Exactly one of ``overhead`` (→ needed bandwidth) or ``bandwidth_bytes_s`` (→ overhead)."""
    if (overhead is None) == (bandwidth_bytes_s is None):
        raise ValueError("give exactly one of overhead or bandwidth")
    ckpt = plan.total_bytes
    own, rep = plan.restore_bytes("own"), plan.restore_bytes("repopulate")
    steps = [f"checkpoint = {ckpt:,} B ({fmt_bytes(ckpt)}) from {plan.workload.name} on "
             f"{plan.ranks} ranks"]
    if overhead is not None:
        budget = overhead * interval_s
        bw = ckpt / budget
        steps += [
            f"write-time budget = overhead × interval = {overhead:g} × {interval_s:g} s = "
            f"{budget:g} s",
            f"bandwidth needed = checkpoint / budget = {ckpt:,} B / {budget:g} s = "
            f"{bw / GiB:.2f} GiB/s ({bw / GB:.2f} GB/s)",
        ]
    else:
        assert bandwidth_bytes_s is not None
        bw = bandwidth_bytes_s
        steps.append(f"write time = checkpoint / bandwidth = {ckpt:,} B / {bw / GiB:.2f} GiB/s "
                     f"= {ckpt / bw:.2f} s")
        steps.append(f"overhead = write time / interval = {ckpt / bw:.2f} s / {interval_s:g} s = "
                     f"{ckpt / bw / interval_s:.2%}")
    write_s = ckpt / bw
    steps += [
        f"restore (own) = {own:,} B / {bw / GiB:.2f} GiB/s = {fmt_duration(own / bw)}",
        f"restore (repopulate: every replica reads its model states) = {rep:,} B / "
        f"{bw / GiB:.2f} GiB/s = {fmt_duration(rep / bw)}",
    ]
    return SizerResult(ckpt, interval_s, bw, write_s, write_s / interval_s, own, rep,
                       own / bw, rep / bw, tuple(steps))
