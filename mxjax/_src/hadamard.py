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


def rht_rows(x, axis: int, signs: np.ndarray) -> jax.Array:
  """f32 `x` with `axis` (zero padded to a multiple of n = len(signs)) split into runs of
  n, each run times `H diag(signs) / sqrt(n)` and laid out last: [..., runs, ..., n]."""
  n = len(signs)
  axis = axis % x.ndim
  x = x.astype(jnp.float32)
  spec = sharding.typed_spec(x)
  if spec is not None and spec[axis] is not None:  # Explicit axes: a run may cross shards
    x = jax.sharding.reshard(x, jax.sharding.NamedSharding(
        jax.typeof(x).sharding.mesh,
        jax.sharding.PartitionSpec(*(None if d == axis else e for d, e in enumerate(spec)))))
  length = -(-x.shape[axis] // n) * n
  blocks = split_axis(pad_axis(x, axis, length), axis, n)
  mat = jnp.asarray(hadamard(n) * signs[None, :] / np.sqrt(np.float32(n)), jnp.float32)
  return jnp.tensordot(blocks, mat, axes=([axis + 1], [1]), precision=lax.Precision.HIGHEST)


def rht(x, axis: int, signs: np.ndarray) -> jax.Array:
  """`x` (f32) with each run of n = len(signs) elements along `axis` times
  `H diag(signs) / sqrt(n)`; the axis is zero padded to a multiple of n (kept)."""
  axis = axis % x.ndim
  return merge_axis(jnp.moveaxis(rht_rows(x, axis, signs), -1, axis + 1), axis)
