"""The block-scaled recipes (TE's fields and defaults, their errors) and their GEMM
(`mxjax.dot_general` with a recipe's roles) against the oracle; stochastic rounding's keys in linen and nnx."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mxjax
from mxjax import reference
from mxjax._src import formats as bfmt
from mxjax._src.formats import ScaleFormat
from mxjax._src.recipes import (Float8BlockScaling, Format, MXFP4BlockScaling, MXFP8BlockScaling,
                                NVFP4BlockScaling)

DIMS = (((1,), (0,)), ((), ()))


def test_te_defaults():
  r = NVFP4BlockScaling().roles()
  assert (r.x, r.w, r.grad) == (bfmt.NVFP4, bfmt.NVFP4_2D, bfmt.NVFP4)
  assert r.stochastic_rounding and r.random_hadamard_transform and r.hadamard_size == 16
  off = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True,
                          disable_2d_quantization=True).roles()
  assert off.w == bfmt.NVFP4 and not off.stochastic_rounding and not off.random_hadamard_transform
  assert not NVFP4BlockScaling(disable_stochastic_rounding=True).needs_rng()
  f = Float8BlockScaling().roles()
  assert (f.x.block, f.w.block, f.grad.block) == ((1, 128), (128, 128), (1, 128))
  assert {f.x.scale, f.w.scale, f.grad.scale} == {ScaleFormat.FP32_POW2}
  assert Float8BlockScaling(use_f32_scales=True).roles().x.scale is ScaleFormat.FP32
  assert Float8BlockScaling(fp8_format=Format.HYBRID).roles().grad.element == "e5m2"
  assert MXFP8BlockScaling().roles().plain_mx  # the MX kernels' fast path
  assert MXFP8BlockScaling(enable_2d_quantization=True).roles().w == bfmt.MXFP8_2D
  sr = MXFP4BlockScaling(stochastic_rounding=True, random_hadamard_transform=True)
  assert sr.needs_rng() and sr.roles().grad == bfmt.mx("e2m1")


@pytest.mark.parametrize("make, match", [
    (lambda: NVFP4BlockScaling(fp4_format=Format.E4M3), "E2M1"),
    (lambda: NVFP4BlockScaling(fp8_format=Format.E5M2), "E4M3"),
    (lambda: NVFP4BlockScaling(hadamard_size=12), "power of two"),
    (lambda: MXFP4BlockScaling(random_hadamard_transform=True, hadamard_size=3), "power of two"),
    (lambda: Float8BlockScaling(x_block_scaling_dim=2, grad_block_scaling_dim=2), "2-D by 2-D"),
    (lambda: Float8BlockScaling(w_block_scaling_dim=3), "1x128"),
    (lambda: Float8BlockScaling(fp8_format=Format.E5M2), "E4M3"),
    (lambda: bfmt.BlockFormat("e2m1", "e8m0", (1, 16), tensor_scale=True), "tensor scale"),
    (lambda: bfmt.BlockFormat("e2m1", "e4m3", (16, 32)), "square"),
])
def test_invalid_combinations(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_quantized_model_init_stores_the_weight_role_of_block_recipes():
  """2-D weight formats are one tile MXArray (serving the forward and the dgrad);
  per-tensor FP8 has no block-scaled weights to store and says so."""
  x = jnp.ones((2, 64))
  for recipe in (NVFP4BlockScaling(), MXFP8BlockScaling(enable_2d_quantization=True)):
    with mxjax.quantized_model_init(recipe=recipe):
      kernel = mxjax.linen.Dense(64).init(jax.random.key(0), x)[mxjax.linen.QUANTIZED_KERNELS][
          "kernel"]
    assert isinstance(kernel, mxjax.MXArray) and kernel.format == recipe.roles().w
  with pytest.raises(ValueError, match="no block-scaled weights to store|block-scaled recipe"):
    with mxjax.quantized_model_init(recipe=mxjax.DelayedScaling()):
      pass


def _oracle(x, bf, axis):
  """(values without the tensor scale, 1 / tensor scale) from the oracle."""
  c, s, t = reference.block_quantize(x, bf, axis=axis)
  inv = 1.0 if t is None else 1.0 / jax.lax.bitcast_convert_type(t, jnp.float32)
  return reference.block_dequantize(c, s, t, bf, axis=axis, apply_tensor_scale=False), inv


@pytest.mark.parametrize("recipe", [
    NVFP4BlockScaling(disable_stochastic_rounding=True, disable_rht=True),
    Float8BlockScaling()], ids=["nvfp4", "fp8_block"])
def test_gemm_equals_the_oracles_products(recipe):
  """Forward, dgrad and wgrad: the products of the oracle's values of each role, each
  along its contraction (2-D weights: one tiling), scaled by the tensor scales."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((40, 48)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((48, 36)) * 0.1, jnp.float32)
  g = jnp.asarray(rng.standard_normal((40, 36)), jnp.float32)
  roles = recipe.roles()
  hi = jax.lax.Precision.HIGHEST

  @jax.jit
  def both(x, w, g):
    y, vjp = jax.vjp(lambda x, w: _dot(x, w, roles), x, w)
    (qx, sx), (qw, sw) = _oracle(x, roles.x, -1), _oracle(w, roles.w, 0)
    (qg, sg), (qw_n, sw_n) = _oracle(g, roles.grad, -1), _oracle(w, roles.w, -1)
    (qx_m, sx_m), (qg_m, sg_m) = _oracle(x, roles.x, 0), _oracle(g, roles.grad, 0)
    want = (jnp.dot(qx, qw, precision=hi) * sx * sw,
            jnp.dot(qg, qw_n.T, precision=hi) * sg * sw_n,
            jnp.dot(qx_m.T, qg_m, precision=hi) * sx_m * sg_m)
    return (y, *vjp(g)), want, jnp.array_equal(qw, qw_n)

  got, want, same_w = both(x, w, g)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-5)
  if roles.w.two_d:  # one quantized weight serves the forward and the dgrad
    assert same_w


def test_linen_rng_stream_drives_stochastic_rounding():
  model = mxjax.linen.Dense(24)
  x = jnp.asarray(np.random.default_rng(1).standard_normal((32, 32)), jnp.float32)
  params = model.init(jax.random.key(0), x)

  recipe = MXFP4BlockScaling(stochastic_rounding=True)

  @jax.jit
  def grad(params, key):
    with mxjax.autocast(recipe=recipe):
      return jax.grad(lambda p: jnp.sum(model.apply(p, x, rngs={"mx": key}) ** 2))(params)

  a, b, c = grad(params, jax.random.key(1)), grad(params, jax.random.key(1)), grad(
      params, jax.random.key(2))
  ka, kb, kc = (t["params"]["kernel"] for t in (a, b, c))
  np.testing.assert_array_equal(ka, kb)
  assert not np.array_equal(ka, kc)
  with pytest.raises(ValueError, match=r"rngs=\{'mx': key\}"):
    with mxjax.autocast(recipe=recipe):
      jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, x))))(params)


def test_nnx_rng_stream_advances_per_call():
  layer = mxjax.nnx.Linear(32, 16, rngs=nnx.Rngs(0, mx=5))
  x = jnp.asarray(np.random.default_rng(2).standard_normal((16, 32)), jnp.float32)

  def loss(layer):
    with mxjax.autocast(recipe=MXFP4BlockScaling(stochastic_rounding=True)):
      return jnp.sum(layer(x) ** 2)

  grad = nnx.jit(nnx.grad(loss))
  g1 = grad(layer).kernel.get_value()
  g2 = grad(layer).kernel.get_value()
  assert not np.array_equal(g1, g2)  # a new key per call
  bare = mxjax.nnx.Linear(32, 16, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="nnx.Rngs with an 'mx' stream"):
    grad(bare)


class _OwnProducts(nnx.Module):
  """A model written with its own params and `@` (no stock layer)."""

  def __init__(self, rngs):
    self.w1 = nnx.Param(jax.random.normal(rngs.params(), (32, 48)) / 6)
    self.w2 = nnx.Param(jax.random.normal(rngs.params(), (48, 16)) / 7)

  def __call__(self, x):
    return jnp.tanh(x @ self.w1[...]) @ self.w2[...]


def test_mx_rng_keys_stochastic_rounding_of_quantized_functions_and_nnx_models():
  """`mxjax.quantized(fn)` and `mxjax.nnx.quantize(model)` take the key as `mx_rng`: the
  same key gives the same gradient, another key another one, none a clear error."""
  x = jnp.asarray(np.random.default_rng(3).standard_normal((16, 32)), jnp.float32)
  model = mxjax.nnx.quantize(_OwnProducts(nnx.Rngs(0)))
  w1, w2 = model.w1[...], model.w2[...]
  loss_fn = mxjax.quantized(lambda w1, w2, x: jnp.sum((jnp.tanh(x @ w1) @ w2) ** 2))

  def fn_grad(key):
    with mxjax.autocast(recipe=NVFP4BlockScaling()):
      return jax.jit(jax.grad(lambda w: loss_fn(w, w2, x, mx_rng=key)))(w1)

  def nnx_grad(key):
    with mxjax.autocast(recipe=NVFP4BlockScaling()):
      return nnx.grad(lambda m: jnp.sum(m(x, mx_rng=key) ** 2))(model).w1[...]

  for grad in (fn_grad, nnx_grad):
    a, b, c = grad(jax.random.key(1)), grad(jax.random.key(1)), grad(jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    with pytest.raises(ValueError, match="mx_rng=key"):
      grad(None)


def test_same_key_same_result_on_one_device_and_a_mesh():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  roles = MXFP4BlockScaling(stochastic_rounding=True).roles()
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((32, 32)), jnp.float32)
  f = jax.jit(jax.grad(lambda x, w, k: jnp.sum(_dot(
      x, w, roles, rng=k) ** 2), argnums=(0, 1)))
  key = jax.random.key(7)
  one = f(x, w, key)
  mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
  sharded = f(xs, w, key)
  assert len(sharded[0].sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(one[0]), np.asarray(sharded[0]))  # dgrad: N local
  np.testing.assert_allclose(np.asarray(one[1]), np.asarray(sharded[1]), rtol=1e-5, atol=1e-4)


def test_stochastic_rounding_under_remat_and_scan():
  """The bits depend on the key alone: remat recomputes the same gradient; a scan over
  steps with per-step keys gives each step its own bits."""
  roles = MXFP4BlockScaling(stochastic_rounding=True).roles()
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.standard_normal((32, 32)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((32, 16)), jnp.float32)

  def loss(w, key):
    return jnp.sum(_dot(x, w, roles, rng=key) ** 2)

  key = jax.random.key(11)
  plain = jax.jit(jax.grad(loss))(w, key)
  remat = jax.jit(jax.grad(jax.checkpoint(loss)))(w, key)
  np.testing.assert_array_equal(plain, remat)

  def step(carry, i):
    return carry, jax.grad(loss)(w, jax.random.fold_in(key, i))

  _, per_step = jax.jit(lambda: jax.lax.scan(step, 0, jnp.arange(2)))()
  assert not np.array_equal(per_step[0], per_step[1])
  np.testing.assert_array_equal(per_step[0], jax.jit(jax.grad(loss))(w, jax.random.fold_in(key, 0)))


def _dot(x, w, roles, **kwargs):
  return mxjax.dot_general(x, w, DIMS, recipe=roles, **kwargs)


def test_mx_roles_agree_with_the_mx_dot():
  """MX roles in the block GEMM (the RHT only touches the wgrad) give the plain MX dot's
  forward and dgrad, bit for bit: one E8M0 rule in both paths."""
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.standard_normal((64, 96)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((96, 40)), jnp.float32)
  g = jnp.asarray(rng.standard_normal((64, 40)), jnp.float32)
  roles = MXFP4BlockScaling(random_hadamard_transform=True).roles()

  @jax.jit
  def both(x, w, g):
    y1, vjp1 = jax.vjp(lambda x, w: _dot(x, w, roles), x, w)
    y2, vjp2 = jax.vjp(lambda x, w: mxjax.dot_general(x, w, DIMS, fwd_format="e2m1",
                                                      bwd_format="e2m1"), x, w)
    return y1, vjp1(g)[0], y2, vjp2(g)[0]

  y1, dx1, y2, dx2 = both(x, w, g)
  np.testing.assert_array_equal(y1, y2)
  np.testing.assert_array_equal(dx1, dx2)


@pytest.mark.parametrize("recipe", [NVFP4BlockScaling(disable_rht=True),
                                    MXFP4BlockScaling(stochastic_rounding=True)],
                         ids=["nvfp4", "mxfp4_sr"])
def test_stochastic_rounding_bits_are_made_where_their_product_needs_them(recipe):
  """A stack of products: each backward's random bits (4 bytes a gradient element, two
  copies) are made when its gradient is, so one buffer serves every layer's; the
  program's temp memory grows with depth as without stochastic rounding. (XLA hoisted
  bits that depend on the key alone to the start and kept every layer's live.)"""
  m = n = 256
  bits_per_layer = 2 * 4 * m * n

  def temp_bytes(recipe, layers: int) -> int:
    def loss(ws, x, key):  # a key per layer, as Flax's rng streams give
      for i, w in enumerate(ws):
        x = jax.nn.gelu(mxjax.dot_general(x, w, DIMS, recipe=recipe,
                                          rng=jax.random.fold_in(key, i)))
      return x.astype(jnp.float32).sum()

    ws = [jnp.ones((n, n), jnp.bfloat16)] * layers
    compiled = jax.jit(jax.grad(loss)).lower(ws, jnp.ones((m, n), jnp.bfloat16),
                                             jax.random.key(0)).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  off = ({"disable_stochastic_rounding": True} if isinstance(recipe, NVFP4BlockScaling)
         else {"stochastic_rounding": False})
  nearest = dataclasses.replace(recipe, **off)
  growth = temp_bytes(recipe, 6) - temp_bytes(recipe, 2)
  growth_nearest = temp_bytes(nearest, 6) - temp_bytes(nearest, 2)
  assert growth - growth_nearest < bits_per_layer, (growth, growth_nearest)
