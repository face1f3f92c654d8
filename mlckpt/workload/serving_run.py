"""A serving run as its configuration gives it (rules 1.13's ``serving`` block): the strategy, the
GPUs (MPI ranks) per replica, the replicas, the loads timed, the shard files and the node-local
tier; what it cannot be run with; and the plan of its loads once the ranks' hosts are known.  Pure.

The runner, ``mlckpt plan`` and the checker's rules all read a serving run through
:meth:`ServingRun.of`, so the replica count and the plan a bundle's records are held to are the
ones its configuration and run.json give, never the ones its summary claims.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlckpt.workload.model import workload_from_config
from mlckpt.workload.serving import DEFAULT_SHARD_FILE_BYTES, STRATEGIES, ServingLayout
from mlckpt.workload.serving_load import LoadPlan, load_plan

DEFAULT_LOADS = 3
DEFAULT_NODE_TIER = "/dev/shm"  # host memory: what a node without a local disk has


@dataclass(frozen=True)
class ServingRun:
    workload: str
    strategy: str
    tp: int
    replicas: int
    loads: int
    shard_file_bytes: int
    node_tier: str | None
    scale: float

    @staticmethod
    def of(config: Mapping[str, Any]) -> ServingRun | None:
        """The serving run ``config`` asks for; None for a checkpoint run.  Assumes a schema-valid
        configuration; :func:`scope_problems` says what does not fit."""
        block = config.get("serving")
        if not isinstance(block, Mapping) or not block.get("strategy"):
            return None
        node = config["workload"]
        tp = int(block.get("tp") or (node.get("parallelism") or {}).get("tensor") or 1)
        ranks = int(config["ranks"])
        return ServingRun(str(node["name"]), str(block["strategy"]), tp, max(1, ranks // tp),
                          int(block.get("loads") or DEFAULT_LOADS),
                          int(block.get("shard_file_bytes") or DEFAULT_SHARD_FILE_BYTES),
                          block.get("node_tier") if block["strategy"] == "nodecache" else None,
                          float(config["scale"]))

    def layout(self, config: Mapping[str, Any]) -> ServingLayout:
        """The serving layout of the configuration's model (every host holds whole replicas, or a
        replica spans whole hosts: the runner places ranks, this is only the sizing's default)."""
        w = workload_from_config(config["workload"])
        return ServingLayout(w.name, w.model, self.tp, self.replicas, max(self.tp, 8), self.shard_file_bytes)

    def plan(self, config: Mapping[str, object], hosts: Sequence[str]) -> LoadPlan:
        """Every rank's part of each load, ``hosts[r]`` rank r's host (ConfigError naming the key
        where they do not fit)."""
        return load_plan(self.layout(config), self.strategy, hosts, self.scale)

    def tier_path(self, run_name: str) -> Path | None:
        """Where nodecache's node-local tier lives on every host (None for the other strategies)."""
        if self.strategy != "nodecache":
            return None
        return Path(self.node_tier or DEFAULT_NODE_TIER).absolute() / f"mlckpt-tier-{run_name}"

    def block(self, node_tier: str | None = None) -> dict[str, object]:
        """run.json's ``serving`` (``node_tier``: the tier as the run resolved it)."""
        return {"strategy": self.strategy, "tp": self.tp, "replicas": self.replicas, "loads": self.loads,
                "shard_file_bytes": self.shard_file_bytes,
                "node_tier": (node_tier or self.node_tier) if self.strategy == "nodecache" else None}


def scope_problems(config: Mapping[str, Any], witnessed: bool = False) -> list[str]:
    """What a serving run cannot be run with (SERVING-SCOPE), each as "key=value (why)".  Nothing
    where ranks or scale are not numbers: the schema and SCALE-RANGE say so (the checker judges
    the structural rules on such a configuration too)."""
    if not all(isinstance(config.get(k), int | float) and not isinstance(config.get(k), bool)
               for k in ("ranks", "scale")):
        return []
    run = ServingRun.of(config)
    if run is None:
        return []
    ck = config.get("checkpoint") or {}
    bad: list[str] = []
    if run.strategy not in STRATEGIES:
        bad.append(f"serving.strategy={run.strategy} (one of {', '.join(STRATEGIES)})")
    ranks = int(config["ranks"])
    if ranks % run.tp:
        bad.append(f"ranks={ranks} (whole replicas: a multiple of serving.tp={run.tp})")
    heads = int(config["workload"]["model"]["num_attention_heads"])
    if run.tp > heads:
        bad.append(f"serving.tp={run.tp} (at most one GPU a head: {heads})")
    if run.strategy == "fanout" and run.scale >= 1:
        bad.append("scale=1 with serving.strategy=fanout (the parts are exchanged in place in whole "
                   "pages: a scale below 1 lays the shard out in whole pages)")
    if (ck.get("tiers") or {}).get("fast") is not None:
        bad.append("checkpoint.tiers.fast (one tier of storage; nodecache's tier is serving.node_tier)")
    if (config.get("state") or {}).get("source") is not None:
        bad.append("state.source (the weights load into host memory)")
    if (config.get("framework") or {}).get("writer") is not None:
        bad.append("framework.writer (the engine loads the weights)")
    if str(config.get("residency", "full")) != "full":
        bad.append("residency=stream (every replica holds its whole shard)")
    if (config.get("witness") or {}).get("url") and not witnessed:
        bad.append("witness.url (serving runs are not witnessed)")
    if ck.get("restore_from"):
        bad.append("checkpoint.restore_from (a serving run lays out its own weights)")
    if str(ck.get("mode", "sync")) != "sync":
        bad.append("checkpoint.mode=async (no checkpoints are written)")
    return bad
