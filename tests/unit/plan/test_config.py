"""Configuration: Hydra composition, defaults, schema validation, `mlckpt config`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlckpt.errors import ConfigError, RuleError, UsageError
from mlckpt.plan.config import compose, declared_hosts, known_workloads, resolved_yaml, setup, validate
from mlckpt.rules import HostSpec
from mlckpt.units import GiB

ALL_WORKLOADS = ["llama3_1t", "llama3_405b", "llama3_70b", "llama3_8b", "llama_1t", "llama_405b",
                 "llama_70b", "llama_70b_zero3", "llama_7b", "llama_7b_zero3"]


def test_known_workloads() -> None:
    assert known_workloads() == ALL_WORKLOADS


def test_overrides_compose() -> None:
    cfg = compose(["workload=llama3_70b", "ranks=64", "checkpoint.num_writes=3"])
    assert cfg["workload"]["name"] == "llama3_70b"
    assert cfg["workload"]["parallelism"] == {"tensor": 8, "pipeline": 1, "zero_stage": 3}
    assert cfg["ranks"] == 64
    assert cfg["checkpoint"]["num_writes"] == 3
    assert cfg["checkpoint"]["num_reads"] == 10
    assert cfg["division"] == "closed"
    assert cfg["scale"] == 1.0
    assert "hydra" not in cfg


def test_setup_from_overrides() -> None:
    s = setup(["workload=llama3_70b", "ranks=64", "checkpoint.num_writes=3"])
    assert s.overrides == ("workload=llama3_70b", "ranks=64", "checkpoint.num_writes=3")
    assert s.workload.name == "llama3_70b"
    assert s.plan.ranks == 64 and s.plan.dp == 8
    assert s.plan.total_bytes == 978_406_572_032
    assert s.config["checkpoint"]["num_writes"] == 3
    assert s.rules.version == "1.22"


def test_defaults() -> None:
    cfg = compose([])
    assert cfg["workload"]["name"] == "llama3_8b"
    assert cfg["ranks"] == 8
    assert cfg["rules_version"] == "1.22"
    assert cfg["checkpoint"]["restore"] == "own"
    assert cfg["residency"] == "full"
    assert (cfg["hosts"], cfg["ranks_per_host"], cfg["accelerator"], cfg["host_memory_gib"]) == (
        None, None, None, None)
    assert cfg["io"]["block_size"] % 4096 == 0


@pytest.mark.parametrize(("name", "ranks"), [("llama3_8b", 8), ("llama3_70b", 64), ("llama3_405b", 512),
                                             ("llama3_1t", 1024), ("llama_70b", 64)])
def test_ranks_default_to_closed_ranks(name: str, ranks: int) -> None:
    cfg = compose([f"workload={name}"])
    assert cfg["ranks"] == cfg["workload"]["closed_ranks"] == ranks


def test_ranks_follow_an_edited_closed_rank_count() -> None:
    assert compose(["workload=llama3_405b", "workload.closed_ranks=1024"])["ranks"] == 1024


def test_checkpoint_counts_default_from_workload() -> None:
    cfg = compose(["workload=llama3_405b", "workload.checkpoint.num_writes=4",
                   "workload.checkpoint.num_reads=2", "workload.checkpoint.fsync=false"])
    assert (cfg["checkpoint"]["num_writes"], cfg["checkpoint"]["num_reads"], cfg["checkpoint"]["fsync"]) == (
        4, 2, False)
    # an explicit checkpoint.* override wins over the workload's default
    cfg = compose(["workload=llama3_405b", "workload.checkpoint.num_writes=4", "checkpoint.num_writes=7"])
    assert cfg["checkpoint"]["num_writes"] == 7


@pytest.mark.parametrize(("override", "key"), [
    ("foo=1", "foo"),
    ("checkpoint.bogus=1", "checkpoint.bogus"),
    ("io.speed=9", "io.speed"),
    ("workload.model.bogus=1", "workload.model.bogus"),
])
def test_unknown_key_names_the_key(override: str, key: str) -> None:
    with pytest.raises(UsageError) as exc:
        setup([override])
    assert str(exc.value).startswith(f"{key}: unknown key")
    assert exc.value.exit_status == 2


def test_appended_unknown_key_is_refused_by_the_schema() -> None:
    with pytest.raises(ConfigError) as exc:
        setup(["+foo=1"])
    assert str(exc.value) == "foo: unknown key"


@pytest.mark.parametrize(("override", "message"), [
    ("ranks=abc", "ranks: 'abc' is not of type 'integer'"),
    ("ranks=true", "ranks: True is not of type 'integer'"),
    ("checkpoint.num_writes=x", "checkpoint.num_writes: 'x' is not of type 'integer'"),
    ("scale=abc", "scale: 'abc' is not of type 'number'"),
    ("io.threads=many", "io.threads: 'many' is not of type 'integer'"),
    ("io.direct=maybe", "io.direct: 'maybe' is not of type 'boolean'"),
    ("workload.model.hidden_size=big", "workload.model.hidden_size: 'big' is not of type 'integer'"),
    ("workload.parallelism.zero_stage=4", "workload.parallelism.zero_stage: 4 is not one of [0, 1, 2, 3]"),
    ("division=semi", "division: 'semi' is not one of ['closed', 'open']"),
    ("ranks=0", "ranks: 0 is less than the minimum of 1"),
    ("scale=0", "scale: 0 is less than or equal to the minimum of 0"),
    ("scale=1.5", "scale: 1.5 is greater than the maximum of 1"),
    ("checkpoint.num_writes=-1", "checkpoint.num_writes: -1 is less than the minimum of 0"),
    ("io.block_size=5000", "io.block_size: 5000 is not a multiple of 4096"),
    ("host_memory_gib=lots", "host_memory_gib: 'lots' is not of type 'number', 'null'"),
])
def test_wrong_types_name_the_dotted_path(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        setup([override])
    assert str(exc.value) == message


@pytest.mark.parametrize(("override", "message"), [
    ("hosts=2.0", "hosts: 2.0 is not of type 'integer', 'null'"),
    ("ranks=8.0", "ranks: 8.0 is not of type 'integer'"),
    ("checkpoint.num_writes=3.0", "checkpoint.num_writes: 3.0 is not of type 'integer'"),
    ("workload.model.hidden_size=4096.0", "workload.model.hidden_size: 4096.0 is not of type 'integer'"),
])
def test_integral_float_is_not_an_integer(override: str, message: str) -> None:
    # JSON Schema's plain "integer" accepts 2.0; ours must not (hosts=2.0 used to crash later)
    with pytest.raises(ConfigError) as exc:
        setup([override]).context()
    assert str(exc.value) == message


def test_unknown_workload_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        setup(["workload=llama_9000b"])
    assert str(exc.value) == ("workload: unknown workload 'llama_9000b'; known: " + ", ".join(ALL_WORKLOADS))
    assert exc.value.key == "workload"


@pytest.mark.parametrize("override", ["ranks", "=3", "+=3"])
def test_malformed_override(override: str) -> None:
    with pytest.raises(UsageError) as exc:
        compose([override])
    assert str(exc.value) == f"override {override!r}: expected KEY=VALUE (e.g. ranks=64)"


def test_unparsable_override() -> None:
    with pytest.raises(UsageError) as exc:
        compose(["ranks=[1,"])
    assert str(exc.value).startswith("cannot parse override:")


def test_unknown_rules_version() -> None:
    with pytest.raises(ConfigError) as exc:
        setup(["rules_version='9.9'"])
    assert str(exc.value) == ("rules_version: unknown rules version '9.9'; known: 1.0, 1.1, 1.2, 1.3, 1.4, "
                              "1.5, 1.6, 1.7, 1.8, 1.9, 1.10, 1.11, 1.12, 1.13, 1.14, 1.15, 1.16, 1.17, "
                              "1.18, 1.19, 1.20, 1.21, 1.22, mlps-v3.0, mlps-v3.0r2, mlps-v3.0r3, "
                              "mlps-v3.0r4, mlps-v3.0r5")


@pytest.mark.parametrize(("overrides", "rule", "fragment"), [
    (["workload=llama3_1t", "ranks=1000"], "RANKS-MULTIPLE",
     "TP·PP = 512; got 1000 (nearest valid: 512 or 1024)"),
    (["workload=llama_405b", "workload.parallelism.zero_stage=3"], "ZERO3-PIPELINE", "got PP = 32"),
    (["workload=llama3_405b", "workload.model.num_layers=16"], "LAYERS-PIPELINE",
     "num_layers must be at least PP = 32; got 16"),
])
def test_structural_rules_refuse_setup(overrides: list[str], rule: str, fragment: str) -> None:
    with pytest.raises(RuleError) as exc:
        setup(overrides)
    assert exc.value.rule == rule
    assert str(exc.value).startswith(f"[{rule}] ")
    assert fragment in str(exc.value)
    assert exc.value.exit_status == 2


def test_validate_accepts_the_default() -> None:
    validate(compose([]))


def test_declared_hosts() -> None:
    cfg = compose(["hosts=3", "host_memory_gib=1.5"])
    hosts = declared_hosts(cfg, 8)
    assert hosts == (HostSpec("0", (0, 1, 2), int(1.5 * GiB)), HostSpec("1", (3, 4, 5), int(1.5 * GiB)),
                     HostSpec("2", (6, 7), int(1.5 * GiB)))
    assert declared_hosts(compose(["ranks_per_host=4"]), 8) == (
        HostSpec("0", (0, 1, 2, 3)), HostSpec("1", (4, 5, 6, 7)))
    assert declared_hosts(compose([]), 8) is None


def test_setup_context_uses_declared_hosts() -> None:
    s = setup(["hosts=2", "host_memory_gib=64"])
    ctx = s.context()
    assert ctx.hosts == (HostSpec("0", (0, 1, 2, 3), 64 * GiB), HostSpec("1", (4, 5, 6, 7), 64 * GiB))
    assert ctx.plan is s.plan and not ctx.complete
    given = (HostSpec("a", tuple(range(8)), 1),)
    assert s.context(given, complete=True).hosts == given


def test_resolved_yaml_round_trips() -> None:
    overrides = ["workload=llama3_70b", "ranks=64", "checkpoint.num_writes=3"]
    text = resolved_yaml(overrides)
    assert yaml.safe_load(text) == compose(overrides)


def test_config_command_prints_resolved_yaml(run_cli) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("config", "workload=llama3_70b", "ranks=64", "checkpoint.num_writes=3")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    doc = yaml.safe_load(r.stdout)
    assert doc["workload"]["name"] == "llama3_70b"
    assert doc["ranks"] == 64
    assert doc["checkpoint"]["num_writes"] == 3
    assert doc["checkpoint"]["num_reads"] == 10
    assert doc["rules_version"] == "1.22"  # stays a string through the YAML round trip
    validate(doc)  # what it prints is itself a valid configuration


def test_config_command_unknown_key(run_cli) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("config", "checkpoint.bogus=1")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr == "mlckpt: error: checkpoint.bogus: unknown key (run `mlckpt config` for the keys)\n"


# --- values as storage people type them --------------------------------------------------------

@pytest.mark.parametrize(("given", "value"), [("4M", 4 << 20), ("16MiB", 16 << 20), ("1.5MiB", 1_572_864),
                                              ("4096", 4096), ("8 KiB", 8192), ("0.004096GB", 4_096_000)])
def test_byte_keys_take_units(given: str, value: int) -> None:
    from mlckpt.plan.config import setup

    assert setup([f"io.block_size={given}"]).config["io"]["block_size"] == value
    assert setup(["residency=stream", f"stream_buffer_bytes={given}" if value >= 1 << 30 else
                  "stream_buffer_bytes=1GiB"]).config["stream_buffer_bytes"] >= 1 << 30


@pytest.mark.parametrize(("word", "value"), [("no", False), ("off", False), ("yes", True), ("ON", True),
                                             ("false", False)])
def test_yes_no_keys_take_words(word: str, value: bool) -> None:
    from mlckpt.plan.config import setup

    cfg = setup([f"io.direct={word}", f"cache.drop_system={word}"]).config
    assert cfg["io"]["direct"] is value and cfg["cache"]["drop_system"] is value


def test_a_value_that_is_no_size_or_word_names_its_key() -> None:
    from mlckpt.errors import ConfigError
    from mlckpt.plan.config import setup

    with pytest.raises(ConfigError, match=r"^io\.block_size: '4X' is not a size \(examples: 4096, 4M, "):
        setup(["io.block_size=4X"])
    with pytest.raises(ConfigError, match=r"^io\.direct: 'maybe' is not of type 'boolean'"):
        setup(["io.direct=maybe"])


def test_near_misses_get_a_did_you_mean(run_cli: Any) -> None:
    cases = [
        (["plan", "checkpoint.num_write=2"],
         "mlckpt: error: checkpoint.num_write: unknown key (did you mean checkpoint.num_writes?) (run "
         "`mlckpt config` for the keys)"),
        (["plan", "workload=llama3_8"],
         "mlckpt: error: workload: unknown workload 'llama3_8' (did you mean llama3_8b?); known: "),
        (["run", "--workload", "llama3_8b"],
         "mlckpt: error: unrecognized arguments: --workload; settings are key=value overrides: did you mean "
         "workload=…? (mlckpt run --help)"),
    ]
    for args, line in cases:
        proc = run_cli(*args)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_public_key_is_taken_as_typed_though_base64_is_override_syntax() -> None:
    key = "ed25519:8qLwfaBEXvvOHITLXhFF3cAS5OuUbPFT+iA57tdo41c="
    for typed in (key, f"'{key}'"):
        s = setup(["witness.url=http://w:8470", f"witness.public_key={typed}"])
        assert s.config["witness"]["public_key"] == key


def test_rules_1_10_is_never_read_as_the_number_1_1() -> None:
    from mlckpt.plan.config import rules_version_text

    assert setup(["rules_version=1.10"]).rules.version == "1.10"  # on the command line, as typed
    assert setup(["rules=1.10"]).rules.version == "1.10"
    assert setup(["rules_version=1.1"]).rules.version == "1.1"
    # a config file's unquoted 1.10 is the YAML number 1.1: refused, naming the remedy
    with pytest.raises(ConfigError) as exc:
        rules_version_text(yaml.safe_load("v: 1.10")["v"])
    assert str(exc.value) == ("rules_version: 1.1 as a number is ambiguous (1.10 reads as 1.1): quote it, "
                              "e.g. rules_version: '1.10' or '1.1'")
    assert rules_version_text(1.9) == "1.9" and rules_version_text("1.10") == "1.10"


def test_the_run_reads_one_typed_value_of_the_configuration(tmp_path: Path) -> None:
    s = setup(["division=open", "scale=0.01", "checkpoint.num_writes=2", "io.threads=8", "io.block_size=1M",
               f"output.root={tmp_path / 'r'}", "checkpoint.keep=true", "io.sample_interval_s=0.5"])
    run = s.settings
    assert run is s.settings  # made once
    assert (run.workload, run.division, run.ranks, run.scale) == ("llama3_8b", "open", 8, 0.01) and run.scaled
    io = run.io
    assert (io.threads, io.block_size, io.direct, io.sample_interval_s) == (8, 1 << 20, True, 0.5)
    assert (run.checkpoint.num_writes, run.checkpoint.keep, run.checkpoint.restore_from) == (2, True, None)
    assert run.checkpoint.kept and run.results == tmp_path / "r" and run.signing_key == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.division = "closed"  # type: ignore[misc]
