"""What the README promises about products, differentiation and interception, each tested:
non-finite inputs, remat, forward mode refused, what interception leaves in high
precision, and `optax.MultiSteps` with DelayedScaling's state."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT
from flax.training.train_state import TrainState

import mxjax
from mxjax import state as state_lib
from mx_products import count_mx_products

MXFP8 = mxjax.MXFP8BlockScaling()
DIMS = (((1,), (0,)), ((), ()))


def test_an_inf_or_nan_input_makes_every_output_it_reaches_nan():
  """A block holding an Inf or a NaN gets the NaN scale: every output its 32 elements
  reach is NaN (the high-precision product gives +-Inf for the Inf)."""
  x = np.array(jax.random.normal(jax.random.key(0), (4, 64)))
  w = np.array(jax.random.normal(jax.random.key(1), (64, 8)))
  x[1, 5], x[2, 40] = np.inf, np.nan  # rows 1 and 2, one block each
  w[33, 6] = -np.inf  # column 6, its second block along K
  y = np.asarray(mxjax.dot_general(jnp.asarray(x), jnp.asarray(w), DIMS))
  nan = np.zeros_like(y, bool)
  nan[1:3, :] = True
  nan[:, 6] = True
  np.testing.assert_array_equal(np.isnan(y), nan)
  hp = x[[0, 1, 3]] @ w
  assert np.isinf(hp[1, :6]).all() and np.isinf(hp[[0, 2], 6]).all()  # high precision: Inf
  # through an intercepted stock layer too
  dense = nn.Dense(8)
  params = dense.init(jax.random.key(2), x)
  with mxjax.autocast(recipe=MXFP8), mxjax.linen.intercept():
    out = np.asarray(dense.apply(params, jnp.asarray(x)))
  np.testing.assert_array_equal(np.isnan(out).all(axis=1), [False, True, True, False])
  assert np.isfinite(out[[0, 3]]).all()


def test_gradients_under_remat_are_the_gradients_without_it():
  x = jax.random.normal(jax.random.key(0), (32, 64))
  w = jax.random.normal(jax.random.key(1), (64, 64))

  def loss(w, x, dot=functools.partial(mxjax.dot_general, dimension_numbers=DIMS)):
    h = jax.nn.gelu(dot(x, w))
    return jnp.sum(dot(h, w) ** 2)

  want = jax.jit(jax.grad(loss, (0, 1)))(w, x)
  got = jax.jit(jax.grad(jax.checkpoint(loss), (0, 1)))(w, x)
  hp = jax.jit(jax.grad(functools.partial(loss, dot=lambda a, b: a @ b), (0, 1)))(w, x)
  for a, b, c in zip(got, want, hp):
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)  # the MX gradients

  # stock layers under nn.remat, intercepted
  class Net(nn.Module):
    remat: bool

    @nn.compact
    def __call__(self, x):
      dense = nn.remat(nn.Dense) if self.remat else nn.Dense
      return dense(64, name="fc")(jax.nn.gelu(dense(64, name="fc0")(x)))

  params = Net(False).init(jax.random.key(2), x)
  grads = {}
  with mxjax.autocast(recipe=MXFP8), mxjax.linen.intercept():
    assert count_mx_products(Net(True).apply, params, x) == 2
    for remat in (False, True):
      grads[remat] = jax.jit(jax.grad(lambda p: jnp.sum(Net(remat).apply(p, x) ** 2)))(params)
  for a, b in zip(jax.tree.leaves(grads[True]), jax.tree.leaves(grads[False])):
    np.testing.assert_array_equal(a, b)


def test_forward_mode_and_second_derivatives_are_type_errors():
  x = jax.random.normal(jax.random.key(0), (8, 64))
  w = jax.random.normal(jax.random.key(1), (64, 32))
  f = lambda x: jnp.sum(mxjax.dot_general(x, w, DIMS))  # noqa: E731
  with pytest.raises(TypeError, match="forward-mode"):
    jax.jvp(f, (x,), (x,))
  with pytest.raises(TypeError, match="forward-mode"):
    jax.jacfwd(f)(x)
  _, f_jvp = jax.linearize(f, x)
  with pytest.raises(TypeError, match="forward-mode"):
    f_jvp(x)
  with pytest.raises(TypeError, match="differentiate once"):
    jax.grad(lambda x: jnp.sum(jax.grad(f)(x)))(x)
  with pytest.raises(TypeError, match="differentiate once"):
    jax.hessian(f)(x[:1])
  # an intercepted stock layer refuses forward mode too, rather than running high precision
  dense = nn.Dense(32)
  params = dense.init(jax.random.key(2), x)
  with mxjax.autocast(recipe=MXFP8), mxjax.linen.intercept():
    with pytest.raises(TypeError, match="forward-mode"):
      jax.jvp(lambda x: dense.apply(params, x), (x,), (x,))


class TiedAndConv(nn.Module):
  """A tied LM head (`nn.Embed.attend`) and a convolution, next to a Dense."""

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(64, 32, name="embed")
    x = nn.Conv(32, (3,), name="conv")(embed(tokens))  # [B, T, 32]
    return x, embed.attend(x), nn.Dense(16, name="dense")(x)


def test_embed_attend_is_mx_and_conv_stays_high_precision_under_interception():
  """README: interception makes every product MX, the tied head `Embed.attend` (a
  `jnp.dot`) included, unless a rule keeps it (`attend`, its path); a convolution is no
  product and stays in high precision, bit for bit. linen and NNX."""
  tokens = jax.random.randint(jax.random.key(0), (4, 32), 0, 64)
  model = TiedAndConv()
  params = model.init(jax.random.key(1), tokens)
  conv, logits, dense = jax.jit(model.apply)(params, tokens)
  with mxjax.autocast(recipe=MXFP8):
    with mxjax.linen.intercept():
      mx_conv, mx_logits, mx_dense = jax.jit(model.apply)(params, tokens)
    with mxjax.linen.intercept([("attend", None)]):
      _, kept_logits, _ = jax.jit(model.apply)(params, tokens)
  np.testing.assert_array_equal(mx_conv, conv)
  np.testing.assert_array_equal(kept_logits, logits)
  assert not np.array_equal(mx_logits, logits) and not np.array_equal(mx_dense, dense)

  class NTiedAndConv(nnx.Module):
    def __init__(self, rngs):
      self.embed = nnx.Embed(64, 32, rngs=rngs)
      self.conv = nnx.Conv(32, 32, (3,), rngs=rngs)
      self.dense = nnx.Linear(32, 16, rngs=rngs)

    def __call__(self, tokens):
      x = self.conv(self.embed(tokens))
      return x, self.embed.attend(x), self.dense(x)

  stock = NTiedAndConv(nnx.Rngs(0))
  conv, logits, dense = stock(tokens)
  model = mxjax.nnx.quantize(NTiedAndConv(nnx.Rngs(0)))
  kept = mxjax.nnx.quantize(NTiedAndConv(nnx.Rngs(0)), [("dot_general", None)])
  with mxjax.autocast(recipe=MXFP8):
    mx_conv, mx_logits, mx_dense = model(tokens)
    _, kept_logits, _ = kept(tokens)
  np.testing.assert_array_equal(mx_conv, conv)
  np.testing.assert_array_equal(kept_logits, logits)
  assert not np.array_equal(mx_logits, logits) and not np.array_equal(mx_dense, dense)


def test_multisteps_records_each_micro_batch_as_a_step():
  """`optax.MultiSteps` under Flax's TrainState with the stock layers' DelayedScaling
  state in the overwrite collection: the params move once per k micro-batches, the
  state once per micro-batch (its input amax history holds each micro-batch's amax)."""
  model = nn.Dense(32)
  xs = [jax.random.normal(jax.random.key(i), (8, 64)) * s for i, s in ((0, 1.0), (1, 5.0))]
  recipe = mxjax.DelayedScaling(amax_history_len=4)

  def loss(variables, x):
    return jnp.mean(model.apply(variables, x) ** 2)

  with mxjax.autocast(recipe=recipe), \
      mxjax.linen.intercept(state_collection=OVERWRITE_WITH_GRADIENT):
    ts = TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(2), xs[0]),
                           tx=optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2))
    start, grad = ts.params["params"], jax.jit(jax.grad(loss))
    histories, params = [], []
    for x in xs:
      ts = ts.apply_gradients(grads=grad(ts.params, x))
      states = [s for s in jax.tree.leaves(ts.params[OVERWRITE_WITH_GRADIENT], is_leaf=lambda n:
                isinstance(n, state_lib.RecipeState)) if isinstance(s, state_lib.RecipeState)]
      assert len(states) == 1
      histories.append(np.asarray(states[0].tensors["input"].amax_history))
      params.append(ts.params["params"])
  amax = [float(jnp.max(jnp.abs(x))) for x in xs]
  np.testing.assert_array_equal(histories[0], [amax[0], 0, 0, 0])
  np.testing.assert_array_equal(histories[1], [amax[1], amax[0], 0, 0])
  assert jax.tree.all(jax.tree.map(jnp.array_equal, params[0], start))  # accumulating
  assert not jnp.array_equal(params[1]["kernel"], start["kernel"])  # the k-th: one update


class _ThreeLayers(nn.Module):
  """The README's rules example: three stock layers, three precisions."""

  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(256, name="embed")(x))
    h = nn.relu(nn.Dense(256, name="mlp")(h))
    return nn.Dense(10, name="lm_head")(h)


def test_readme_rules_example_splits_its_layers_three_ways():
  """README: the autocast recipe for `embed` (no rule), MXFP4 for `mlp` (its rule), high
  precision for `lm_head` (a None rule); no warning (every rule matches a path)."""
  import warnings  # noqa: PLC0415
  x = jax.random.normal(jax.random.key(0), (64, 128), jnp.bfloat16)
  model = _ThreeLayers()
  variables = model.init(jax.random.key(1), x)
  rules = [(r"lm_head", None), (r"mlp", mxjax.MXFP4BlockScaling())]
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with mxjax.autocast(recipe=MXFP8), mxjax.linen.intercept(rules):
      report = mxjax.coverage(model.apply, variables, x)
  by_path = {p.path: p for p in report.products}
  assert list(by_path) == ["embed", "mlp", "lm_head"]
  assert by_path["embed"].recipe.startswith("MXFP8BlockScaling")
  assert by_path["mlp"].recipe.startswith("MXFP4BlockScaling")
  assert not by_path["lm_head"].mx and "lm_head" in by_path["lm_head"].reason
  assert report.table().splitlines()[0] == f"under autocast({report.autocast})"
  assert report.autocast.startswith("MXFP8BlockScaling(")


def test_coverage_outside_an_autocast_says_so():
  """The README's `print(mxjax.coverage(...))` outside the `with`: the table's first line
  says no autocast is active, each product's reason is "no recipe", and it warns; inside
  an autocast the same call names the recipe and does not warn."""
  import warnings  # noqa: PLC0415
  x = jax.random.normal(jax.random.key(0), (64, 128), jnp.bfloat16)
  model = _ThreeLayers()
  variables = model.init(jax.random.key(1), x)
  with mxjax.linen.intercept():
    with pytest.warns(UserWarning, match="outside an enabled mxjax.autocast"):
      report = mxjax.coverage(model.apply, variables, x)
  assert report.autocast is None and report.mx_share == 0.0
  assert report.table().startswith("NO ACTIVE AUTOCAST")
  assert all("no enabled mxjax.autocast" in p.reason for p in report.products)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with mxjax.autocast(recipe=MXFP8), mxjax.linen.intercept():
      inside = mxjax.coverage(model.apply, variables, x)
    # the ops themselves pick their recipe: all MX, nothing to warn about
    direct = mxjax.coverage(lambda a, b: mxjax.dot_general(a, b, DIMS), x,
                            jnp.ones((128, 32), jnp.bfloat16))
  assert inside.mx_share == 1.0 and "NO ACTIVE AUTOCAST" not in inside.table()
  assert direct.mx_share == 1.0 and direct.autocast is None


def test_ci_runs_the_readme_commands():
  """`.ci/run` runs the README's build-tools line and its test command, character for
  character; the build tools include every build requirement of pyproject.toml (a build
  without isolation needs them installed), and both installs build without isolation, in
  the stable build folder (so the second one recompiles nothing)."""
  import os  # noqa: PLC0415
  import re  # noqa: PLC0415
  tomllib = pytest.importorskip("tomllib")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
  block = re.search(r"## Install.*?```sh\n(.*?)```", readme, re.S).group(1)
  tools, demo, test = [line for line in block.splitlines() if line and not line.startswith("#")]
  ci = open(os.path.join(root, ".ci", "run"), encoding="utf-8").read().splitlines()
  assert f"{tools} || exit 1" in ci and test in ci
  assert test == 'pip install --no-build-isolation ".[test,docs]" && pytest'
  assert demo == "pip install --no-build-isolation . && mxjax-sweep"
  with open(os.path.join(root, "pyproject.toml"), "rb") as f:
    pyproject = tomllib.load(f)
  for requirement in pyproject["build-system"]["requires"]:
    assert f'"{requirement}"' in tools, requirement
  assert pyproject["tool"]["scikit-build"]["build-dir"] == "build/{wheel_tag}"
