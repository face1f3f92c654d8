"""Check functions of runs on object storage (rules 1.6): what an object run may be (config),
whether every host can use the store (host), and whether the bundle states the store it used
(result).  Pure: the runner probes, these judge."""

from __future__ import annotations

from collections.abc import Iterator

from mlckpt.locations import is_object_url, parse_object_url, s3_settings
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import run_data
from mlckpt.workload.pipeline import Pipeline


def beyond_one_tier(ctx: Context, *, fsync: bool = False, objects: bool = False) -> list[str]:
    """What a configuration asks beyond one tier with full residency, in one invocation, not
    witnessed (what the object engine and the GPU source carry today); ``fsync``: also a run
    without fsync, ``objects``: also a folder on object storage."""
    pipe = Pipeline.of(ctx.config)
    bad = []
    if pipe.tiered:
        bad.append(f"checkpoint.tiers.fast={pipe.fast}")
    if ctx.get("residency") == "stream":
        bad.append("residency=stream")
    if fsync and ctx.get("checkpoint.fsync") is False:
        bad.append("checkpoint.fsync=false")
    if objects and is_object_url(ctx.get("checkpoint.folder")):
        bad.append(f"checkpoint.folder={ctx.get('checkpoint.folder')}")
    if ctx.get("checkpoint.restore_from"):
        bad.append("checkpoint.restore_from (a read-only invocation)")
    if ctx.get("witness.url"):
        bad.append("witness.url")
    return bad


def object_modes(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """OBJECT-MODES: an object run is sync or async on one tier, full residency, fsync on, one
    invocation, not witnessed (the modes the object engine carries today)."""
    if not is_object_url(ctx.get("checkpoint.folder")):
        return Outcome(True)
    bad = beyond_one_tier(ctx, fsync=True)
    return Outcome(
        not bad, "one tier, residency=full, checkpoint.fsync=true, one invocation, no witness", ", ".join(bad)
    )


def object_store_usable(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome]:
    if not is_object_url(ctx.get("checkpoint.folder")):
        yield Outcome(True)
        return
    for h in ctx.hosts or ():  # needs: [host_measurements]
        yield Outcome(h.store_problem is None, "usable", h.store_problem, where=f"host {h.name}")


def object_storage_recorded(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """The storage block agrees with the configuration, and every host's facts name the store
    (filesystem type s3, the same endpoint host): a bundle cannot pass files off as objects or
    one store off as another without the configuration saying so too."""
    d = run_data(ctx)
    block = d.run.get("storage")
    if block is None:
        yield NotChecked("run.json has no storage block (run format 5 or older)")
        return
    folder = str(d.config.get("checkpoint", {}).get("folder", ""))
    if not is_object_url(folder):
        yield Outcome(block.get("kind") == "posix", "storage.kind=posix", f"storage.kind={block.get('kind')}")
        return
    loc = parse_object_url(folder)
    s3 = s3_settings(d.config)
    want = {
        "kind": "s3",
        "bucket": loc.bucket,
        "prefix": loc.key,
        "part_size": s3.get("part_size"),
        "inflight": s3.get("inflight"),
        "addressing_style": s3.get("addressing_style"),
        "verify_tls": s3.get("verify_tls"),
    }
    for key, value in want.items():
        yield Outcome(
            block.get(key) == value, f"storage.{key}={value!r}", f"{block.get(key)!r}", where="run.json"
        )
    endpoint = block.get("endpoint_host")
    for h in d.system.get("hosts", []):
        fs = h.get("filesystem") or {}
        yield Outcome(
            fs.get("fs_type") == "s3" and fs.get("source") == endpoint,
            f"filesystem s3 at {endpoint}",
            f"{fs.get('fs_type')} at {fs.get('source')}",
            where=f"host {h.get('hostname')}",
        )


CHECKS = checks_table(object_modes, object_store_usable, object_storage_recorded)
