"""One rank's background worker for asynchronous and tiered checkpoints: the persist of one
checkpoint at a time, while the training thread goes on."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

_Job = tuple[Callable[[], object], Callable[[], object] | None]  # (persist, housekeeping after it)


class Background:
    """One rank's background worker: runs one checkpoint's persist at a time (one staging slot).
    A persistent thread, so handing work over inside the stall costs a queue put, not a thread
    start.  Its failure is raised by ``wait`` in the training thread, which turns it into the
    usual collective error."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.finished = threading.Event()
        self.pending = False
        self.result: object = None
        self.error: BaseException | None = None
        self.late_error: BaseException | None = None  # from an ``after`` step
        self.thread = threading.Thread(target=self._loop, name="mlckpt-persist", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (item := self.jobs.get()) is not None:
            job, after = item
            try:
                self.result = job()
            except BaseException as exc:  # handed to the training thread
                self.error = exc
            self.finished.set()
            if after is not None and self.error is None:
                try:
                    after()
                except BaseException as exc:  # raised by the next wait
                    self.late_error = exc

    def submit(self, job: Callable[[], object], after: Callable[[], object] | None = None) -> None:
        """Run ``job``; once it is done (``wait`` returns its result), run ``after`` before the
        next job."""
        self.finished.clear()
        self.result, self.error, self.pending = None, None, True
        self.jobs.put((job, after))

    def done(self) -> bool:
        return self.finished.is_set()

    def wait(self) -> Any:
        self.finished.wait()
        self.pending = False
        error = self.error or self.late_error
        self.late_error = None
        if error is not None:
            raise error
        return self.result

    def close(self) -> None:
        """Let a running persist end (files must not be written after cleanup), then stop."""
        if self.pending:
            self.finished.wait()
        self.jobs.put(None)
        self.thread.join()
