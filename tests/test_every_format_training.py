"""Every format: a jitted training step under linen (`mxjax.linen.Dense`), NNX
(`mxjax.nnx.Linear`) and `mxjax.quantized(fn)` gives the gradients of the same product
computed directly with `mxjax.dot_general(..., recipe=, rng=, name=)`, bit for bit, and a
few SGD steps lower the loss.

The direct product gets what each way into a model gives its product (so the bits can
match, SR and RHT included): the key (linen: the module's first draw of its "mx" stream,
`make_rng("mx")`; NNX: the first key of its `nnx.Rngs` "mx" stream; `mxjax.quantized`:
`mx_rng` folded with the product's number, 1 for the first) and the name (the RHT's signs
are drawn from it: linen "Dense (top level)", NNX "nnx.Linear(K, N)", interception
"product 'dot_general_0'").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import mxjax
from format_cases import DIMS, RECIPES, assert_bits_equal, every_format, random_data

M, K, N = 64, 256, 128
KEY = jax.random.key(7)


def _data():
  x = random_data((M, K), seed=0, spread=0)
  teacher = random_data((K, N), seed=1, scale=K ** -0.5)
  return x, x @ teacher  # a linear target the layer can fit


def _mse(out, y):
  return jnp.mean((out - y) ** 2)


def _direct_grads(recipe, params, x, y, key, name):
  """Loss and gradients of `x . kernel + bias` with the product called directly."""
  def loss(params):
    out = mxjax.dot_general(x, params["kernel"], DIMS, recipe=recipe, rng=key, name=name)
    return _mse(out + params["bias"], y)
  return jax.jit(jax.value_and_grad(loss))(params)


def _assert_same_step(got, want, what):
  (loss_g, grads_g), (loss_w, grads_w) = got, want
  assert_bits_equal(loss_g, loss_w, f"{what}: loss")
  for k in ("kernel", "bias"):
    assert_bits_equal(grads_g[k], grads_w[k], f"{what}: d{k}")


LR = 8.0  # the loss's curvature is at most about 2 (sqrt(M) + sqrt(K))**2 / (M N) = 0.14


def _sgd_lowers_the_loss(step, params, lr=LR, steps=4):
  """Runs `steps` SGD steps of `step(params, key) -> (loss, grads)`, a new key each."""
  losses = []
  for i in range(steps + 1):
    loss, grads = step(params, jax.random.fold_in(KEY, i))
    losses.append(float(loss))
    params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
  assert all(np.isfinite(losses)), losses
  assert losses[-1] < 0.5 * losses[0], losses
  return losses


def _rng_matters(recipe, step, params):
  """Another key changes the gradients exactly where the recipe rounds stochastically."""
  a = step(params, jax.random.key(1))[1]["kernel"]
  b = step(params, jax.random.key(2))[1]["kernel"]
  assert np.array_equal(np.asarray(a), np.asarray(b)) != recipe.needs_rng()


@every_format
def test_linen_step_equals_the_direct_product(name):
  recipe = RECIPES[name]
  x, y = _data()
  model = mxjax.linen.Dense(N)
  with mxjax.autocast(recipe=recipe):
    variables = model.init(jax.random.key(0), x)
  params = variables["params"]

  @jax.jit
  def step(params, key):
    def loss(params):
      return _mse(model.apply({**variables, "params": params}, x, rngs={"mx": key}), y)
    return jax.value_and_grad(loss)(params)

  with mxjax.autocast(recipe=recipe):
    got = step(params, KEY)
    key = model.apply(variables, rngs={"mx": KEY}, method=lambda m: m.make_rng("mx"))
    want = _direct_grads(recipe, params, x, y, key, "Dense (top level)")
    _assert_same_step(got, want, f"linen {name}")
    _rng_matters(recipe, step, params)
    _sgd_lowers_the_loss(step, params)


@every_format
def test_nnx_step_equals_the_direct_product(name):
  recipe = RECIPES[name]
  x, y = _data()
  with mxjax.autocast(recipe=recipe):
    layer = mxjax.nnx.Linear(K, N, rngs=nnx.Rngs(0, mx=5))
  params = {"kernel": layer.kernel.get_value(), "bias": layer.bias.get_value()}

  @nnx.jit
  def step(layer):
    def loss(layer):
      return _mse(layer(x), y)
    loss, grads = nnx.value_and_grad(loss)(layer)
    return loss, {"kernel": grads.kernel.get_value(), "bias": grads.bias.get_value()}

  with mxjax.autocast(recipe=recipe):
    got = step(layer)  # the layer's first call: its "mx" stream's first key
    want = _direct_grads(recipe, params, x, y, nnx.Rngs(0, mx=5).mx(), f"nnx.Linear({K}, {N})")
    _assert_same_step(got, want, f"nnx {name}")
    again = step(layer)[1]["kernel"]  # the stream advanced: SR draws new bits
    assert np.array_equal(np.asarray(again), np.asarray(got[1]["kernel"])) != recipe.needs_rng()
    losses = []
    for _ in range(5):
      loss, grads = step(layer)
      losses.append(float(loss))
      layer.kernel.set_value(layer.kernel.get_value() - LR * grads["kernel"])
      layer.bias.set_value(layer.bias.get_value() - LR * grads["bias"])
  assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses


@every_format
def test_quantized_function_step_equals_the_direct_product(name):
  recipe = RECIPES[name]
  x, y = _data()
  params = {"kernel": random_data((K, N), seed=2, scale=K ** -0.5), "bias": jnp.zeros((N,))}
  loss_mx = mxjax.quantized(lambda p, x, y: _mse(x @ p["kernel"] + p["bias"], y))

  @jax.jit
  def step(params, key):
    return jax.value_and_grad(lambda p: loss_mx(p, x, y, mx_rng=key))(params)

  with mxjax.autocast(recipe=recipe):
    report = mxjax.coverage(lambda p: loss_mx(p, x, y, mx_rng=KEY), params)
    assert [(p.path, p.mx) for p in report.products] == [("dot_general_0", True)]
    got = step(params, KEY)
    want = _direct_grads(recipe, params, x, y, jax.random.fold_in(KEY, 1),
                         "product 'dot_general_0'")
    _assert_same_step(got, want, f"mxjax.quantized {name}")
    _rng_matters(recipe, step, params)
    _sgd_lowers_the_loss(step, params)


@every_format
def test_the_step_is_quantized(name):
  """The direct product is not high precision in disguise: its gradient differs from the
  f32 one by about the format's error, and is close to it."""
  recipe = RECIPES[name]
  x, y = _data()
  params = {"kernel": random_data((K, N), seed=2, scale=K ** -0.5), "bias": jnp.zeros((N,))}
  _, mx = _direct_grads(recipe, params, x, y, KEY, "layer")
  exact = jax.grad(lambda p: _mse(x @ p["kernel"] + p["bias"], y))(params)["kernel"]
  err = float(jnp.linalg.norm(mx["kernel"] - exact) / jnp.linalg.norm(exact))
  bits = RECIPES[name].roles().x.element_format.bits
  assert 0 < err < (0.05 if bits == 8 else 0.5), err
