"""Every product of models written as model libraries write them (tests/library_models.py:
own einsum modules, `lax.dot_general` with two contracting dims, `@`, `jnp.dot`, attention
by einsum, a tied head `x @ table.T`, `nn.scan` / `nnx.scan` layers, MoE on
`lax.ragged_dot`) runs MX under `linen.intercept` / `nnx.quantize`.

Coverage is counted here from the jaxpr alone, not from mxjax's report: the dot FLOPs of
the stock program, against those of the intercepted program's products that are not
inside a `custom_vjp` (every mxjax product is one)."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.extend import core as jex_core

import library_models as lm
import mxjax

MX = mxjax.MXFP8BlockScaling()
TOKENS = jax.random.randint(jax.random.key(1), (4, 33), 0, lm.VOCAB)
X, Y = TOKENS[:, :-1], TOKENS[:, 1:]  # 32 positions: attention contracts a whole block


def dot_flops(jaxpr, skip_custom_vjp: bool, times: int = 1):
  """(FLOPs, [(lhs shape, rhs shape)]) of the dot_general / ragged_dot_general equations
  of a jaxpr, scans counted by their length; with `skip_custom_vjp`, not those inside a
  custom_vjp function."""
  flops, shapes = 0, []
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name in ("dot_general", "ragged_dot_general"):
      lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
      if name == "dot_general":
        (lc, _), (lb, _) = eqn.params["dimension_numbers"]
        out = math.prod(eqn.outvars[0].aval.shape)
        flops += times * 2 * out * math.prod(lhs[d] for d in lc)
      else:
        flops += times * 2 * math.prod(lhs) * rhs[-1]
      shapes.append((tuple(lhs), tuple(rhs)))
      continue
    if skip_custom_vjp and name == "custom_vjp_call":
      continue
    n = times * (eqn.params["length"] if name == "scan" else 1)
    for sub in jex_core.jaxprs_in_params(eqn.params):
      f, s = dot_flops(sub, skip_custom_vjp, n)
      flops, shapes = flops + f, shapes + s
  return flops, shapes


class Linen:
  name = "linen"

  def __init__(self, moe):
    self.model = lm.LinenLM(moe=moe)
    self.variables = self.model.init(jax.random.key(0), X)

  def params(self):
    return self.variables

  def forward(self, params, x, rules=None):
    """The model's logits; with `rules`, under `intercept(rules)` (autocast is the
    caller's)."""
    if rules is None:
      return self.model.apply(params, x)
    with mxjax.linen.intercept(rules):
      return self.model.apply(params, x)

  def gemm_paths(self):
    return mxjax.linen.gemm_paths(self.model, X)


class Nnx:
  name = "nnx"

  def __init__(self, moe):
    self.stock = lm.NnxLM(nnx.Rngs(0), moe=moe)
    self.graphdef, self.state = nnx.split(self.stock)

  def params(self):
    return self.state

  def forward(self, params, x, rules=None):
    model = nnx.merge(self.graphdef, params)
    if rules is not None:
      mxjax.nnx.quantize(model, rules)
    return model(x)

  def gemm_paths(self):
    return mxjax.nnx.gemm_paths(mxjax.nnx.quantize(nnx.merge(self.graphdef, self.state)), X)


@pytest.fixture(scope="module", params=[(Linen, False), (Linen, True), (Nnx, False),
                                        (Nnx, True)],
                ids=["linen", "linen-moe", "nnx", "nnx-moe"])
def lib(request):
  cls, moe = request.param
  return cls(moe)


def test_every_product_is_mx_by_the_jaxpr(lib):
  params = lib.params()
  total, stock_shapes = dot_flops(jax.make_jaxpr(lib.forward)(params, X).jaxpr, False)
  with mxjax.autocast(recipe=MX):
    jaxpr = jax.make_jaxpr(lambda p, x: lib.forward(p, x, rules=()))(params, X).jaxpr
    report = mxjax.coverage(lambda p, x: lib.forward(p, x, rules=()), params, X)
  high, _ = dot_flops(jaxpr, skip_custom_vjp=True)
  assert total > 0 and len(stock_shapes) >= 8
  assert 1 - high / total >= 0.99
  assert report.mx_share >= 0.99 and report.total_flops == total


def test_autocast_off_is_bit_identical_and_params_are_the_stock_ones(lib):
  params = lib.params()
  stock = lib.forward(params, X)
  off = lib.forward(params, X, rules=())
  with mxjax.autocast(enabled=False):
    disabled = lib.forward(params, X, rules=())
  with mxjax.autocast(recipe=MX):
    mx = lib.forward(params, X, rules=())
  for y in (off, disabled):
    np.testing.assert_array_equal(np.asarray(y), np.asarray(stock))
  assert not np.array_equal(np.asarray(mx), np.asarray(stock))
  if isinstance(lib, Linen):
    with mxjax.autocast(recipe=MX), mxjax.linen.intercept():
      again = lib.model.init(jax.random.key(0), X)
    jax.tree.map(np.testing.assert_array_equal, again, lib.variables)
  else:
    model = nnx.merge(lib.graphdef, lib.state)
    before = jax.tree.map(np.asarray, nnx.state(model))
    mxjax.nnx.quantize(model)
    jax.tree.map(np.testing.assert_array_equal, nnx.state(model), before)


def _unordered(shapes):
  return {tuple(sorted(pair)) for pair in shapes}  # jnp.einsum may swap its operands


ATTENTION = _unordered([((4, 32, lm.HEADS, lm.HEAD_DIM), (4, 32, lm.HEADS, lm.HEAD_DIM)),  # QK
                        ((4, lm.HEADS, 32, 32), (4, 32, lm.HEADS, lm.HEAD_DIM))])          # PV


def test_no_attention_keeps_exactly_qk_and_pv_in_high_precision(lib):
  paths = lib.gemm_paths()
  rules = mxjax.rules.preset("no_attention", paths)
  assert len(rules) == 2  # one body of the scanned layers: QK^T and PV
  with mxjax.autocast(recipe=MX):
    jaxpr = jax.make_jaxpr(lambda p, x: lib.forward(p, x, rules=rules))(lib.params(), X)
  _, high = dot_flops(jaxpr.jaxpr, skip_custom_vjp=True)
  assert _unordered(high) == ATTENTION and len(high) == 2


def test_no_ends_finds_the_tied_head_and_a_rule_names_one_product(lib):
  paths = lib.gemm_paths()
  head = paths[-1]
  assert head.product.op == "dot_general" and head.product.rhs_shape == (lm.DIM, lm.VOCAB)
  rules = mxjax.rules.preset("no_ends", paths)
  with mxjax.autocast(recipe=MX):
    _, high = dot_flops(jax.make_jaxpr(
        lambda p, x: lib.forward(p, x, rules=rules))(lib.params(), X).jaxpr, True)
    assert ((*X.shape, lm.DIM), (lm.DIM, lm.VOCAB)) in high  # the head
    assert len(high) == 2  # and the first product
    down = next(p for p in paths if p.product.rhs_shape in (  # the MLP's down projection
        (lm.HIDDEN, lm.DIM), (lm.EXPERTS, lm.HIDDEN, lm.DIM)))
    _, high = dot_flops(jax.make_jaxpr(lambda p, x: lib.forward(
        p, x, rules=[(f"^{down}$", None)]))(lib.params(), X).jaxpr, True)
  assert high == [(down.product.lhs_shape, down.product.rhs_shape)]


def test_jit_retraces_when_the_rules_change(lib):
  traces = []

  @jax.jit
  def forward(params, x):
    traces.append(1)
    return lib.forward(params, x, rules=mxjax._src.context.get_layer_rules() or ())

  params = lib.params()
  with mxjax.autocast(recipe=MX):
    with mxjax._src.context.layer_rules([("einsum", None)]):
      a = forward(params, X)
      forward(params, X)
    with mxjax._src.context.layer_rules([("dot_general", None)]):
      b = forward(params, X)
  assert len(traces) == 2 and not np.array_equal(np.asarray(a), np.asarray(b))


def _sequences(key):
  """A batch of a task with a loss floor: x[t + 1] = (3 x[t] + 1) mod VOCAB from random
  starts, with a quarter of the tokens replaced by random ones."""
  start, noise, where = jax.random.split(key, 3)
  t = jnp.arange(33)
  clean = (jax.random.randint(start, (8, 1), 0, lm.VOCAB) * 3 ** t + (3 ** t - 1) // 2)
  random = jax.random.randint(noise, (8, 33), 0, lm.VOCAB)
  return jnp.where(jax.random.uniform(where, (8, 33)) < 0.25, random, clean % lm.VOCAB)


def _train(lib, recipe, steps=60):
  opt = optax.adam(3e-3)

  def loss(params, batch):
    logits = lib.forward(params, batch[:, :-1], rules=())
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

  @jax.jit
  def step(params, opt_state, key):
    value, grads = jax.value_and_grad(loss)(params, _sequences(key))
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  params = lib.params()
  opt_state = opt.init(params)
  with mxjax.autocast(enabled=recipe is not None, recipe=recipe):
    with warnings.catch_warnings(record=True) as said:  # off: coverage says no recipe is on
      warnings.simplefilter("always")
      report = mxjax.coverage(jax.grad(loss), params, _sequences(jax.random.key(0)))
    assert any("outside an enabled mxjax.autocast" in str(w.message) for w in said) == (
        recipe is None)
    for i in range(steps):
      params, opt_state, value = step(params, opt_state, jax.random.key(i))
  return float(value), len([p for p in report.products if p.mx])


def test_60_mxfp8_steps_end_within_5_percent_of_bf16(lib):
  bf16, n_plain = _train(lib, None)
  mx, n_mx = _train(lib, MX)
  assert n_plain == 0 and n_mx >= 8  # MX ran: products in the differentiated step
  assert mx != bf16 and abs(mx - bf16) / bf16 < 0.05, (mx, bf16)


# -- plain JAX: mxjax.quantized ----------------------------------------------------------


def _mlp(params, x):
  h = jax.nn.relu(jnp.einsum("bd,dh->bh", x, params["w1"]))
  return jnp.tensordot(h, params["w2"], axes=1)


PARAMS = {"w1": jax.random.normal(jax.random.key(2), (64, 96)) * 0.1,
          "w2": jax.random.normal(jax.random.key(3), (96, 64)) * 0.1}
XS = jax.random.normal(jax.random.key(4), (16, 64))


def test_quantized_under_grad_equals_mxjax_products():
  def expected(params, x):  # the same model written with mxjax's own products
    fmt = dict(fwd_format=MX.fwd_format, bwd_format=MX.bwd_format)
    h = jax.nn.relu(mxjax.einsum("bd,dh->bh", x, params["w1"], **fmt))
    return mxjax.dot_general(h, params["w2"], (((1,), (0,)), ((), ())), **fmt)

  loss = lambda f: lambda p, x: jnp.sum(f(p, x) ** 2)  # noqa: E731
  with mxjax.autocast(recipe=MX):
    got = jax.jit(jax.value_and_grad(loss(mxjax.quantized(_mlp))))(PARAMS, XS)
    want = jax.value_and_grad(loss(expected))(PARAMS, XS)
  jax.tree.map(np.testing.assert_array_equal, got, want)
  plain = jax.value_and_grad(loss(_mlp))(PARAMS, XS)
  assert not np.array_equal(got[0], plain[0])


def test_quantized_reaches_products_under_vmap_remat_cond_while_and_shard_map():
  mesh = jax.make_mesh((2,), ("d",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])

  def fn(params, x):
    y = jax.checkpoint(_mlp)(params, x)
    y = jax.lax.cond(x.sum() > -1e9, lambda a: a @ params["w1"], lambda a: jnp.zeros((a.shape[0], 96)), y)
    y = jax.lax.fori_loop(0, 2, lambda i, a: jnp.tanh(a @ params["w2"] @ params["w1"]), y)
    sm = jax.shard_map(lambda a, w: a @ w, mesh=mesh, in_specs=(jax.P("d"), jax.P()),
                       out_specs=jax.P("d"))
    return sm(y, params["w2"])

  with mxjax.autocast(recipe=MX):
    report = mxjax.coverage(mxjax.quantized(fn), PARAMS, XS)
    batched = jax.vmap(mxjax.quantized(_mlp), in_axes=(None, 0))(PARAMS, XS.reshape(2, 8, 64))
    value = jax.jit(mxjax.quantized(fn))(PARAMS, XS)  # (eager shard_map: no custom_vjp)
  one = mxjax.quantized(_mlp)  # vmap: each example alone (rows quantize on their own)
  with mxjax.autocast(recipe=MX):
    np.testing.assert_array_equal(np.asarray(batched[1]), np.asarray(one(PARAMS, XS[8:])))
  assert report.mx_share == 1.0 and len(report.products) == 6
  assert [p.path for p in report.products] == [
      "einsum_0", "dot_general_0", "dot_general_1", "dot_general_2", "dot_general_3",
      "dot_general_4"]
  assert value.shape == (16, 64) and bool(jnp.all(jnp.isfinite(value)))


def test_quantized_on_an_explicit_mesh_equals_one_device():
  mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,),
                       devices=jax.devices()[:4])
  with mxjax.autocast(recipe=MX):
    one = mxjax.quantized(_mlp)(PARAMS, XS)
    with jax.set_mesh(mesh):
      x = jax.device_put(XS, jax.P("data"))
      sharded = jax.jit(mxjax.quantized(_mlp))(PARAMS, x)
  assert sharded.sharding.spec[0] == "data"
  np.testing.assert_array_equal(np.asarray(sharded), np.asarray(one))


def test_nothing_quantized_warns_and_a_covered_model_is_quiet():
  def tiny(params, x):  # contracts 8 < one block: nothing to quantize
    return x[:, :8] @ params["w1"][:8]

  with mxjax.autocast(recipe=MX):
    with pytest.warns(UserWarning, match="quantized no product: .*shorter than one block"):
      mxjax.quantized(tiny, name="tiny")(PARAMS, XS)
    with pytest.warns(UserWarning, match="no dot_general"):
      mxjax.quantized(jnp.tanh)(XS)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      mxjax.quantized(_mlp)(PARAMS, XS)


def test_a_rule_that_matches_nothing_warns_with_the_paths():
  with mxjax.autocast(recipe=MX):
    with pytest.warns(UserWarning, match=r"'Dense_0' matches no product path.*'einsum_0'"):
      mxjax.quantized(_mlp, rules=[("Dense_0", None)])(PARAMS, XS)
    with pytest.warns(UserWarning, match="'dot_general_0'"):
      report = mxjax.coverage(mxjax.quantized(_mlp, rules=[("einsum", None), ("nope", None)]),
                              PARAMS, XS)
  assert [(p.path, p.mx) for p in report.products] == [("einsum_0", False),
                                                       ("dot_general_0", True)]
  assert report.products[0].reason == "rule 'einsum'"


def test_a_stock_dense_under_intercept_is_quantized_once():
  import flax.linen as nn  # noqa: PLC0415

  model = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(64)])
  variables = model.init(jax.random.key(0), XS)
  with mxjax.autocast(recipe=MX), mxjax.linen.intercept():
    report = mxjax.coverage(model.apply, variables, XS)
    jaxpr = jax.make_jaxpr(model.apply)(variables, XS).jaxpr
  assert [p.path for p in report.products] == ["layers_0", "layers_2"]
  calls = [e for e in jaxpr.eqns if e.primitive.name == "custom_vjp_call"]
  nested = [e for c in calls for e in c.params["call_jaxpr"].jaxpr.eqns
            if e.primitive.name == "custom_vjp_call"]
  assert len(calls) == 2 and not nested


def test_a_rule_on_a_name_that_is_not_there_warns_under_intercept_and_quantize():
  """`nn.Sequential` names its layers `layers_0`, `layers_2`: a rule on `Dense_0` would
  quietly do nothing; it warns, naming the paths that exist."""
  import flax.linen as nn  # noqa: PLC0415

  model = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(64)])
  variables = model.init(jax.random.key(0), XS)
  with mxjax.autocast(recipe=MX):
    with pytest.warns(UserWarning, match=r"'Dense_0' matches no product path.*'layers_0'"):
      with mxjax.linen.intercept([("Dense_0", None)]):
        model.apply(variables, XS)
    linear = nnx.Sequential(nnx.Linear(64, 64, rngs=nnx.Rngs(0)), jax.nn.relu)
    mxjax.nnx.quantize(linear, [("Linear_0", None)])
    with pytest.warns(UserWarning, match=r"'Linear_0' matches no product path.*'layers/0'"):
      linear(XS)


def test_nvfp4_under_intercept_takes_stochastic_rounding_keys_from_the_mx_stream():
  import flax.linen as nn  # noqa: PLC0415

  class Own(nn.Module):
    @nn.compact
    def __call__(self, x):
      w = self.param("w", nn.initializers.normal(0.1), (64, 64))
      return jnp.tanh(x @ w) @ w.T

  model = Own()
  variables = model.init(jax.random.key(1), XS)
  grad = jax.jit(jax.grad(lambda v, k: jnp.sum(model.apply(v, XS, rngs={"mx": k}) ** 2)))
  with mxjax.autocast(recipe=mxjax.NVFP4BlockScaling()), mxjax.linen.intercept():
    report = mxjax.coverage(lambda v: model.apply(v, XS), variables)
    a, b, c = (grad(variables, jax.random.key(k))["params"]["w"] for k in (1, 1, 2))
    with pytest.raises(ValueError, match=r"rngs=\{'mx'"):
      jax.grad(lambda v: jnp.sum(model.apply(v, XS) ** 2))(variables)
  assert [p.recipe.startswith("NVFP4BlockScaling") for p in report.products] == [True, True]
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


def test_stock_models_run_from_quantize_params_as_from_quantizing_on_the_fly():
  """`quantize_params` stores the kernels as MX (one copy); an intercepted stock model
  (linen and NNX) runs from them unchanged and gives the on-the-fly quantization's
  output bit for bit (the stored values are MX values: quantizing them again is exact)."""
  import flax.linen as nn  # noqa: PLC0415

  model = nn.Sequential([nn.Dense(96), nn.relu, nn.Dense(64)])
  variables = model.init(jax.random.key(0), XS)
  stored = mxjax.quantize_params(variables, MX)
  assert isinstance(stored["params"]["layers_0"]["kernel"], mxjax.MXArray)
  with mxjax.autocast(recipe=MX), mxjax.linen.intercept():
    np.testing.assert_array_equal(model.apply(stored, XS), model.apply(variables, XS))
  graphdef, state = nnx.split(nnx.Sequential(nnx.Linear(64, 96, rngs=nnx.Rngs(0)),
                                             jax.nn.relu, nnx.Linear(96, 64, rngs=nnx.Rngs(1))))
  from_mx = mxjax.nnx.quantize(nnx.merge(graphdef, mxjax.quantize_params(state, MX)))
  on_the_fly = mxjax.nnx.quantize(nnx.merge(graphdef, state))
  with mxjax.autocast(recipe=MX):
    np.testing.assert_array_equal(from_mx(XS), on_the_fly(XS))
  kernel = from_mx.layers[0].kernel.get_value()
  assert isinstance(kernel, mxjax.MXArray)  # still stored quantized after the call
