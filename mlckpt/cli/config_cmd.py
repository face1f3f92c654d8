"""`mlckpt config OVERRIDES`: print the resolved configuration (as Hydra's --cfg job does)."""

from __future__ import annotations

import argparse

from mlckpt.cli import hydra_app
from mlckpt.errors import ExitStatus


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="print the resolved configuration",
                       description="Compose workloads/config.yaml with the overrides and print "
                       "the resolved YAML (validated against the rules' config schema).")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    hydra_app.add_source_flags(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from mlckpt.plan.config import compose, resolved_yaml, validate  # Hydra: not for --help

    src, overrides = hydra_app.source(args), hydra_app.aliased(args.overrides)
    validate(compose(overrides, src))
    print(resolved_yaml(overrides, src), end="")
    return ExitStatus.OK
