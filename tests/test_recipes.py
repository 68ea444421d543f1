"""mxjax.recipes: fields, validation, predicates, hashing, str; MXBlockScaling end to end."""

import dataclasses
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx as fnnx

import mxjax
from mxjax import reference, state as state_lib
from mxjax._src import memory
from mxjax import linen as mxl
from mxjax import nnx as mxnnx
from mxjax._src.recipes import (DelayedScaling, Float8CurrentScaling, Format, MXBlockScaling,
                           MXFP4BlockScaling, MXFP6BlockScaling, MXFP8BlockScaling, Recipe,
                           recipe_for_weight)

ALL = [MXFP8BlockScaling(), MXFP8BlockScaling(fp8_format=Format.HYBRID), MXFP6BlockScaling(),
       MXFP6BlockScaling(fp6_format=Format.E3M2), MXFP4BlockScaling(), DelayedScaling(),
       Float8CurrentScaling(), MXBlockScaling("e5m2", "e5m2")]


def test_mxfp8_formats():
  assert (MXFP8BlockScaling().fwd_format, MXFP8BlockScaling().bwd_format) == ("e4m3", "e4m3")
  hybrid = MXFP8BlockScaling(fp8_format=Format.HYBRID)
  assert (hybrid.fwd_format, hybrid.bwd_format) == ("e4m3", "e5m2")
  assert (hybrid.block_size, hybrid.scale_mode, hybrid.margin) == (32, "rceil", 0)


def test_mxfp8_refuses_e5m2_and_attention():
  with pytest.raises(ValueError, match="E5M2"):
    MXFP8BlockScaling(fp8_format=Format.E5M2)
  with pytest.raises(NotImplementedError, match="fp8_dpa"):
    MXFP8BlockScaling(fp8_dpa=True)
  with pytest.raises(NotImplementedError, match="fp8_mha"):
    MXFP8BlockScaling(fp8_mha=True)


def test_mx_recipes_validate_block_size_and_scale_mode():
  with pytest.raises(ValueError, match="block_size"):
    MXFP8BlockScaling(block_size=48)
  with pytest.raises(ValueError, match="scale mode"):
    MXFP4BlockScaling(scale_mode="ceil")
  assert MXFP8BlockScaling(scale_mode="FLOOR").scale_mode == "floor"


def test_mxfp6_and_mxfp4_backward_formats():
  assert (MXFP6BlockScaling().fwd_format, MXFP6BlockScaling().bwd_format) == ("e2m3", "e2m3")
  e3m2 = MXFP6BlockScaling(fp6_format="e3m2", bwd_format=Format.E5M2)
  assert (e3m2.fwd_format, e3m2.bwd_format) == ("e3m2", "e5m2")
  assert MXFP6BlockScaling() == MXFP6BlockScaling(bwd_format="e2m3")  # None = same as fwd
  assert (MXFP4BlockScaling().fwd_format, MXFP4BlockScaling().bwd_format) == ("e2m1", "e2m1")
  assert MXFP4BlockScaling(bwd_format=Format.HYBRID).bwd_format == "e5m2"
  with pytest.raises(ValueError, match="E2M3 or Format.E3M2"):
    MXFP6BlockScaling(fp6_format=Format.E4M3)
  with pytest.raises(ValueError, match="multiple of 4"):
    MXFP6BlockScaling(block_size=18)


def test_per_tensor_recipes_validate():
  with pytest.raises(ValueError, match="amax_compute_algo"):
    DelayedScaling(amax_compute_algo="mean")
  with pytest.raises(ValueError, match="amax_history_len"):
    DelayedScaling(amax_history_len=0)
  with pytest.raises(ValueError, match="E4M3 or Format.HYBRID"):
    Float8CurrentScaling(fp8_format=Format.E2M1)
  d = DelayedScaling()
  assert (d.fwd_format, d.bwd_format, d.amax_history_len, d.reduce_amax) == (
      "e4m3", "e5m2", 1024, True)


PREDICATES = ("mxfp8", "mx", "fp8", "delayed", "block_scaling", "float8_current_scaling")
EXPECTED = {
    "MXFP8BlockScaling": {"mxfp8", "mx", "block_scaling"},
    "MXFP6BlockScaling": {"mx", "block_scaling"},
    "MXFP4BlockScaling": {"mx", "block_scaling"},
    "DelayedScaling": {"fp8", "delayed"},
    "Float8CurrentScaling": {"fp8", "float8_current_scaling"},
    "MXBlockScaling": {"mxfp8", "mx", "block_scaling"},  # the E5M2 one in ALL
}


@pytest.mark.parametrize("recipe", ALL, ids=lambda r: type(r).__name__)
def test_predicates(recipe):
  assert isinstance(recipe, Recipe)
  true = {p for p in PREDICATES if getattr(recipe, p)()}
  assert true == EXPECTED[type(recipe).__name__]
  assert recipe.stateful() == recipe.delayed()


@pytest.mark.parametrize("recipe", ALL, ids=lambda r: type(r).__name__)
def test_frozen_hashable_and_usable_as_static_arg(recipe):
  assert hash(recipe) == hash(dataclasses.replace(recipe))
  with pytest.raises(dataclasses.FrozenInstanceError):
    recipe.block_size = 16
  traces = []
  f = jax.jit(lambda x, r: (traces.append(r), x)[1], static_argnums=1)
  f(1.0, recipe)
  f(1.0, dataclasses.replace(recipe))  # equal recipe: cache hit
  assert traces == [recipe]


def test_str():
  assert str(MXFP8BlockScaling()).startswith("recipe_type=MXFP8BlockScaling, margin=0, format=E4M3")
  assert str(DelayedScaling()).startswith("recipe_type=DelayedScaling, margin=0, format=HYBRID")
  assert "format=E3M2" in str(MXFP6BlockScaling(fp6_format=Format.E3M2))
  assert str(MXFP4BlockScaling()).startswith("recipe_type=MXFP4BlockScaling")


def test_recipe_for_weight():
  assert recipe_for_weight(mxjax.mx("e4m3", 32, "rceil")) == MXFP8BlockScaling()
  assert recipe_for_weight(mxjax.mx("e3m2", 16, "floor")) == MXFP6BlockScaling(
      fp6_format=Format.E3M2, block_size=16, scale_mode="floor")
  assert recipe_for_weight(mxjax.mx("e2m1", 64, "rceil")).mxfp4()
  assert recipe_for_weight(mxjax.mx("e5m2", 32, "floor")) == MXBlockScaling(
      "e5m2", "e5m2", scale_mode="floor")
  for recipe in (mxjax.NVFP4BlockScaling(), mxjax.Float8BlockScaling(),
                 mxjax.MXFP8BlockScaling(enable_2d_quantization=True)):
    assert recipe_for_weight(recipe.roles().w).roles().w == recipe.roles().w


# --- MXBlockScaling: any pair of element formats, wherever the other MX recipes work ---


def test_mx_block_scaling_fields_and_names():
  r = MXBlockScaling("E5M2", Format.E2M1, block_size=16, scale_mode="FLOOR")
  assert (r.fwd_format, r.bwd_format, r.block_size, r.scale_mode) == ("e5m2", "e2m1", 16,
                                                                      "floor")
  assert r == MXBlockScaling("mxfp8_e5m2", "e2m1", 16, "floor")
  assert mxjax.MXBlockScaling is MXBlockScaling
  assert str(MXBlockScaling("e5m2", "e5m2")) == (
      "recipe_type=MXBlockScaling, fwd_format=e5m2, bwd_format=e5m2, block_size=32, "
      "scale_mode=rceil")
  with pytest.raises(ValueError, match="fwd_format must be one of"):
    MXBlockScaling("e4m4", "e5m2")
  with pytest.raises(ValueError, match="bwd_format must be one of"):
    MXBlockScaling("e4m3", Format.HYBRID)  # HYBRID names two formats
  with pytest.raises(ValueError, match="multiple of 4"):
    MXBlockScaling("e2m3", "e4m3", block_size=18)
  with pytest.raises(ValueError, match="scale mode"):
    MXBlockScaling("e4m3", "e4m3", scale_mode="ceil")


@pytest.mark.parametrize("fwd, width", [("e4m3", "mxfp8"), ("e5m2", "mxfp8"),
                                        ("e3m2", "mxfp6"), ("e2m3", "mxfp6"),
                                        ("e2m1", "mxfp4")])
def test_mx_block_scaling_predicates_follow_the_forward_width(fwd, width):
  r = MXBlockScaling(fwd, "e5m2")
  true = {p for p in PREDICATES + ("mxfp6", "mxfp4") if getattr(r, p)()}
  assert true == {width, "mx", "block_scaling"} and not r.stateful()


def _oracle_fake_quantize(x, fmt, axis):
  data, scales = reference.quantize(x, fmt, axis=axis)
  return reference.dequantize(data, scales, fmt, axis=axis, shape=x.shape)


X = jax.random.normal(jax.random.key(1), (8, 64), jnp.float32)


def test_mx_block_scaling_drives_linen_and_nnx_gemms():
  """Forward: both operands in the forward format along K (the oracle's products);
  backward: the gradient in the backward format (as mxjax.dot_general with that pair)."""
  recipe = MXBlockScaling("e5m2", "e2m1")
  dense = mxl.Dense(32, use_bias=False, dtype=jnp.float32)
  params = dense.init(jax.random.key(0), X)
  w = params["params"]["kernel"]
  expected = _oracle_fake_quantize(X, "e5m2", 1) @ _oracle_fake_quantize(w, "e5m2", 0)
  loss = lambda p, x: jnp.sum(dense.apply(p, x) ** 3)  # noqa: E731
  with mxjax.autocast(recipe=recipe):
    y = jax.jit(dense.apply)(params, X)
    gx = jax.grad(loss, argnums=1)(params, X)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
  dims = (((1,), (0,)), ((), ()))
  direct = lambda x: jnp.sum(mxjax.dot_general(  # noqa: E731
      x, w, dims, fwd_format="e5m2", bwd_format="e2m1") ** 3)
  np.testing.assert_array_equal(gx, jax.grad(direct)(X))
  with mxjax.autocast(recipe=MXBlockScaling("e5m2", "e5m2")):
    assert not np.array_equal(gx, jax.grad(loss, argnums=1)(params, X))
  with mxjax.autocast(recipe=MXFP8BlockScaling()):  # E4M3 forward: other products
    assert not np.array_equal(y, dense.apply(params, X))

  linear = mxnnx.Linear(64, 32, use_bias=False, dtype=jnp.float32, rngs=fnnx.Rngs(0))
  linear.kernel[...] = w
  with mxjax.autocast(recipe=recipe):
    np.testing.assert_array_equal(linear(X), y)


def test_mx_block_scaling_through_intercept_of_a_stock_dense():
  """A stock nn.Dense inside mxjax.linen.intercept runs the general recipe as mxjax's own
  Dense does (same kernel, same products)."""
  recipe = MXBlockScaling("e5m2", "e3m2")
  stock = nn.Dense(32, use_bias=False, dtype=jnp.float32)
  params = stock.init(jax.random.key(0), X)
  own = mxl.Dense(32, use_bias=False, dtype=jnp.float32)
  with mxjax.autocast(recipe=recipe):
    expected = own.apply(params, X)
    with mxjax.linen.intercept():
      np.testing.assert_array_equal(stock.apply(params, X), expected)
  w = params["params"]["kernel"]
  oracle = _oracle_fake_quantize(X, "e5m2", 1) @ _oracle_fake_quantize(w, "e5m2", 0)
  np.testing.assert_allclose(expected, oracle, rtol=1e-5, atol=1e-5)


class _Net(nn.Module):

  @nn.compact
  def __call__(self, x):
    return mxl.Dense(32, use_bias=False, dtype=jnp.float32, name="proj")(x)


def test_mx_block_scaling_quantized_model_init_memory_and_mismatch():
  recipe = MXBlockScaling("e5m2", "e4m3")
  with mxjax.quantized_model_init(recipe=recipe, for_training=True):
    variables = _Net().init(jax.random.key(0), X)
  kernel = variables[mxjax.linen.QUANTIZED_KERNELS]["proj"]["kernel"]
  assert [a.data.dtype for a in kernel] == [jnp.float8_e5m2, jnp.float8_e5m2]
  assert state_lib.describe(variables) == {"mx_state/proj/recipe_state": "MXBlockScaling"}
  # E5M2 pair with 32-blocks: 2 copies of (1 byte + 1/32 scale byte) vs 4 f32 bytes.
  assert memory.memory_report(variables).quantized_ratio == pytest.approx(2 * (1 + 1 / 32) / 4)
  w = kernel[0].dequantize()
  with mxjax.autocast(recipe=recipe):
    y = _Net().apply(variables, X)
  np.testing.assert_allclose(y, _oracle_fake_quantize(X, "e5m2", 1) @ w, rtol=1e-5, atol=1e-5)
  with mxjax.autocast(recipe=MXFP8BlockScaling()):
    with pytest.raises(ValueError, match="Recipe mismatch for Dense 'proj'") as info:
      _Net().apply(variables, X)
  assert "fwd_format=e5m2" in str(info.value) and str(MXFP8BlockScaling()) in str(info.value)

  # An E4M3 kernel from MXFP8BlockScaling runs under the general recipe with E4M3 forward.
  with mxjax.quantized_model_init(recipe=MXFP8BlockScaling()):
    e4m3_variables = _Net().init(jax.random.key(0), X)
  with mxjax.autocast(recipe=MXBlockScaling("e4m3", "e5m2")):
    general = _Net().apply(e4m3_variables, X)
  with mxjax.autocast(recipe=MXFP8BlockScaling(fp8_format=Format.HYBRID)):
    np.testing.assert_array_equal(general, _Net().apply(e4m3_variables, X))


def test_mx_block_scaling_state_kind_and_recipe_change():
  with mxjax.autocast(recipe=MXBlockScaling("e3m2", "e5m2")):
    variables = _Net().init(jax.random.key(0), X)
  assert state_lib.describe(variables) == {"mx_state/proj/recipe_state": "MXBlockScaling"}
  assert not jax.tree.leaves(variables["mx_state"])  # stateless: no arrays
  with mxjax.autocast(recipe=DelayedScaling()), warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    _, mutated = _Net().apply(variables, X, mutable=["mx_state"])
  assert any("Recipe type changed" in str(w.message) for w in seen)
  assert state_lib.describe(mutated) == {"mx_state/proj/recipe_state": "DelayedScaling"}
