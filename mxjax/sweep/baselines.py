"""Weight quantizers of the sweep's rows, in plain jnp: what a user would pick instead of MX.

Each maps a GEMM kernel `w [K, N]` (K contracted) to its quantize-dequantize in w's dtype,
with a straight-through gradient, for weight-only QAT and PTQ alike.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mxjax._src import codec
from mxjax._src import formats as mx_formats
from mxjax._src.quantize import fake_quantize

INT8_MAX = 127


def _straight_through(w, wq):
  """`wq` in the forward pass, the identity's gradient in the backward pass."""
  return w + jax.lax.stop_gradient(wq - w)


def int8_per_channel(w: jax.Array) -> jax.Array:
  """w [K, N] -> symmetric INT8 quantize-dequantize, one scale `amax / 127` per column."""
  w32 = w.astype(jnp.float32)
  amax = jnp.max(jnp.abs(w32), axis=0, keepdims=True)  # [1, N]
  scale = jnp.where(amax > 0, amax / INT8_MAX, 1.0)
  q = jnp.clip(jnp.round(w32 / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
  return _straight_through(w, (q.astype(jnp.float32) * scale).astype(w.dtype))


def fp8_per_tensor(w: jax.Array, fmt: str = "e4m3") -> jax.Array:
  """w [K, N] -> per-tensor FP8 quantize-dequantize of w (scale `fp8_max / amax`)."""
  amax = jnp.max(jnp.abs(w.astype(jnp.float32)))
  scale = jnp.where(amax > 0, mx_formats.element_format(fmt).max / amax, 1.0)
  wq = codec.dequantize_per_tensor(codec.quantize_per_tensor(w, scale, fmt), scale, w.dtype)
  return _straight_through(w, wq)


def mx(w: jax.Array, fmt: str, block_size: int = 32, scale_mode: str = "rceil") -> jax.Array:
  """w [K, N] -> MX quantize-dequantize of w in blocks of `block_size` along K."""
  return fake_quantize(w, fmt, axis=0, block_size=block_size, scale_mode=scale_mode)
