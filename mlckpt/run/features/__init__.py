"""The runner's side of the optional features a configuration turns on: ``gpustate`` (the state
on the GPU, ``state.source=gpu``), ``witnessing`` (a witnessed run, ``witness.url``) and ``split``
(split invocations: a write half kept for a later read half, ``checkpoint.restore_from``)."""
