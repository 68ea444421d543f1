"""mxjax.nnx.Linear: recipes, state, quantized init and mismatch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from conftest import bits_of, mxarray_bits, mxarrays
from sharding_helpers import spec_of

from mxjax import nnx as mxnnx, state as state_lib
from mxjax._src import context
from mxjax._src.mxarray import MXArray
from mxjax._src.recipes import (DelayedScaling, Float8CurrentScaling, Format, MXFP4BlockScaling,
                           MXFP8BlockScaling)

X = jax.random.normal(jax.random.key(0), (8, 64))


def _rel(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def test_linear_follows_the_recipe_under_nnx_jit():
  layer = mxnnx.Linear(64, 16, rngs=nnx.Rngs(0))
  exact = X @ layer.kernel.get_value() + layer.bias.get_value()
  traces = []

  @nnx.jit
  def apply(layer, x):
    traces.append(context.get_recipe())
    return layer(x)

  np.testing.assert_allclose(apply(layer, X), exact, rtol=1e-5, atol=1e-6)
  with context.autocast(recipe=MXFP8BlockScaling()):
    mx8 = apply(layer, X)
  with context.autocast(recipe=MXFP4BlockScaling()):
    mx4 = apply(layer, X)
  assert traces == [None, MXFP8BlockScaling(), MXFP4BlockScaling()]
  assert 0 < _rel(mx8, exact) < 0.06 and _rel(mx4, exact) > 2 * _rel(mx8, exact)
  assert mx8.shape == (8, 16) and mx8.dtype == jnp.float32


def test_delayed_state_forward_and_gradient_overwrite():
  recipe = DelayedScaling(amax_history_len=3)
  with context.autocast(recipe=recipe):
    layer = mxnnx.Linear(64, 16, rngs=nnx.Rngs(0))
    assert layer.recipe_state.kind == "DelayedScaling"
    params_and_state = nnx.DiffState(0, nnx.Any(nnx.Param, mxnnx.RecipeStateVar))
    grads = nnx.grad(lambda m: jnp.sum(m(X)), argnums=params_and_state)(layer)
  amax_x = float(jnp.max(jnp.abs(X)))
  forward = nnx.as_pure(layer.recipe_state).tensors  # what the call stored
  np.testing.assert_allclose(forward["input"].amax_history, [amax_x, 0, 0], rtol=1e-6)
  np.testing.assert_array_equal(forward["grad"].amax_history, 0)
  assert grads["kernel"].get_value().shape == (64, 16)
  nnx.update(layer, nnx.state(grads, mxnnx.RecipeStateVar))  # the gradient: all roles
  advanced = nnx.as_pure(layer.recipe_state).tensors
  np.testing.assert_allclose(advanced["grad"].amax_history, [1.0, 0, 0])
  np.testing.assert_allclose(advanced["grad"].scale, 57344.0)
  np.testing.assert_allclose(advanced["input"].scale, 448.0 / amax_x, rtol=1e-6)


def test_several_calls_in_one_loss_run_on_the_steps_state():
  """A loss calling the layer 3 times on one batch (NNX micro-batches), step after step:
  each call runs on the state the step started with, so the forward record is the one-call
  record, the overwrite holds 3 uses (the kernel's history as one call's, the input's
  newest amax their sum), and the kernel gradient is 3 times the one-call gradient. Before,
  each later call read the record the call before it stored (its scales from the earlier
  call's amaxes), and before that the history turned NaN."""
  recipe = DelayedScaling(amax_history_len=4)

  def train(calls):
    with context.autocast(recipe=recipe):
      layer = mxnnx.Linear(64, 16, rngs=nnx.Rngs(0))
      which = nnx.DiffState(0, nnx.Any(nnx.Param, mxnnx.RecipeStateVar))
      for _ in range(4):
        loss = lambda m: sum(jnp.sum(m(X) ** 2) for _ in range(calls))  # noqa: E731
        grads = nnx.grad(loss, argnums=which)(layer)
        record = nnx.as_pure(layer.recipe_state)
        nnx.update(layer, nnx.state(grads, mxnnx.RecipeStateVar))
    return record, nnx.as_pure(layer.recipe_state), grads["kernel"].get_value()

  (record3, state3, kernel3), (record1, state1, kernel1) = train(3), train(1)
  for role in ("input", "kernel"):
    np.testing.assert_array_equal(record3.tensors[role].amax_history[0],
                                  record1.tensors[role].amax_history[0])
  assert float(state3.tensors["input"].uses) == 3
  settled = state_lib.settle(state3, recipe).tensors
  np.testing.assert_allclose(settled["kernel"].amax_history,
                             state1.tensors["kernel"].amax_history, rtol=1e-6)
  np.testing.assert_allclose(settled["input"].amax_history[0],
                             3 * state1.tensors["input"].amax_history[0], rtol=1e-6)
  fresh = mxnnx.Linear(64, 16, rngs=nnx.Rngs(0))  # the params, which the steps leave as they are
  exact = 2 * X.T @ (X @ fresh.kernel.get_value() + fresh.bias.get_value())
  assert _rel(kernel3, 3 * exact) < 1.5 * _rel(kernel1, exact) < 0.15


def test_a_layer_called_on_its_own_output_scales_each_call_from_the_steps_state():
  """`layer(layer(x))` under DelayedScaling in `nnx.grad`, the second input about 6 times
  the first's amax: from a fresh state each call scales from its own amax (bit for bit
  Float8CurrentScaling's forward), the record holds the larger amax and the overwrite both
  calls. Before, the second call took the first call's scale and saturated (63% error)."""
  hybrid = dict(fp8_format=Format.HYBRID)
  which = nnx.DiffState(0, nnx.Any(nnx.Param, mxnnx.RecipeStateVar))
  x = jax.random.normal(jax.random.key(0), (4, 32))

  def make():
    return mxnnx.Linear(32, 32, kernel_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(0))

  with context.autocast(recipe=Float8CurrentScaling(**hybrid)):
    current = make()
    want, first = current(current(x)), current(x)
  with context.autocast(recipe=DelayedScaling(amax_history_len=4, **hybrid)):
    layer = make()

    def loss(m):
      y = m(m(x))
      return jnp.sum(y ** 2), y

    (_, got), grads = nnx.value_and_grad(loss, argnums=which, has_aux=True)(layer)
  np.testing.assert_array_equal(got, want)
  record = nnx.as_pure(layer.recipe_state).tensors["input"]
  amaxes = float(jnp.max(jnp.abs(x))), float(jnp.max(jnp.abs(first)))
  assert amaxes[1] > 4 * amaxes[0]
  assert float(record.amax_history[0]) == max(amaxes)
  overwrite = nnx.as_pure(nnx.state(grads, mxnnx.RecipeStateVar))["recipe_state"]
  overwrite = overwrite.tensors["input"]
  assert float(overwrite.uses) == 2
  np.testing.assert_allclose(overwrite.amax_history[0], sum(amaxes), rtol=1e-6)


def test_per_example_nnx_vmap_of_a_shared_layer_records_the_whole_batch():
  """`nnx.vmap(in_axes=(None, 0))` of one DelayedScaling layer (per-example calls): the
  stored forward record and the gradient overwrite are the whole batch's (each amax
  max-reduced over the examples), step after step. Before, NNX refused the batched record
  in the shared layer ("axis spec None but output was batched")."""
  recipe = DelayedScaling(amax_history_len=4)
  which = nnx.DiffState(0, nnx.Any(nnx.Param, mxnnx.RecipeStateVar))

  def per_example(m, x):
    return jnp.sum(nnx.vmap(lambda m, xi: m(xi), in_axes=(None, 0))(m, x) ** 2)

  def whole_batch(m, x):
    return jnp.sum(m(x) ** 2)

  def train(loss):
    with context.autocast(recipe=recipe):
      layer = mxnnx.Linear(64, 16, rngs=nnx.Rngs(0))
      states = []
      for _ in range(3):
        grads = nnx.grad(loss, argnums=which)(layer, X)
        states.append(nnx.as_pure(layer.recipe_state))  # the forward's record
        nnx.update(layer, nnx.state(grads, mxnnx.RecipeStateVar))
        states.append(nnx.as_pure(layer.recipe_state))  # the overwrite
    return states, grads["kernel"].get_value()

  (states, kernel), (want_states, want_kernel) = train(per_example), train(whole_batch)
  for got, want in zip(states, want_states, strict=True):
    for role in ("input", "kernel"):
      for name in ("amax_history", "scale", "uses"):
        np.testing.assert_array_equal(getattr(got.tensors[role], name),
                                      getattr(want.tensors[role], name))
    np.testing.assert_allclose(got.tensors["grad"].amax_history,
                               want.tensors["grad"].amax_history, rtol=0.05)
  assert _rel(kernel, want_kernel) < 0.05


def test_recipe_change_warns_and_replaces_state():
  with context.autocast(recipe=DelayedScaling(amax_history_len=2)):
    layer = mxnnx.Linear(64, 16, rngs=nnx.Rngs(0))
  with context.autocast(recipe=MXFP8BlockScaling()):
    with pytest.warns(UserWarning, match="Recipe type changed"):
      layer(X)
    assert layer.recipe_state.kind == "MXFP8BlockScaling"
    assert not nnx.state(layer, mxnnx.RecipeStateVar)  # a stateless recipe: no arrays


def test_quantized_init_and_mismatch():
  with context.quantized_model_init(recipe=MXFP8BlockScaling(), columnwise=False):
    layer = mxnnx.Linear(64, 32, use_bias=False, rngs=nnx.Rngs(0))
  kernel = nnx.as_pure(layer.kernel)
  assert isinstance(kernel, MXArray) and kernel.axis == 0
  # Frozen: QuantizedKernel variables (the data and the scales), not an nnx.Param.
  assert {path: type(v) for path, v in nnx.to_flat_state(nnx.state(layer))} == {
      ("kernel", "data"): mxnnx.QuantizedKernel, ("kernel", "scales"): mxnnx.QuantizedKernel}
  with context.autocast(recipe=MXFP8BlockScaling()):
    y = layer(X)
  assert _rel(y, X @ kernel.dequantize()) < 0.06
  with context.autocast(recipe=DelayedScaling()):
    with pytest.raises(ValueError, match=r"^Recipe mismatch for nnx.Linear\(64, 32\)"):
      layer(X)


class _TwoLayers(nnx.Module):

  def __init__(self, rngs):
    self.a = mxnnx.Linear(64, 32, rngs=rngs)
    self.b = mxnnx.Linear(32, 8, rngs=rngs)

  def __call__(self, x):
    return self.b(nnx.relu(self.a(x)))


@pytest.mark.parametrize("optimizer", [optax.sgd(0.1), optax.adam(1e-2)],
                         ids=["sgd", "adam"])
def test_quantized_kernels_stay_frozen_under_nnx_optimizer(optimizer):
  """Kernels made under quantized_model_init are QuantizedKernel variables, not
  nnx.Param (E8M0 scales have no zero: any optax update of one is NaN): nnx.grad and
  nnx.Optimizer(wrt=nnx.Param) leave them bit-identical and train the biases."""
  recipe = MXFP8BlockScaling()
  with context.quantized_model_init(recipe=recipe, for_training=True):
    model = _TwoLayers(nnx.Rngs(0))
  kernels = lambda: mxarrays(nnx.as_pure([model.a.kernel, model.b.kernel]))  # noqa: E731
  kernels_before = mxarray_bits(kernels())
  assert len(kernels_before) == 2 * 2 * 2  # 2 layers, an MXArray pair each
  biases_before = [np.asarray(model.a.bias.get_value()), np.asarray(model.b.bias.get_value())]
  with context.autocast(recipe=recipe):
    opt = nnx.Optimizer(model, optimizer, wrt=nnx.Param)

    @nnx.jit
    def step(model, opt):
      loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(X) - 1.0) ** 2))(model)
      opt.update(model, grads)
      return loss

    losses = [float(step(model, opt)) for _ in range(3)]
    y = model(X)
  assert np.all(np.isfinite(losses)) and bool(jnp.all(jnp.isfinite(y)))
  params = nnx.state(model, nnx.Param)
  for leaf in jax.tree.leaves(params):
    assert bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32))))
  assert [path for path, _ in nnx.to_flat_state(params)] == [("a", "bias"), ("b", "bias")]
  opt_shapes = {a.shape for a in jax.tree.leaves(nnx.state(opt, nnx.OptState))}
  assert opt_shapes <= {(), (32,), (8,)}  # the biases' moments (and adam's count)
  for a, b in zip(mxarray_bits(kernels()), kernels_before, strict=True):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(model.a.bias.get_value(), biases_before[0])
  assert not np.array_equal(model.b.bias.get_value(), biases_before[1])


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")
@pytest.mark.parametrize("columnwise", [True, False], ids=["pair", "rowwise"])
@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_quantized_kernel_with_partitioning_shards_each_array_evenly(axis_type, columnwise):
  """FSDP of a quantized kernel [64, 256] over 8 devices (`nnx.with_partitioning`,
  sharded at creation): the data splits as annotated; the scales along the blocks (2 of
  them along 64) cannot and stay whole. The kernel and the output are the unsharded
  ones, bit for bit."""
  recipe = MXFP8BlockScaling()
  init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("fsdp", None))
  make = lambda: mxnnx.Linear(64, 256, kernel_init=init, rngs=nnx.Rngs(0))  # noqa: E731
  with context.quantized_model_init(recipe=recipe, columnwise=columnwise):
    want_model = mxnnx.Linear(64, 256, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (64, 64))  # 8 rows a device: the same GEMM
  with context.autocast(recipe=recipe):
    want = want_model(x)
  kind = getattr(jax.sharding.AxisType, axis_type.capitalize())
  mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(kind,))
  with jax.set_mesh(mesh):
    with context.quantized_model_init(recipe=recipe, columnwise=columnwise):
      model = nnx.jit(make)()
    with context.autocast(recipe=recipe):  # FSDP: the batch split too
      got = nnx.jit(lambda m, x: m(x))(model, jax.device_put(x, P("fsdp")))
  kernel = nnx.as_pure(model.kernel)
  along_k, along_n = kernel if columnwise else (kernel, None)
  assert (spec_of(along_k.data), spec_of(along_k.scales)) == (("fsdp", None), (None, None))
  if columnwise:  # scales [64, 8]: the rows split as the data's
    assert (spec_of(along_n.data), spec_of(along_n.scales)) == (("fsdp", None), ("fsdp", None))
  for a, b in zip(jax.tree.leaves(kernel), jax.tree.leaves(nnx.as_pure(want_model.kernel)),
                  strict=True):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
  np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                np.asarray(want).view(np.uint32))


class _QuantizedAndDelayed(nnx.Module):
  """FSDP-annotated kernels: [64, 256] quantized (MXFP8 pair), [256, 16] with DelayedScaling
  state."""

  def __init__(self):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("fsdp", None))
    with context.quantized_model_init(recipe=MXFP8BlockScaling(), for_training=True):
      self.q = mxnnx.Linear(64, 256, kernel_init=init, rngs=nnx.Rngs(0))
    with context.autocast(recipe=DelayedScaling(amax_history_len=4)):
      self.d = mxnnx.Linear(256, 16, kernel_init=init, rngs=nnx.Rngs(1))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")
@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_nnx_sharding_tools_and_orbax_restore_see_each_array(axis_type, tmp_path):
  """nnx's own tools assume one array per variable: `nnx.get_abstract_model` (that is
  `nnx.eval_shape` under a mesh), `nnx.get_partition_spec` + `with_sharding_constraint`,
  and an orbax restore onto the abstract state give every array of a quantized kernel and
  of a recipe state the sharding the model was created with, and the same bits."""
  import orbax.checkpoint as ocp  # noqa: PLC0415

  kind = getattr(jax.sharding.AxisType, axis_type.capitalize())
  mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(kind,))
  with jax.set_mesh(mesh):
    model = nnx.jit(_QuantizedAndDelayed)()
    graphdef, abstract = nnx.get_abstract_model(_QuantizedAndDelayed, mesh)

    @nnx.jit
    def constrain(model):
      state = nnx.state(model)
      nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
      return model

    constrained = nnx.state(constrain(model))
  made = nnx.to_flat_state(nnx.state(model))
  want = {
      ("q", "kernel", 0, "data"): ("fsdp", None),  # blocks along 64: 2 scales, kept whole
      ("q", "kernel", 0, "scales"): (None, None),
      ("q", "kernel", 1, "data"): ("fsdp", None),  # blocks along 256: rows split
      ("q", "kernel", 1, "scales"): ("fsdp", None),
      ("d", "kernel"): ("fsdp", None),
      ("d", "recipe_state", "tensors", "input", "amax_history"): (None,),
  }
  got = {path: spec_of(v.get_value()) for path, v in made}
  assert {k: got[k] for k in want} == want
  assert len([p for p, _ in made if "recipe_state" in p]) == 3 * 3  # roles x arrays
  for tree in (abstract, constrained):
    flat = dict(nnx.to_flat_state(tree))
    assert {path: spec_of(v.get_value()) for path, v in flat.items()} == got
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "state", nnx.state(model))
  checkpointer.wait_until_finished()
  restored = nnx.to_flat_state(checkpointer.restore(tmp_path / "state", abstract))
  for (path, a), (path_b, b) in zip(made, restored, strict=True):
    assert path == path_b and spec_of(b.get_value()) == got[path]
    np.testing.assert_array_equal(bits_of(a.get_value()), bits_of(b.get_value()))


def test_repr_of_a_quantized_layer_shows_each_array():
  with context.quantized_model_init(recipe=MXFP8BlockScaling(), columnwise=False):
    layer = mxnnx.Linear(64, 32, rngs=nnx.Rngs(0))
  text = repr(layer)  # Flax's repr puts stand-ins for the variables inside the MXArray
  assert text.count("QuantizedKernel(") == 2 and "format=e4m3" in text
  assert "float8_e8m0fnu" in text and "shape=(2, 32)" in text  # the scales
  assert "shape=(64, 32)" in repr(nnx.as_pure(layer.kernel))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")
@pytest.mark.parametrize("quantized", [False, True], ids=["param", "quantized"])
def test_kernel_metadata_shards_as_stock_nnx_linear(quantized):
  """`kernel_metadata` / `bias_metadata` (Flax's other way to annotate) as in
  `nnx.Linear`: the same specs and values as stock, per array when quantized."""
  mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Explicit,))
  kw = dict(kernel_metadata={"out_sharding": ("fsdp", None)},
            bias_metadata={"out_sharding": ("fsdp",)}, use_bias=True)
  with jax.set_mesh(mesh):
    stock = nnx.Linear(256, 64, rngs=nnx.Rngs(0), **kw)
    with context.quantized_model_init(enabled=quantized, recipe=MXFP8BlockScaling(),
                                      for_training=True):
      ours = mxnnx.Linear(256, 64, rngs=nnx.Rngs(0), **kw)
  assert ours.use_bias and spec_of(ours.bias.get_value()) == spec_of(stock.bias.get_value())
  kernel = nnx.as_pure(ours.kernel)
  if not quantized:
    assert spec_of(kernel) == spec_of(stock.kernel.get_value()) == ("fsdp", None)
    np.testing.assert_array_equal(bits_of(kernel), bits_of(stock.kernel.get_value()))
    return
  along_k, along_n = kernel  # blocks along 256 (8 of them) / along 64 (2 of them)
  assert (spec_of(along_k.data), spec_of(along_k.scales)) == (("fsdp", None), ("fsdp", None))
  assert (spec_of(along_n.data), spec_of(along_n.scales)) == (("fsdp", None), ("fsdp", None))


def test_to_linen_of_a_quantized_layer_applies_under_quantized_model_init():
  """nnx.bridge.ToLinen builds the layer again in each apply: a quantized kernel's
  variables fit only a layer built under quantized_model_init, which the error names.
  Applied so, it is the NNX layer holding the same arrays, bit for bit."""
  from flax.nnx import bridge  # noqa: PLC0415
  recipe = MXFP8BlockScaling()
  linen_layer = bridge.ToLinen(mxnnx.Linear, args=(64, 32))
  with context.quantized_model_init(recipe=recipe, for_training=True):
    variables = linen_layer.init(jax.random.key(0), X)
    layer = mxnnx.Linear(64, 32, rngs=nnx.Rngs(1))
  for copy, arrays in zip(layer.kernel, variables["QuantizedKernel"]["kernel"].values(),
                          strict=True):
    copy.data.set_value(arrays["data"])
    copy.scales.set_value(arrays["scales"])
  layer.bias.set_value(variables["params"]["bias"])
  with context.autocast(recipe=recipe):
    with pytest.raises(TypeError, match="run apply under quantized_model_init too"):
      linen_layer.apply(variables, X)
    with context.quantized_model_init(recipe=recipe, for_training=True):
      y = linen_layer.apply(variables, X)
    np.testing.assert_array_equal(bits_of(y), bits_of(layer(X)))


def test_precision_reaches_the_high_precision_product_as_in_nnx_linear():
  stock = nnx.Linear(64, 16, precision=jax.lax.Precision.HIGHEST, rngs=nnx.Rngs(0))
  ours = mxnnx.Linear(64, 16, precision=jax.lax.Precision.HIGHEST, rngs=nnx.Rngs(0))
  jaxpr = lambda layer: str(jax.make_jaxpr(layer)(X))  # noqa: E731
  assert "precision=(Precision.HIGHEST, Precision.HIGHEST)" in jaxpr(stock)
  assert "precision=(Precision.HIGHEST, Precision.HIGHEST)" in jaxpr(ours)
  np.testing.assert_array_equal(bits_of(ours(X)), bits_of(stock(X)))


def test_promote_dtype_is_the_layers_as_in_nnx_linear():
  """A custom `promote_dtype` (everything to bf16, whatever `dtype` says): stock's bits and
  dtype in high precision, bf16 through the MX product; a quantized kernel reaches it as
  a param_dtype scalar and is used as it is."""
  calls = []

  def to_bf16(args, *, dtype=None):
    calls.append(tuple(None if a is None else (a.shape, a.dtype) for a in args))
    return tuple(None if a is None else a.astype(jnp.bfloat16) for a in args)

  stock = nnx.Linear(64, 16, promote_dtype=to_bf16, rngs=nnx.Rngs(0))
  ours = mxnnx.Linear(64, 16, promote_dtype=to_bf16, rngs=nnx.Rngs(0))
  want = stock(X)
  assert want.dtype == jnp.bfloat16 and calls[-1] == ((X.shape, X.dtype), ((64, 16), jnp.float32),
                                                      ((16,), jnp.float32))
  np.testing.assert_array_equal(bits_of(ours(X)), bits_of(want))
  assert calls[-1] == calls[-2]
  with context.autocast(recipe=MXFP8BlockScaling()):
    assert ours(X).dtype == jnp.bfloat16
  with context.quantized_model_init(recipe=MXFP8BlockScaling(), for_training=True):
    frozen = mxnnx.Linear(64, 16, use_bias=False, promote_dtype=to_bf16, rngs=nnx.Rngs(0))
  y = frozen(X)
  assert calls[-1] == ((X.shape, X.dtype), ((), jnp.float32), None)
  w = nnx.as_pure(frozen.kernel)[0].dequantize(jnp.bfloat16)
  np.testing.assert_array_equal(bits_of(y), bits_of(X.astype(jnp.bfloat16) @ w))


def test_preferred_element_type_sets_the_output_dtype_as_in_nnx_linear():
  """bf16 operands, f32 output: stock's bits in high precision, the MX product's f32 output
  (which rounds to its bf16 output) under a recipe, and a quantized kernel's high-precision
  product on bf16 operands."""
  kw = dict(dtype=jnp.bfloat16, preferred_element_type=jnp.float32)
  stock = nnx.Linear(64, 16, **kw, rngs=nnx.Rngs(0))
  ours = mxnnx.Linear(64, 16, **kw, rngs=nnx.Rngs(0))
  assert ours(X).dtype == stock(X).dtype == jnp.float32
  np.testing.assert_array_equal(bits_of(ours(X)), bits_of(stock(X)))
  bf16_out = mxnnx.Linear(64, 16, use_bias=False, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  f32_out = mxnnx.Linear(64, 16, use_bias=False, **kw, rngs=nnx.Rngs(0))
  with context.autocast(recipe=MXFP8BlockScaling()):
    y = f32_out(X)
    assert y.dtype == jnp.float32
    np.testing.assert_array_equal(bits_of(y.astype(jnp.bfloat16)), bits_of(bf16_out(X)))
  assert _rel(y, X @ f32_out.kernel.get_value()) < 0.05
  with context.quantized_model_init(recipe=MXFP8BlockScaling(), for_training=True):
    frozen = mxnnx.Linear(64, 16, use_bias=False, **kw, rngs=nnx.Rngs(0))
  w = nnx.as_pure(frozen.kernel)[0].dequantize(jnp.bfloat16)
  expect = jax.lax.dot(X.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
  np.testing.assert_array_equal(bits_of(frozen(X)), bits_of(expect))
