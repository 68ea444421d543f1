"""mxjax.nnx.Linear: recipes, state, quantized init and mismatch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mxjax import context, nnx as mxnnx
from mxjax.mxarray import MXArray
from mxjax.recipes import DelayedScaling, MXFP4BlockScaling, MXFP8BlockScaling

X = jax.random.normal(jax.random.key(0), (8, 64))


def _rel(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def test_linear_follows_the_recipe_under_nnx_jit():
  layer = mxnnx.Linear(64, 16, rngs=nnx.Rngs(0))
  exact = X @ layer.kernel.get_value() + layer.bias.get_value()
  traces = []

  @nnx.jit
  def apply(layer, x):
    traces.append(context.get_recipe())
    return layer(x)

  np.testing.assert_allclose(apply(layer, X), exact, rtol=1e-5, atol=1e-6)
  with context.autocast(recipe=MXFP8BlockScaling()):
    mx8 = apply(layer, X)
  with context.autocast(recipe=MXFP4BlockScaling()):
    mx4 = apply(layer, X)
  assert traces == [None, MXFP8BlockScaling(), MXFP4BlockScaling()]
  assert 0 < _rel(mx8, exact) < 0.06 and _rel(mx4, exact) > 2 * _rel(mx8, exact)
  assert mx8.shape == (8, 16) and mx8.dtype == jnp.float32


def test_delayed_state_forward_and_gradient_overwrite():
  recipe = DelayedScaling(amax_history_len=3)
  with context.autocast(recipe=recipe):
    layer = mxnnx.Linear(64, 16, rngs=nnx.Rngs(0))
    assert layer.recipe_state.get_value().kind == "DelayedScaling"
    params_and_state = nnx.DiffState(0, nnx.Any(nnx.Param, mxnnx.RecipeStateVar))
    grads = nnx.grad(lambda m: jnp.sum(m(X)), argnums=params_and_state)(layer)
  amax_x = float(jnp.max(jnp.abs(X)))
  forward = layer.recipe_state.get_value().tensors  # what the call stored
  np.testing.assert_allclose(forward["input"].amax_history, [amax_x, 0, 0], rtol=1e-6)
  np.testing.assert_array_equal(forward["grad"].amax_history, 0)
  advanced = grads["recipe_state"].get_value().tensors  # the gradient: all roles
  np.testing.assert_allclose(advanced["grad"].amax_history, [1.0, 0, 0])
  np.testing.assert_allclose(advanced["grad"].scale, 57344.0)
  np.testing.assert_allclose(advanced["input"].scale, 448.0 / amax_x, rtol=1e-6)
  assert grads["kernel"].get_value().shape == (64, 16)


def test_recipe_change_warns_and_replaces_state():
  with context.autocast(recipe=DelayedScaling(amax_history_len=2)):
    layer = mxnnx.Linear(64, 16, rngs=nnx.Rngs(0))
  with context.autocast(recipe=MXFP8BlockScaling()):
    with pytest.warns(UserWarning, match="Recipe type changed"):
      layer(X)
    assert layer.recipe_state.get_value().kind == "MXFP8BlockScaling"
    assert jax.tree.leaves(layer.recipe_state.get_value()) == []


def test_quantized_init_and_mismatch():
  with context.quantized_model_init(recipe=MXFP8BlockScaling(), columnwise=False):
    layer = mxnnx.Linear(64, 32, use_bias=False, rngs=nnx.Rngs(0))
  kernel = layer.kernel.get_value()
  assert isinstance(kernel, MXArray) and kernel.axis == 0
  with context.autocast(recipe=MXFP8BlockScaling()):
    y = layer(X)
  assert _rel(y, X @ kernel.dequantize()) < 0.06
  with context.autocast(recipe=DelayedScaling()):
    with pytest.raises(ValueError, match=r"^Recipe mismatch for nnx.Linear\(64, 32\)"):
      layer(X)
