"""Stock NNX models through `mxjax.nnx.quantize(model, rules)`.

The model is built from stock `flax.nnx` layers only (Embed, LayerNorm, Einsum
projections, MultiHeadAttention, Linear, LinearGeneral).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import mxjax
from mx_products import count_mx_products

VOCAB, D, HEADS, T, BATCH = 64, 64, 4, 16, 8
MX = mxjax.MXFP8BlockScaling()


class Block(nnx.Module):
  """Einsum q/k/v projections -> causal attention (nnx.MultiHeadAttention's own
  projections too) -> Linear MLP."""

  def __init__(self, *, dtype, rngs: nnx.Rngs):
    self.norm1 = nnx.LayerNorm(D, dtype=dtype, rngs=rngs)
    self.qkv_einsum = nnx.Einsum("btd,dnhk->btnhk", (D, 3, HEADS, D // HEADS),
                                 (3, HEADS, D // HEADS), dtype=dtype, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(HEADS, D, dtype=dtype, decode=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(D, dtype=dtype, rngs=rngs)
    self.mlp_in = nnx.Linear(D, 4 * D, dtype=dtype, rngs=rngs)
    self.mlp_out = nnx.LinearGeneral(4 * D, D, dtype=dtype, rngs=rngs)

  def __call__(self, x):
    qkv = self.qkv_einsum(self.norm1(x)).reshape(*x.shape[:2], 3, D)
    mask = nnx.make_causal_mask(jnp.ones(x.shape[:2]))
    x = x + self.attn(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], mask=mask)
    return x + self.mlp_out(nnx.gelu(self.mlp_in(self.norm2(x))))


class Decoder(nnx.Module):
  """tokens int[B, T] -> logits f32[B, T, VOCAB]."""

  def __init__(self, *, layers=2, dtype=jnp.float32, seed=0):
    rngs = nnx.Rngs(seed)
    self.embed = nnx.Embed(VOCAB, D, rngs=rngs)
    self.layers = nnx.List([Block(dtype=dtype, rngs=rngs) for _ in range(layers)])
    self.norm = nnx.LayerNorm(D, dtype=dtype, rngs=rngs)
    self.lm_head = nnx.Linear(D, VOCAB, dtype=dtype, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    for block in self.layers:
      x = block(x)
    return self.lm_head(self.norm(x)).astype(jnp.float32)


def tokens(seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  start = jax.random.randint(k1, (BATCH, 1), 0, VOCAB)
  step = jax.random.randint(k2, (BATCH, 1), 1, 4)
  return (start + step * jnp.arange(T + 1)) % VOCAB


def relative_error(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def same_state(a, b) -> bool:
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
      bool(jnp.all(x == y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_state_unchanged_off_bit_identical_mxfp8_close():
  stock, model = Decoder(layers=1), Decoder(layers=1)
  x = tokens(1)[:, :-1]
  want = stock(x)
  assert mxjax.nnx.quantize(model) is model
  assert same_state(nnx.state(model), nnx.state(stock))
  assert bool(jnp.all(model(x) == want))  # autocast off: the stock computation
  with mxjax.autocast(recipe=MX):
    mx = model(x)
  assert not bool(jnp.all(mx == want))
  assert relative_error(mx, want) < 0.10


RULES = [(r"lm_head", None), (r"attn/(query|key)$", None), (r"layers/1/mlp", None)]
HIGH_PRECISION = {"lm_head", "layers/0/attn/query", "layers/0/attn/key",
                  "layers/1/attn/query", "layers/1/attn/key", "layers/1/mlp_in",
                  "layers/1/mlp_out"}


def test_a_none_rule_keeps_exactly_the_matching_layers_in_high_precision():
  stock, model = Decoder(), Decoder()
  mxjax.nnx.quantize(model, RULES)
  paths = mxjax.nnx.gemm_paths(model)
  assert len(paths) == 2 * 7 + 1 and HIGH_PRECISION <= set(paths)
  layers, stock_layers = dict(nnx.iter_graph(model)), dict(nnx.iter_graph(stock))
  for path in paths:
    key = tuple(int(p) if p.isdigit() else p for p in path.split("/"))
    layer, stock_layer = layers[key], stock_layers[key]
    in_shape = getattr(layer, "in_features", layer.kernel.shape[0])
    in_shape = (in_shape,) if isinstance(in_shape, int) else tuple(in_shape)
    x = jax.random.normal(jax.random.key(3), (2, 5, *in_shape))
    with mxjax.autocast(recipe=MX):
      y = layer(x)
    want = stock_layer(x)
    if path in HIGH_PRECISION:
      assert bool(jnp.all(y == want)), path
    else:
      assert not bool(jnp.all(y == want)), path
      assert relative_error(y, want) < 0.10, path


def test_jit_retraces_when_the_recipe_or_the_rules_change():
  model = Decoder(layers=1)
  x = tokens()[:, :-1]
  traces = []

  @nnx.jit
  def forward(model, x):
    traces.append(1)
    return model(x)

  plain = forward(model, x)
  mxjax.nnx.quantize(model)
  with mxjax.autocast(recipe=MX):
    a = forward(model, x)
    assert bool(jnp.all(forward(model, x) == a))  # cached
  mxjax.nnx.quantize(model, [(r"lm_head", None)])
  with mxjax.autocast(recipe=MX):
    b = forward(model, x)
  with mxjax.autocast(recipe=mxjax.MXFP4BlockScaling()):
    c = forward(model, x)
  assert len(traces) == 4
  assert len({v.tobytes() for v in (plain, a, b, c)}) == 4


def _train(recipe, steps=60):
  model = Decoder(dtype=jnp.bfloat16)
  mxjax.nnx.quantize(model)
  optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, batch):
    def loss_fn(model):
      logits = model(batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  with mxjax.autocast(enabled=recipe is not None, recipe=recipe):
    for i in range(steps):
      loss = step(model, optimizer, tokens(100 + i))
  return float(loss)


def test_sixty_mxfp8_steps_reach_the_bf16_loss():
  # MX runs: every GEMM layer's product is an MX product (none with autocast off).
  model, x = mxjax.nnx.quantize(Decoder(dtype=jnp.bfloat16)), tokens()[:, :-1]
  assert count_mx_products(model, x) == 0
  with mxjax.autocast(recipe=MX):
    assert count_mx_products(model, x) >= len(mxjax.nnx.gemm_paths(model, x)) >= 2 * 7 + 1
  bf16, mx = _train(None), _train(MX)
  assert bf16 < 3.0  # it learned (log(64) = 4.16 at the start)
  assert mx != bf16  # the MX run is not the bf16 one
  assert abs(mx - bf16) / bf16 < 0.05, (mx, bf16)


def test_delayed_scaling_is_a_clear_error_naming_the_layer():
  model = mxjax.nnx.quantize(Decoder(layers=1), [(r"^(?!layers/0/mlp_in)", None)])
  with mxjax.autocast(recipe=mxjax.DelayedScaling()):
    with pytest.raises(ValueError, match="layer 'layers/0/mlp_in' runs DelayedScaling"):
      model(tokens()[:, :-1])


def test_bad_input_is_a_clear_error_and_changes_nothing():
  with pytest.raises(TypeError, match="needs an nnx.Module, got dict"):
    mxjax.nnx.quantize({"kernel": jnp.ones(3)})
  model, stock = Decoder(layers=1), Decoder(layers=1)
  with pytest.raises(ValueError, match=r"rules\[1\]: '\[' is not a valid regular expression"):
    mxjax.nnx.quantize(model, [("lm_head", None), ("[", MX)])
  with pytest.raises(TypeError, match="must be an mxjax recipe"):
    mxjax.nnx.quantize(model, [("lm_head", optax.adam(1e-3))])
  # a layer with a product of its own that a rule would replace
  model.layers[0].mlp_in.dot_general = lambda *a, **k: jax.lax.dot_general(*a, **k)
  with pytest.raises(ValueError, match="layer 'layers/0/mlp_in' .* already has its own"):
    mxjax.nnx.quantize(model)
  x = tokens()[:, :-1]
  with mxjax.autocast(recipe=MX):  # nothing was quantized by the failed calls
    assert bool(jnp.all(model(x) == stock(x)))
  # a rule (pattern, None) leaves that layer as it is; the others are quantized
  mxjax.nnx.quantize(model, [("mlp_in", None)])
  with mxjax.autocast(recipe=MX):
    assert not bool(jnp.all(model(x) == stock(x)))


def test_requantizing_with_a_none_rule_restores_the_stock_product():
  model, stock = Decoder(layers=1), Decoder(layers=1)
  mxjax.nnx.quantize(model)
  mxjax.nnx.quantize(model, [(".*", None)])
  x = tokens()[:, :-1]
  with mxjax.autocast(recipe=MX), pytest.warns(UserWarning, match="quantized no product"):
    assert bool(jnp.all(model(x) == stock(x)))
  layers = lambda m: [type(n) for p, n in nnx.iter_graph(m)  # noqa: E731
                      if isinstance(n, nnx.Module) and p]
  assert layers(model) == layers(stock)  # stock; the model itself intercepts every product
  jax.tree.map(np.testing.assert_array_equal, nnx.state(model), nnx.state(stock))


class _DefinedInCallOrder(nnx.Module):
  """stem -> blocks 0..10 -> attention (query, key, value, out) -> mxjax head: names whose
  sorted order (nnx's graph order) is not the call order."""

  def __init__(self, rngs: nnx.Rngs):
    self.stem = nnx.Linear(D, D, rngs=rngs)
    self.blocks = nnx.List([nnx.Linear(D, D, rngs=rngs) for _ in range(11)])
    self.attn = nnx.MultiHeadAttention(HEADS, D, decode=False, rngs=rngs)
    self.head = mxjax.nnx.Linear(D, VOCAB, rngs=rngs)

  def __call__(self, x):
    x = self.stem(x)
    for block in self.blocks:
      x = nnx.relu(block(x))
    return self.head(self.attn(x))


def test_gemm_paths_follow_definition_order_so_no_ends_keeps_the_real_ends():
  model = _DefinedInCallOrder(nnx.Rngs(0))
  want = (["stem"] + [f"blocks/{i}" for i in range(11)]
          + ["attn/query", "attn/key", "attn/value", "attn/out", "head"])
  assert mxjax.nnx.gemm_paths(model) == want
  mxjax.nnx.quantize(model, mxjax.rules.preset("no_ends", want))
  x = jax.random.normal(jax.random.key(1), (BATCH, T, D))
  with mxjax.autocast(recipe=MX):
    stem, head, block = model.stem(x), model.head(x), model.blocks[0](x)
  exact = lambda layer: x @ layer.kernel.get_value() + layer.bias.get_value()  # noqa: E731
  assert jnp.array_equal(stem, exact(model.stem))  # the ends: high precision, exactly
  assert jnp.array_equal(head, exact(model.head))
  assert not jnp.allclose(block, exact(model.blocks[0]), rtol=1e-4, atol=1e-4)  # MXFP8


class _SubclassWithItsOwnProduct(nnx.Linear):
  def __call__(self, x):
    return x @ self.kernel.get_value()


@pytest.mark.parametrize("restore", ["clone", "eval_shape + merge"])
def test_gemm_paths_with_inputs_keep_the_call_order_after_a_restore(restore):
  """A restored model (`nnx.clone`, or orbax's route: `nnx.eval_shape` then `nnx.merge`)
  has its attributes sorted by name, so the definition order is gone and "no_ends" took a
  middle layer (`attn/key`) for an end; with inputs, `gemm_paths` traces the call (nothing
  computed, the model unchanged) and lists the products in the order it runs them, only
  those that run (a subclass's own product by its op path)."""
  model = _DefinedInCallOrder(nnx.Rngs(0))
  want = mxjax.nnx.gemm_paths(model)
  if restore == "clone":
    restored = nnx.clone(model)
  else:
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: _DefinedInCallOrder(nnx.Rngs(0))))
    restored = nnx.merge(graphdef, nnx.state(model))
  assert mxjax.nnx.gemm_paths(restored) != want  # sorted by name
  x = jax.random.normal(jax.random.key(1), (BATCH, T, D))
  before = nnx.state(restored)
  assert mxjax.nnx.gemm_paths(restored, x) == want
  assert jax.tree.all(jax.tree.map(lambda a, b: a is b, nnx.state(restored), before))
  assert restored.stem.dot_general is jax.lax.dot_general
  own = _SubclassWithItsOwnProduct(D, D, rngs=nnx.Rngs(0))
  assert mxjax.nnx.gemm_paths(own) == [""]
  assert mxjax.nnx.gemm_paths(own, x) == ["dot_general_0"]


def test_rules_choose_the_recipe_of_mxjax_own_linear_too():
  """A rule matching an `mxjax.nnx.Linear` gives it the rule's recipe under an enabled
  autocast (None: high precision), as for stock layers; its own `recipe` still wins."""
  x = jax.random.normal(jax.random.key(1), (BATCH, D))
  model = _DefinedInCallOrder(nnx.Rngs(0))
  exact = x @ model.head.kernel.get_value() + model.head.bias.get_value()
  mx4 = mxjax.MXFP4BlockScaling()
  with mxjax.autocast(recipe=mx4):
    want_mx4 = mxjax.nnx.Linear(D, VOCAB, recipe=mx4, rngs=nnx.Rngs(0))
    want_mx4.kernel, want_mx4.bias = model.head.kernel, model.head.bias
    want_mx4 = want_mx4(x)
  mxjax.nnx.quantize(model, [("head", None)])
  with mxjax.autocast(recipe=MX):
    assert jnp.array_equal(model.head(x), exact)
  mxjax.nnx.quantize(model, [("head", mx4)])
  with mxjax.autocast(recipe=MX):
    assert jnp.array_equal(model.head(x), want_mx4)
  assert jnp.array_equal(model.head(x), exact)  # autocast off: high precision
  own = mxjax.nnx.Linear(D, VOCAB, recipe=MX, rngs=nnx.Rngs(0))
  own.kernel, own.bias = model.head.kernel, model.head.bias
  with mxjax.autocast(recipe=MX):
    want_mx8 = own(x)
    mxjax.nnx.quantize(own, [("", None)])
    assert jnp.array_equal(own(x), want_mx8)


def test_stock_layers_take_mxjax_ops_as_their_injected_op():
  """`nnx.Linear(dot_general=mxjax.dot_general)`, `nnx.LinearGeneral(dot_general=...)` and
  `nnx.Einsum(einsum_op=mxjax.einsum)`: the layers pass `precision` (and Einsum
  `out_sharding`); each output is mxjax's product of the layer's own kernel plus its bias,
  bit for bit, not the stock product. Gradients flow to the kernel."""
  x = jax.random.normal(jax.random.key(0), (8, 64))
  rngs = lambda: nnx.Rngs(0)  # noqa: E731
  dims = (((1,), (0,)), ((), ()))
  layers = {
      "Linear": (nnx.Linear(64, 32, dot_general=mxjax.dot_general, rngs=rngs()),
                 nnx.Linear(64, 32, rngs=rngs())),
      "LinearGeneral": (nnx.LinearGeneral(64, 32, dot_general=mxjax.dot_general, rngs=rngs()),
                        nnx.LinearGeneral(64, 32, rngs=rngs())),
      "Einsum": (nnx.Einsum("bk,kn->bn", (64, 32), (32,), einsum_op=mxjax.einsum, rngs=rngs()),
                 nnx.Einsum("bk,kn->bn", (64, 32), (32,), rngs=rngs())),
  }
  for name, (layer, stock) in layers.items():
    kernel, bias = layer.kernel[...], layer.bias[...]
    want = mxjax.dot_general(x, kernel, dims) + bias
    assert jnp.array_equal(layer(x), want), name
    assert not jnp.array_equal(layer(x), stock(x)), name
    grad = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)["kernel"][...]
    want_grad = jax.grad(lambda w: jnp.sum((mxjax.dot_general(x, w, dims) + bias) ** 2))(kernel)
    assert jnp.array_equal(grad, want_grad), name
