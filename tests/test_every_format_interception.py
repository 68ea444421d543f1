"""Every format: a model written like real model code (its own modules and params,
`jnp.einsum` for projections and attention, `@` and `jnp.dot`; no stock GEMM layer) under
`mxjax.linen.intercept` and `mxjax.nnx.quantize`: `mxjax.coverage` lists every product
with the recipe (MX share 100%, or the split a rule asks for, computed here from the
shapes), and the outputs equal the same model written with `mxjax.einsum` / `matmul` /
`dot_general` under the recipe, bit for bit.

Every contraction is at least 128 long, so that FP8's 1x128 blocks quantize it too.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import mxjax
from format_cases import RECIPES, assert_bits_equal, every_format, random_data

B, T, D, H, DH = 1, 128, 256, 2, 128
INIT = nn.initializers.normal(0.05)
PATHS = ["einsum_0", "einsum_1", "einsum_2", "dot_general_0", "mlp/dot_general_0"]
FLOPS = {"einsum_0": 2 * B * T * D * H * DH,      # x . wq            (contract d)
         "einsum_1": 2 * B * H * T * T * DH,      # q . k^T: scores   (contract h)
         "einsum_2": 2 * B * H * T * T * DH,      # probs . v         (contract s)
         "dot_general_0": 2 * B * T * H * DH * D,  # attn @ wo         (contract n h)
         "mlp/dot_general_0": 2 * B * T * D * D}  # jnp.dot(h, w)     (contract d)


def forward(params, x, einsum=jnp.einsum, matmul=jnp.matmul, dot=jnp.dot):
  """The model's math, with the product functions given (jnp's, or mxjax's)."""
  q = einsum("btd,dnh->btnh", x, params["wq"])
  scores = einsum("btnh,bsnh->bnts", q, q) / DH ** 0.5
  attn = einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), q)
  h = matmul(attn.reshape(B, T, H * DH), params["wo"])
  return dot(jax.nn.gelu(h), params["mlp"]["w"])


class Mlp(nn.Module):
  @nn.compact
  def __call__(self, h):
    return jnp.dot(jax.nn.gelu(h), self.param("w", INIT, (D, D)))


class Model(nn.Module):
  @nn.compact
  def __call__(self, x):
    wq = self.param("wq", INIT, (D, H, DH))
    q = jnp.einsum("btd,dnh->btnh", x, wq)
    scores = jnp.einsum("btnh,bsnh->bnts", q, q) / DH ** 0.5
    attn = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), q)
    h = attn.reshape(B, T, H * DH) @ self.param("wo", INIT, (H * DH, D))
    return Mlp(name="mlp")(h)


class NnxModel(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.wq = nnx.Param(INIT(rngs.params(), (D, H, DH)))
    self.wo = nnx.Param(INIT(rngs.params(), (H * DH, D)))
    self.mlp = NnxMlp(rngs)

  def __call__(self, x):
    q = jnp.einsum("btd,dnh->btnh", x, self.wq[...])
    scores = jnp.einsum("btnh,bsnh->bnts", q, q) / DH ** 0.5
    attn = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), q)
    return self.mlp(attn.reshape(B, T, H * DH) @ self.wo[...])


class NnxMlp(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.w = nnx.Param(INIT(rngs.params(), (D, D)))

  def __call__(self, h):
    return jnp.dot(jax.nn.gelu(h), self.w[...])


def _direct(recipe, params, x):
  """The model with mxjax's products under `recipe` (the forward needs no key or name).

  Interception runs each `dot_general` the program traces with its lhs in the x role and
  its rhs in the w role. `jnp.einsum` traces "bnts,bsnh->btnh" as `dot_general(v, probs)`
  (it puts the operands in the order that needs no transpose of the result), so the
  direct product is that `dot_general`; for recipes whose x and w formats differ (2-D
  weight tiles) `mxjax.einsum("bnts,bsnh->btnh", probs, v)` would quantize probs as w.
  """
  def einsum(eq, a, b):
    if eq == "bnts,bsnh->btnh":  # as jnp.einsum traces it: v . probs, then a transpose
      y = mxjax.dot_general(b, a, (((1,), (3,)), ((0, 2), (0, 1))), recipe=recipe)
      return jnp.transpose(y, (0, 3, 1, 2))  # [b, n, h, t] -> [b, t, n, h]
    return mxjax.einsum(eq, a, b, recipe=recipe)

  return forward(params, x, einsum=einsum, matmul=lambda a, b: mxjax.matmul(a, b, recipe=recipe),
                 dot=lambda a, b: mxjax.matmul(a, b, recipe=recipe))


def test_jnp_einsum_traces_pv_with_the_operands_swapped():
  """What `_direct` mirrors: jnp's own choice (if jax changes it, so must `_direct`)."""
  p, v = jnp.zeros((B, H, T, T)), jnp.zeros((B, T, H, DH))
  eqn = jax.make_jaxpr(lambda p, v: jnp.einsum("bnts,bsnh->btnh", p, v))(p, v).jaxpr.eqns[0]
  assert eqn.primitive.name == "dot_general"
  assert eqn.params["dimension_numbers"] == (((1,), (3,)), ((0, 2), (0, 1)))
  assert eqn.invars[0].aval.shape == v.shape  # lhs: v


def _check_report(report, recipe, kept=()):
  """Every product listed, with the recipe (or the rule's reason), and the MX share the
  shapes give."""
  assert [p.path for p in report.products] == PATHS, report.table()
  for p in report.products:
    assert p.flops == FLOPS[p.path], (p.path, p.flops)
    if p.path in kept:
      assert not p.mx and p.reason.startswith("rule"), report.table()
    else:
      assert p.mx and p.recipe.startswith(type(recipe).__name__), report.table()
  want = 1 - sum(FLOPS[k] for k in kept) / sum(FLOPS.values())
  assert report.mx_share == pytest.approx(want, rel=1e-12), report.table()


@every_format
def test_linen_intercept_covers_every_product_and_equals_the_direct_products(name):
  recipe = RECIPES[name]
  x = random_data((B, T, D), seed=0)
  model = Model()
  variables = model.init(jax.random.key(0), x)
  with mxjax.autocast(recipe=recipe):
    with mxjax.linen.intercept():
      report = mxjax.coverage(model.apply, variables, x)
      got = jax.jit(model.apply)(variables, x)
    with mxjax.linen.intercept([(r"einsum_1$", None)]):  # attention scores in bf16 / f32
      split = mxjax.coverage(model.apply, variables, x)
    want = jax.jit(lambda p, x: _direct(recipe, p, x))(variables["params"], x)
  _check_report(report, recipe)
  _check_report(split, recipe, kept=("einsum_1",))
  assert_bits_equal(got, want, f"linen {name}")
  hp = model.apply(variables, x)  # quantized, not high precision, and near it
  err = float(jnp.linalg.norm(got - hp) / jnp.linalg.norm(hp))
  assert 0 < err < (0.2 if recipe.roles().x.element_format.bits == 8 else 0.6), err


@every_format
def test_nnx_quantize_covers_every_product_and_equals_the_direct_products(name):
  recipe = RECIPES[name]
  x = random_data((B, T, D), seed=1)
  model = mxjax.nnx.quantize(NnxModel(nnx.Rngs(0)))
  params = {"wq": model.wq[...], "wo": model.wo[...], "mlp": {"w": model.mlp.w[...]}}
  with mxjax.autocast(recipe=recipe):
    report = mxjax.coverage(lambda x: model(x), x)
    got = nnx.jit(lambda m, x: m(x))(model, x)
    want = jax.jit(lambda p, x: _direct(recipe, p, x))(params, x)
  _check_report(report, recipe)
  assert_bits_equal(got, want, f"nnx {name}")
  split_model = mxjax.nnx.quantize(NnxModel(nnx.Rngs(0)), [(r"einsum_1$", None)])
  with mxjax.autocast(recipe=recipe):
    _check_report(mxjax.coverage(lambda x: split_model(x), x), recipe, kept=("einsum_1",))


@every_format
def test_intercepted_einsum_gradient_equals_mxjax_einsum(name):
  """Gradients too: an intercepted `jnp.einsum` projection differentiates as `mxjax.einsum`
  given the key (`mx_rng` folded with the product's number) and the name (the RHT's
  signs) that interception gives it."""
  recipe = RECIPES[name]
  x, wq = random_data((B, T, D), seed=2), random_data((D, H, DH), seed=3, scale=0.05)
  key = jax.random.key(3)
  loss = mxjax.quantized(lambda w, x: jnp.sum(jnp.einsum("btd,dnh->btnh", x, w) ** 2))
  direct = lambda w, x: jnp.sum(mxjax.einsum(  # noqa: E731
      "btd,dnh->btnh", x, w, recipe=recipe, rng=jax.random.fold_in(key, 1),
      name="product 'einsum_0'") ** 2)
  with mxjax.autocast(recipe=recipe):
    got = jax.jit(jax.grad(lambda w, x: loss(w, x, mx_rng=key), argnums=(0, 1)))(wq, x)
  want = jax.jit(jax.grad(direct, argnums=(0, 1)))(wq, x)
  for g, w, what in zip(got, want, ("dw", "dx")):
    assert_bits_equal(g, w, f"{name}: {what}")
