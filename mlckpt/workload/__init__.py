"""The workload, pure: the model and its parallelism (``model``: the one parameter formula), its
per-rank files (``layout``: the Plan), and what each checkpoint mode costs (``pipeline``)."""
