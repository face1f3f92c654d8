"""The MPI tests: every module's runs sign with a key in a config home of its own, never the
user's (signing.key=auto creates one under $XDG_CONFIG_HOME/mlckpt)."""

from support.runs import private_config_home  # noqa: F401 (an autouse fixture)
