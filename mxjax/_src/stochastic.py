"""The random bits of stochastic rounding: a hash of the global element index, so any
sharding on any mesh rounds the same way. `random_bits` is their definition in XLA; a
`Counter` asks a quantize op for them, which the CPU block kernels make as they round
(elsewhere XLA makes them inside the op)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

_U32 = jnp.uint32

MISSING_KEY = (
    "{where}: stochastic rounding (recipe {recipe}) needs a random key for the backward "
    "pass. Linen: apply the model with rngs={{'mx': key}} (a new key each step, e.g. "
    "jax.random.fold_in(key, step)); mxjax.nnx modules: give them an nnx.Rngs with an 'mx' "
    "stream; mxjax.quantized(fn) and mxjax.nnx.quantize(model): call them with mx_rng=key; "
    "mxjax.dot_general / einsum / ragged_dot: pass rng=key. Or turn stochastic rounding off.")


def _mix(h):
  """A 32-bit integer hash (lowbias32: xor-shift-multiply)."""
  h = h ^ jnp.right_shift(h, _U32(16))
  h = h * _U32(0x7FEB352D)
  h = h ^ jnp.right_shift(h, _U32(15))
  h = h * _U32(0x846CA68B)
  return h ^ jnp.right_shift(h, _U32(16))


def row_major_strides(shape) -> tuple[int, ...]:
  """Each dim's stride (elements) in a row-major array of `shape`, modulo 2**32."""
  strides, stride = [], 1
  for n in reversed(shape):
    strides.append(stride % 2 ** 32)
    stride *= n
  return tuple(reversed(strides))


def index(shape, strides=None, base=0) -> jax.Array:
  """uint32 of `shape`: `base + sum_d i_d * strides[d]` of each element modulo 2**32; with
  the row-major strides (the default), each element's row-major index."""
  strides = row_major_strides(shape) if strides is None else strides
  idx = jnp.full(shape, base, _U32)
  for d, stride in enumerate(strides):
    idx = idx + lax.broadcasted_iota(_U32, shape, d) * _U32(stride % 2 ** 32)
  return idx


def random_bits(seed, shape, strides=None, base=0) -> jax.Array:
  """uint32 bits of `shape`: `mix(mix(i * golden ^ seed[0]) ^ seed[1])` of each element's
  global index i, `index(shape, strides, base)` (the row-major index by default); `seed`
  is uint32[2]."""
  seed = jnp.asarray(seed).astype(_U32).reshape(-1)
  return _mix(_mix(index(shape, strides, base) * _U32(0x9E3779B9) ^ seed[0]) ^ seed[1])


@dataclasses.dataclass(frozen=True)
class Counter:
  """Stochastic rounding's bits of the array a quantize op is given, x, not made yet:
  `random_bits(seed, x.shape, strides)` (strides None: row-major); `seed` is uint32[2]."""
  seed: jax.Array
  strides: tuple[int, ...] | None = None

  def strides_of(self, shape) -> tuple[int, ...]:
    """The index strides for x of `shape`, each modulo 2**32."""
    if self.strides is None:
      return row_major_strides(shape)
    return tuple(s % 2 ** 32 for s in self.strides)


def counter(key) -> Counter | None:
  """Stochastic rounding's bits from a JAX key, row-major (None: nearest even)."""
  return None if key is None else Counter(seed_of(key))


def after(bits, x) -> jax.Array:
  """`bits` xor a 0 computed from x's elements (NaN and not NaN, which XLA cannot fold),
  so that XLA schedules them once x exists: unordered, it hoists every product's bits to
  the start of the program and keeps them all live (4 bytes an element) until their
  backward."""
  return bits ^ ((x != x) & (x == x)).astype(_U32)


def seed_of(key) -> jax.Array:
  """uint32[2] from a JAX key (typed or raw); zeros for None."""
  if key is None:
    return jnp.zeros((2,), _U32)
  if jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return jnp.asarray(key).astype(_U32).reshape(-1)[-2:]


def stream(seed, i: int) -> jax.Array:
  """The seed of stream `i` (one per quantized copy) of a product's seed."""
  return seed ^ jnp.asarray([0x9E3779B9 * (i + 1) % 2 ** 32, 0x85EBCA6B * (i + 1) % 2 ** 32],
                            _U32)
