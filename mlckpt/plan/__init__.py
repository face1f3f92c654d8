"""From overrides to a judged plan: the configuration (``config``, the only Hydra importer), the
plan's report (``report``) and the bandwidth sizer (``sizer``)."""
