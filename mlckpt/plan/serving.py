"""What `mlckpt plan --replicas` and `mlckpt size --replicas` print: a serving layout (bytes per
GPU, per replica, per host) and how long each loading strategy takes to bring replicas up.  Pure
(returns data and strings; the CLI prints them).  The model: mlckpt/workload/serving.py."""

from __future__ import annotations

from typing import Any

from mlckpt.units import GB, fmt_bytes_both, fmt_duration
from mlckpt.workload.serving import STRATEGIES, Links, ScaleUp, ServingLayout, fmt_gb, scale_up
from mlckpt.workload.serving_load import load_plan, placement


def layout_document(layout: ServingLayout) -> dict[str, Any]:
    shards = [{"tp_rank": r, "bytes": layout.shard_bytes(r), "files": list(layout.shard_files(r))}
              for r in range(layout.tp)]
    return {
        "workload": layout.name, "dtype": layout.dtype, "tp": layout.tp, "replicas": layout.replicas,
        "gpus_per_host": layout.gpus_per_host, "shard_file_bytes": layout.shard_file_bytes,
        "model_bytes": layout.model_bytes, "replica_bytes": layout.replica_bytes,
        "replicas_per_host": layout.replicas_per_host, "hosts_per_replica": layout.hosts_per_replica,
        "hosts": layout.hosts(), "host_bytes": layout.host_bytes,
        "all_replicas_bytes": layout.replicas * layout.replica_bytes, "shards": shards,
        "strategies": strategies_document(layout),
    }


def strategies_document(layout: ServingLayout) -> dict[str, dict[str, int]]:
    """Per loading strategy, what the storage serves and the most any one host or GPU moves, with
    the ranks placed as the layout says (mlckpt/workload/serving_load.py)."""
    out: dict[str, dict[str, int]] = {}
    for strategy in STRATEGIES:
        plan = load_plan(layout, strategy, placement(layout))
        out[strategy] = {
            "storage_bytes": plan.storage_bytes,
            "host_storage_bytes_max": max(plan.host_storage_bytes().values()),
            "gpu_storage_bytes_max": max(r.storage_bytes for r in plan.ranks),
            "gpu_received_bytes_max": max(r.received_bytes for r in plan.ranks),
            "gpu_node_tier_bytes_max": max(r.node_tier_bytes for r in plan.ranks),
        }
    return out


def layout_text(layout: ServingLayout) -> str:
    d = layout_document(layout)
    gpus = layout.gpus_per_host
    where = (f"{layout.replicas_per_host} to a host of {gpus} GPUs" if layout.replicas_per_host
             else f"each over {layout.hosts_per_replica} hosts of {gpus} GPUs")
    lines = [
        f"{layout.name} served: {layout.replicas} replicas of TP {layout.tp} ({where}), weights only, "
        f"{layout.dtype}",
        "",
        f"  weights             {fmt_bytes_both(d['model_bytes'])} (each parameter once)",
        f"  per replica         {fmt_bytes_both(d['replica_bytes'])} (norms on every GPU"
        + (", key/value heads repeated past one a GPU)" if layout.tp > layout.model.num_kv_heads else ")"),
        f"  per host            {fmt_bytes_both(d['host_bytes'])} read directly by its GPUs",
        f"  every replica       {fmt_bytes_both(d['all_replicas_bytes'])} on {d['hosts']} hosts",
        "",
        "  GPU (TP rank)  bytes                 files",
    ]
    for s in d["shards"]:
        files = s["files"]
        lines.append(f"  {s['tp_rank']:>13}  {fmt_gb(s['bytes']):<20}  {len(files)} × at most "
                     f"{fmt_gb(max(files))}")
    lines += ["", "  loading all replicas    from storage     busiest host     a GPU reads      "
              "a GPU receives   from node tier"]
    columns = ("storage_bytes", "host_storage_bytes_max", "gpu_storage_bytes_max", "gpu_received_bytes_max",
               "gpu_node_tier_bytes_max")
    for name, t in d["strategies"].items():
        lines.append(f"  {name:<22}" + "".join(f"  {fmt_gb(t[c]):>15}" for c in columns))
    lines.append("  (a GPU: the most any one reads, receives over the network, or reads from its host's "
                 "tier)")
    return "\n".join(lines)


def scale_up_all(layout: ServingLayout, from_replicas: int, to_replicas: int,
                 links: Links) -> list[ScaleUp]:
    return [scale_up(layout, from_replicas, to_replicas, links, s) for s in STRATEGIES]


def links_document(links: Links) -> dict[str, float | None]:
    return {"storage_bytes_s": links.storage, "host_link_bytes_s": links.host_link,
            "network_bytes_s": links.network, "node_tier_bytes_s": links.node_tier}


def scale_up_text(layout: ServingLayout, results: list[ScaleUp], from_replicas: int,
                  to_replicas: int) -> str:
    best = min(results, key=lambda r: r.seconds)
    lines = [f"{layout.name} served by replicas of TP {layout.tp}, {fmt_gb(layout.replica_bytes)} each: "
             f"{from_replicas} → {to_replicas} replicas", "",
             "  strategy    ready in    read from storage   effective        bottleneck"]
    for r in results:
        lines.append(f"  {r.strategy:<10}  {fmt_duration(r.seconds):>9}   {r.storage_bytes / GB:>12,.1f} GB"
                     f"   {r.placed_bytes_s / GB:>9,.1f} GB/s   {r.bottleneck}")
    lines.append(f"\n  fastest: {best.strategy} ({fmt_duration(best.seconds)}; "
                 f"bottleneck: {best.bottleneck})")
    for r in results:
        lines.append(f"\n  {r.strategy}:")
        lines += [f"    {s}" for s in r.steps]
    lines.append("\n  A model, not a measurement: each time is the slowest of its rate bounds; the running "
                 "replicas are not sources; a host's GPUs share what it read.")
    return "\n".join(lines)
