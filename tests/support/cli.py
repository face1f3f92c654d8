"""The installed commands as the tests run them, and the honest test system every checker test
describes and trusts."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from support.paths import SUPPORT

# The console script installed into the same environment as the interpreter running the tests.
MLCKPT = Path(sys.executable).parent / "mlckpt"
CLI_TIMEOUT_S = 60
FAULT_LAUNCHER = SUPPORT / "fault_launcher.py"


def mlckpt_command(env: dict[str, str] | None = None) -> list[str]:
    """``mlckpt``, or the test-only fault launcher (tests/support/fault_launcher.py) when ``env`` asks
    for an injected fault: the product has no switch for faults, only a seam."""
    if any(k.startswith("MLCKPT_TEST_") for k in env or {}):
        return [sys.executable, str(FAULT_LAUNCHER)]
    return [str(MLCKPT)]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MLCKPT_DEBUG", None)  # with it set, internal errors re-raise with a traceback
    return env


CHECKER_ORG = "example-org"
CHECKER_SYSTEM = "laptop-ext4"
ASYNC_FAST_TIER = "fast-tier"  # honest_bundles["async_tiers"]: its fast tier, under "dir"
ASYNC_COMPUTE_S = 0.05
CHECKER_DESCRIPTION = """\
description_format: 1
system_name: laptop-ext4
submitter: Example Org
availability: available
storage: {product: ext4 test disk, type: local-nvme, usable_capacity_tib: 0.5,
          max_write_gib_s: 100, max_read_gib_s: 100}
clients: {count: 1, model: test VM, memory_gib: 24}
network: {type: none}
"""


S3_BUCKET = "mlckpt-test"


def s3_client(env: dict[str, str]) -> Any:
    """A plain boto3 client on the test store (the tests' own view, independent of mlckpt's)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                        config=Config(s3={"addressing_style": "path"}))
