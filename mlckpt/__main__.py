"""`python -m mlckpt ...` is the `mlckpt` command (used by the self-launch under mpiexec)."""

from mlckpt.cli import main

main()
