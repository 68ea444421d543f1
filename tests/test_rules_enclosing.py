"""A rule on an enclosing module path (`^block_0/mlp$`, `attn$`) decides every product
inside that module, and `mxjax.coverage` names the rule as the reason; a rule "every path
but ..." (`^(?!block_0/mlp)`, the "mlp_only" preset) keeps exactly the products outside
what it excludes: in linen (`mxjax.linen.intercept`), NNX (`mxjax.nnx.quantize`) and plain JAX
(`mxjax.quantized`).

The models are written as model libraries write them: their own modules computing
products with `jnp.einsum`, `x @ w`, `jnp.dot` and `lax.dot_general`, named submodules
(`block_0/attn`, `block_0/mlp`), plus one stock Dense / Linear (`gate`) inside each MLP.
Every product's expected recipe is worked out here from its path alone.
"""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

import mxjax

B, T, D, HEADS, HD, F = 2, 4, 64, 2, 32, 64
MX = mxjax.MXFP8BlockScaling()
INIT = nn.initializers.normal(0.1)
BLOCK0_MLP, ATTN = r"^block_0/mlp$", r"attn$"
MLP_ONLY = mxjax.rules.preset("mlp_only")
ALL_BUT = r"^(?!block_0/mlp)"  # every path but block_0's MLP: matched on the path alone
RULE_SETS = {"enclosing": [(BLOCK0_MLP, None), (ATTN, None)], "mlp_only": MLP_ONLY,
             "all_but": [(ALL_BUT, None)]}
# Products per module: attn (3 projections, QK^T, PV, the output projection), mlp (in,
# the stock gate, out).
PER_ATTN, PER_MLP = 6, 3


def expected_reason(path: str, rules: str) -> str | None:
  """The reason a product at `path` stays in high precision under a rule set (None: MX)."""
  parts = path.split("/")
  if rules == "enclosing":
    if parts[:2] == ["block_0", "mlp"]:
      return f"rule {BLOCK0_MLP!r}"
    if len(parts) > 1 and parts[1] == "attn":
      return f"rule {ATTN!r}"
    return None
  if rules == "all_but":
    return None if parts[:2] == ["block_0", "mlp"] else f"rule {ALL_BUT!r}"
  return None if len(parts) > 1 and parts[1] == "mlp" else f"rule {MLP_ONLY[0][0]!r}"


def check_report(report, rules: str):
  """Every product of the two blocks is there, each MX or kept for the expected rule."""
  by_module = {}
  for p in report.products:
    module = "/".join(p.path.split("/")[:2])
    by_module[module] = by_module.get(module, 0) + 1
    want = expected_reason(p.path, rules)
    if want is None:
      assert p.mx, (p.path, p.reason)
    else:
      assert not p.mx and p.reason == want, (p.path, p.recipe, p.reason, want)
  assert by_module == {f"block_{i}/{m}": n for i in range(2)
                       for m, n in (("attn", PER_ATTN), ("mlp", PER_MLP))}, by_module


def inputs():
  return jnp.asarray(np.random.default_rng(0).standard_normal((B, T, D)), jnp.float32)


def _attention(x, wq, wk, wv, wo):
  q = jnp.einsum("btd,dnh->btnh", x, wq)
  k = jnp.einsum("btd,dnh->btnh", x, wk)
  v = jnp.einsum("btd,dnh->btnh", x, wv)
  probs = jax.nn.softmax(jnp.einsum("btnh,bsnh->bnts", q, k) / HD ** 0.5, axis=-1)
  return lax.dot_general(jnp.einsum("bnts,bsnh->btnh", probs, v), wo,
                         (((2, 3), (0, 1)), ((), ())))


# -- linen ------------------------------------------------------------------------------


class LinenAttn(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = [self.param(n, INIT, (D, HEADS, HD)) for n in ("wq", "wk", "wv")]
    return _attention(x, *w, self.param("wo", INIT, (HEADS, HD, D)))


class LinenMlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = jax.nn.gelu(x @ self.param("wi", INIT, (D, F))) * nn.Dense(F, name="gate")(x)
    return jnp.dot(h, self.param("wo", INIT, (F, D)))


class LinenBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = x + LinenAttn(name="attn")(x)
    return x + LinenMlp(name="mlp")(x)


class LinenModel(nn.Module):
  @nn.compact
  def __call__(self, x):
    for i in range(2):
      x = LinenBlock(name=f"block_{i}")(x)
    return x


# -- NNX --------------------------------------------------------------------------------


class NnxAttn(nnx.Module):
  def __init__(self, rngs):
    for n in ("wq", "wk", "wv"):
      setattr(self, n, nnx.Param(INIT(rngs.params(), (D, HEADS, HD))))
    self.wo = nnx.Param(INIT(rngs.params(), (HEADS, HD, D)))

  def __call__(self, x):
    return _attention(x, self.wq[...], self.wk[...], self.wv[...], self.wo[...])


class NnxMlp(nnx.Module):
  def __init__(self, rngs):
    self.wi = nnx.Param(INIT(rngs.params(), (D, F)))
    self.gate = nnx.Linear(D, F, rngs=rngs)
    self.wo = nnx.Param(INIT(rngs.params(), (F, D)))

  def __call__(self, x):
    return jnp.dot(jax.nn.gelu(x @ self.wi[...]) * self.gate(x), self.wo[...])


class NnxBlock(nnx.Module):
  def __init__(self, rngs):
    self.attn, self.mlp = NnxAttn(rngs), NnxMlp(rngs)

  def __call__(self, x):
    x = x + self.attn(x)
    return x + self.mlp(x)


class NnxModel(nnx.Module):
  def __init__(self, rngs):
    self.block_0, self.block_1 = NnxBlock(rngs), NnxBlock(rngs)

  def __call__(self, x):
    return self.block_1(self.block_0(x))


# -- plain JAX: module paths from jax.named_scope -----------------------------------------


def jax_params():
  keys = iter(jax.random.split(jax.random.key(0), 32))
  block = lambda: {  # noqa: E731
      "attn": {n: INIT(next(keys), (D, HEADS, HD)) for n in ("wq", "wk", "wv")}
      | {"wo": INIT(next(keys), (HEADS, HD, D))},
      "mlp": {"wi": INIT(next(keys), (D, F)), "gate": INIT(next(keys), (D, F)),
              "wo": INIT(next(keys), (F, D))}}
  return {"block_0": block(), "block_1": block()}


def jax_model(params, x):
  for name in ("block_0", "block_1"):
    p = params[name]
    with jax.named_scope(name):
      with jax.named_scope("attn"):
        x = x + _attention(x, **p["attn"])
      with jax.named_scope("mlp"):
        h = jax.nn.gelu(x @ p["mlp"]["wi"])
        with jax.named_scope("gate"):
          h = h * lax.dot_general(x, p["mlp"]["gate"], (((2,), (0,)), ((), ())))
        x = x + jnp.dot(h, p["mlp"]["wo"])
  return x


# -- the three entry points, each as (report, run) under rules ----------------------------


def linen_entry(rules):
  model, x = LinenModel(), inputs()
  variables = model.init(jax.random.key(0), x)

  def under(fn):
    with mxjax.autocast(recipe=MX), mxjax.linen.intercept(rules):
      return fn(model.apply, variables, x)

  return under, jax.jit(model.apply)(variables, x)


def nnx_entry(rules):
  model, x = NnxModel(nnx.Rngs(0)), inputs()
  plain = nnx.jit(lambda m, x: m(x))(model, x)
  mxjax.nnx.quantize(model, rules)
  graphdef, state = nnx.split(model)

  def apply(state, x):
    return nnx.merge(graphdef, state)(x)

  def under(fn):
    with mxjax.autocast(recipe=MX):
      return fn(apply, state, x)

  return under, plain


def jax_entry(rules):
  params, x = jax_params(), inputs()
  fn = mxjax.quantized(jax_model, rules)

  def under(run):
    with mxjax.autocast(recipe=MX):
      return run(fn, params, x)

  return under, jax.jit(jax_model)(params, x)


ENTRIES = {"linen": linen_entry, "nnx": nnx_entry, "quantized": jax_entry}


@pytest.mark.parametrize("rules", sorted(RULE_SETS))
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_rule_on_an_enclosing_module_decides_every_product_inside(entry, rules):
  under, _ = ENTRIES[entry](RULE_SETS[rules])
  report = under(mxjax.coverage)
  check_report(report, rules)


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_rules_on_every_enclosing_module_give_the_high_precision_model_bit_for_bit(entry):
  """Rules naming only the modules (`^block_0/mlp$`, `attn$`, `^block_1/mlp$`) keep every
  product in high precision: the output is the plain model's, bit for bit, and the call
  warns that nothing was quantized; without the rules it is MX (and differs)."""
  rules = [(BLOCK0_MLP, None), (ATTN, None), (r"^block_1/mlp$", None)]
  under, plain = ENTRIES[entry](rules)
  with pytest.warns(UserWarning, match="quantized no product"):
    kept = under(lambda f, *a: jax.jit(f)(*a))
  np.testing.assert_array_equal(np.asarray(kept), np.asarray(plain))
  under_mx, _ = ENTRIES[entry](None)
  with warnings.catch_warnings():
    warnings.filterwarnings("error", message="mxjax")  # every product quantized: quiet
    mx = under_mx(lambda f, *a: jax.jit(f)(*a))
  assert not np.array_equal(np.asarray(mx), np.asarray(plain))


def test_recipe_for_and_match_take_enclosing_module_paths():
  """`mxjax.rules.recipe_for` (what layers ask) follows a rule on an enclosing module; a
  pattern "every path but ..." (a leading negative lookahead, as "mlp_only"'s) is matched
  against the path alone, since the modules above what it excludes all match it."""
  rules = mxjax.rules.check([(BLOCK0_MLP, None), (ATTN, mxjax.MXFP4BlockScaling())])
  assert mxjax.rules.recipe_for(rules, "block_0/mlp/gate", MX) is None
  assert mxjax.rules.recipe_for(rules, "block_1/mlp/gate", MX) is MX
  assert mxjax.rules.recipe_for(rules, "block_1/attn/q", MX) == mxjax.MXFP4BlockScaling()
  assert mxjax.rules.recipe_for(MLP_ONLY, "block_0/mlp/gate", MX) is MX
  assert mxjax.rules.recipe_for(MLP_ONLY, "block_0/attn/q", MX) is None
  all_but = mxjax.rules.check([(ALL_BUT, None)])
  assert mxjax.rules.recipe_for(all_but, "block_0/mlp/gate", MX) is MX
  assert mxjax.rules.recipe_for(all_but, "block_1/mlp/gate", MX) is None
  assert mxjax.rules.enclosing_paths("a/b/c") == ["a/b/c", "a/b", "a"]
