"""One function run in a forked child process, its value brought back over a pipe (pickled).

The checker's share of a large bundle's work on a second core (checker/rule_workers.py, the
records' second half in checker/records_read.py): a fork shares the parsed bundle without copying
it.  What the function raises is raised again by :meth:`Forked.result`, as the same exception
where it pickles (else a RuntimeError naming it), the child's traceback kept as a note for
MLCKPT_DEBUG.  A child that dies (killed, out of memory) gives no value, and a fork that fails
raises OSError: either way the caller does the work itself.  Linux and macOS only: callers check
:data:`AVAILABLE`.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")
AVAILABLE = hasattr(os, "fork")
# Below this many records a bundle's work stays in one process: a fork would cost more than the
# share it takes (check_large.py: 1,024 ranks x 20 ops take about a second; 8 ranks, milliseconds).
MIN_RECORDS = 4096


class Forked(Generic[T]):
    """``fn()`` in a child process, started now; :meth:`result` waits for its value."""

    def __init__(self, fn: Callable[[], T]) -> None:
        r, w = os.pipe()
        gc.freeze()  # the parsed bundle stays shared pages: the child's collector leaves it alone
        try:
            pid = os.fork()
        except OSError:
            gc.unfreeze()
            os.close(r)
            os.close(w)
            raise
        if pid == 0:  # the child: never returns, never runs this process's exit handlers
            code = 1
            try:
                os.close(r)
                try:
                    payload: tuple[bool, object] = (True, fn())
                except Exception as exc:
                    payload = (False, portable(exc))
                # Pickled whole before the first byte is written: a pipe holds 64 KiB, and the
                # parent reads only once its own share is done, so pickling into the pipe would
                # wait for it rather than overlap with it.
                data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(w, "wb") as out:
                    out.write(data)
                code = 0
            finally:
                os._exit(code)
        gc.unfreeze()
        os.close(w)
        self.pid: int | None = pid
        self._fd = r

    def result(self) -> tuple[bool, T | None]:
        """(True, its value), or (False, None) where the child died without one; what ``fn``
        raised is raised here."""
        with os.fdopen(self._fd, "rb") as f:
            data = f.read()
        assert self.pid is not None
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0 or not data:
            return False, None
        try:
            ok, value = pickle.loads(data)
        except Exception:  # a child cut off mid-write
            return False, None
        if not ok:
            raise value
        return True, value

    def __enter__(self) -> Forked[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """A child whose value was never asked for (the caller failed first) is stopped and reaped."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            os.close(self._fd)
            self.pid = None


def portable(exc: BaseException) -> BaseException:
    """``exc`` as it can cross the pipe: itself where it pickles, else a RuntimeError naming it;
    the child's traceback kept as a note."""
    note = "in a forked checker process:\n" + "".join(traceback.format_exception(exc))
    try:
        back = pickle.loads(pickle.dumps(exc))
    except Exception:
        back = RuntimeError(f"{type(exc).__name__}: {exc}")
    back.add_note(note)
    return back
