"""The runner's side of the optional features a configuration turns on: ``witnessing`` (a
witnessed run, ``witness.url``) and ``split`` (split invocations: a write invocation kept for a later
read invocation, ``checkpoint.restore_from``).  The state on the GPU (``state.source=gpu``) is a phase
of its own, mlckpt/run/phases/gpustate.py."""
