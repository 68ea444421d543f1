"""Shared timing for the benchmarks: warm up, then the median of several timed runs."""

from __future__ import annotations

import statistics
import time

import jax


def median_seconds(fn, *args, reps: int = 7, warmup: int = 2) -> float:
  """Median wall time of `fn(*args)` (a jitted function), blocking on its outputs."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def interleaved_times(fns: dict, *args, reps: int = 7, warmup: int = 2) -> dict:
  """Wall seconds of each `fn(*args)` per repetition ({name: [reps floats]}), the functions
  timed in turn within each repetition, so that a noisy neighbour slows all of them alike
  and the times of one repetition can be compared pairwise."""
  for fn in fns.values():
    for _ in range(warmup):
      jax.block_until_ready(fn(*args))
  times = {name: [] for name in fns}
  for _ in range(reps):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
  return times


def interleaved_medians(fns: dict, *args, reps: int = 7, warmup: int = 2) -> dict:
  """The median of each function's `interleaved_times`."""
  times = interleaved_times(fns, *args, reps=reps, warmup=warmup)
  return {name: statistics.median(t) for name, t in times.items()}


def cpu_model() -> str:
  """The CPU's model name (from /proc/cpuinfo where there is one)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  import platform  # noqa: PLC0415
  return platform.processor() or platform.machine()
