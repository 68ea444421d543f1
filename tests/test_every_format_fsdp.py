"""Every format: FSDP of kernels stored once (`mxjax.quantize_params`): each kernel's codes
and scales sharded along K over the data axis of an Explicit 8-device mesh; the compiled
step's all-gathers move the stored bytes (the format's bytes per param), not bf16 / f32
weights, and the step equals one device's (output and input gradient bit for bit).

A scale array whose leading dim does not split over 8 devices (two 128x128 tiles along
K) stays replicated: it is not gathered, so those gathers move the codes alone (1.0 B/param
against the format's 1.0002).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import mxjax
from format_cases import RECIPES, WEIGHT_BYTES_PER_PARAM, assert_bits_equal, every_format
from sharding_helpers import bytes_per_kind, collectives

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")
KEY = jax.random.key(3)


class Net(nn.Module):

  @nn.compact
  def __call__(self, x):
    return mxjax.Dense(256, name="down")(jax.nn.gelu(mxjax.Dense(512, name="up")(x)))


def _step(model, params, x, key):
  """Loss, output and gradients (bias of `up`, x) with the kernels frozen."""
  def loss(bias, x):
    y = model.apply({"params": {**params, "up": {**params["up"], "bias": bias}}}, x,
                    rngs={"mx": key})
    return jnp.mean(y ** 2), y

  (value, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
      params["up"]["bias"], x)
  return value, y, grads


def _fsdp(mesh, params):
  """The kernels' arrays split along their leading dim (K for the codes and 1-D scales,
  K / b for tiles' scales) where it splits evenly over the mesh; everything else (biases,
  the tensor scale) replicated."""
  def place(a, split):
    split = split and a.ndim >= 1 and a.shape[0] % mesh.size == 0
    return jax.device_put(a, NamedSharding(mesh, P("data") if split else P()))

  def leaf(x):
    if isinstance(x, mxjax.MXArray):
      return dataclasses.replace(x, data=place(x.data, True), scales=place(x.scales, True),
                                 tensor_scale=None if x.tensor_scale is None
                                 else place(x.tensor_scale, False))
    return place(x, False)

  return jax.tree.map(leaf, params, is_leaf=lambda x: isinstance(x, mxjax.MXArray))


@every_format
def test_fsdp_step_gathers_the_stored_kernels(name):
  recipe = RECIPES[name]
  model = Net()
  x = jax.random.normal(jax.random.key(1), (64, 256))
  hp = model.init(jax.random.key(0), x)["params"]
  params = mxjax.quantize_params(hp, recipe)
  kernels = [params[layer]["kernel"] for layer in ("up", "down")]
  assert all(isinstance(k, mxjax.MXArray) and k.format == recipe.roles().w for k in kernels)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
  step = jax.jit(lambda p, x, key: _step(model, p, x, key))
  with mxjax.autocast(recipe=recipe):
    want = step(params, x, KEY)  # one device
    with jax.set_mesh(mesh):
      sharded = _fsdp(mesh, params)
      assert sharded["up"]["kernel"].data.sharding.spec[0] == "data"
      assert mxjax.memory_report(sharded).nbytes == mxjax.memory_report(params).nbytes
      xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
      hlo = step.lower(sharded, xs, KEY).compile().as_text()
      got = step(sharded, xs, KEY)
  ops = collectives(hlo)
  gathered = bytes_per_kind(ops)["all-gather"]
  n_kernel = 256 * 512 * 2
  assert gathered == pytest.approx(n_kernel * WEIGHT_BYTES_PER_PARAM[name], rel=0.02), ops
  wide = {"f32", "bf16", "f16"}  # no high-precision weight is gathered
  assert not [op for op in ops if op[0] == "all-gather" and op[2] in wide
              and np.prod(op[1]) >= 256 * 256], ops
  # sums over the batch (the loss, the bias gradient) add the shards in another order
  for a, b in ((got[0], want[0]), (got[2][0], want[2][0])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)
  assert_bits_equal(got[1], want[1], f"{name}: output")
  assert_bits_equal(got[2][1], want[2][1], f"{name}: dx")
