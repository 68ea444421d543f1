"""Stochastic rounding gives the same bits on any mesh: the forward, dgrad and wgrad of a
product with SR (`mxjax.quantized` under `autocast`, one key) on Auto and Explicit
8-device meshes equal one device's, bit for bit, for a 1-D layout (rows over 8 devices),
a 2-D one (rows over 2, columns over 4) and a ragged one (5 rows per device: blocks along
the rows straddle devices, and the last block along the rows and along N is partial).

SR draws its bits from a counter on each element's global index, so every device rounds
its elements as one device would. The sums then differ only in order; the data here
makes every sum exact in f32 (each block holds one element of magnitude A, so every block
of a tensor gets the same scale, and the elements are small integer multiples of one
step), so any order gives the same bits, and the gradients must be bit-equal.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import mxjax
from sharding_helpers import spec_of

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")

RECIPES = {
    "nvfp4": mxjax.NVFP4BlockScaling(disable_rht=True),  # SR, 2-D weights, tensor scales
    "mxfp4": mxjax.MXFP4BlockScaling(stochastic_rounding=True),
}
# layout: (mesh shape, axis names, (M, K, N), x spec, w spec, g spec)
LAYOUTS = {
    "1d": ((8,), ("d",), (128, 64, 64), P("d", None), P(), P("d", None)),
    "2d": ((2, 4), ("data", "model"), (64, 64, 128), P("data", None), P(None, "model"),
           P("data", "model")),
    "ragged": ((8,), ("d",), (40, 64, 48), P("d", None), P(), P("d", None)),
}


def spiked(rows, cols, seed):
  """f32 [rows, cols]: +-1 wherever (i - j) % 8 == 0 (so every run of 8 along either axis,
  every block and every 16x16 tile, holds one), elsewhere multiples of 1/64 in (-1, 1)."""
  rng = np.random.default_rng(seed)
  a = rng.integers(-63, 64, (rows, cols)) / 64
  i, j = np.indices((rows, cols))
  a = np.where((i - j) % 8 == 0, rng.choice([-1.0, 1.0], (rows, cols)), a)
  return jnp.asarray(a, jnp.float32)


@jax.jit
def _product(x, w, g, key):
  """(y, dx, dw): the forward and the VJP of `x @ w` with cotangent g."""
  f = mxjax.quantized(lambda x, w: x @ w)
  y, vjp = jax.vjp(lambda x, w: f(x, w, mx_rng=key), x, w)
  return (y, *vjp(g))


def run(recipe, x, w, g, key):
  with mxjax.autocast(recipe=recipe):
    return _product(x, w, g, key)


def bits(a):
  return np.asarray(a).view(np.uint32)


def operands(layout):
  _, _, (m, k, n), *_ = LAYOUTS[layout]
  return spiked(m, k, 0), spiked(k, n, 1) / 8, spiked(m, n, 2)


KEY = 7


@functools.cache
def one_device(name, layout):
  """(y, dx, dw) on one device (shared by the Auto and Explicit cases)."""
  recipe = RECIPES[name]
  want = run(recipe, *operands(layout), jax.random.key(KEY))
  # SR is on: another key rounds the gradients otherwise (the forward rounds to nearest).
  other = run(recipe, *operands(layout), jax.random.key(KEY + 1))
  assert np.array_equal(bits(want[0]), bits(other[0]))
  assert not np.array_equal(bits(want[1]), bits(other[1]))
  assert not np.array_equal(bits(want[2]), bits(other[2]))
  return want


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_sr_gives_one_devices_bits_on_a_mesh(name, layout, kind):
  recipe = RECIPES[name]
  shape, axes, _, x_spec, w_spec, g_spec = LAYOUTS[layout]
  x, w, g = operands(layout)
  key = jax.random.key(KEY)
  want = one_device(name, layout)
  mesh = jax.make_mesh(shape, axes, axis_types=(kind,) * len(axes))
  with jax.set_mesh(mesh):
    xs, ws, gs = (jax.device_put(a, NamedSharding(mesh, s))
                  for a, s in ((x, x_spec), (w, w_spec), (g, g_spec)))
    got = run(recipe, xs, ws, gs, key)
  assert len(got[0].sharding.device_set) == 8
  if kind == AxisType.Explicit:  # a cotangent's type is its primal's
    assert (spec_of(got[1]), spec_of(got[2])) == (spec_of(xs), spec_of(ws))
  differ = {what: int(np.sum(bits(a) != bits(b))) for what, a, b in
            zip(("forward", "dgrad", "wgrad"), got, want) if not np.array_equal(bits(a), bits(b))}
  assert not differ, f"elements whose bits differ from one device's: {differ}"


_QUANTIZE_FORMATS = (mxjax.nvfp4(), "e2m1")  # NVFP4 (tensor scale), MXFP4


@jax.jit
def _sr_quantize(g, key):
  """Each format's SR quantize (data, scales) along both axes and SR fake_quantize of g."""
  out = []
  for fmt in _QUANTIZE_FORMATS:
    for axis in (0, 1):
      a = mxjax.quantize(g, fmt, axis=axis, rng=key)
      out += [a.data, a.scales, mxjax.fake_quantize(g, fmt, axis=axis, rng=key)]
  return out


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sr_quantize_gives_one_devices_bits_on_a_mesh(layout, kind):
  """SR quantize and fake_quantize (bits made in the kernels from each shard's first
  global index) of a sharded array equal one device's, rows and columns."""
  shape, axes, _, _, _, g_spec = LAYOUTS[layout]
  g = operands(layout)[2]
  key = jax.random.key(KEY)
  want = _sr_quantize(g, key)
  mesh = jax.make_mesh(shape, axes, axis_types=(kind,) * len(axes))
  with jax.set_mesh(mesh):
    got = _sr_quantize(jax.device_put(g, NamedSharding(mesh, g_spec)), key)
  for i, (a, b) in enumerate(zip(got, want)):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8),
                                  err_msg=f"result {i}")
