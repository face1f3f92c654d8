"""Where the run's checkpoints go and how they leave: ``folders`` (this run's place on each tier,
or a write invocation's folder a read-only invocation restores), ``folderlock`` (one run at a
time on a folder), ``objectstore`` (a run on an S3 store) and ``cleanup`` (what the run created,
removed in order at the end or swept from the plan when it cannot finish)."""
