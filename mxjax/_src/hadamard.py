"""The random Hadamard transform (RHT) of a GEMM's operands along their contraction: it
cancels in the product and spreads outliers across each block (NVFP4's wgrad, as TE)."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mxjax._src import sharding
from mxjax._src.codec import merge_axis, pad_axis, split_axis


def hadamard(n: int) -> np.ndarray:
  """The n x n Sylvester Hadamard matrix (n a power of two), entries +-1."""
  if n < 1 or n & (n - 1):
    raise ValueError(f"the Hadamard size must be a power of two, got {n}")
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


def rht_signs(seed: int, name: str, n: int) -> np.ndarray:
  """The random signs (+-1, float32[n]) of the transform of the GEMM `name`."""
  rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
  return np.where(rng.random(n) < 0.5, -1.0, 1.0).astype(np.float32)


def _flushed(v):
  """f32 `v` with subnormals as zeros of their sign: XLA's CPU flushes them, other
  platforms need not, and the transform is the same everywhere."""
  u = lax.bitcast_convert_type(v, jnp.uint32)
  return lax.bitcast_convert_type(
      jnp.where((u & 0x7F800000) == 0, u & np.uint32(0x80000000), u), jnp.float32)


def _sign_masks(signs: np.ndarray, shape, axis: int) -> jax.Array:
  """uint32 of `shape`: 0x80000000 where element i of `axis` has sign -1, else 0 (made of
  scalars, not an array constant: custom_partitioning's rules take no constants)."""
  i = lax.broadcasted_iota(jnp.uint32, shape, axis)
  word = jnp.zeros(shape, jnp.uint32)
  for k in range(0, len(signs), 32):
    bits = sum(1 << j for j, s in enumerate(signs[k:k + 32]) if s < 0)
    word = jnp.where(i >> 5 == k // 32, np.uint32(bits), word)
  return ((word >> (i & 31)) & 1) << 31


def rht(x, axis: int, signs: np.ndarray) -> jax.Array:
  """f32 `x` with each run of n = len(signs) elements along `axis` times
  `H diag(signs) / sqrt(n)`; the axis is zero padded to a multiple of n (kept).

  The order of its f32 arithmetic is part of the format (a kernel makes the same bits,
  ffi/cpu/rht.h): signs, then the butterfly's log2(n) stages (h = 1, 2, ..., n / 2:
  elements i and i + h of a run, i's bit h clear, become their sum and difference), then
  the factor f32(1 / sqrt(n)), each result's subnormals flushed to zero."""
  n = len(signs)
  axis = axis % x.ndim
  x = x.astype(jnp.float32)
  spec = sharding.typed_spec(x)
  if spec is not None and spec[axis] is not None:  # Explicit axes: a run may cross shards
    x = jax.sharding.reshard(x, jax.sharding.NamedSharding(
        jax.typeof(x).sharding.mesh,
        jax.sharding.PartitionSpec(*(None if d == axis else e for d, e in enumerate(spec)))))
  length = -(-x.shape[axis] // n) * n
  runs = split_axis(pad_axis(x, axis, length), axis, n)  # [..., runs, n, ...]
  flip = _sign_masks(signs, runs.shape, axis + 1)
  v = _flushed(lax.bitcast_convert_type(lax.bitcast_convert_type(runs, jnp.uint32) ^ flip,
                                        jnp.float32))
  shape, h = v.shape, 1
  while h < n:
    pairs = v.reshape(*shape[:axis + 1], n // (2 * h), 2, h, *shape[axis + 2:])
    a, b = (lax.index_in_dim(pairs, i, axis + 2, keepdims=False) for i in (0, 1))
    v = jnp.stack([_flushed(a + b), _flushed(a - b)], axis + 2).reshape(shape)
    h *= 2
  return merge_axis(_flushed(v * np.float32(1 / np.sqrt(n))), axis)


def padded(x, axis: int, n: int):
  """`x` zero padded along `axis` to a multiple of n (the transform's length)."""
  return pad_axis(x, axis % x.ndim, -(-x.shape[axis] // n) * n)
