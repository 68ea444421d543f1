"""Sharded training of mxjax.Dense MLPs under jax.jit with NamedSharding (8 CPU devices).

A 2-layer MLP on a 2x4 ('data', 'model') mesh, batch always sharded on 'data':
- dp: weights replicated.
- tp-col: Megatron style, fc1 kernel split on its features, fc2 kernel on its contraction.
- tp-row: both kernels split on their contraction.
One jitted train step (forward, loss, grad, optax update) must match the single-device
step, move no weight between devices, and (dp, tp-col) run exactly the collectives of
the same step in high precision: MX quantization is shard-local.
"""

from collections import Counter
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import mxjax
from mxjax import state as state_lib
from sharding_helpers import collectives

pytestmark = pytest.mark.skipif(
    jax.device_count() < 8,
    reason="needs 8 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=8 "
    "(tests/conftest.py sets it unless XLA_FLAGS is already set)")

# Sizes: every shard holds whole 32-blocks along each quantized axis, and the per-shard
# batch (96) is a dimension no weight (or weight shard) has, so a gathered weight and a
# gathered activation are told apart by shape.
D, H, BATCH = 128, 256, 192
LOCAL_BATCH = BATCH // 2

# Logical axis rules per mode (flax.linen.logical_to_mesh_sharding).
RULES = {
    "dp": (("batch", "data"), ("embed", None), ("mlp", None)),
    "tp-col": (("batch", "data"), ("embed", None), ("mlp", "model")),
}
# What the rules must give, and tp-row, which one rule set cannot express: Flax gives a
# mesh axis to one logical axis per array, so fc1 (embed, mlp) and fc2 (mlp, embed)
# cannot both be split on their first (contracting) axis.
SPECS = {
    "dp": {"fc1": {"kernel": P(None, None), "bias": P(None)},
           "fc2": {"kernel": P(None, None), "bias": P(None)}},
    "tp-col": {"fc1": {"kernel": P(None, "model"), "bias": P("model")},
               "fc2": {"kernel": P("model", None), "bias": P(None)}},
    "tp-row": {"fc1": {"kernel": P("model", None), "bias": P(None)},
               "fc2": {"kernel": P("model", None), "bias": P(None)}},
}
MODES = ("dp", "tp-col", "tp-row")
MXFP8 = mxjax.MXFP8BlockScaling()


class MLP(nn.Module):
  """x [B, D] -> [B, D]: fc1 (D -> H), GELU, fc2 (H -> D), with logical kernel axes."""

  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    h = mxjax.Dense(H, dtype=self.dtype, kernel_axes=("embed", "mlp"), bias_axes=("mlp",),
                    name="fc1")(x)
    return mxjax.Dense(D, dtype=self.dtype, kernel_axes=("mlp", "embed"),
                       bias_axes=("embed",), name="fc2")(nn.gelu(h))


@pytest.fixture(scope="module")
def mesh():
  return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def data(scale_first_shard=1.0):
  x = jax.random.normal(jax.random.key(1), (BATCH, D))
  x = x.at[:LOCAL_BATCH].multiply(scale_first_shard)  # the rows of data shard 0
  y = jax.random.normal(jax.random.key(2), (BATCH, D))
  return x, y


def init(model, recipe):
  """(boxed variables, params, mx_state) made under `recipe`."""
  with mxjax.autocast(enabled=recipe is not None, recipe=recipe):
    boxed = model.init(jax.random.key(0), jnp.zeros((BATCH, D)))
  variables = nn.unbox(boxed)
  return boxed, variables["params"], variables.get("mx_state", {})


def param_shardings(mesh, boxed, mode):
  if mode in RULES:  # the logical-axis path
    specs = nn.get_partition_spec(boxed)["params"]
    return nn.logical_to_mesh_sharding(specs, mesh, RULES[mode])
  return jax.tree.map(lambda s: NamedSharding(mesh, s), SPECS[mode])


def make_step(model, tx):
  def loss_fn(params, mx_state, x, y):
    out, mutated = model.apply({"params": params, "mx_state": mx_state}, x,
                               mutable=["mx_state"])
    return jnp.mean(jnp.square(out.astype(jnp.float32) - y)), mutated["mx_state"]

  def step(params, mx_state, opt_state, x, y):
    (loss, mutated), (g_params, g_state) = jax.value_and_grad(
        loss_fn, argnums=(0, 1), has_aux=True)(params, mx_state, x, y)
    updates, opt_state = tx.update(g_params, opt_state, params)
    return (optax.apply_updates(params, updates), state_lib.next_state(g_state, mutated),
            opt_state, loss)

  return step


class Run:
  """One model + optimizer, run on one device and sharded on the mesh in `mode`."""

  def __init__(self, mesh, mode, recipe, model=None):
    self.mesh, self.mode, self.recipe = mesh, mode, recipe
    self.model = model or MLP()
    self.tx = optax.sgd(0.1)
    self.boxed, self.params, self.mx_state = init(self.model, recipe)
    self.shardings = param_shardings(mesh, self.boxed, mode)
    self.step = make_step(self.model, self.tx)

  def single(self, x, y, steps=1):
    with mxjax.autocast(enabled=self.recipe is not None, recipe=self.recipe):
      return self._loop(jax.jit(self.step), self.params, self.mx_state, x, y, steps)

  def sharded_args(self, x, y):
    batch = NamedSharding(self.mesh, P("data", None))
    replicated = NamedSharding(self.mesh, P())
    params = jax.device_put(self.params, self.shardings)
    mx_state = jax.device_put(self.mx_state, replicated)
    return params, mx_state, jax.device_put(x, batch), jax.device_put(y, batch)

  def jitted(self):
    return jax.jit(self.step, out_shardings=(self.shardings, None, None, None))

  def sharded(self, x, y, steps=1):
    params, mx_state, xs, ys = self.sharded_args(x, y)
    with mxjax.autocast(enabled=self.recipe is not None, recipe=self.recipe):
      return self._loop(self.jitted(), params, mx_state, xs, ys, steps)

  def hlo(self, x, y):
    params, mx_state, xs, ys = self.sharded_args(x, y)
    with mxjax.autocast(enabled=self.recipe is not None, recipe=self.recipe):
      return self.jitted().lower(params, mx_state, self.tx.init(params), xs, ys).compile(
      ).as_text()

  def _loop(self, f, params, mx_state, x, y, steps):
    opt_state, losses = self.tx.init(params), []
    for _ in range(steps):
      params, mx_state, opt_state, loss = f(params, mx_state, opt_state, x, y)
      losses.append(loss)
    return params, mx_state, losses


def assert_params_close(got, want, start):
  """Updated params equal up to f32 reduction order: each leaf within 1e-5 of the
  single-device value, relative to it and to the largest update of that leaf."""
  flat = zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want),
             jax.tree.leaves(start))
  for (path, g), w, p0 in flat:
    g, w, p0 = np.asarray(g), np.asarray(w), np.asarray(p0)
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w - p0).max(),
                               err_msg=jax.tree_util.keystr(path))


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", sorted(RULES))
def test_logical_axes_give_the_param_shardings(mesh, mode):
  run = Run(mesh, mode, MXFP8)
  assert nn.get_partition_spec(run.boxed)["params"]["fc1"]["kernel"] == P("embed", "mlp")
  for name in ("fc1", "fc2"):
    for leaf in ("kernel", "bias"):
      got, spec = run.shardings[name][leaf], SPECS[mode][name][leaf]
      ndim = run.params[name][leaf].ndim
      assert got.is_equivalent_to(NamedSharding(mesh, spec), ndim), (name, leaf, got.spec)


@pytest.mark.parametrize("mode", MODES)
def test_train_step_matches_single_device_and_moves_no_weights(mesh, mode):
  run = Run(mesh, mode, MXFP8)
  x, y = data()
  want_params, _, want_loss = run.single(x, y)
  got_params, _, got_loss = run.sharded(x, y)
  np.testing.assert_allclose(float(got_loss[0]), float(want_loss[0]), rtol=1e-6)
  assert_params_close(got_params, want_params, run.params)
  for name in ("fc1", "fc2"):  # updated params keep their layout
    for leaf in ("kernel", "bias"):
      a = got_params[name][leaf]
      assert a.sharding.is_equivalent_to(run.shardings[name][leaf], a.ndim), (name, leaf)

  ops = collectives(run.hlo(x, y))
  plain = collectives(Run(mesh, mode, None).hlo(x, y))  # the same step in high precision
  gathers = lambda ops: Counter(op for op in ops if op[0] == "all-gather")  # noqa: E731
  # No weight is gathered or resharded: apart from all-reduces (partial sums of sharded
  # contractions, the gradient reduction) the only collectives are all-gathers of
  # activation gradients (they carry the per-shard batch) and of a replicated bias's
  # update, which XLA computes sharded - the very gathers of the high-precision step.
  assert {kind for kind, _, _ in ops} <= {"all-gather", "all-reduce"}, ops
  for kind, shape, _ in ops:
    if kind == "all-gather":
      assert LOCAL_BATCH in shape or len(shape) == 1, (kind, shape)
  assert gathers(ops) == gathers(plain), (ops, plain)
  if mode in ("dp", "tp-col"):
    # Nothing but all-reduces, exactly those of the high-precision step (kind, shape and
    # element type).
    assert not gathers(ops), ops
    assert Counter(ops) == Counter(plain), (ops, plain)
  if mode == "dp":  # one gradient all-reduce: every param's gradient plus the loss
    n_params = sum(a.size for a in jax.tree.leaves(run.params))
    assert sum(int(np.prod(s)) for _, s, _ in ops) == n_params + 1, ops


@pytest.mark.parametrize("mode", ["dp", "tp-col"])
def test_mxfp8_sharded_loss_is_the_mxfp8_loss_not_the_bf16_one(mesh, mode):
  model = MLP(dtype=jnp.bfloat16)
  x, y = data()
  losses = {}
  for name, recipe in (("bf16", None), ("mxfp8", MXFP8)):
    run = Run(mesh, mode, recipe, model)
    losses[name] = float(run.single(x, y)[2][0])
    losses[name + "_sharded"] = float(run.sharded(x, y)[2][0])
  # Shard-local quantization makes the same blocks: the sharded MXFP8 loss is the
  # single-device MXFP8 loss, far closer to it than to the bf16 loss.
  gap = abs(losses["mxfp8"] - losses["bf16"])
  assert gap > 1e-4 * losses["bf16"], losses
  np.testing.assert_allclose(losses["mxfp8_sharded"], losses["mxfp8"], rtol=1e-6, atol=0)
  np.testing.assert_allclose(losses["bf16_sharded"], losses["bf16"], rtol=1e-6, atol=0)


@pytest.mark.parametrize("mode", ["dp", "tp-col"])
def test_delayed_scaling_amax_is_global_and_identical_on_every_device(mesh, mode):
  recipe = mxjax.DelayedScaling(amax_history_len=4)
  run = Run(mesh, mode, recipe)
  x, y = data(scale_first_shard=100.0)  # data shard 0 sees a 100x larger amax
  assert float(jnp.max(jnp.abs(x[:LOCAL_BATCH]))) > 50 * float(jnp.max(jnp.abs(x[LOCAL_BATCH:])))
  want_params, want_state, want_losses = run.single(x, y, steps=2)
  got_params, got_state, got_losses = run.sharded(x, y, steps=2)

  leaves = jax.tree_util.tree_leaves_with_path(got_state)
  assert len(leaves) == 2 * 3 * 3  # 2 GEMMs x (input, kernel, grad) x (history, scale, uses)
  for (path, got), want in zip(leaves, jax.tree.leaves(want_state)):
    shards = [np.asarray(s.data) for s in got.addressable_shards]
    assert len(shards) == 8 and all(s.shape == want.shape for s in shards), path
    for s in shards[1:]:  # every device holds the same history and scale ...
      np.testing.assert_array_equal(s, shards[0], err_msg=jax.tree_util.keystr(path))
    # ... which is the single-device one.
    np.testing.assert_allclose(shards[0], np.asarray(want), rtol=1e-6,
                               err_msg=jax.tree_util.keystr(path))
  # The recorded input amax of fc1 is the global one (from data shard 0), both steps.
  fc1_input = got_state["fc1"]["recipe_state"].tensors["input"]
  np.testing.assert_array_equal(np.asarray(fc1_input.amax_history[:2]),
                                [float(jnp.max(jnp.abs(x)))] * 2)
  np.testing.assert_allclose([float(v) for v in got_losses], [float(v) for v in want_losses],
                             rtol=1e-6)
  assert_params_close(got_params, want_params, run.params)
