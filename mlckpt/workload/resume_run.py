"""A resume run as its configuration gives it (rules 1.21's ``resume`` block): the job runs at the
workload's layout (``ranks``, the workload's TP and PP) and resumes, ``resume.resumes`` times, from a
checkpoint written at another (``resume.from_ranks``, ``from_tensor``, ``from_pipeline``); what it
cannot be run with; and both plans.  Pure.

From rules 1.22 a resume run may resume through PyTorch DCP's own resharding load
(``framework.writer=torch_dcp``): with ``framework.reference`` (the default) its resumes alternate
with the engine's on the same checkpoint, as a library's checkpoints alternate with the engine's
(mlckpt/workload/frameworks.py): resume 0, 2, ... through DCP, 1, 3, ... through the engine.

The runner, ``mlckpt plan`` and the checker's rules all read a resume run through
:meth:`ResumeRun.of`, so the layouts and the plan a bundle's records are held to are the ones its
configuration gives, never the ones its summary claims.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from mlckpt.errors import ConfigError
from mlckpt.workload.frameworks import ENGINE, Framework
from mlckpt.workload.layout import Plan, make_plan
from mlckpt.workload.model import Workload, workload_from_config
from mlckpt.workload.resume import Index, ResumePlan, checkpoint_index, resume_plan, resume_scope

DEFAULT_RESUMES = 3
ENGINE_ONLY = Framework()


@dataclass(frozen=True)
class ResumeRun:
    workload: Workload  # the model, at the layout the job runs at
    ranks: int
    scale: float
    from_ranks: int
    from_tensor: int
    from_pipeline: int
    resumes: int
    framework: Framework = ENGINE_ONLY  # who resumes (rules 1.22): the engine, or DCP beside it

    @staticmethod
    def of(config: Mapping[str, Any]) -> ResumeRun | None:
        """The resume run ``config`` asks for; None for another kind.  Assumes a schema-valid
        configuration; :func:`scope_problems` says what does not fit."""
        block = config.get("resume")
        if not isinstance(block, Mapping) or not block.get("from_ranks"):
            return None
        w = workload_from_config(config["workload"])
        return ResumeRun(w, int(config["ranks"]), float(config["scale"]), int(block["from_ranks"]),
                         int(block.get("from_tensor") or w.parallelism.tensor),
                         int(block.get("from_pipeline") or w.parallelism.pipeline),
                         int(block.get("resumes") or DEFAULT_RESUMES), Framework.of(config))

    @property
    def tp(self) -> int:
        return self.workload.parallelism.tensor

    @property
    def pp(self) -> int:
        return self.workload.parallelism.pipeline

    @property
    def layouts(self) -> tuple[int, int, int, int, int]:
        """The written layout (ranks, TP, PP) and the job's (TP, PP): what a leaderboard row shows."""
        return self.from_ranks, self.from_tensor, self.from_pipeline, self.tp, self.pp

    @cached_property
    def written(self) -> Plan:
        """The layout the checkpoint was written at (its files, names and sizes)."""
        old = replace(self.workload, parallelism=replace(self.workload.parallelism, tensor=self.from_tensor,
                                                         pipeline=self.from_pipeline))
        return make_plan(old, self.from_ranks, self.scale)

    @cached_property
    def index(self) -> Index:
        return checkpoint_index(self.written)

    @cached_property
    def plan(self) -> ResumePlan:
        """Every new rank's state, needs and reads."""
        return resume_plan(self.index, self.workload, self.ranks, self.tp, self.pp)

    @cached_property
    def whole_pieces(self) -> ResumePlan:
        """The plan of a library that saves a replicated tensor once and reads every stored piece
        it needs whole (DCP: mlckpt/engine/dcp_reshard.py): the same states, read from the first
        copy."""
        return resume_plan(self.index, self.workload, self.ranks, self.tp, self.pp, spread=False)

    def writer_of(self, index: int) -> str:
        """Who makes resume ``index`` (0-based): the library's and the engine's alternate."""
        return self.framework.writer_of(index + 1)

    @property
    def writers(self) -> tuple[str, ...]:
        """Every writer whose resumes this run times (the library's first)."""
        return tuple(dict.fromkeys(self.writer_of(i) for i in range(self.resumes)))

    def plan_of(self, writer: str) -> ResumePlan:
        return self.plan if writer == ENGINE else self.whole_pieces

    def block(self) -> dict[str, object]:
        """run.json's ``resume``."""
        return {"from_ranks": self.from_ranks, "from_tensor": self.from_tensor,
                "from_pipeline": self.from_pipeline, "resumes": self.resumes}


def scope_problems(config: Mapping[str, Any], writers: Sequence[str] = (ENGINE,)) -> list[str]:
    """What a resume run cannot be run with (RESUME-SCOPE), each as "key=value (why)".  ``writers``:
    who may resume (the rules' ``resume.writers``: rules 1.21 the engine alone).  Nothing where
    ranks or scale are not numbers: the schema and SCALE-RANGE say so."""
    if not all(isinstance(config.get(k), int | float) and not isinstance(config.get(k), bool)
               for k in ("ranks", "scale")):
        return []
    run = ResumeRun.of(config)
    if run is None:
        return []
    ck = config.get("checkpoint") or {}
    bad: list[str] = []
    if (config.get("serving") or {}).get("strategy"):
        bad.append("serving.strategy (a run resumes from a checkpoint or loads a model, not both)")
    if (ck.get("tiers") or {}).get("fast") is not None:
        bad.append("checkpoint.tiers.fast (one tier of storage: the checkpoint resumed from)")
    if (config.get("state") or {}).get("source") is not None:
        bad.append("state.source (the state is resumed into host memory)")
    writer = (config.get("framework") or {}).get("writer")
    if writer is not None and writer not in writers:
        bad.append(f"framework.writer={writer} (" + ("the engine resumes; DCP's resharding load is measured "
                                                      "by benchmarks/resume.py --dcp, or under rules 1.22"
                                                      if writers == (ENGINE,) else
                                                      "a library that reshards: " + ", ".join(writers)) + ")")
    if str(config.get("residency", "full")) != "full":
        bad.append("residency=stream (every new rank holds its whole shard)")
    if (config.get("witness") or {}).get("url"):
        bad.append("witness.url (resume runs are not witnessed)")
    if ck.get("restore_from"):
        bad.append("checkpoint.restore_from (a resume run lays out the checkpoint it resumes from)")
    if str(ck.get("mode", "sync")) != "sync":
        bad.append("checkpoint.mode=async (no checkpoints are written)")
    old = run.from_tensor * run.from_pipeline
    if run.from_ranks % old:
        bad.append(f"resume.from_ranks={run.from_ranks} (a multiple of from_tensor x from_pipeline = {old})")
    elif run.workload.parallelism.zero_stage >= 3 and run.from_pipeline > 1:
        bad.append(f"resume.from_pipeline={run.from_pipeline} (ZeRO 3 runs one pipeline stage)")
    elif run.from_pipeline > run.workload.model.num_layers:
        bad.append(f"resume.from_pipeline={run.from_pipeline} (at most one stage a layer: "
                   f"{run.workload.model.num_layers})")
    if bad:
        return bad
    try:
        index = run.index
    except ConfigError as exc:
        return [f"scale={run.scale} ({exc.message.split(': ', 1)[-1]})"]
    return [f"ranks={p}" if p.startswith("ranks=") else f"workload.parallelism.{p}"
            for p in resume_scope(index, run.ranks, run.tp, run.pp, run.workload.model.num_layers)]
