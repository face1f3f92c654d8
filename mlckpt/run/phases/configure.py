"""The first phase: the validated configuration, and what rank 0 must load before anything runs
(the system description, the output folder, an explicit signing key), so that a bad input never
costs a whole run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mlckpt import bundle
from mlckpt.errors import UsageError
from mlckpt.host.description import load_system_description
from mlckpt.plan.config import SHIPPED, ConfigSource, Setup, setup
from mlckpt.run.collective import Job
from mlckpt.run.features.split import Source, load_source
from mlckpt.run.phases.gates import output_problem
from mlckpt.run.site_mpi import first_line
from mlckpt.workload.pipeline import Pipeline


@dataclass(frozen=True)
class Configured:
    setup: Setup
    pipe: Pipeline
    overrides: tuple[str, ...]
    description: Mapping[str, object] | None  # the vendor's system description (rank 0)
    signing_key: Ed25519PrivateKey | None  # an explicit key path, loaded (rank 0); None: auto or none
    source: Source | None = None  # a read-only invocation: the write invocation it restores

    @property
    def config(self) -> Mapping[str, Any]:
        return self.setup.config


def resolve_signing_key(setting: str, say: Callable[[str], object]) -> Ed25519PrivateKey | None:
    """``auto``: the user's key (``mlckpt keygen``'s default path), created once; ``none``: no
    signature; anything else: a PEM key path (passphrase from $MLCKPT_KEY_PASSPHRASE)."""
    if setting == "none":
        return None
    if setting == "auto":
        path = bundle.default_key_path()
        if not path.exists():
            info = bundle.generate_key(path)
            say(
                f"created signing key {path} (fingerprint {info.fingerprint}); give {info.public_path} "
                "to the committee that checks your results"
            )
        return bundle.load_private_key(path)
    return bundle.load_private_key(Path(setting))


def mpi_library() -> str:
    try:
        from mpi4py import MPI

        return first_line(MPI.Get_library_version())  # Open MPI's ends in NUL
    except Exception:  # pragma: no cover - facts are best effort
        return ""


def configure(job: Job, overrides: Sequence[str], source: ConfigSource = SHIPPED) -> Configured:
    """The validated configuration; rank 0 also loads what must not fail after a whole run (the
    system description, the output folder, an explicit signing key)."""
    ovs = list(overrides)
    if not any(o.split("=", 1)[0].lstrip("+") == "ranks" for o in ovs):
        ovs.append(f"ranks={job.size}")
    s = setup(ovs, source)
    description, key, restored = None, None, None
    run = s.settings
    if job.rank == 0:
        if run.system:
            description = load_system_description(run.system, s.rules.version)
        problem = output_problem(run.results)
        if problem:
            raise UsageError(f"output.root: {problem}", key="output.root")
        if run.signing_key not in ("auto", "none"):
            key = resolve_signing_key(run.signing_key, job.say)
        if run.checkpoint.restore_from:  # the write invocation's bundle, verified, before any I/O
            restored = load_source(run.checkpoint.restore_from, run.results, s.config)
    if s.plan.ranks != job.size:
        raise UsageError(
            f"ranks={s.plan.ranks} but the MPI world has {job.size} ranks "
            "(drop ranks= under mpiexec, or match -n)",
            key="ranks",
        )
    return Configured(s, Pipeline.of(s.config), tuple(ovs), description, key, restored)
