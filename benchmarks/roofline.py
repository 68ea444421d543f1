"""The CPU memory roofline: copy bandwidth on every core, measured in the caller's run.

XLA's CPU elementwise ops run on one thread, so they are no bandwidth reference for the
kernels, which use XLA's whole thread pool. `parallel_copy` copies a buffer with numpy
(memcpy, GIL released) from one thread per core and counts bytes read + bytes written.

Store kinds: glibc's memcpy writes copies this large (128 MiB per thread, past its
non-temporal threshold, a fraction of the shared cache) with streaming stores, so each
byte copied moves 2 bytes, no read-for-ownership of the destination. The kernels also
write with streaming stores for inputs of 32 MiB and more (ffi/cpu/stream.h), so the
comparison counts the same traffic on both sides.
"""

from __future__ import annotations

import os
import threading

import numpy as np


def parallel_copy(nbytes: int = 256 << 20, threads: int | None = None):
  """A function that copies an `nbytes` buffer with one thread per core; with the bytes each
  call moves (read + written)."""
  threads = threads or os.cpu_count() or 1
  src = np.ones(nbytes, np.uint8)
  dst = np.zeros_like(src)  # written here, so its pages are faulted in before any timing
  bounds = [nbytes * i // threads // 64 * 64 for i in range(threads)] + [nbytes]
  pieces = [(src[a:b], dst[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

  def copy_all():
    workers = [threading.Thread(target=np.copyto, args=(d, s)) for s, d in pieces]
    for w in workers:
      w.start()
    for w in workers:
      w.join()

  return copy_all, 2 * nbytes


def quantize_bytes(n: int, k: int, bits: int, block: int = 32, in_bytes: int = 2,
                   outputs: int = 1) -> int:
  """Bytes a quantize of n elements (rows of k) moves: the input once, and codes and scales
  for each of `outputs` quantizations (2: rowwise + columnwise, counted as rowwise)."""
  return n * in_bytes + outputs * (n // k * (-(-k * bits // 8)) + n // block)
