"""mxjax.linen modules: every module under every recipe, recipe changes between steps,
re-tracing, and training numerics against f32."""

import math
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import bits_of, mxarray_bits, mxarrays
from sharding_helpers import spec_of

from mxjax import linen as mxl, state as state_lib
from mxjax._src import context
from mxjax._src.quantize import fake_quantize, quantize_2x
from mxjax._src.recipes import (DelayedScaling, Float8CurrentScaling, Format, MXFP4BlockScaling,
                           MXFP6BlockScaling, MXFP8BlockScaling)

RECIPES = {
    "high_precision": None,
    "mxfp8": MXFP8BlockScaling(),
    "mxfp8_hybrid": MXFP8BlockScaling(fp8_format=Format.HYBRID),
    "mxfp6": MXFP6BlockScaling(),
    "mxfp4": MXFP4BlockScaling(),
    "delayed": DelayedScaling(amax_history_len=4),
    "current": Float8CurrentScaling(),
}
# Relative Frobenius error of a module's output vs high precision, per recipe: FP8 and
# FP6 (3 mantissa bits) a few %, FP4 (1 bit) ~15%; bf16 compute adds ~0.5%.
TOLERANCE = {"high_precision": 0.01, "mxfp8": 0.06, "mxfp8_hybrid": 0.06, "mxfp6": 0.06,
             "mxfp4": 0.3, "delayed": 0.06, "current": 0.06}


def _modules(dtype):
  return {
      "Dense": (mxl.Dense(16, dtype=dtype), (2, 3, 32), (2, 3, 16)),
      "DenseGeneral": (mxl.DenseGeneral((2, 8), axis=(-2, -1), dtype=dtype), (3, 4, 16),
                       (3, 2, 8)),
      "LayerNormDense": (mxl.LayerNormDense(16, norm_type="rmsnorm", dtype=dtype), (4, 32),
                         (4, 16)),
      "LayerNormMLP": (mxl.LayerNormMLP(intermediate_dim=32, activations=("gelu", "linear"),
                                        dtype=dtype), (4, 32), (4, 32)),
  }


_BASELINES = {}


def _baseline(module_name, dtype):
  """(module, input, variables initialized in high precision, high-precision output),
  made once per module and dtype."""
  key = (module_name, jnp.dtype(dtype).name)
  if key not in _BASELINES:
    module, in_shape, out_shape = _modules(dtype)[module_name]
    x = jax.random.normal(jax.random.key(0), in_shape, jnp.float32).astype(dtype)
    variables = jax.jit(module.init)(jax.random.key(1), x)
    y_hp = jax.jit(module.apply)(variables, x)
    assert y_hp.shape == out_shape
    _BASELINES[key] = module, x, variables, y_hp
  return _BASELINES[key]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("module_name", ["Dense", "DenseGeneral", "LayerNormDense",
                                         "LayerNormMLP"])
def test_every_module_under_every_recipe(module_name, recipe_name, dtype):
  """Shapes, dtypes, finite values and gradients, error vs high precision, under jit."""
  module, x, variables, y_hp = _baseline(module_name, dtype)
  recipe = RECIPES[recipe_name]

  @jax.jit
  def run(variables, x):
    def loss(params, x):
      # The state made at init (high precision) is replaced by the recipe's.
      y, mutated = module.apply({**variables, "params": params}, x, mutable=["mx_state"])
      return jnp.sum(y.astype(jnp.float32) ** 2), (y, mutated)
    (_, (y, mutated)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
        variables["params"], x)
    return y, mutated, grads

  with context.autocast(enabled=recipe is not None, recipe=recipe):
    y, mutated, (g_params, g_x) = run(variables, x)
  assert set(state_lib.describe(mutated).values()) == {state_lib.kind_of(recipe)}
  assert y.shape == y_hp.shape and y.dtype == dtype
  assert g_x.shape == x.shape and g_x.dtype == dtype
  assert bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))
  for g, p in zip(jax.tree.leaves(g_params), jax.tree.leaves(variables["params"])):
    assert g.shape == p.shape and g.dtype == p.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(g)))
  kernel_grads = [g for path, g in jax.tree_util.tree_flatten_with_path(g_params)[0]
                  if "kernel" in jax.tree_util.keystr(path)]
  assert kernel_grads and all(float(jnp.max(jnp.abs(g))) > 0 for g in kernel_grads)
  y32, hp32 = y.astype(jnp.float32), y_hp.astype(jnp.float32)
  err = float(jnp.linalg.norm(y32 - hp32) / jnp.linalg.norm(hp32))
  gemms = 2 if module_name == "LayerNormMLP" else 1  # errors of chained GEMMs add up
  assert err <= TOLERANCE[recipe_name] * gemms
  if recipe is not None:
    assert err > 0  # it really ran quantized


def test_module_recipe_overrides_autocast():
  x = jax.random.normal(jax.random.key(0), (8, 64))
  plain = mxl.Dense(16, use_bias=False)
  variables = plain.init(jax.random.key(1), x)
  exact = x @ variables["params"]["kernel"]
  pinned = mxl.Dense(16, use_bias=False, recipe=MXFP4BlockScaling())
  with context.autocast(recipe=MXFP8BlockScaling()):
    mx8 = plain.apply(variables, x)
    mx4 = pinned.apply(variables, x)
  np.testing.assert_array_equal(pinned.apply(variables, x), mx4)  # outside autocast too
  rel = lambda a: float(jnp.linalg.norm(a - exact) / jnp.linalg.norm(exact))  # noqa: E731
  assert rel(mx4) > 2 * rel(mx8) > 0


def test_params_are_named_like_flax_and_partitioned():
  x = jnp.ones((2, 32))
  model = mxl.Dense(16, kernel_axes=("embed", "mlp"), bias_axes=("mlp",))
  variables = model.init(jax.random.key(0), x)
  params = variables["params"]
  assert isinstance(params["kernel"], nn.Partitioned)
  assert params["kernel"].names == ("embed", "mlp") and params["bias"].names == ("mlp",)
  reference = nn.Dense(16).init(jax.random.key(0), x)["params"]
  assert jax.tree.map(jnp.shape, nn.unbox(params)) == jax.tree.map(jnp.shape, reference)
  np.testing.assert_allclose(model.apply(variables, x),
                             nn.Dense(16).apply({"params": nn.unbox(params)}, x), rtol=1e-6)


@pytest.mark.parametrize("features,axis", [(16, -1), ((8, 16), -1), ((4, 8, 16), -1),
                                           ((8, 16), (-2, -1)), (32, (1, 2))])
def test_dense_general_init_is_stock_flax_init(features, axis):
  """Same rng, same params as nn.DenseGeneral, bit for bit: the initializers see the 2-D
  shape (prod(in dims), prod(features)), so variance scaling gets stock's fan-in, also
  with logical axes. Under quantized_model_init the kernel is stock's 2-D kernel,
  quantized."""
  x = jax.random.normal(jax.random.key(0), (2, 4, 64))
  inits = dict(kernel_init=nn.initializers.variance_scaling(1.0, "fan_avg", "normal"),
               bias_init=nn.initializers.normal(1.0))
  want = nn.DenseGeneral(features, axis=axis, **inits).init(jax.random.key(1), x)["params"]
  got = mxl.DenseGeneral(features, axis=axis, **inits).init(jax.random.key(1), x)["params"]
  for name in ("kernel", "bias"):
    np.testing.assert_array_equal(got[name], want[name])
  names = ("a", "b", "c", "d")[:want["kernel"].ndim]
  boxed = nn.with_logical_partitioning(inits["kernel_init"], names)
  stock = nn.DenseGeneral(features, axis, kernel_init=boxed).init(jax.random.key(1), x)
  for module in (mxl.DenseGeneral(features, axis=axis, kernel_axes=names, **inits),
                 mxl.DenseGeneral(features, axis=axis, kernel_init=boxed)):
    kernel = module.init(jax.random.key(1), x)["params"]["kernel"]
    assert kernel.names == names
    np.testing.assert_array_equal(kernel.value, stock["params"]["kernel"].value)

  recipe = MXFP8BlockScaling()
  kernel_2d = want["kernel"].reshape(-1, math.prod(np.atleast_1d(features)))
  quantized = quantize_2x(kernel_2d, recipe.fwd_format, axes=(0, 1))
  n_in = want["kernel"].ndim - np.atleast_1d(features).size
  for module in (mxl.DenseGeneral(features, axis=axis, **inits),
                 mxl.DenseGeneral(features, axis=axis, kernel_axes=names, **inits),
                 mxl.DenseGeneral(features, axis=axis, bias_init=inits["bias_init"],
                                  kernel_init=nn.with_logical_partitioning(
                                      inits["kernel_init"], names))):
    with context.quantized_model_init(recipe=recipe, for_training=True):
      variables = module.init(jax.random.key(1), x)
    np.testing.assert_array_equal(variables["params"]["bias"], want["bias"])
    kernel = variables[mxl.QUANTIZED_KERNELS]["kernel"]
    if isinstance(kernel, nn.LogicallyPartitioned):
      assert kernel.names == (names[0], names[n_in])
    for a, b in zip(mxarray_bits(mxarrays(nn.unbox(kernel))), mxarray_bits(quantized),
                    strict=True):
      np.testing.assert_array_equal(a, b)


def test_precision_reaches_the_high_precision_product_as_in_nn_dense():
  x = jax.random.normal(jax.random.key(0), (4, 64))
  highest = jax.lax.Precision.HIGHEST
  stock, ours = nn.Dense(16, precision=highest), mxl.Dense(16, precision=highest)
  params = stock.init(jax.random.key(1), x)
  jaxpr = lambda m: str(jax.make_jaxpr(m.apply)(params, x))  # noqa: E731
  assert "precision=(Precision.HIGHEST, Precision.HIGHEST)" in jaxpr(stock)
  assert "precision=(Precision.HIGHEST, Precision.HIGHEST)" in jaxpr(ours)
  np.testing.assert_array_equal(ours.apply(params, x), stock.apply(params, x))


def test_fields_after_features_are_keyword_only():
  """`nn.Dense(16, False)` means no bias, but mxjax.Dense's second field was `axis`: it
  kept the bias and contracted axis 0 (on a square input, silently). Now a TypeError."""
  for module in (mxl.Dense, mxl.DenseGeneral):
    with pytest.raises(TypeError, match="positional argument"):
      module(16, False)
  assert mxl.Dense(16, use_bias=False).use_bias is False


def test_promote_dtype_is_the_layers_as_in_nn_dense():
  """A custom `promote_dtype` (everything to bf16): stock's bits and dtype in high
  precision, a bf16 output through the MX product."""
  def to_bf16(*args, dtype=None):
    return [None if a is None else a.astype(jnp.bfloat16) for a in args]

  x = jax.random.normal(jax.random.key(0), (4, 64))
  stock, ours = nn.Dense(16, promote_dtype=to_bf16), mxl.Dense(16, promote_dtype=to_bf16)
  params = stock.init(jax.random.key(1), x)
  want = stock.apply(params, x)
  assert want.dtype == jnp.bfloat16
  np.testing.assert_array_equal(bits_of(ours.apply(params, x)), bits_of(want))
  with context.autocast(recipe=MXFP8BlockScaling()):
    assert ours.apply(params, x).dtype == jnp.bfloat16


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_layernorm_dense_matches_flax_composition(norm_type):
  x = jax.random.normal(jax.random.key(0), (4, 32)) * 3 + 1
  model = mxl.LayerNormDense(8, norm_type=norm_type)
  variables = model.init(jax.random.key(1), x)
  p = variables["params"]
  norm = nn.LayerNorm(epsilon=1e-6) if norm_type == "layernorm" else nn.RMSNorm(epsilon=1e-6)
  h = norm.apply({"params": p["norm"]}, x)
  np.testing.assert_allclose(model.apply(variables, x),
                             h @ p["dense"]["kernel"] + p["dense"]["bias"], rtol=1e-5,
                             atol=1e-5)
  with pytest.raises(ValueError, match="norm_type"):
    mxl.LayerNormDense(8, norm_type="batchnorm").init(jax.random.key(1), x)


def test_layernorm_mlp_gated_matches_reference():
  x = jax.random.normal(jax.random.key(0), (4, 32))
  model = mxl.LayerNormMLP(intermediate_dim=16, activations=("gelu", "linear"))
  variables = model.init(jax.random.key(1), x)
  p = variables["params"]
  h = nn.LayerNorm(epsilon=1e-6).apply({"params": p["norm"]}, x)
  h = h @ p["wi"]["kernel"] + p["wi"]["bias"]
  h = jax.nn.gelu(h[:, :16]) * h[:, 16:]
  expected = h @ p["wo"]["kernel"] + p["wo"]["bias"]
  assert p["wi"]["kernel"].shape == (32, 32) and p["wo"]["kernel"].shape == (16, 32)
  np.testing.assert_allclose(model.apply(variables, x), expected, rtol=1e-5, atol=1e-5)


def _regression_step(model, tx):
  """A train step on (params, mx_state) that uses both state conventions."""

  @jax.jit
  def step(params, mx_state, opt_state, x, y):
    def loss_fn(params, mx_state):
      out, mutated = model.apply({"params": params, "mx_state": mx_state}, x,
                                 mutable=["mx_state"])
      return jnp.mean((out - y) ** 2), mutated["mx_state"]

    (loss, mutated), (g_params, g_state) = jax.value_and_grad(
        loss_fn, argnums=(0, 1), has_aux=True)(params, mx_state)
    updates, opt_state = tx.update(g_params, opt_state, params)
    return (optax.apply_updates(params, updates), state_lib.next_state(g_state, mutated),
            opt_state, loss)

  return step


def test_recipe_change_from_delayed_to_mxfp8_replaces_the_state():
  model = mxl.Dense(8)
  x = jax.random.normal(jax.random.key(0), (16, 32))
  y = x[:, :8] * 2.0
  delayed = DelayedScaling(amax_history_len=4)
  with context.autocast(recipe=delayed):
    variables = model.init(jax.random.key(1), x)
  tx = optax.adamw(1e-2)
  step = _regression_step(model, tx)
  params, mx_state, opt_state = variables["params"], variables["mx_state"], tx.init(
      variables["params"])
  with context.autocast(recipe=delayed):
    for _ in range(3):
      params, mx_state, opt_state, _ = step(params, mx_state, opt_state, x, y)
  assert state_lib.describe(mx_state) == {"recipe_state": "DelayedScaling"}
  history = mx_state["recipe_state"].tensors["grad"].amax_history
  assert np.all(np.asarray(history[:3]) > 0) and float(history[3]) == 0  # 3 steps recorded

  with context.autocast(recipe=MXFP8BlockScaling()):
    with pytest.warns(UserWarning, match="Recipe type changed") as record:
      params, mx_state, opt_state, _ = step(params, mx_state, opt_state, x, y)
    assert len([w for w in record if "Recipe type changed" in str(w.message)]) == 1
    assert state_lib.describe(mx_state) == {"recipe_state": "MXFP8BlockScaling"}
    assert jax.tree.leaves(mx_state) == []  # stateless
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      for _ in range(2):
        params, mx_state, opt_state, loss = step(params, mx_state, opt_state, x, y)
  assert state_lib.describe(mx_state) == {"recipe_state": "MXFP8BlockScaling"}
  assert np.isfinite(float(loss))


def test_same_jitted_step_retraces_for_each_recipe():
  model = mxl.Dense(8)
  x = jax.random.normal(jax.random.key(0), (16, 64))
  y = x[:, :8]
  variables = model.init(jax.random.key(1), x)
  traces = []

  @jax.jit
  def loss_and_grad(params, x, y):
    traces.append(context.get_recipe())
    def loss_fn(params):
      out = model.apply({**variables, "params": params}, x)
      return jnp.mean((out - y) ** 2)
    return jax.value_and_grad(loss_fn)(params)

  results = {}
  for name, recipe in (("mxfp8", MXFP8BlockScaling()), ("mxfp4", MXFP4BlockScaling()),
                       ("mxfp8_again", MXFP8BlockScaling())):
    with context.autocast(recipe=recipe):
      results[name] = loss_and_grad(variables["params"], x, y)
  results["f32"] = loss_and_grad(variables["params"], x, y)
  assert traces == [MXFP8BlockScaling(), MXFP4BlockScaling(), None]
  loss = {k: float(v[0]) for k, v in results.items()}
  assert loss["mxfp8"] == loss["mxfp8_again"]
  # FP4 is much coarser than FP8: its loss is further from the f32 loss.
  assert abs(loss["mxfp4"] - loss["f32"]) > abs(loss["mxfp8"] - loss["f32"]) > 0


class _MLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    h = nn.gelu(mxl.Dense(64, name="fc1")(x))
    h = nn.gelu(mxl.Dense(64, name="fc2")(h))
    return mxl.Dense(8, name="out")(h)


_TEACHER = jax.random.normal(jax.random.key(42), (32, 8))


def _classification_batch(key, n):
  """x ~ N(0, I_32); label = argmax of a random linear teacher, 10% replaced at random."""
  k1, k2, k3 = jax.random.split(key, 3)
  x = jax.random.normal(k1, (n, 32))
  labels = jnp.argmax(x @ _TEACHER, -1)
  noisy = jax.random.uniform(k2, (n,)) < 0.1
  return x, jnp.where(noisy, jax.random.randint(k3, (n,), 0, 8), labels)


def test_mxfp8_training_matches_f32():
  model = _MLP()
  x_eval, y_eval = _classification_batch(jax.random.key(0), 2048)
  variables = model.init(jax.random.key(1), x_eval)
  tx = optax.adamw(3e-3, weight_decay=1e-4)

  def loss_fn(params, x, y):
    logits = model.apply({**variables, "params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def step(params, opt_state, key):
    x, y = _classification_batch(key, 128)
    grads = jax.grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  final, trained = {}, {}
  for name, recipe in (("f32", None), ("mxfp8", MXFP8BlockScaling())):
    params, opt_state = variables["params"], tx.init(variables["params"])
    with context.autocast(enabled=recipe is not None, recipe=recipe):
      for i in range(100):
        params, opt_state = step(params, opt_state, jax.random.fold_in(jax.random.key(5), i))
      final[name] = float(jax.jit(loss_fn)(params, x_eval, y_eval))
    trained[name] = params
  initial = float(loss_fn(variables["params"], x_eval, y_eval))
  assert final["f32"] < 0.6 * initial  # the task is learned
  assert abs(final["mxfp8"] - final["f32"]) <= 0.05 * final["f32"]

  # One layer of the trained MXFP8 model: MXFP8 forward vs f32 on the same weights.
  fc1 = mxl.Dense(64)
  fc1_vars = {"params": trained["mxfp8"]["fc1"]}
  exact = fc1.apply(fc1_vars, x_eval)
  with context.autocast(recipe=MXFP8BlockScaling()):
    quantized = fc1.apply(fc1_vars, x_eval)
  rel = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))  # noqa: E731
  # Each operand quantized to E4M3 is within 3% (3 mantissa bits), and the product of
  # two independently quantized operands within sqrt(2) * 3%.
  kernel = fc1_vars["params"]["kernel"]
  assert rel(fake_quantize(x_eval, "e4m3"), x_eval) <= 0.03
  assert rel(fake_quantize(kernel, "e4m3", axis=0), kernel) <= 0.03
  assert rel(quantized, exact) <= 0.03 * np.sqrt(2)


@pytest.mark.parametrize("optimizer", [optax.sgd(0.1), optax.adam(1e-2)],
                         ids=["sgd", "adam"])
def test_quantized_kernels_stay_frozen_under_a_stock_optax_step(optimizer):
  """Kernels made under quantized_model_init live outside "params" (E8M0 scales have no
  zero: any optax update of one, even a zero one, is NaN). Training the params with a
  stock optimizer keeps everything finite, leaves the kernels bit-identical and moves the
  biases."""
  recipe = MXFP8BlockScaling()
  model = _MLP()
  x, labels = _classification_batch(jax.random.key(0), 64)
  with context.quantized_model_init(recipe=recipe, for_training=True):
    variables = model.init(jax.random.key(1), x)
  kernels_before = mxarray_bits(mxarrays(variables))
  assert len(kernels_before) == 3 * 2 * 2  # 3 layers, an MXArray pair each

  def loss_fn(params, rest):
    logits = model.apply({**rest, "params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  @jax.jit
  def step(params, rest, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params, rest)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  params = variables["params"]
  rest = {k: v for k, v in variables.items() if k != "params"}
  opt_state = optimizer.init(params)
  with context.autocast(recipe=recipe):
    losses = []
    for _ in range(3):
      params, opt_state, loss = step(params, rest, opt_state)
      losses.append(float(loss))
    y = model.apply({**rest, "params": params}, x)
  assert np.all(np.isfinite(losses)) and bool(jnp.all(jnp.isfinite(y)))
  for leaf in jax.tree.leaves(params):
    assert bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32))))
  assert not mxarrays(params)  # no quantized kernel among the trainable params
  assert not mxarrays(opt_state)
  after = {**rest, "params": params}
  for a, b in zip(mxarray_bits(mxarrays(after)), kernels_before, strict=True):
    np.testing.assert_array_equal(a, b)
  for name in ("fc1", "fc2", "out"):
    assert not np.array_equal(params[name]["bias"], variables["params"][name]["bias"])
  assert set(variables[mxl.QUANTIZED_KERNELS]) == {"fc1", "fc2", "out"}


def test_get_sharding_takes_its_mesh_argument_without_a_mesh_in_context():
  """nn.get_sharding(tree, mesh) outside jax.set_mesh, as stock takes it: the scales of a
  kernel of 2 blocks over 8 devices stay whole (they were split, and jit's init failed)."""
  model = mxl.Dense(256, kernel_axes=("fsdp", None))
  x = jnp.ones((8, 64))
  init = lambda k: model.init(k, x)  # noqa: E731
  mesh = jax.make_mesh((8,), ("fsdp",))
  with context.quantized_model_init(recipe=MXFP8BlockScaling(), columnwise=False):
    shardings = nn.get_sharding(jax.eval_shape(init, jax.random.key(1)), mesh)
    variables = nn.unbox(jax.jit(init, out_shardings=shardings)(jax.random.key(1)))
  kernel = variables[mxl.QUANTIZED_KERNELS]["kernel"]
  assert (spec_of(kernel.data), spec_of(kernel.scales)) == (("fsdp", None), (None, None))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")
@pytest.mark.parametrize("columnwise", [True, False], ids=["pair", "rowwise"])
@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
@pytest.mark.parametrize("names", ["logical", "mesh"])
def test_quantized_kernel_axes_shard_each_array_evenly(names, axis_type, columnwise):
  """FSDP of a quantized kernel [64, 256] over 8 devices, by Flax's jit-init flow
  (eval_shape; get_partition_spec + logical rules, or mesh-axis names + get_sharding;
  out_shardings): the data splits as its axes ask; the scales along the blocks (2 of them
  along 64) cannot and stay whole. The kernel and the output are the unsharded ones, bit
  for bit."""
  recipe = MXFP8BlockScaling()
  model = mxl.Dense(256, kernel_axes=("embed", "mlp") if names == "logical" else ("fsdp", None))
  x = jax.random.normal(jax.random.key(2), (64, 64))  # 8 rows a device: the same GEMM
  with context.quantized_model_init(recipe=recipe, columnwise=columnwise):
    want_vars = model.init(jax.random.key(1), x)
  with context.autocast(recipe=recipe):
    want = model.apply(nn.unbox(want_vars), x)
  kind = getattr(jax.sharding.AxisType, axis_type.capitalize())
  mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(kind,))
  with jax.set_mesh(mesh), context.quantized_model_init(recipe=recipe, columnwise=columnwise):
    abstract = jax.eval_shape(lambda k: model.init(k, x), jax.random.key(1))
    shardings = (nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh,
                                             (("embed", "fsdp"), ("mlp", None)))
                 if names == "logical" else nn.get_sharding(abstract, mesh))
    variables = nn.unbox(jax.jit(lambda k: model.init(k, x), out_shardings=shardings)(
        jax.random.key(1)))
  kernel = variables[mxl.QUANTIZED_KERNELS]["kernel"]
  along_k, along_n = kernel if columnwise else (kernel, None)
  assert (spec_of(along_k.data), spec_of(along_k.scales)) == (("fsdp", None), (None, None))
  if columnwise:  # scales [64, 8]: the rows split as the data's
    assert (spec_of(along_n.data), spec_of(along_n.scales)) == (("fsdp", None), ("fsdp", None))
  for a, b in zip(jax.tree.leaves(variables), jax.tree.leaves(nn.unbox(want_vars))):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
  with jax.set_mesh(mesh), context.autocast(recipe=recipe):  # FSDP: the batch split too
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp")))
    got = jax.jit(model.apply)(variables, xs)
  np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                np.asarray(want).view(np.uint32))
