"""The witness: an independent party's service that stamps a run's ops with its own
clock and signs what it saw.  ``protocol`` (pure: requests, event order, receipts, transcript),
``journal`` (its append-only, hash-chained journal), ``server`` (the aiohttp service)."""
