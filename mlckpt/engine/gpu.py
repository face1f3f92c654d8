"""GPU-resident state (rules 1.7, ``state.source=gpu``): each rank's shard lives in device memory,
as a trainer's parameters and optimizer state do, and every checkpoint starts with a copy out of
it.  The one module that imports the array library (PyTorch; ``pip install 'mlckpt[gpu]'``).

The copy path, the same for every checkpoint op:

- The rank's host buffers (the arena, the async staging copy) stay ``content.alloc``'s page-aligned,
  huge-page mappings, so the file engine writes and reads them with O_DIRECT as before; they are
  *pinned in place* (``cudaHostRegister``) rather than replaced by the library's pinned allocator,
  so device copies into them run at the DMA engines' rate and need no second bounce.
- Copies run on a CUDA stream of the rank's own (non-blocking), never on the stream the training
  kernels use, so a snapshot overlaps with training work still running on the GPU.
- ``train`` keeps the GPU busy for a training interval with bf16 matrix products on the training
  stream, leaving the last batch running when it returns (the next checkpoint's copy competes
  with it, as it would in a trainer).

On a host without CUDA, ``device="cpu"`` runs the same calls through the library's CPU tensors (no
streams, no pinning, nothing to overlap): a dry run of the path for tests and field debugging,
which the rules judge invalid as a GPU result (GPU-SOURCE-RECORDED).

Effects only: no MPI, no clock of the run's (the probe times itself), no printing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlckpt.errors import UsageError

COPY_PATH = "pinned host buffer (cudaHostRegister of the engine's mapping) <-> device, on a stream of its own"
CPU_COPY_PATH = "the array library's CPU tensors (no GPU: a dry run of the path)"
PROBE_BYTES = 256 << 20  # the copy-rate probe: enough to reach the DMA engines' steady rate
_MATMUL_N = 4096  # training kernels: 4096² bf16 products (~0.2 ms each on an H100)
_QUEUED = 8  # at most this many training kernels waiting on the GPU at once


MISSING = "PyTorch is not installed on this host (pip install 'mlckpt[gpu]')"


def library() -> Any:
    """The array library, or UsageError naming the extra to install."""
    try:
        import torch
    except ImportError:
        raise UsageError(f"state.source=gpu: {MISSING}", key="state.source") from None
    return torch


def probe_host(device: str | None) -> tuple[dict[str, object] | None, str | None]:
    """What a host's leader reports for the gates: its GPUs (name, count, library) or why the
    state cannot live there (a missing library, no CUDA device)."""
    try:
        import torch
    except ImportError:
        return None, MISSING
    facts = {"library": "torch", "library_version": str(torch.__version__)}
    if device == "cpu":
        return {**facts, "device_type": "cpu", "count": 0, "names": []}, None
    if not torch.cuda.is_available():
        return None, (f"no CUDA device (torch {torch.__version__}, "
                      f"built for CUDA {torch.version.cuda or 'none'})")
    n = torch.cuda.device_count()
    return {**facts, "device_type": "cuda", "count": n,
            "names": [torch.cuda.get_device_name(i) for i in range(n)]}, None


@dataclass
class DeviceState:
    """One rank's shard in device memory and the streams it is copied and trained on."""

    torch: Any
    device: Any  # torch.device
    state: Any  # uint8 tensor of the shard's bytes on ``device``
    copy_stream: Any  # None on the CPU
    train_stream: Any
    pinned: list[int]  # host addresses registered with CUDA (unregistered on close)
    _mats: Any = None
    _pending: Any = None  # events of queued training kernels

    @property
    def cuda(self) -> bool:
        return bool(self.device.type == "cuda")

    @property
    def nbytes(self) -> int:
        return int(self.state.numel())

    def pin(self, buf: np.ndarray) -> None:
        """Pin ``buf`` (an ``alloc`` mapping) in place for DMA; idempotent per address."""
        if not self.cuda or buf.nbytes == 0 or buf.ctypes.data in self.pinned:
            return
        err = self.torch.cuda.cudart().cudaHostRegister(buf.ctypes.data, buf.nbytes, 0)
        if int(err) != 0:
            raise UsageError(f"state.source=gpu: cudaHostRegister of {buf.nbytes} bytes failed "
                            f"(CUDA error {int(err)}; locked-memory limit?)", key="state.source")
        self.pinned.append(buf.ctypes.data)

    def _host(self, buf: np.ndarray, n: int) -> Any:
        return self.torch.from_numpy(buf[:n])

    def upload(self, buf: np.ndarray, n: int) -> None:
        """Host → device: the first ``n`` bytes of ``buf`` into the shard; returns when done."""
        src = self._host(buf, n)
        if not self.cuda:
            self.state[:n].copy_(src)
            return
        with self.torch.cuda.stream(self.copy_stream):
            self.state[:n].copy_(src, non_blocking=True)
        self.copy_stream.synchronize()

    def download(self, buf: np.ndarray, n: int) -> None:
        """Device → host: the shard's first ``n`` bytes into ``buf``; returns when they are there."""
        dst = self._host(buf, n)
        if not self.cuda:
            dst.copy_(self.state[:n])
            return
        with self.torch.cuda.stream(self.copy_stream):
            dst.copy_(self.state[:n], non_blocking=True)
        self.copy_stream.synchronize()

    def train(self, until_ns: int) -> int:
        """Keep the GPU busy until ``until_ns`` (``time.perf_counter_ns``): matrix products on the
        training stream, at most ``_QUEUED`` waiting; the last ones stay running.  On the CPU
        there is nothing to overlap: it sleeps.  Returns the kernels launched."""
        if not self.cuda:
            time.sleep(max(0, until_ns - time.perf_counter_ns()) / 1e9)
            return 0
        torch = self.torch
        if self._mats is None:
            with torch.cuda.stream(self.train_stream):
                a = torch.randn(_MATMUL_N, _MATMUL_N, device=self.device, dtype=torch.bfloat16)
                self._mats = (a, a.clone(), torch.empty_like(a))
            self._pending = []
        a, b, c = self._mats
        launched = 0
        while time.perf_counter_ns() < until_ns:
            self._pending = [e for e in self._pending if not e.query()]
            if len(self._pending) >= _QUEUED:
                time.sleep(0.0002)
                continue
            with torch.cuda.stream(self.train_stream):
                torch.mm(a, b, out=c)
                ev = torch.cuda.Event()
                ev.record(self.train_stream)
            self._pending.append(ev)
            launched += 1
        return launched

    def settle(self) -> None:
        """Wait for queued training kernels (before restores: training has stopped)."""
        if self.cuda:
            self.train_stream.synchronize()
            self._pending = []

    def probe(self, buf: np.ndarray, nbytes: int = PROBE_BYTES, rounds: int = 3) -> dict[str, float]:
        """The copy rates of this rank's path alone (GiB/s, best of ``rounds``), through ``buf``
        (pinned).  Untimed by the run: called once, before any checkpoint."""
        n = min(nbytes, self.nbytes, buf.nbytes)
        if n == 0:
            return {"d2h_gib_s": 0.0, "h2d_gib_s": 0.0}
        best = {"d2h_gib_s": 0.0, "h2d_gib_s": 0.0}
        for _ in range(rounds):
            for key, fn in (("d2h_gib_s", self.download), ("h2d_gib_s", self.upload)):
                t0 = time.perf_counter_ns()
                fn(buf, n)
                dt = max(time.perf_counter_ns() - t0, 1)
                best[key] = max(best[key], n / dt * 1e9 / 2**30)
        return {k: round(v, 3) for k, v in best.items()}

    def describe(self) -> dict[str, object]:
        return {
            "library": "torch",
            "library_version": str(self.torch.__version__),
            "device": str(self.device),
            "device_type": self.device.type,
            "device_name": self.torch.cuda.get_device_name(self.device) if self.cuda else "cpu",
            "copy_path": COPY_PATH if self.cuda else CPU_COPY_PATH,
        }

    def close(self) -> None:
        if self.cuda:
            self.settle()
            for addr in self.pinned:
                self.torch.cuda.cudart().cudaHostUnregister(addr)
        self.pinned.clear()
        self.state = None
        self._mats = None


def open_state(device: str | None, local_rank: int, nbytes: int) -> DeviceState:
    """The shard's device memory: ``device`` ``None``/``auto`` = GPU local_rank mod the host's
    count, an integer = that GPU, ``cpu`` = the library's CPU fallback.  UsageError when the host
    cannot hold it."""
    torch = library()
    if device == "cpu":
        dev = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            raise UsageError("state.source=gpu: no CUDA device on this host", key="state.source")
        index = local_rank % torch.cuda.device_count() if device in (None, "auto") else int(device)
        dev = torch.device("cuda", index)
        torch.cuda.set_device(dev)
    try:
        # empty: no kernel on the default stream that the copy stream could overtake
        state = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)
    except RuntimeError as exc:  # out of device memory
        raise UsageError(f"state.source=gpu: cannot hold {nbytes} bytes on {dev}: "
                        f"{str(exc).splitlines()[0]}", key="state.source") from None
    cuda = dev.type == "cuda"
    return DeviceState(torch, dev, state,
                       torch.cuda.Stream(dev) if cuda else None,
                       torch.cuda.Stream(dev) if cuda else None, [])
