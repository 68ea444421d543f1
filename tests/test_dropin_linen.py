"""Stock linen models through mxjax: Flax's hooks and `mxjax.linen.intercept(rules)`.

The models are built from stock `flax.linen` layers only (Embed, LayerNorm,
MultiHeadDotProductAttention, Dense, DenseGeneral, Einsum).
"""

import contextlib
import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from flax.linen import fp8_ops
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT
from flax.training.train_state import TrainState

import mxjax
from mxjax import state as state_lib
from mx_products import count_mx_products

VOCAB, D, HEADS, T, BATCH = 64, 64, 4, 16, 8
MX = mxjax.MXFP8BlockScaling()


class Block(nn.Module):
  """Pre-norm decoder block: causal self-attention, then a Dense MLP."""

  hooks: bool = False  # Flax's own hooks set to mxjax's classes
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    hook = dict(qkv_dot_general_cls=mxjax.linen.DotGeneral,
                out_dot_general_cls=mxjax.linen.DotGeneral,
                qk_attn_weights_einsum_cls=mxjax.linen.Einsum,
                attn_weights_value_einsum_cls=mxjax.linen.Einsum) if self.hooks else {}
    dense = dict(dot_general_cls=mxjax.linen.DotGeneral) if self.hooks else {}
    h = nn.LayerNorm(dtype=self.dtype)(x)
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
    x = x + nn.MultiHeadDotProductAttention(HEADS, dtype=self.dtype, name="attn", **hook)(
        h, h, mask=mask)
    h = nn.LayerNorm(dtype=self.dtype)(x)
    h = nn.gelu(nn.Dense(4 * D, dtype=self.dtype, name="mlp_in", **dense)(h))
    return x + nn.DenseGeneral(D, dtype=self.dtype, name="mlp_out", **dense)(h)


class Decoder(nn.Module):
  """Byte-level decoder LM: tokens int[B, T] -> logits f32[B, T, VOCAB]."""

  hooks: bool = False
  dtype: jnp.dtype = jnp.float32
  layers: int = 2

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, D, name="embed")(tokens)
    for i in range(self.layers):
      x = Block(self.hooks, self.dtype, name=f"block_{i}")(x)
    x = nn.LayerNorm(dtype=self.dtype)(x)
    # a stock Einsum as the LM head
    logits = nn.Einsum((D, VOCAB), "btd,dv->btv", dtype=self.dtype, name="lm_head")(x)
    return logits.astype(jnp.float32)


def tokens(seed=0, batch=BATCH):
  """A learnable sequence task: each token is the previous one plus a per-row step."""
  k1, k2 = jax.random.split(jax.random.key(seed))
  start = jax.random.randint(k1, (batch, 1), 0, VOCAB)
  step = jax.random.randint(k2, (batch, 1), 1, 4)
  return (start + step * jnp.arange(T + 1)) % VOCAB


@pytest.fixture(scope="module")
def stock():
  model = Decoder()
  return model, model.init(jax.random.key(0), tokens()[:, :-1])


def relative_error(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def test_params_are_identical_with_and_without_mxjax(stock):
  model, variables = stock
  x = tokens()[:, :-1]
  for recipe in (None, MX):
    with mxjax.autocast(enabled=recipe is not None, recipe=recipe), mxjax.linen.intercept():
      got = model.init(jax.random.key(0), x)
    assert jax.tree.structure(got) == jax.tree.structure(variables)  # no extra collection
    assert all(bool(jnp.all(a == b)) for a, b in
               zip(jax.tree.leaves(got), jax.tree.leaves(variables)))
  hooked = Decoder(hooks=True).init(jax.random.key(0), x)
  assert jax.tree.structure(hooked) == jax.tree.structure(variables)
  assert all(bool(jnp.all(a == b)) for a, b in
             zip(jax.tree.leaves(hooked), jax.tree.leaves(variables)))


@pytest.mark.parametrize("way", ["intercept", "hooks"])
def test_off_is_bit_identical_and_mxfp8_close_but_not_equal(way):
  """One block: its logits carry the error of 7 E4M3 GEMMs, two of them in series per
  branch (about 7%). (Two blocks, at init, measured 10.5%: each E4M3 product adds ~3.75%.)"""
  model = Decoder(layers=1)
  x = tokens(1)[:, :-1]
  variables = model.init(jax.random.key(0), x)
  want = jax.jit(model.apply)(variables, x)
  if way == "hooks":
    run = jax.jit(Decoder(hooks=True, layers=1).apply)
    off = run(variables, x)
    with mxjax.autocast(recipe=MX):
      mx = run(variables, x)
  else:
    run = jax.jit(model.apply)
    with mxjax.linen.intercept():
      off = run(variables, x)
      with mxjax.autocast(recipe=MX):
        mx = run(variables, x)
  assert bool(jnp.all(off == want))
  assert not bool(jnp.all(mx == want))
  assert relative_error(mx, want) < 0.10


def _layer_runs(model, variables, x):
  """Applies `model` under the enclosing contexts and records every stock GEMM layer's
  call: {path: (the layer, its params, its input, its output)}."""
  layers = {}

  def record(next_fun, args, kwargs, ctx):
    y = next_fun(*args, **kwargs)
    if ctx.method_name == "__call__" and isinstance(ctx.module, (nn.Dense, nn.DenseGeneral,
                                                                 nn.Einsum)):
      path = "/".join(ctx.module.scope.path)
      layers[path] = ctx.module.clone(parent=None)
      ctx.module.sow("intermediates", "io", (args, y))  # the model is traced: no side exit
    return y

  with nn.intercept_methods(record):  # outermost: sees what mxjax's interception makes
    with mxjax.autocast(recipe=MX), mxjax.linen.intercept(RULES):
      _, out = model.apply(variables, x, mutable=["intermediates"])
  calls = {}
  for path, layer in layers.items():
    params, io = variables["params"], out["intermediates"]
    for part in path.split("/"):
      params, io = params[part], io[part]
    (args, y), = io["io"]
    calls[path] = (layer, params, args, y)
  return calls


RULES = [(r"lm_head", None), (r"attn/(query|key)$", None), (r"block_1/mlp", None)]
HIGH_PRECISION = {"lm_head", "block_0/attn/query", "block_0/attn/key", "block_1/attn/query",
                  "block_1/attn/key", "block_1/mlp_in", "block_1/mlp_out"}


def test_a_none_rule_keeps_exactly_the_matching_layers_in_high_precision(stock):
  model, variables = stock
  calls = _layer_runs(model, variables, tokens(2)[:, :-1])
  assert len(calls) == 2 * 6 + 1  # q, k, v, out, mlp_in, mlp_out per block; the head
  for path, (layer, params, args, y) in calls.items():
    stock_y = layer.apply({"params": params}, *args)  # the stock layer, same input
    if path in HIGH_PRECISION:
      assert bool(jnp.all(y == stock_y)), path
    else:
      assert not bool(jnp.all(y == stock_y)), path
      assert relative_error(y, stock_y) < 0.10, path
  assert set(calls) >= HIGH_PRECISION


def test_jit_retraces_when_the_recipe_or_the_rules_change(stock):
  model, variables = stock
  x = tokens()[:, :-1]
  traces = []

  @jax.jit
  def forward(variables, x):
    traces.append(1)
    return model.apply(variables, x)

  plain = forward(variables, x)
  with mxjax.autocast(recipe=MX):
    assert bool(jnp.all(forward(variables, x) == plain))  # no intercept: stock model
    with mxjax.linen.intercept():
      a = forward(variables, x)
      assert bool(jnp.all(forward(variables, x) == a))  # same rules: cached
    with mxjax.linen.intercept([(r"lm_head", None)]):
      b = forward(variables, x)
    with mxjax.linen.intercept([(r"lm_head", None)]):
      assert bool(jnp.all(forward(variables, x) == b))  # equal rules: cached
  with mxjax.autocast(recipe=mxjax.MXFP4BlockScaling()), mxjax.linen.intercept():
    c = forward(variables, x)
  assert len(traces) == 5
  assert len({a.tobytes() for a in (plain, a, b, c)}) == 4


def _train(model, variables, recipe, steps=60):
  """The loss after `steps` Adam steps of the stock `model`, intercepted under `recipe`."""
  opt = optax.adam(3e-3)

  @jax.jit
  def step(params, opt_state, batch):
    def loss_fn(params):
      logits = model.apply({"params": params}, batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  params = variables["params"]
  opt_state = opt.init(params)
  with mxjax.autocast(enabled=recipe is not None, recipe=recipe), mxjax.linen.intercept():
    for i in range(steps):
      params, opt_state, loss = step(params, opt_state, tokens(100 + i))
  return float(loss)


def test_sixty_mxfp8_steps_reach_the_bf16_loss():
  model = Decoder(dtype=jnp.bfloat16)
  x = tokens()[:, :-1]
  variables = model.init(jax.random.key(0), x)
  # MX runs: every GEMM layer's product is an MX product (none with autocast off).
  with mxjax.linen.intercept():
    assert count_mx_products(model.apply, variables, x) == 0
    with mxjax.autocast(recipe=MX):
      assert count_mx_products(model.apply, variables, x) >= len(
          mxjax.linen.gemm_paths(model, x)) >= 13
  bf16, mx = _train(model, variables, None), _train(model, variables, MX)
  assert bf16 < 3.0  # it learned (log(64) = 4.16 at the start)
  assert mx != bf16  # the MX run is not the bf16 one
  assert abs(mx - bf16) / bf16 < 0.05, (mx, bf16)


@pytest.mark.parametrize("way", ["intercept", "hooks"])
def test_delayed_scaling_keeps_and_advances_its_state(stock, way):
  _, stock_variables = stock
  model = Decoder(hooks=way == "hooks")
  x = tokens()[:, :-1]
  recipe = mxjax.DelayedScaling(amax_history_len=4)
  intercept = mxjax.linen.intercept if way == "intercept" else contextlib.nullcontext
  with mxjax.autocast(recipe=recipe), intercept():
    variables = model.init(jax.random.key(0), x)
    _, updated = model.apply(variables, x, mutable=[state_lib.STATE_COLLECTION])
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), variables["params"],
                                   stock_variables["params"]))
  states = {path: leaf for path, leaf in jax.tree_util.tree_flatten_with_path(
      updated[state_lib.STATE_COLLECTION], is_leaf=lambda n: isinstance(
          n, state_lib.RecipeState))[0]}
  assert len(states) == 2 * 6 + (1 if way == "intercept" else 0) + (4 if way == "hooks" else 0)
  # The MLP input layer's kernel amax is recorded: the max |kernel| of its params.
  key = next(k for k in states if "block_0" in str(k) and "mlp_in" in str(k))
  kernel = variables["params"]["block_0"]["mlp_in"]["kernel"]
  history = states[key].tensors["kernel"].amax_history
  assert float(history[0]) == float(jnp.max(jnp.abs(kernel)))
  assert float(states[key].tensors["input"].amax_history[0]) > 0


def test_intercepted_delayed_state_in_the_overwrite_collection_under_train_state():
  """`intercept(state_collection=OVERWRITE_WITH_GRADIENT)`: the stock layers' states live in
  Flax's overwrite collection, so `TrainState` (Adam on everything it holds) advances them
  by the gradient overwrite and Adam only the params: three steps give the states and
  params of the `mx_state` flow with `next_state` and Adam on the params, bit for bit.
  Before, only `mx_state` was possible, and TrainState ran Adam on the states."""
  model, x = Decoder(layers=1), tokens()[:, :-1]
  recipe, tx = mxjax.DelayedScaling(amax_history_len=4), optax.adam(1e-3)

  def loss(variables):
    return jnp.mean(model.apply(variables, x) ** 2)

  with mxjax.autocast(recipe=recipe):
    with mxjax.linen.intercept(state_collection=OVERWRITE_WITH_GRADIENT):
      ts = TrainState.create(apply_fn=model.apply, tx=tx,
                             params=model.init(jax.random.key(0), x))
      for _ in range(3):
        ts = ts.apply_gradients(grads=jax.grad(loss)(ts.params))
    with mxjax.linen.intercept():
      variables = model.init(jax.random.key(0), x)
      opt_state = tx.init(variables["params"])
      for _ in range(3):
        grads = jax.grad(loss)(variables)
        updates, opt_state = tx.update(grads["params"], opt_state)
        variables = {"params": optax.apply_updates(variables["params"], updates),
                     "mx_state": state_lib.next_state(grads["mx_state"], grads["mx_state"])}
  assert set(ts.params) == {"params", OVERWRITE_WITH_GRADIENT}
  got = {"params": ts.params["params"], "mx_state": ts.params[OVERWRITE_WITH_GRADIENT]}
  assert jax.tree.structure(got) == jax.tree.structure(variables)
  assert jax.tree.all(jax.tree.map(jnp.array_equal, got, variables))
  assert len(state_lib.describe(got)) == 7  # attention: 4, the MLP: 2, the Einsum head


def test_bad_rules_are_clear_errors_and_enter_nothing(stock):
  model, variables = stock
  x = tokens()[:, :-1]
  with pytest.raises(ValueError, match=r"rules\[1\]: '\(unclosed' is not a valid regular"):
    with mxjax.linen.intercept([("lm_head", None), ("(unclosed", MX)]):
      pass
  with pytest.raises(TypeError, match=r"rules\[0\] \('mlp'\): the recipe must be an mxjax"):
    with mxjax.linen.intercept([("mlp", "mxfp8")]):
      pass
  with pytest.raises(TypeError, match="pair"):
    with mxjax.linen.intercept([("mlp",)]):
      pass
  # nothing stayed entered: under autocast the model is the stock one again
  want = jax.jit(model.apply)(variables, x)
  with mxjax.autocast(recipe=MX):
    assert mxjax._src.context.get_layer_rules() is None
    assert bool(jnp.all(jax.jit(model.apply)(variables, x) == want))


def test_quantized_kernel_mismatch_names_the_layer_path():
  """mxjax's own modules follow the rules too; a kernel stored quantized for one recipe
  meeting another raises, naming the layer."""

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      return mxjax.linen.Dense(32, name="head")(mxjax.linen.Dense(64, name="body")(x))

  x = jnp.ones((4, 64))
  with mxjax.quantized_model_init(recipe=MX):
    variables = Net().init(jax.random.key(0), x)
  with mxjax.autocast(recipe=MX), mxjax.linen.intercept(
      [("head", mxjax.MXFP4BlockScaling())]):
    with pytest.raises(ValueError, match="Recipe mismatch for Dense 'head'"):
      Net().apply(variables, x)


def test_gemm_paths_and_presets(stock):
  model, _ = stock
  paths = mxjax.linen.gemm_paths(model, tokens()[:, :-1])
  assert paths == [f"block_{i}/{name}" for i in range(2) for name in
                   ("attn/query", "attn/key", "attn/value", "attn/out", "mlp_in", "mlp_out")
                   ] + ["lm_head"]
  rules = mxjax.rules.preset("no_ends", paths)
  high = {p for p in paths if mxjax.rules.recipe_for(rules, p, MX) is None}
  assert high == {"block_0/attn/query", "lm_head"}
  rules = mxjax.rules.preset("mlp_only")
  quantized = {p for p in paths if mxjax.rules.recipe_for(rules, p, MX) is not None}
  assert quantized == {"block_0/mlp_in", "block_0/mlp_out", "block_1/mlp_in",
                       "block_1/mlp_out"}
  assert mxjax.rules.preset("all") == ()
  with pytest.raises(ValueError, match="unknown rules preset 'most'"):
    mxjax.rules.preset("most")


class GainEinsum(nn.Einsum):
  """An nn.Einsum subclass whose own `__call__` scales `nn.Einsum.__call__` by a param."""

  @nn.compact
  def __call__(self, x):
    return self.param("gain", nn.initializers.constant(3.0), ()) * super().__call__(x)


class OwnEinsum(nn.Einsum):
  """An nn.Einsum subclass that computes its product itself (no `super().__call__`)."""

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", self.kernel_init, self.shape)
    return jnp.einsum(self.einsum_str, x, kernel)


class GainDense(nn.Dense):
  """An nn.Dense subclass whose own `__call__` scales `nn.Dense.__call__`."""

  @nn.compact
  def __call__(self, x):
    return 3.0 * super().__call__(x)


class Heads(nn.Module):
  """Stock and subclassed Dense / Einsum layers side by side."""

  @nn.compact
  def __call__(self, x):
    eq = "btd,dv->btv"
    return (GainDense(D, name="up")(nn.Dense(D, name="in")(x)),
            nn.Einsum((D, 32), eq, name="stock")(x), GainEinsum((D, 32), eq, name="gain")(x),
            OwnEinsum((D, 32), eq, use_bias=False, name="own")(x))


def test_subclass_calls_run_under_intercept():
  """A subclass's own `__call__` runs as written: its `super().__call__` gets the MX
  product, and so does a product it computes itself (`own`, by `jnp.einsum`)."""
  x = jax.random.normal(jax.random.key(0), (2, T, D))
  variables = Heads().init(jax.random.key(1), x)
  want = Heads().apply(variables, x)
  with mxjax.autocast(recipe=MX), mxjax.linen.intercept():
    got = jax.jit(Heads().apply)(variables, x)
  for name, y, y_stock in zip(("up", "stock", "gain", "own"), got, want):  # no gain: 67% off
    assert not bool(jnp.all(y == y_stock)), name
    assert relative_error(y, y_stock) < 0.10, name


def test_gemm_paths_are_the_same_inside_autocast_and_intercept():
  x = jnp.ones((2, T, D))
  outside = mxjax.linen.gemm_paths(Heads(), x)
  assert outside == ["in", "up", "stock", "gain", "own/einsum_0"]  # own: by its op path
  with mxjax.autocast(recipe=MX), mxjax.linen.intercept([("up", None)]):
    assert mxjax.linen.gemm_paths(Heads(), x) == outside
  with mxjax.quantized_model_init(recipe=MX):
    assert mxjax.linen.gemm_paths(Heads(), x) == outside


class _OwnProducts(nn.Module):
  """Stock Dense layers with products of their own, around a plain one."""

  class Matmul(nn.Dense):  # a subclass computing its own product
    @nn.compact
    def __call__(self, x):
      return x @ self.param("kernel", self.kernel_init, (x.shape[-1], self.features))

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D, dot_general=functools.partial(jax.lax.dot_general,
                                                  precision="highest"), name="own_dot")(x)
    x = nn.Dense(D, dot_general_cls=fp8_ops.Fp8DotGeneral, name="flax_fp8")(x)
    x = self.Matmul(D, name="subclass")(x)
    return nn.Dense(D, name="plain")(x)


def test_gemm_paths_list_only_the_products_intercept_quantizes():
  """A Dense with its own `dot_general` and a subclass computing its own product have
  their products intercepted (by op path), the plain Dense gets the hook; Flax's FP8
  `dot_general_cls` computes inside custom_vjp functions, which stay as they are, so
  `gemm_paths` leaves it out (it listed it, and "no_ends" took it for an end)."""
  x = jax.random.normal(jax.random.key(0), (2, D))
  model = _OwnProducts()
  assert mxjax.linen.gemm_paths(model, x) == [
      "own_dot/dot_general_0", "subclass/dot_general_0", "plain"]
  with mxjax.autocast(recipe=MX), mxjax.linen.intercept():
    report = mxjax.coverage(model.apply, model.init(jax.random.key(1), x), x)
  fp8 = [p for p in report.products if p.path.startswith("flax_fp8")]
  assert fp8 and all(not p.mx and p.reason.startswith("inside a custom_vjp") for p in fp8)
  params = model.init(jax.random.key(1), x)
  with mxjax.autocast(recipe=MX), mxjax.linen.intercept():
    hooked = model.apply(params, x, capture_intermediates=True, mutable=["intermediates"])[1]
  paths = ["/".join(path[:-1]) for path in flax.traverse_util.flatten_dict(
      hooked["intermediates"]) if "DotGeneral_0" in path]
  assert [p.replace("/DotGeneral_0", "") for p in paths] == ["plain"]


def test_stock_dense_takes_mxjax_dot_general_as_its_dot_general():
  """`nn.Dense(dot_general=mxjax.dot_general)` (Dense passes `precision`): mxjax's product
  of Dense's own kernel plus its bias, bit for bit, in value and kernel gradient."""
  x = jax.random.normal(jax.random.key(0), (8, 64))
  dense = nn.Dense(32, dot_general=mxjax.dot_general, precision=jax.lax.Precision.HIGHEST)
  params = dense.init(jax.random.key(1), x)["params"]
  dims = (((1,), (0,)), ((), ()))

  def loss(kernel, through_dense):
    if through_dense:
      y = dense.apply({"params": {**params, "kernel": kernel}}, x)
    else:
      y = mxjax.dot_general(x, kernel, dims) + params["bias"]
    return jnp.sum(y ** 2), y

  (_, got), got_grad = jax.value_and_grad(loss, has_aux=True)(params["kernel"], True)
  (_, want), want_grad = jax.value_and_grad(loss, has_aux=True)(params["kernel"], False)
  assert jnp.array_equal(got, want) and jnp.array_equal(got_grad, want_grad)
  assert not jnp.array_equal(got, nn.Dense(32).apply({"params": params}, x))
