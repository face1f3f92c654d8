"""A committee's and a vendor's first hour: keys, trusted keys, a system description.  Run as a
person would: the installed commands, their output pasted into the files they describe."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlckpt import bundle, strict
from mlckpt.errors import ConfigError, UsageError
from mlckpt.host.description import load_system_description
from mlckpt.rules.engine import DEFAULT_RULES_VERSION

BIN = Path(sys.executable).parent


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / args[0]), *args[1:]], text=True, capture_output=True, cwd=cwd,
                          check=False, timeout=120)


def test_keygen_prints_an_entry_that_trusts_the_key(tmp_path: Path) -> None:
    proc = run("mlckpt", "keygen", "--out", str(tmp_path / "k.pem"), "--org", "acme")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    entry = lines[lines.index(next(ln for ln in lines if "under organizations:" in ln)) + 1]
    (tmp_path / "trusted-keys.yaml").write_text(f'mlckpt_trusted_keys: "1.0"\norganizations:\n{entry}\n')
    trusted = bundle.TrustedKeys.load(tmp_path / "trusted-keys.yaml")
    (info,) = trusted.keys_for("acme")
    assert trusted.org_for(info.keyid) == "acme"
    # One notation everywhere: the .pub file's text, and the fingerprint keygen prints, which the
    # pasted entry carries as a comment and the signature's keyid begins with.
    pub = (tmp_path / "k.pem.pub").read_text().strip()
    fp = next(ln.split()[1] for ln in lines if ln.startswith("fingerprint: "))
    assert info.public_key == pub and info.keyid.startswith(fp) and len(fp) == 16
    assert entry.endswith(f"# fingerprint {fp}") and pub in entry


def test_a_passphrase_in_another_variable_is_told_which_one_the_run_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, "PW": "s3cret"}
    proc = subprocess.run([str(BIN / "mlckpt"), "keygen", "--out", str(tmp_path / "k.pem"),
                           "--passphrase-env", "PW"], text=True, capture_output=True, env=env,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "mlckpt run reads the passphrase from $MLCKPT_KEY_PASSPHRASE" in proc.stdout
    assert "--passphrase-env PW" in proc.stdout
    monkeypatch.delenv("MLCKPT_KEY_PASSPHRASE", raising=False)
    with pytest.raises(UsageError, match="encrypted; set MLCKPT_KEY_PASSPHRASE to its passphrase"):
        bundle.load_private_key(tmp_path / "k.pem")  # what the run does
    monkeypatch.setenv("MLCKPT_KEY_PASSPHRASE", "s3cret")
    assert bundle.load_private_key(tmp_path / "k.pem") is not None
    quiet = subprocess.run([str(BIN / "mlckpt"), "keygen", "--out", str(tmp_path / "j.pem"),
                            "--passphrase-env", "MLCKPT_KEY_PASSPHRASE"], text=True, capture_output=True,
                           env={**os.environ, "MLCKPT_KEY_PASSPHRASE": "x"}, check=False, timeout=120)
    assert quiet.returncode == 0 and "reads the passphrase" not in quiet.stdout


def test_organisations_at_the_top_level_are_told_where_they_go(tmp_path: Path) -> None:
    path = tmp_path / "trusted-keys.yaml"
    path.write_text('acme: ["ed25519:CyevH6lrq2mRN70CUc5kJyGp9Z6dM79HtyQbHL9udaw="]\n')
    with pytest.raises(UsageError, match=r"organisations go under organizations:.*found 'acme'"):
        bundle.TrustedKeys.load(path)
    (tmp_path / "open").mkdir()
    proc = run("mlckpt-check", str(tmp_path))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "mlckpt keygen --org NAME" in proc.stderr


def test_describe_system_drafts_a_valid_description(tmp_path: Path) -> None:
    proc = run("mlckpt", "describe-system", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    doc = strict.loads_yaml(proc.stdout)
    assert doc["storage"]["usable_capacity_tib"] > 0 and doc["clients"]["memory_gib"] > 0
    assert "COMPLETE" in doc["submitter"]  # what only the vendor knows is marked
    out = tmp_path / "system.yaml"
    proc = run("mlckpt", "describe-system", str(tmp_path), "--out", str(out))
    assert proc.returncode == 0 and "replace the values marked COMPLETE" in proc.stdout
    # the draft is refused until its placeholders are replaced, naming the first and the count
    with pytest.raises(ConfigError) as got:
        load_system_description(out, DEFAULT_RULES_VERSION)
    assert str(got.value).startswith(f"system: {out}: submitter is still the draft's placeholder "
                                     "'COMPLETE: your organisation' (and "), got.value
    assert got.value.key == "system"
    done = out.read_text().replace('"COMPLETE: your organisation"', "ACME")
    done = re.sub(r'"COMPLETE: [^"]*"', '"vm"', done)
    out.write_text(done)
    assert load_system_description(out, DEFAULT_RULES_VERSION)["description_format"] == 1
    # each command it names as next works on this host (the run's own path: tests/mpi)
    nexts = [ln.split("#")[0].split() for ln in proc.stdout.splitlines() if ln.startswith("  mlckpt ")]
    assert [n[:2] for n in nexts] == [["mlckpt", "run"], ["mlckpt", "plan"]], proc.stdout
    plan = run(*[w.replace("hosts=N", "hosts=1").replace("accelerator=NAME", "accelerator=h100")
                 for w in nexts[1]])
    assert plan.returncode == 0 and "Verdict: closed" in plan.stdout, plan.stderr
    first = subprocess.run(
        [str(BIN / "mlckpt"), *[w.replace("FOLDER", str(tmp_path / "ckpt")) for w in nexts[0][1:]],
         f"output.root={tmp_path / 'out'}", "signing.key=none", "io.direct=false"],
        text=True, capture_output=True, check=False, timeout=600,
        env={**os.environ, "MLCKPT_RETRY_DISTURBED": "3"})
    assert first.returncode in (0, 6) and "bundle: " in first.stdout, first.stderr  # 6: disturbed
    again = run("mlckpt", "describe-system", str(tmp_path), "--out", str(out))
    assert again.returncode == 2 and "exists; not overwritten" in again.stderr


@pytest.mark.parametrize("writer", ["torch_save", "safetensors"])
def test_a_framework_writer_without_pytorch_is_refused_before_any_rank(tmp_path: Path, writer: str) -> None:
    """PyTorch hidden as an uninstalled package is (``sys.modules["torch"] = None``, from a
    sitecustomize every process of the run would load): one line naming the writer, the package
    and both install lines, exit 2, before any rank or any checkpoint folder exists."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text('import sys\nsys.modules["torch"] = None\n')
    env = {**os.environ, "PYTHONPATH": str(hide), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    proc = subprocess.run([str(BIN / "mlckpt"), "run", "division=open", "scale=0.0005", "ranks=2",
                           f"framework.writer={writer}", "io.direct=false", "signing.key=none",
                           f"checkpoint.folder={tmp_path / 'ckpt'}", f"output.root={tmp_path / 'out'}"],
                          text=True, capture_output=True, env=env, check=False, timeout=300)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line == (f"mlckpt: error: framework.writer={writer}: torch is not installed: pip install "
                    "'mlckpt[frameworks]'; without a GPU, PyTorch's CPU build first: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu"), line
    assert "rank" not in proc.stdout and not (tmp_path / "ckpt").exists()


# ----------------------------------------------------------------------------------------------
# From a run to a checked, published result: the documented recipe, word for word.

def recipe() -> list[str]:
    """The command lines of the recipe on the operator's page (its sh block)."""
    page = (Path(__file__).parents[2] / "docs/src/run/your-storage.md").read_text()
    section = page.split("## From a run to a checked, published result", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_documented_path_from_a_run_to_a_published_result(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    env.pop("MLCKPT_DEBUG", None)
    env["MLCKPT_RETRY_DISTURBED"] = "5"  # beside a busy disk: the last try's bundle is the one kept
    lines = recipe()
    assert lines[0].startswith("mlckpt describe-system") and lines[-1].startswith("mlckpt-check leaderboard")
    for line in lines:
        proc = subprocess.run(line, shell=True, cwd=tmp_path, env=env, text=True, capture_output=True,
                              timeout=300, check=False)
        if line.startswith("mlckpt place"):  # a disturbed try's bundle is no result: keep the last
            bundles = sorted((tmp_path / "mlckpt-results").iterdir())
            if len(bundles) > 1:
                proc = subprocess.run(line.replace("mlckpt-results/*/", str(bundles[-1])), shell=True,
                                      cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300)
        assert proc.returncode == 0, (line, proc.stdout[-2000:], proc.stderr[-2000:])
    tree = tmp_path / "submission"
    [placed] = (tree / "open" / "acme-storage" / "results").glob("*/llama3_8b/*")
    assert (placed / "bundle.dsse.json").is_file()
    system = yaml_of(tree / "open" / "acme-storage" / "systems" / f"{placed.parent.parent.name}.yaml")
    assert system["submitter"] == "Acme Storage" and "COMPLETE" not in str(system)
    check = subprocess.run([str(BIN / "mlckpt-check"), str(tree), "--json", "-"], text=True,
                           capture_output=True, env=env, check=False)
    report = json.loads(check.stdout)
    assert report["verdict"] == "valid" and report["summary"]["bundles"] == 1, report["findings"]
    page = (tmp_path / "leaderboard.html").read_text()
    assert placed.name in page or "acme-storage" in page


def yaml_of(path: Path) -> dict:  # type: ignore[type-arg]
    import yaml

    return yaml.safe_load(path.read_text())


def test_place_refuses_before_it_copies_anything(tmp_path: Path, honest_bundles: dict[str, Path]) -> None:
    source = honest_bundles["llama3_8b"]
    tree = tmp_path / "tree"
    ok = run("mlckpt", "place", str(source), str(tree), "--org", "example-org")
    assert ok.returncode == 0, ok.stderr
    assert "trusted keys:" in ok.stdout and (tree / "trusted-keys.yaml").is_file()
    # again: already there; with another bundle first in line, neither is copied
    other = honest_bundles["llama_7b"]
    again = run("mlckpt", "place", str(other), str(source), str(tree), "--org", "example-org")
    assert again.returncode == 2 and "already in the tree" in again.stderr, again.stderr
    assert not list(tree.glob("open/example-org/results/*/llama_7b"))
    # a lone bundle given to the checker: told to place it
    lone = run("mlckpt-check", str(source))
    assert lone.returncode == 2 and f"mlckpt place {source} TREE" in lone.stderr, lone.stderr
    # a bundle whose run had no system description
    bare = tmp_path / "bare"
    ran = subprocess.run([str(BIN / "mlckpt"), "run", "--json", "scale=0.0005", "ranks=2",
                          "checkpoint.num_writes=1", "checkpoint.num_reads=1", "io.direct=false",
                          "checkpoint.folder=ck", f"output.root={bare}"], cwd=tmp_path, text=True,
                         capture_output=True, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "x")},
                         check=False, timeout=300)
    made = json.loads(ran.stdout)["bundle"]
    refused = run("mlckpt", "place", made, str(tmp_path / "t2"))
    assert refused.returncode == 2 and "no system description" in refused.stderr
    assert not (tmp_path / "t2").exists()
