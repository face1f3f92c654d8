"""From command-line overrides to a validated setup (Hydra compose → JSON Schema → workload →
structural rules → plan).  The only module that talks to Hydra.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from mlckpt import formats
from mlckpt.errors import ConfigError, UsageError
from mlckpt.locations import is_object_url, parse_object_url
from mlckpt.plan import aliases
from mlckpt.plan.settings import Settings
from mlckpt.resources import workloads_dir
from mlckpt.rules import Context, HostSpec, RuleSet, host_blocks, known_versions, load_rules, override_key
from mlckpt.schemas import drop_unknown_nulls, first_error, schema
from mlckpt.units import GiB, parse_size
from mlckpt.workload.frameworks import ENGINE, WRITERS
from mlckpt.workload.layout import Plan, make_plan
from mlckpt.workload.model import Workload, workload_from_config
from mlckpt.workload.pipeline import ring_bytes


@dataclass(frozen=True)
class Setup:
    """A validated configuration: resolved config, the overrides that produced it, the rules it
    is judged by, its workload and its plan."""

    config: Mapping[str, object]
    overrides: tuple[str, ...]
    rules: RuleSet
    workload: Workload
    plan: Plan

    def context(self, hosts: tuple[HostSpec, ...] | None = None, *, complete: bool = False,
                measured: bool = False) -> Context:
        """``measured``: ``hosts`` carry the runner's own measurements of each host."""
        return Context(self.config, self.workload, self.overrides, self.plan,
                       hosts if hosts is not None else self.declared, complete, measured)

    @property
    def declared(self) -> tuple[HostSpec, ...] | None:
        return declared_hosts(self.config, self.plan.ranks)

    @cached_property
    def settings(self) -> Settings:
        """The configuration as the run reads it: typed, made once (mlckpt/plan/settings.py)."""
        return Settings.of(self.config)


@dataclass(frozen=True)
class ConfigSource:
    """Where the configuration comes from: the shipped ``workloads/`` folder, plus a user's own
    folder (Hydra's ``--config-dir``) and the primary config's name (``--config-name``)."""

    config_dir: str | None = None
    config_name: str = "config"

    def user_dir(self) -> Path | None:
        if self.config_dir is None:
            return None
        d = Path(self.config_dir).expanduser().absolute()
        if not d.is_dir():
            raise UsageError(f"--config-dir: {d} is not a folder", key="--config-dir")
        # The ranks append the user's folder to Hydra's search path while `mlckpt run` prepends it
        # (Hydra's --config-dir), so a file in both would compose differently; and a canonical
        # name must always mean the canonical workload.
        shipped = {q.relative_to(workloads_dir()) for q in workloads_dir().rglob("*.yaml")}
        for q in sorted(d.rglob("*.yaml")):
            if q.relative_to(d) in shipped:
                raise ConfigError(f"--config-dir: {q} shadows mlckpt's own {q.relative_to(d)}; give "
                                  "it another name", key="--config-dir")
        return d

    def args(self) -> list[str]:
        """The same source as Hydra flags (for the ranks' command line)."""
        out = [] if self.config_dir is None else ["--config-dir", str(self.user_dir())]
        return out + ([] if self.config_name == "config" else ["--config-name", self.config_name])


SHIPPED = ConfigSource()


def known_workloads(source: ConfigSource = SHIPPED) -> list[str]:
    folders = [workloads_dir(), *filter(None, [source.user_dir()])]
    return sorted({p.stem for d in folders for p in (d / "workload").glob("*.yaml")})


def compose(overrides: Sequence[str], source: ConfigSource = SHIPPED) -> dict[str, Any]:
    """Hydra compose of ``workloads/config.yaml`` (or ``source``'s primary config, with its own
    folder on the search path) with ``overrides``; returns a plain dict."""
    # Hydra logs composition details at import; keep the CLI quiet.
    logging.getLogger("hydra").setLevel(logging.ERROR)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = aliases.canonical(overrides)[0]  # the commands print the notes (cli.hydra_app)
    for ov in overrides:
        if ("=" not in ov and not ov.startswith("~")) or ov.lstrip("+~").startswith("="):
            raise UsageError(f"override {ov!r}: expected KEY=VALUE (e.g. ranks=64)", key=ov)
        key, _, choice = ov.partition("=")
        if key == "workload" and choice not in known_workloads(source):
            known = known_workloads(source)
            raise ConfigError(f"workload: unknown workload {choice!r}"
                              f"{did_you_mean(choice, known)}; known: {', '.join(known)}",
                              key="workload")
    user = source.user_dir()
    extra = [] if user is None else [f"hydra.searchpath=[file://{user}]"]
    try:
        with initialize_config_dir(config_dir=str(workloads_dir()), version_base="1.3",
                                   job_name="mlckpt"):
            cfg = hydra_compose(config_name=source.config_name, overrides=[*overrides, *extra])
            resolved = OmegaConf.to_container(cfg, resolve=True)
    except OverrideParseException as exc:
        raise UsageError(f"cannot parse override: {_first_line(exc)}") from None
    except MissingConfigException as exc:
        raise ConfigError(f"unknown configuration: {_first_line(exc)}") from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise UsageError(_hydra_message(exc, overrides, source)) from None
    assert isinstance(resolved, dict)
    resolved = cast(dict[str, Any], resolved)  # a configuration's keys are names
    resolved.pop("hydra", None)
    # `rules_version=1.0` arrives as a float from the command line; versions are strings.
    if "rules_version" in resolved:
        resolved["rules_version"] = rules_version_text(resolved["rules_version"])
    if resolved.get("ranks") is None:  # ranks=null: the workload's canonical count
        resolved["ranks"] = resolved["workload"]["closed_ranks"]
    if str(resolved.get("rules_version")) in known_versions():
        drop_unknown_nulls(resolved, "config", str(resolved["rules_version"]))
        _rule_set_defaults(resolved, overrides)
        as_typed(resolved)
    return resolved


def rules_version_text(version: object) -> object:
    """A rules version as text: a config file's unquoted 1.9 arrives as a number (the command line
    quotes it, mlckpt.plan.aliases); one that a later version's name shadows (1.10 reads as 1.1)
    is refused."""
    if not isinstance(version, int | float) or isinstance(version, bool):
        return version
    if f"{version}0" in known_versions():
        raise ConfigError(f"rules_version: {version} as a number is ambiguous (1.10 reads as 1.1): "
                          f"quote it, e.g. rules_version: '{version}0' or '{version}'", key="rules_version")
    return str(version)


# Values as storage people type them: every byte-count key takes units (4M, 16MiB, 1.5GB; a bare
# number is bytes, K/M/G/T are binary as in fio), every yes/no key takes yes/no/on/off/true/false.
BYTE_KEYS = ("io.block_size", "stream_buffer_bytes", "storage.s3.part_size")
BOOLEAN_WORDS = {"yes": True, "on": True, "true": True, "y": True, "no": False, "off": False,
                 "false": False, "n": False}


def as_typed(config: dict[str, object]) -> None:
    """Turn sizes with units into bytes and yes/no words into booleans, in place (pure); a value
    that is neither is left for the schema to refuse, naming the key."""
    for dotted in BYTE_KEYS:
        *parents, last = dotted.split(".")
        node: object = config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(last), str):
            try:
                node[last] = parse_size(node[last])
            except ValueError:
                raise ConfigError(f"{dotted}: {node[last]!r} is not a size (examples: 4096, 4M, 16MiB, "
                                  "1.5GB)", key=dotted) from None
    _booleans(config, schema("config", str(config.get("rules_version", "1.0"))))


def _booleans(node: object, schema: Mapping[str, Any]) -> None:
    props = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
    if not isinstance(node, dict):
        return
    for key, sub in props.items():
        if key not in node:
            continue
        types = sub.get("type", [])
        if "boolean" in (types if isinstance(types, list) else [types]) and isinstance(node[key], str):
            node[key] = BOOLEAN_WORDS.get(node[key].strip().lower(), node[key])
        elif isinstance(node[key], dict):
            _booleans(node[key], sub)


def _rule_set_defaults(config: dict[str, Any], overrides: Sequence[str]) -> None:
    """A rule set's own defaults (``defaults:`` in its rules.yaml, e.g. MLPerf's 5 s between
    checkpoints), for the keys the command line does not set."""
    given = {override_key(o) for o in overrides}
    for dotted, value in load_rules(str(config["rules_version"])).data.get("defaults", {}).items():
        if dotted in given:
            continue
        node = config
        *parents, last = str(dotted).split(".")
        for part in parents:
            node = node[part]
        node[last] = value


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def did_you_mean(given: str, known: Sequence[str]) -> str:
    """`` (did you mean checkpoint.num_writes?)`` for a near miss, else nothing (pure)."""
    close = difflib.get_close_matches(given, list(known), n=1, cutoff=0.85)  # near misses only
    return f" (did you mean {close[0]}?)" if close else ""


def known_keys(source: ConfigSource = SHIPPED) -> list[str]:
    """Every dotted key of the default configuration (for did-you-mean)."""
    def walk(node: object, prefix: str) -> list[str]:
        if not isinstance(node, dict):
            return [prefix]
        return [k for key, v in node.items() for k in walk(v, f"{prefix}.{key}" if prefix else key)]

    try:
        return walk(compose([], source), "")
    except Exception:  # the hint is a courtesy: never fail the message for it
        return []


def _hydra_message(exc: BaseException, overrides: Sequence[str], source: ConfigSource = SHIPPED) -> str:
    """One line for a failed composition, from OmegaConf's own fields (the key it names), never
    from the wording of a message."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    cause = next((e for e in _chain(exc) if isinstance(e, OmegaConfBaseException) and e.full_key), None)
    key = str(cause.full_key) if cause is not None else ""
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):  # a key the configuration lacks
        return f"{key}: unknown key{did_you_mean(key, known_keys(source))} (run `mlckpt config` for the keys)"
    if cause is not None:
        return f"{key}: {_first_line(cause)}"
    present = _added_but_present(overrides, source)
    if present:  # Hydra refuses `+key=…` for a key that exists, in a message that names no field
        return f"{present}: key already exists; override it without '+'"
    return _first_line(exc)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def _added_but_present(overrides: Sequence[str], source: ConfigSource) -> str | None:
    """The first key that a ``+key=value`` override adds but the configuration already has."""
    from omegaconf import OmegaConf

    adds = [ov[1:].split("=", 1)[0] for ov in overrides if ov.startswith("+") and not ov.startswith("++")]
    if not adds:
        return None
    try:
        base = OmegaConf.create(compose([ov for ov in overrides if not ov.startswith("+")], source))
    except UsageError:
        return None
    return next((key for key in adds if OmegaConf.select(base, key, default=None) is not None), None)


def witness_format_fits(version: str, loads: bool = False) -> bool:
    """Whether the transcript schema of rules ``version`` takes the witness format this run's
    transcript will be written in (``loads``: a serving run's, witness format 3)."""
    pins = schema("witness-transcript", version)["properties"]["witness_format"]
    written = formats.WITNESS.version if loads else formats.WITNESS_WITHOUT_LOADS
    return written in pins.get("enum", [pins.get("const")])


# PyTorch's default wheels carry CUDA (several GB); a storage client with no GPU needs none of it.
CPU_TORCH = ("; without a GPU, PyTorch's CPU build first: pip install torch --index-url "
             "https://download.pytorch.org/whl/cpu")


def library_installed(module: str) -> bool:
    """Whether a framework writer's library is installed here (found, not imported)."""
    return importlib.util.find_spec(module.split(".")[0]) is not None


def validate(config: Mapping[str, Any]) -> None:
    """JSON Schema of the resolved configuration (types, ranges, unknown keys) → exit 2."""
    version = str(config.get("rules_version", "1.0"))
    load_rules(version)  # unknown version → ConfigError naming the known ones
    state = config.get("state")
    if isinstance(state, Mapping) and state.get("source") is not None and "state" not in (
            schema("config", version)["properties"]):  # the rule set predates GPU state
        raise ConfigError(f"state.source: GPU-resident state needs rules_version 1.7 or later "
                          f"(got {version})", key="state.source")
    writer = (config.get("framework") or {}).get("writer")
    if writer not in (None, ENGINE):
        if "framework" not in schema("config", version)["properties"]:
            raise ConfigError(f"framework.writer: library writers need rules_version 1.11 or later "
                              f"(got {version})", key="framework.writer")
        needs = WRITERS[writer].needs if writer in WRITERS else ()
        missing = [m for m in needs if not library_installed(m)]
        if missing:
            raise ConfigError(f"framework.writer={writer}: {' and '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} not installed: "
                              f"pip install 'mlckpt[frameworks]'{CPU_TORCH if 'torch' in missing else ''}",
                              key="framework.writer")
    serving = config.get("serving")
    if isinstance(serving, Mapping) and serving.get("strategy") is not None and "serving" not in (
            schema("config", version)["properties"]):
        raise ConfigError(f"serving.strategy: serving runs need rules_version 1.13 or later (got {version})",
                          key="serving.strategy")
    resume = config.get("resume")
    if isinstance(resume, Mapping) and resume.get("from_ranks") is not None and "resume" not in (
            schema("config", version)["properties"]):
        raise ConfigError(f"resume.from_ranks: resume runs need rules_version 1.21 or later (got {version})",
                          key="resume.from_ranks")
    problem = first_error(config, "config", version)
    if problem:
        raise ConfigError(problem)
    loads = isinstance(serving, Mapping) and serving.get("strategy") is not None
    if (config.get("witness") or {}).get("url") and not witness_format_fits(version, loads):
        kind, fmt, since = (("serving", formats.WITNESS.version, "1.16") if loads else
                            ("checkpoint", formats.WITNESS_WITHOUT_LOADS, "1.10"))
        raise ConfigError(f"witness.url: this runner's witness transcripts of a {kind} run are witness "
                          f"format {fmt}, which rules_version {version} cannot check: use rules {since} "
                          "or later", key="witness.url")
    folder = config["checkpoint"]["folder"]
    if is_object_url(folder):
        parse_object_url(str(folder))  # a malformed URL names checkpoint.folder, exit 2
        if "storage" not in config:  # the rule set predates object storage (its schema lacks the key)
            raise ConfigError(f"checkpoint.folder: object storage ({folder}) needs rules_version 1.6 or "
                              f"later (got {version})", key="checkpoint.folder")
    io = config["io"]
    ring = ring_bytes(io["threads"], io["block_size"], verifying=True)  # what a streamed restore needs
    if config["residency"] == "stream" and config.get("stream_buffer_bytes", 0) < ring:
        raise ConfigError(f"stream_buffer_bytes: must hold 2 × io.threads × io.block_size = {ring} bytes "
                          f"for residency=stream; got {config.get('stream_buffer_bytes')}",
                          key="stream_buffer_bytes")


def declared_hosts(config: Mapping[str, Any], ranks: int) -> tuple[HostSpec, ...] | None:
    """Hosts as declared for planning (hosts=, ranks_per_host=, host_memory_gib=)."""
    blocks = host_blocks(ranks, config.get("hosts"), config.get("ranks_per_host"))
    if blocks is None:
        return None
    placed = sum(len(b) for b in blocks)
    if placed != ranks or not all(blocks):
        # A mapping that drops ranks or leaves hosts empty would let the rules judge a subset.
        raise ConfigError(f"hosts={config.get('hosts')}, ranks_per_host={config.get('ranks_per_host')}: "
                          f"must place all {ranks} ranks with at least one rank on every host "
                          f"(placed {placed} on {sum(1 for b in blocks if b)} of {len(blocks)} hosts)",
                          key="hosts")
    mem = config.get("host_memory_gib")
    return tuple(HostSpec(f"{i}", tuple(b), None if mem is None else int(mem * GiB))
                 for i, b in enumerate(blocks))


def setup(overrides: Sequence[str], source: ConfigSource = SHIPPED) -> Setup:
    config = compose(overrides, source)
    validate(config)
    rules = load_rules(str(config["rules_version"]))
    workload = workload_from_config(config["workload"])
    ctx = Context(config, workload, tuple(overrides))
    rules.require_structure(ctx)  # RANKS-MULTIPLE, ZERO3-PIPELINE, ... → RuleError, exit 2
    plan = make_plan(workload, int(config["ranks"]), float(config["scale"]))
    declared_hosts(config, plan.ranks)  # a bad host mapping is bad input: refuse it now
    return Setup(config, tuple(overrides), rules, workload, plan)


def resolved_yaml(overrides: Sequence[str], source: ConfigSource = SHIPPED) -> str:
    import yaml

    return yaml.safe_dump(compose(overrides, source), sort_keys=False)
