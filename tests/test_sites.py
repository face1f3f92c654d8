"""At an HPC site: what the site's MPI library reports about itself reaches the bundle in a form the
checker accepts, and the runner never publishes a bundle its own checker would refuse for its form.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from mlckpt import strict
from mlckpt.host.facts import host_facts
from mlckpt.run.publish import self_check

# What Open MPI 4.1.4's MPI_Get_library_version returns (Debian's build): a NUL ends it.
OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\x00"


def test_printable_drops_nul_and_turns_other_control_characters_into_spaces() -> None:
    assert strict.printable(OPEN_MPI) == OPEN_MPI[:-1]
    got = strict.printable({"a\x1b[31m": ["x\ty", 3, None, ("\x7f",)]})
    assert got == {"a [31m": ["x y", 3, None, [" "]]}
    assert strict.printable("/mnt/two  spaces/é") == "/mnt/two  spaces/é"  # nothing else changes


@given(st.text())
def test_every_printable_string_passes_the_checkers_strict_parse(text: str) -> None:
    clean = strict.printable(text)
    try:
        doc = strict.parse_json(json.dumps({"k": clean}).encode("utf-8", "surrogatepass"))
    except strict.ParseError as exc:  # only an unpaired surrogate (not a control character) is left
        assert "surrogate" in str(exc)
    else:
        assert doc == {"k": clean} and not any(ord(c) < 32 or ord(c) == 127 for c in clean)


def test_the_hosts_facts_carry_the_mpi_library_without_its_nul(tmp_path: Path) -> None:
    facts = host_facts(tmp_path, OPEN_MPI)
    assert facts["mpi_library"] == OPEN_MPI[:-1]
    strict.parse_json(json.dumps(facts).encode())  # what the checker reads back


def test_the_runner_refuses_to_publish_a_bundle_its_checker_would_refuse(
    honest_bundles: dict[str, Path], tmp_path: Path
) -> None:
    src = honest_bundles["llama3_8b"]
    rules = json.loads((src / "run.json").read_text())["rules_version"]
    assert self_check(src, rules) == ""
    bad = tmp_path / "b"
    shutil.copytree(src, bad)
    system = json.loads((bad / "system.json").read_text())
    system["hosts"][0]["mpi_library"] = OPEN_MPI  # as the runner stored it before
    (bad / "system.json").write_text(json.dumps(system))
    assert self_check(bad, rules) == "system.json: string holds a NUL character"
    run = json.loads((src / "run.json").read_text())
    run["verdict"] = "splendid"
    (bad / "system.json").write_bytes((src / "system.json").read_bytes())
    (bad / "run.json").write_text(json.dumps(run))
    assert self_check(bad, rules).startswith("run.json: verdict: 'splendid' is not one of")
