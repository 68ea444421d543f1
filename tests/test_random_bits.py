"""Stochastic rounding's random bits: their definition in XLA (`stochastic.random_bits`,
which the plain-XLA path uses and the CPU block kernels make from a counter as they round:
`test_block_kernels.py` checks those against it) against a numpy oracle: lowbias32 twice
over each element's global index, for row-major, permuted, zero and huge strides and a
base.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mxjax._src import stochastic

SEEDS = [(0, 0), (5, 6), (0xFFFFFFFF, 0x80000001)]


def _mix(h):
  h = h ^ (h >> np.uint32(16))
  h = h * np.uint32(0x7FEB352D)
  h = h ^ (h >> np.uint32(15))
  h = h * np.uint32(0x846CA68B)
  return h ^ (h >> np.uint32(16))


def oracle(seed, shape, strides=None) -> np.ndarray:
  """The bits in numpy: mix(mix(i * 0x9E3779B9 ^ seed[0]) ^ seed[1]) of each element's
  index i = sum_d i_d * strides[d] (row-major by default), all modulo 2^32."""
  if strides is None:
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
  index = np.zeros(shape, np.uint64)
  for d, (i, s) in enumerate(zip(np.indices(shape, dtype=np.uint64), strides)):
    index += i * np.uint64(s % 2 ** 32)
  index = (index % 2 ** 32).astype(np.uint32)
  with np.errstate(over="ignore"):
    return _mix(_mix(index * np.uint32(0x9E3779B9) ^ np.uint32(seed[0])) ^ np.uint32(seed[1]))


_bits = jax.jit(stochastic.random_bits, static_argnums=(1, 2))

# (shape, strides or None): ranks 0 to 3, long rows, strides past 2^32, zero and permuted
# strides.
CASES = [((), None), ((7,), None), ((3, 5), None), ((2, 3, 70001), None), ((4, 1, 9), None),
         ((5, 33), (2 ** 33 + 7, 3)), ((6, 4, 16), (64, 1, 4)), ((3, 8), (0, 1)),
         ((1000, 16), None)]


@pytest.mark.parametrize("seed", SEEDS)
def test_bits_equal_the_oracle(seed):
  for shape, strides in CASES:
    got = _bits(jnp.asarray(seed, jnp.uint32), shape, strides)
    assert got.dtype == jnp.uint32 and got.shape == shape
    np.testing.assert_array_equal(np.asarray(got), oracle(seed, shape, strides),
                                  err_msg=f"{shape} {strides}")


def test_a_base_moves_every_index():
  """A shard's bits: those of its elements' global indices (the base added to each)."""
  seed = jnp.asarray(SEEDS[1], jnp.uint32)
  whole = oracle(SEEDS[1], (8, 6))
  got = jax.jit(lambda s: stochastic.random_bits(s, (3, 6), None, 4 * 6))(seed)
  np.testing.assert_array_equal(np.asarray(got), whole[4:7])
