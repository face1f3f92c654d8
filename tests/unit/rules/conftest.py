"""The rules' own logic is tested whether or not the framework writers' libraries are installed
(the README's test command installs safetensors, not PyTorch); the plan's refusal of a writer
whose library is missing has its own test (test_framework_rules.py)."""

from __future__ import annotations

import pytest

from mlckpt.plan import config


@pytest.fixture(autouse=True)
def _libraries_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "library_installed", lambda module: True)
