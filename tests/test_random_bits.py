"""Stochastic rounding's random bits (`ops.random_bits_like`: the mxjax_random_bits CPU
kernel where the kernels are in use, XLA elsewhere) against a numpy oracle of their
definition (`stochastic.random_bits`: lowbias32 twice over each element's global index),
at every SIMD level; on Auto and Explicit 8-device meshes (rows, columns, 2-D, a dim over
two axes) equal to one device's with no collective; under vmap; and through a product
whose SR bits follow a permuted index (the RHT's runs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from mxjax._src import backend, ops, stochastic
from sharding_helpers import compiled_collectives

KERNELS = "cpu" in backend.ffi_platforms()
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


_bits = jax.jit(ops.random_bits_like, static_argnums=(2,))

# (shape, strides or None, dtype): ranks 0 to 3, rows longer than a work chunk, strides
# past 2^32, zero and permuted strides.
CASES = [((), None, jnp.float32), ((7,), None, jnp.bfloat16), ((3, 5), None, jnp.float32),
         ((2, 3, 70001), None, jnp.bfloat16), ((4, 1, 9), None, jnp.float16),
         ((5, 33), (2 ** 33 + 7, 3), jnp.float32), ((6, 4, 16), (64, 1, 4), jnp.bfloat16),
         ((3, 8), (0, 1), jnp.float32), ((1000, 16), None, jnp.float32)]


@pytest.mark.usefixtures("simd_level")
@pytest.mark.parametrize("seed", SEEDS)
def test_bits_equal_the_oracle(seed):
  for shape, strides, dtype in CASES:
    x = jnp.ones(shape, dtype)
    got = _bits(jnp.asarray(seed, jnp.uint32), x, strides)
    assert got.dtype == jnp.uint32 and got.shape == shape
    np.testing.assert_array_equal(np.asarray(got), oracle(seed, shape, strides),
                                  err_msg=f"{shape} {strides}")


@pytest.mark.skipif(not KERNELS, reason="the CPU kernels are not in use (MXJAX_KERNELS)")
def test_the_kernel_runs():
  text = _bits.lower(jnp.asarray(SEEDS[1], jnp.uint32), jnp.ones((4, 8)), None).compile().as_text()
  assert "mxjax_random_bits" in text


# (mesh shape, axis names, x shape, spec): rows over 8 (8 and 5 a device), 2-D, two axes
# on one dim, the last dim sharded.
LAYOUTS = [((8,), ("d",), (64, 24), P("d", None)), ((8,), ("d",), (40, 13), P("d", None)),
           ((2, 4), ("a", "b"), (16, 24), P("a", "b")),
           ((2, 4), ("a", "b"), (32, 5), P(("a", "b"), None)),
           ((8,), ("d",), (3, 64), P(None, "d"))]


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")
@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_a_mesh_gives_one_devices_bits(kind, layout):
  mesh_shape, names, shape, spec = LAYOUTS[layout]
  mesh = jax.make_mesh(mesh_shape, names, axis_types=(kind,) * len(names))
  seed = jnp.asarray(SEEDS[2], jnp.uint32)
  x = jax.device_put(jnp.ones(shape, jnp.bfloat16), NamedSharding(mesh, spec))
  for strides in (None, (1, shape[0])):  # row-major, and column-major
    with jax.set_mesh(mesh):
      got = _bits(seed, x, strides)
      assert compiled_collectives(lambda s, x: ops.random_bits_like(s, x, strides), seed, x) == []
    np.testing.assert_array_equal(np.asarray(got), oracle(SEEDS[2], shape, strides),
                                  err_msg=f"{kind} {spec} {strides}")
    if kind == AxisType.Explicit:
      assert jax.typeof(got).sharding.spec == jax.typeof(x).sharding.spec


def test_under_vmap():
  """One seed: every example's bits are those of its own index; a seed per example: each
  example's bits are its seed's."""
  xs = jnp.ones((3, 4, 8))
  seed = jnp.asarray(SEEDS[1], jnp.uint32)
  got = jax.vmap(lambda x: ops.random_bits_like(seed, x))(xs)
  np.testing.assert_array_equal(np.asarray(got), np.broadcast_to(oracle(SEEDS[1], (4, 8)),
                                                                 (3, 4, 8)))
  seeds = jnp.asarray(SEEDS, jnp.uint32)
  got = jax.vmap(ops.random_bits_like)(seeds, xs)
  for i, s in enumerate(SEEDS):
    np.testing.assert_array_equal(np.asarray(got[i]), oracle(s, (4, 8)))


def test_the_rht_runs_follow_the_rows_index():
  """The RHT's wgrad copy quantizes rows [*B, M/n, N, n] of R g; its element (m, c) has the
  SR bits of g's row-major index (m, c): the same as the XLA formula over that layout."""
  runs, cols, n = 3, 5, 16
  rows = jnp.ones((2, runs, cols, n))
  strides = stochastic.row_major_strides((2, runs, n, cols))
  permuted = (*strides[:-2], strides[-1], strides[-2])
  got = np.asarray(ops.random_bits_like(jnp.asarray(SEEDS[1], jnp.uint32), rows, permuted))
  want = oracle(SEEDS[1], (2, runs, n, cols)).swapaxes(-1, -2)
  np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not KERNELS, reason="the CPU kernels are not in use (MXJAX_KERNELS)")
@pytest.mark.parametrize("seed, base, out, strides", [
    (np.zeros(2, np.int32), np.zeros(1, np.uint32), (4, 8), (8, 1)),  # an int32 seed
    (np.zeros(3, np.uint32), np.zeros(1, np.uint32), (4, 8), (8, 1)),  # three seed words
    (np.zeros(2, np.uint32), np.zeros(1, np.uint32), (4, 8), (1,)),  # a stride short
    (np.zeros(2, np.uint32), np.zeros(1, np.uint32), (32,), (8, 1)),  # not like's rank
])
def test_bad_buffers_raise(seed, base, out, strides):
  """The kernel answers wrong operands with an error naming what it needs."""
  from mxjax._src import extension  # noqa: PLC0415
  extension.load()
  call = jax.ffi.ffi_call("mxjax_random_bits", jax.ShapeDtypeStruct(out, jnp.uint32))
  with pytest.raises(Exception, match="random bits"):
    jax.block_until_ready(jax.jit(lambda s, b, x: call(
        s, b, x, strides=np.asarray(strides, np.int64)))(seed, base, jnp.ones((4, 8))))
