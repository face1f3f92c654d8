"""`mlckpt config OVERRIDES`: print the resolved configuration (as Hydra's --cfg job does)."""

from __future__ import annotations

import argparse

from mlckpt.plan.config import compose, resolved_yaml, validate


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("config", help="print the resolved configuration",
                       description="Compose workloads/config.yaml with the overrides and print "
                       "the resolved YAML (validated against the rules' config schema).")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    validate(compose(args.overrides))
    print(resolved_yaml(args.overrides), end="")
    return 0
