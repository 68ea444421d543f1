"""Every format: a small training step (a product under the recipe, a loss, both
gradients) on an 8-device mesh, Explicit and Auto (`jax.make_mesh`, the batch sharded over
all 8 CPU devices), gives one device's forward and gradients bit for bit, stochastic
rounding included (its bits come from each element's global index).

The forward and the input gradient contract K and N, which every device holds whole. The
weight gradient contracts the sharded M, so the mesh sums it in another order; the data
make every partial sum exact (the inputs are small integers, the output gradient lies in
+-[1, 2), so each quantized product has a few significant bits and no sum of them needs
more than f32's 24), so the bits are the same exactly when each quantized operand is,
in any order. A wrong SR bit or a block cut at a shard boundary changes them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import mxjax
from format_cases import DIMS, RECIPES, assert_bits_equal, every_format

M, K, N = 64, 256, 128
KEY = jax.random.key(5)

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")


def _data():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.integers(-15, 16, (M, K)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((K, N)) * 0.05, jnp.float32)
  c = jnp.asarray(rng.choice([-1, 1], (M, N)) * rng.uniform(1, 2, (M, N)), jnp.float32)
  return x, w, c


def _step(recipe, x, w, c, key):
  """(loss, output, dx, dw) of `sum(x . w * c)`: the output gradient is c."""
  def loss(x, w):
    out = mxjax.dot_general(x, w, DIMS, recipe=recipe, rng=key, name="layer")
    return jnp.sum(out * c), out
  (value, out), (dx, dw) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, w)
  return value, out, dx, dw


def _assert_equal_to_one_device(got, want, what):
  np.testing.assert_allclose(got[0], want[0], rtol=1e-6, err_msg=f"{what}: loss")
  for g, w, part in zip(got[1:], want[1:], ("output", "dx", "dw")):
    assert_bits_equal(g, w, f"{what}: {part}")


@every_format
@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_mesh_step_equals_one_device(name, axis_type):
  recipe = RECIPES[name]
  x, w, c = _data()
  step = jax.jit(lambda x, w, c, key: _step(recipe, x, w, c, key))
  one = step(x, w, c, KEY)
  kind = AxisType.Explicit if axis_type == "explicit" else AxisType.Auto
  mesh = jax.make_mesh((8,), ("data",), axis_types=(kind,))
  rows = NamedSharding(mesh, P("data", None))
  with jax.set_mesh(mesh):
    xs, cs = jax.device_put(x, rows), jax.device_put(c, rows)
    ws = jax.device_put(w, NamedSharding(mesh, P()))
    sharded = step(xs, ws, cs, KEY)
  assert sharded[1].sharding.spec[0] == "data" and len(sharded[1].sharding.device_set) == 8
  assert sharded[2].sharding.spec[0] == "data"
  _assert_equal_to_one_device(sharded, one, f"{name} {axis_type}")
  if recipe.needs_rng():  # the bits matter: another key gives another weight gradient
    other = step(x, w, c, jax.random.key(6))
    assert not np.array_equal(np.asarray(other[3]), np.asarray(one[3]))
