"""Where the run's checkpoints go and how they leave: ``backends`` (the one storage interface,
and its folder implementation), ``objectstore`` (its S3 implementation), ``kinds`` (which storage
a configured folder is, and the sweep of a run that cannot finish), ``folderlock`` (one run at a
time on a folder) and ``cleanup`` (what the run created, removed in order at the end).  This run's
place on each tier is made by the folders phase (mlckpt/run/phases/folders.py)."""
