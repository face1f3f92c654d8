"""Shared, generic test helpers.  Keep this file small: only fixtures several test files use."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from support.cli import (
    ASYNC_COMPUTE_S,
    ASYNC_FAST_TIER,
    CHECKER_DESCRIPTION,
    CHECKER_ORG,
    CLI_TIMEOUT_S,
    MLCKPT,
    S3_BUCKET,
    cli_env,
    s3_client,
)

# The suite runs on shared machines (CI, a laptop beside other work, the suite beside a tenant):
# a run another process disturbed is run again, as the product tells its users to (README: On a
# busy machine); tests that study disturbed runs unset it (tests/mpi/test_environment.py).
os.environ.setdefault("MLCKPT_RETRY_DISTURBED", "2")

# The suite runs beside other tenants (CI's, the tests' own): a per-example deadline fails honest
# code on a busy machine, so property tests are bounded by their examples, not by the clock.
settings.register_profile("busy-machine", deadline=None)
settings.load_profile("busy-machine")


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_cli("plan", "workload=llama3_8b", "--json")`` runs the installed ``mlckpt`` console
    script in a fresh temporary directory and returns the CompletedProcess (text mode)."""
    if not MLCKPT.is_file():
        pytest.fail(f"console script not installed next to the interpreter: {MLCKPT}")

    def run(*args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(MLCKPT), *args], cwd=tmp_path, env=cli_env(), text=True,
                              capture_output=True, timeout=timeout, check=False)

    return run


# --- mlckpt-check: honest bundles made once by the real runner ----------------------------------

@pytest.fixture(scope="session")
def honest_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two real bundles (llama3_8b, llama_7b; open, scale 0.0005, 4 ranks, 1 write + 1 read) and an
    asynchronous, tiered llama3_8b run (``"async_tiers"``: 2 writes + 2 reads, fast tier
    ``ASYNC_FAST_TIER`` relative to ``"dir"``, training interval ``ASYNC_COMPUTE_S``) and a serving
    run (``"serving"``: llama3_8b's weights, 2 replicas of TP 2, fan-out, 2 loads) and a framework run
    (``"framework"``: PyTorch DCP, 1 write + 1 read; only where PyTorch is installed), all signed
    with ``keys/org.pem``; also ``keys/other.pem`` (trusted for other-org), ``keys/rogue.pem``
    (untrusted), ``trusted-keys.yaml`` and ``laptop-ext4.yaml``.  Keys: ``"dir"`` → that folder."""
    from mlckpt import bundle

    d = tmp_path_factory.mktemp("honest")
    infos = {n: bundle.generate_key(d / "keys" / f"{n}.pem") for n in ("org", "other", "rogue")}
    (d / "laptop-ext4.yaml").write_text(CHECKER_DESCRIPTION)
    (d / "trusted-keys.yaml").write_text(
        f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {CHECKER_ORG}: ["{infos["org"].public_key}"]\n'
        f'  other-org: ["{infos["other"].public_key}"]\n')
    # the checker's tests need valid bundles: beside a busy disk a try may come out disturbed, so
    # each run is tried up to six times (the last try's bundle is the one printed last)
    env = {**cli_env(), "XDG_CONFIG_HOME": str(d / "xdg"), "MLCKPT_RETRY_DISTURBED": "5"}
    proc = subprocess.run(
        [str(MLCKPT), "run", "--json", "-m", "workload=llama3_8b,llama_7b", "division=open", "scale=0.0005",
         "ranks=4", "checkpoint.num_writes=1", "checkpoint.num_reads=1", "io.direct=false",
         "system=laptop-ext4.yaml", f"signing.key={d / 'keys' / 'org.pem'}", "output.root=results"],
        cwd=d, env=env, text=True, capture_output=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr
    out = {"dir": d}
    for line in proc.stdout.splitlines():  # mlckpt run --json: one outcome per combination
        path = Path(json.loads(line)["bundle"])
        out["llama3_8b" if "-llama3_8b-" in path.name else "llama_7b"] = path
    assert {"llama3_8b", "llama_7b"} <= set(out), proc.stdout
    common = ["workload=llama3_8b", "division=open", "scale=0.0005", "ranks=4", "system=laptop-ext4.yaml",
              f"signing.key={d / 'keys' / 'org.pem'}", "output.root=results"]

    def last_bundle(*overrides: str) -> Path:
        proc = subprocess.run([str(MLCKPT), "run", "--json", *common, *overrides], cwd=d, env=env,
                              text=True, capture_output=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr
        return Path(json.loads(proc.stdout)["bundle"])  # the last try's

    # Asynchronous and tiered: 2 writes (checkpoint 1 leaves the fast tier once 2 is durable) and 2
    # restores (checkpoint 1 from the durable tier, 2 from the fast tier: a folder on /tmp's disk).
    out["async_tiers"] = last_bundle(
        "checkpoint.mode=async", f"checkpoint.tiers.fast={ASYNC_FAST_TIER}",
        f"checkpoint.compute_interval_s={ASYNC_COMPUTE_S}", "checkpoint.num_writes=2",
        "checkpoint.num_reads=2", "io.direct=false")
    # A serving run (rules 1.13): 2 replicas of TP 2 loading by fan-out, twice.
    out["serving"] = last_bundle("serving.strategy=fanout", "serving.tp=2", "serving.loads=2")
    # A framework run (rules 1.11): PyTorch DCP writes and restores, 1 + 1 (where PyTorch is here:
    # .ci/run installs its CPU build where the image's wheels offer it).
    if importlib.util.find_spec("torch") is not None:
        out["framework"] = last_bundle("framework.writer=torch_dcp", "checkpoint.num_writes=1",
                                       "checkpoint.num_reads=1", "io.direct=false")
    return out


# --- object storage (tests/e2e/test_objects.py, tests/mpi/test_objects_mpi.py): one real S3 store
# (Swift's all-in-one) per session -------------------------------------------------------------

@pytest.fixture(scope="session")
def s3_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3-compatible store on the loopback address (benchmarks/lab/s3local.py: OpenStack Swift with
    its S3 API) holding the bucket ``S3_BUCKET``; ``.env`` is what a client (and mlckpt) needs."""
    from lab import s3local

    why = s3local.unavailable()
    if why:
        pytest.skip(why)
    store = s3local.start(tmp_path_factory.mktemp("s3store"))
    try:
        s3_client(store.env).create_bucket(Bucket=S3_BUCKET)
        yield store
    finally:
        store.stop()


