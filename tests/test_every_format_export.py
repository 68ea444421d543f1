"""Every format: `jax.export` of a jitted forward whose quantized weights
(`mxjax.quantize_params`) are inputs: it lowers on the plain-XLA path (no FFI call, so
for cpu and tpu at once), serializes, deserializes and runs, giving the jitted outputs bit
for bit, for these weights and for others of the same shapes without re-export."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest

import mxjax
from format_cases import RECIPES, assert_bits_equal, every_format, random_data
from mxjax._src import backend


@pytest.fixture
def xla_kernels():
  """Export needs the plain-XLA path (MXJAX_KERNELS=xla): no FFI call in the program."""
  before = backend.get_kernels()
  mxjax.set_kernels("xla")
  yield
  mxjax.set_kernels(before)


class Net(nn.Module):

  @nn.compact
  def __call__(self, x):
    return mxjax.Dense(128, name="down")(jax.nn.gelu(mxjax.Dense(256, name="up")(x)))


@every_format
def test_export_with_quantized_weights_as_inputs(name, xla_kernels):
  recipe = RECIPES[name]
  model = Net()
  x = random_data((16, 256), seed=0)
  weights = [mxjax.quantize_params(model.init(jax.random.key(seed), x)["params"], recipe)
             for seed in (0, 1)]

  def serve(params, x):
    with mxjax.autocast(recipe=recipe):
      return model.apply({"params": params}, x)

  exported = jax.export.export(jax.jit(serve), platforms=("cpu", "tpu"))(weights[0], x)
  assert "custom_call" not in exported.mlir_module()  # plain XLA: no FFI call
  inputs = jax.tree.leaves(exported.in_tree.unflatten(exported.in_avals),
                           is_leaf=lambda a: isinstance(a, mxjax.MXArray))
  assert [a.format for a in inputs if isinstance(a, mxjax.MXArray)] == [recipe.roles().w] * 2
  reloaded = jax.export.deserialize(exported.serialize())
  outs = []
  for params in weights:
    got = reloaded.call(params, x)
    assert_bits_equal(got, jax.jit(serve)(params, x), f"{name}: exported")
    outs.append(np.asarray(got))
  assert not np.array_equal(*outs)  # the weights are inputs, not constants
