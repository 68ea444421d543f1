"""The operand dtype of the MX product on CPU: the one XLA's CPU GEMM is faster at.

MX values are exact in both bf16 and f32; XLA's CPU bf16 dot is fast only with bf16 dot
instructions (AVX512_BF16, AMX-BF16), else ~1.5x slower than f32.
`MXJAX_CPU_OPERAND_DTYPE=bfloat16|float32` overrides the choice.
"""

from __future__ import annotations

import functools
import os

import jax.numpy as jnp

_BF16_DOT_FLAGS = ("avx512_bf16", "amx_bf16")
_OVERRIDE = "MXJAX_CPU_OPERAND_DTYPE"


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
  """The CPU feature flags Linux reports (empty where there is no /proc/cpuinfo)."""
  try:
    with open(cpuinfo) as f:
      for line in f:
        if line.startswith("flags"):
          return frozenset(line.split(":", 1)[1].split())
  except OSError:
    pass
  return frozenset()


@functools.lru_cache(maxsize=None)
def cpu_operand_dtype() -> jnp.dtype:
  """bfloat16 where the CPU has bf16 dot instructions, else float32 (or the override)."""
  override = os.environ.get(_OVERRIDE)
  if override:
    if override not in ("bfloat16", "float32"):
      raise ValueError(f"{_OVERRIDE} must be 'bfloat16' or 'float32'; got {override!r}")
    return jnp.dtype(override)
  bf16 = any(flag in cpu_flags() for flag in _BF16_DOT_FLAGS)
  return jnp.dtype(jnp.bfloat16 if bf16 else jnp.float32)
