"""mxjax.context: autocast / get_recipe / quantized_model_init, and jit re-tracing."""

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mxjax import linen as mxl, nnx as mxnnx, state as state_lib
from mxjax._src import context, memory
from mxjax._src.mxarray import MXArray
from mxjax._src.recipes import (DelayedScaling, Float8CurrentScaling, MXFP4BlockScaling,
                           MXFP8BlockScaling, Recipe)


def test_get_recipe_default_nesting_and_disable():
  assert context.get_recipe() is None
  with context.autocast():
    assert context.get_recipe() == MXFP8BlockScaling()
    with context.autocast(recipe=DelayedScaling()):
      assert context.get_recipe() == DelayedScaling()
      with context.autocast(enabled=False, recipe=MXFP4BlockScaling()):
        assert context.get_recipe() is None
      assert context.get_recipe() == DelayedScaling()
    assert context.get_recipe() == MXFP8BlockScaling()
  assert context.get_recipe() is None


def test_autocast_restores_after_exception():
  with pytest.raises(RuntimeError):
    with context.autocast(recipe=Float8CurrentScaling()):
      raise RuntimeError("boom")
  assert context.get_recipe() is None


def test_autocast_rejects_non_recipes():
  with pytest.raises(TypeError, match="recipe"):
    with context.autocast(recipe="mxfp8"):
      pass
  # A bare Recipe is neither MX nor per-tensor FP8: no GEMM path would run it.
  with pytest.raises(TypeError, match=r"MX or per-tensor FP8 recipe.*got Recipe"):
    with context.autocast(recipe=Recipe()):
      pass


@pytest.mark.parametrize("scope", [context.autocast, context.quantized_model_init])
@pytest.mark.parametrize("recipe", [MXFP4BlockScaling(), MXFP4BlockScaling])
def test_a_recipe_given_for_enabled_is_refused(scope, recipe):
  """`autocast(MXFP4BlockScaling())` would otherwise run the default MXFP8 silently."""
  with pytest.raises(TypeError, match=r"first argument is `enabled`.*recipe="):
    with scope(recipe):
      pass
  assert context.get_recipe() is None and context.get_quantized_init() is None


def test_jit_retraces_when_the_recipe_changes():
  traced = []

  @jax.jit
  def f(x):
    traced.append(context.get_recipe())
    return x + 1

  x = jnp.ones(3)
  f(x)
  with context.autocast(recipe=MXFP8BlockScaling()):
    f(x)
    f(x)  # cache hit
  with context.autocast(recipe=DelayedScaling()):
    f(x)
  with context.autocast(recipe=MXFP8BlockScaling()):
    f(x)  # seen before: cache hit
  assert traced == [None, MXFP8BlockScaling(), DelayedScaling()]


def test_jitted_dense_follows_the_recipe():
  """The same jitted apply gives the exact f32 product outside autocast and an
  MX-quantized product inside, not the recipe it was traced with first."""
  x = jax.random.normal(jax.random.key(0), (8, 64))
  model = mxl.Dense(32, use_bias=False)
  variables = model.init(jax.random.key(1), x)
  apply = jax.jit(model.apply)
  exact = x @ variables["params"]["kernel"]
  hp = apply(variables, x)
  with context.autocast(recipe=MXFP8BlockScaling()):
    mx8 = apply(variables, x)
  with context.autocast(recipe=MXFP4BlockScaling()):
    mx4 = apply(variables, x)
  err = lambda y: float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact))  # noqa: E731
  assert err(hp) < 1e-6
  assert 1e-3 < err(mx8) < 0.06
  assert err(mx4) > 2 * err(mx8)


def test_quantized_model_init_stores_mxarray_pairs():
  x = jnp.ones((2, 64))
  with context.quantized_model_init(recipe=MXFP8BlockScaling(), for_training=True):
    variables = mxl.Dense(64).init(jax.random.key(0), x)
  # Frozen: the kernel is in its own collection, not a trainable param.
  assert set(variables) == {"params", context.QUANTIZED_KERNELS, "mx_state"}
  assert "kernel" not in variables["params"]
  kernel = variables[context.QUANTIZED_KERNELS]["kernel"]
  assert isinstance(kernel, tuple) and all(isinstance(a, MXArray) for a in kernel)
  assert [a.axis for a in kernel] == [0, 1]
  assert kernel[0].data.dtype == jnp.float8_e4m3fn
  assert variables["params"]["bias"].dtype == jnp.float32  # biases stay high precision
  assert state_lib.describe(variables) == {"mx_state/recipe_state": "MXFP8BlockScaling"}
  # Both copies are quantizations of one high-precision initial value.
  a, b = kernel[0].dequantize(), kernel[1].dequantize()
  assert float(jnp.linalg.norm(a - b) / jnp.linalg.norm(a)) < 0.08


def test_quantized_model_init_needs_a_block_scaled_recipe():
  with pytest.raises(ValueError, match="needs a block-scaled recipe"):
    with context.quantized_model_init(recipe=DelayedScaling()):
      pass


@pytest.mark.parametrize("columnwise, expected", [(True, 2 * (1 + 1 / 32) / 4),
                                                 (False, (1 + 1 / 32) / 4)])
def test_memory_report_of_quantized_kernels(columnwise, expected):
  """E4M3 with 32-blocks: each copy is 1 byte per element plus 1 scale byte per 32,
  against 4 bytes in f32: 51.56% for both copies, 25.78% for the forward copy alone."""
  x = jnp.ones((2, 128))
  with context.quantized_model_init(recipe=MXFP8BlockScaling(), columnwise=columnwise):
    variables = mxl.Dense(96, use_bias=False).init(jax.random.key(0), x)
  report = memory.memory_report(variables)
  assert report.quantized_f32_nbytes == 128 * 96 * 4
  assert report.quantized_ratio == pytest.approx(expected, abs=1e-12)
  assert report.ratio == pytest.approx(expected, abs=1e-12)  # no other arrays
  hp = memory.memory_report(mxl.Dense(96, use_bias=False).init(jax.random.key(0), x))
  assert hp.ratio == 1.0 and hp.quantized_nbytes == 0


def test_memory_report_of_an_nnx_module_and_not_of_its_state():
  """MXFP4 (packed 2 codes a byte) pair of a [128, 96] kernel: (0.5 + 1/32) bytes per
  element and copy, against 4. The module keeps the MXArrays; nnx.state splits them into
  arrays, which would be counted as f32 of their packed shapes, so it is refused."""
  with context.quantized_model_init(recipe=MXFP4BlockScaling(), for_training=True):
    layer = mxnnx.Linear(128, 96, use_bias=False, rngs=nnx.Rngs(0))
  report = memory.memory_report(layer)
  assert report.quantized_f32_nbytes == 128 * 96 * 4
  assert report.quantized_ratio == pytest.approx(2 * (0.5 + 1 / 32) / 4, abs=1e-12)
  with pytest.raises(TypeError, match="pass the NNX module itself"):
    memory.memory_report(nnx.state(layer))


def test_quantized_kernel_runs_under_matching_recipe_and_dequantizes_when_off():
  x = jax.random.normal(jax.random.key(2), (4, 64))
  model = mxl.Dense(32, use_bias=False)
  with context.quantized_model_init(recipe=MXFP8BlockScaling(), for_training=True):
    variables = model.init(jax.random.key(0), x)
  w = variables[context.QUANTIZED_KERNELS]["kernel"][0].dequantize()
  off = model.apply(variables, x)
  np.testing.assert_allclose(off, x @ w, rtol=1e-5, atol=1e-5)
  with context.autocast(recipe=MXFP8BlockScaling()):
    on = model.apply(variables, x)
  assert float(jnp.linalg.norm(on - x @ w) / jnp.linalg.norm(x @ w)) < 0.06
  # Applying without the frozen kernels' collection: the error says where they are.
  without = {k: v for k, v in variables.items() if k != context.QUANTIZED_KERNELS}
  with pytest.raises(ValueError, match="finds no kernel in 'params' or 'mx_kernels'"):
    model.apply(without, x)


def test_quantized_kernels_round_trip_flax_serialization():
  """Flax's checkpoint route keeps every collection of a model with quantized kernels:
  bytes and state dicts restore into the initialized variables bit for bit."""
  x = jax.random.normal(jax.random.key(2), (4, 64))
  model = mxl.Dense(32)
  with context.quantized_model_init(recipe=MXFP8BlockScaling()):
    variables = model.init(jax.random.key(0), x)
  restored = [flax.serialization.from_bytes(variables, flax.serialization.to_bytes(variables)),
              flax.serialization.from_state_dict(variables, flax.serialization.msgpack_restore(
                  flax.serialization.msgpack_serialize(
                      flax.serialization.to_state_dict(variables))))]
  with context.autocast(recipe=MXFP8BlockScaling()):
    expected = model.apply(variables, x)
    for r in restored:
      assert jax.tree.structure(r) == jax.tree.structure(variables)
      for a, b in zip(jax.tree.leaves(r), jax.tree.leaves(variables), strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
      np.testing.assert_array_equal(model.apply(r, x), expected)


class _ScanBlock(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return x + mxl.Dense(64, use_bias=False)(x), None


def _scanned(variable_axes):
  class Stack(nn.Module):
    @nn.compact
    def __call__(self, x):
      layers = nn.scan(_ScanBlock, variable_axes=variable_axes, split_rngs={"params": True},
                       length=2)
      return layers()(x, None)[0]
  return Stack()


def test_quantized_kernels_under_nn_scan():
  """Under a lifted transform the frozen kernels' collection must be given to it, as the
  params are: without it the error says so; with it the stacked layers run as unrolled
  ones with the same kernels."""
  x = jax.random.normal(jax.random.key(1), (4, 64))
  recipe = MXFP8BlockScaling()
  with context.quantized_model_init(recipe=recipe, for_training=True):
    with pytest.raises(ValueError, match="'mx_kernels'.*lifted transform.*variable_axes"):
      _scanned({"params": 0}).init(jax.random.key(0), x)
    variables = _scanned({"params": 0, context.QUANTIZED_KERNELS: 0, "mx_state": 0}).init(
        jax.random.key(0), x)
  (layers,) = variables[context.QUANTIZED_KERNELS].values()
  kernel = layers["Dense_0"]["kernel"]
  assert isinstance(kernel[0], MXArray) and kernel[0].shape == (2, 64, 64)
  with context.autocast(recipe=recipe):
    out = _scanned({"params": 0, context.QUANTIZED_KERNELS: 0, "mx_state": 0}).apply(
        variables, x)
    expected = x
    for i in range(2):
      layer = jax.tree.map(lambda a: a[i], kernel)
      expected = expected + mxl.Dense(64, use_bias=False).apply(
          {context.QUANTIZED_KERNELS: {"kernel": layer}}, expected)
  np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


class _Net(nn.Module):

  @nn.compact
  def __call__(self, x):
    return mxl.Dense(32, name="proj")(x)


def test_recipe_mismatch_for_quantized_weights():
  x = jnp.ones((2, 64))
  model = _Net()
  with context.quantized_model_init(recipe=MXFP8BlockScaling()):
    variables = model.init(jax.random.key(0), x)
  for recipe in (DelayedScaling(), MXFP8BlockScaling(block_size=16), MXFP4BlockScaling()):
    with context.autocast(recipe=recipe):
      with pytest.raises(ValueError) as info:
        model.apply(variables, x, mutable=["mx_state"])
    message = str(info.value)
    assert message.startswith("Recipe mismatch for ")
    assert "Dense 'proj'" in message
    assert str(MXFP8BlockScaling()) in message and str(recipe) in message
