"""Dense / DenseGeneral train steps on Explicit and Auto meshes (8 CPU devices): DP,
TP-column, TP-row and FSDP, against one device and against the same step in high
precision (its collectives and, on Explicit meshes, its output and gradient types)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import mxjax
from mx_products import count_mx_products
from sharding_helpers import (assert_collectives_within, assert_grads_close, bits,
                              compiled_collectives, spec_of)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")

D, H = 128, 256
MXFP8 = mxjax.MXFP8BlockScaling()
# Logical axis rules per mode; the batch is always split over 'data'. fc1 kernel is
# (embed, mlp), fc2 kernel (mlp, embed). TP-row and FSDP split both kernels' contraction
# (over 'model', over 'data'), which one rule set cannot say (Flax gives a mesh axis to
# one logical axis per array): their specs are given directly. Biases are replicated.
RULES = {
    "dp": (("embed", None), ("mlp", None)),
    "tp-col": (("embed", None), ("mlp", "model")),
}
SPECS = {mode: {"norm": {"scale": P(), "bias": P()},
                "fc1": {"kernel": P(axis, None), "bias": P()},
                "fc2": {"kernel": P(axis, None), "bias": P()}}
         for mode, axis in (("tp-row", "model"), ("fsdp", "data"))}
MODES = ("dp", "tp-col", "tp-row", "fsdp")


class MLP(nn.Module):
  """x [B, S, D] -> [B, S, D]: a stock LayerNorm, fc1 (a DenseGeneral), GELU, fc2 (a
  Dense), as a transformer's MLP block. `fc2_out`: fc2's out_sharding (Explicit meshes,
  where TP-column contracts a sharded dim).

  The norm makes fc1's input an activation, as every layer's is past the first. On an Auto
  mesh the partitioner treats a jit argument differently: it cannot re-shard it, but it may
  slice the quantized copy of a replicated one for free, so with the argument fed straight
  into fc1 under TP-row it all-reduces the activations where the high-precision step
  all-to-alls the weight; through any op first, both all-reduce."""

  fc2_out: P | None = None

  @nn.compact
  def __call__(self, x):
    x = nn.LayerNorm(name="norm")(x)
    h = mxjax.DenseGeneral(H, axis=-1, kernel_axes=("embed", "mlp"), name="fc1")(x)
    h = nn.gelu(h)
    return mxjax.Dense(D, kernel_axes=("mlp", "embed"), name="fc2")(h,
                                                                  out_sharding=self.fc2_out)


def make_mesh(kind):
  if kind == "explicit":
    return jax.make_mesh((2, 4), ("data", "model"))
  return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def shardings(mesh, boxed, mode):
  if mode in SPECS:
    return jax.tree.map(lambda s: NamedSharding(mesh, s), SPECS[mode])
  specs = nn.get_partition_spec(boxed)["params"]
  return nn.logical_to_mesh_sharding(specs, mesh, RULES[mode])


def train_step(model, recipe):
  tx = optax.sgd(0.1)

  def loss_fn(params, x, y):
    out = model.apply({"params": params}, x)
    return jnp.mean(jnp.square(out.astype(jnp.float32) - y))

  def step(params, x, y):
    with mxjax.autocast(enabled=recipe is not None, recipe=recipe):
      loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, _ = tx.update(grads, tx.init(params), params)
    return optax.apply_updates(params, updates), loss, grads

  return step


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [2, 96])  # 2 and 96 rows (of [S=2, D]) per data shard
def test_train_step_matches_one_device_with_the_high_precision_collectives(kind, mode,
                                                                            batch):
  mesh = make_mesh(kind)
  fc2_out = P("data", None, None) if (kind, mode) == ("explicit", "tp-col") else None
  model = MLP(fc2_out)
  x = jax.random.normal(jax.random.key(1), (batch, 2, D))
  y = jax.random.normal(jax.random.key(2), (batch, 2, D))
  boxed = MLP().init(jax.random.key(0), x)  # the same params as `model`'s
  params = nn.unbox(boxed)["params"]
  step, hp_step = train_step(MLP(), MXFP8), train_step(model, None)
  want_params, want_loss, want_grads = jax.jit(step)(params, x, y)

  sh = shardings(mesh, boxed, mode)
  with jax.set_mesh(mesh):
    ps = jax.device_put(params, sh)
    xs, ys = (jax.device_put(a, NamedSharding(mesh, P("data", None, None))) for a in (x, y))
    mx_step = train_step(model, MXFP8)
    got_params, got_loss, got_grads = jax.jit(mx_step)(ps, xs, ys)
    hp_params, hp_loss, hp_grads = jax.jit(hp_step)(ps, xs, ys)
    ops = compiled_collectives(mx_step, ps, xs, ys)
    hp_ops = compiled_collectives(hp_step, ps, xs, ys)

  np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-6)
  assert float(got_loss) != float(hp_loss)  # MX ran: fc1 and fc2 are MX products
  with mxjax.autocast(recipe=MXFP8):
    assert count_mx_products(MLP().apply, {"params": params}, x) == 2
  for (path, g), want, hp_g, param in zip(jax.tree_util.tree_leaves_with_path(got_grads),
                                          jax.tree.leaves(want_grads), jax.tree.leaves(hp_grads),
                                          jax.tree.leaves(ps)):
    where = jax.tree_util.keystr(path)
    assert_grads_close(g, want, err_msg=where)  # the same products, summed in another order
    # A gradient is sharded as the high-precision one; on Explicit meshes as its param.
    assert spec_of(g) == spec_of(hp_g), (where, g.sharding, hp_g.sharding)
    if kind == "explicit":
      assert spec_of(g) == spec_of(param), (where, g.sharding)
  for got, hp in zip(jax.tree.leaves(got_params), jax.tree.leaves(hp_params)):
    assert spec_of(got) == spec_of(hp)
  if batch > 2:  # whole blocks on every device: the high-precision step's collectives
    # (FSDP: the weight moves once, in high precision, before its two quantizations)
    assert_collectives_within(ops, hp_ops, exact=True)
  else:  # a row per device: the rows of each product's activation and output gradient
    # (f32 [M, D] and [M, H], both GEMMs) may be gathered for the quantization along them
    assert_collectives_within(ops, hp_ops, row_gathers=2 * 4 * x.shape[0] * 2 * (D + H))


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_quantized_kernels_keep_their_logical_axes_and_run_fsdp(kind):
  model = MLP()
  x = jax.random.normal(jax.random.key(3), (64, D))
  with mxjax.quantized_model_init(recipe=MXFP8, for_training=True):
    boxed = model.init(jax.random.key(0), x)
    dense_general = mxjax.DenseGeneral((4, 8), axis=(-2, -1), kernel_axes=("a", "b", "c", "d"))
    boxed_general = dense_general.init(jax.random.key(0), jnp.zeros((2, 4, 64)))
  kernels = mxjax.linen.QUANTIZED_KERNELS  # frozen: outside "params"
  assert "kernel" not in boxed["params"]["fc1"]
  specs = nn.get_partition_spec(boxed)
  specs = {col: specs[col] for col in ("params", kernels)}
  # One spec per array (data and scales of each copy); no mesh here to check them against.
  assert jax.tree.leaves(specs[kernels]["fc1"]["kernel"]) == [P("embed", "mlp")] * 4
  assert jax.tree.leaves(specs[kernels]["fc2"]["kernel"]) == [P("mlp", "embed")] * 4
  # The 2-D form [4 * 64, 4 * 8] keeps the axes of the leading in and feature dims.
  assert jax.tree.leaves(nn.get_partition_spec(boxed_general)[kernels]["kernel"]) == [
      P("a", "c")] * 4
  params = {col: nn.unbox(boxed)[col] for col in ("params", kernels)}
  assert isinstance(params[kernels]["fc2"]["kernel"][0], mxjax.MXArray)
  mesh = make_mesh(kind)
  # FSDP of fc1's kernel (contraction over 'data'), fc2's replicated.
  sh = nn.logical_to_mesh_sharding(specs, mesh, (("embed", "data"),))
  for col in sh:
    sh[col]["fc2"] = jax.tree.map(lambda _: NamedSharding(mesh, P()), sh[col]["fc2"])
  apply = lambda p, x: model.apply(p, x)  # noqa: E731
  with mxjax.autocast(recipe=MXFP8):
    want = jax.jit(apply)(params, x)
    with jax.set_mesh(mesh):
      ps = jax.device_put(params, nn.unbox(sh))  # the boxes of the specs are gone too
      xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
      got = jax.jit(apply)(ps, xs)
      grad_x = jax.jit(jax.grad(lambda x: jnp.sum(apply(ps, x) ** 2)))(xs)
    want_grad_x = jax.grad(lambda x: jnp.sum(apply(params, x) ** 2))(x)
  fc1_along_k = ps[kernels]["fc1"]["kernel"][0]  # [D, H] sharded over 'data' on D: whole blocks
  assert spec_of(fc1_along_k.data) == ("data", None)
  assert spec_of(fc1_along_k.scales) == ("data", None)
  assert spec_of(got)[0] == "data"
  np.testing.assert_array_equal(bits(got), bits(want))
  assert_grads_close(grad_x, want_grad_x)


def test_nnx_linear_takes_out_sharding_like_flax_nnx_linear():
  from flax import nnx
  mesh = make_mesh("explicit")
  x = jax.random.normal(jax.random.key(4), (64, 256))
  model = mxjax.nnx.Linear(256, 128, rngs=nnx.Rngs(0))
  with mxjax.autocast(recipe=MXFP8):
    want = model(x)
    with jax.set_mesh(mesh):  # TP-row: the contraction is sharded, as jnp.dot asks
      model.kernel.set_value(jax.sharding.reshard(model.kernel.get_value(), P("model", None)))
      xs = jax.device_put(x, P("data", "model"))
      got = nnx.jit(lambda m, x: m(x, out_sharding=P("data", None)))(model, xs)
  assert spec_of(got) == ("data", None)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recipe", [mxjax.DelayedScaling(), mxjax.Float8CurrentScaling()],
                         ids=lambda r: type(r).__name__)
def test_per_tensor_fp8_dense_takes_out_sharding_on_an_explicit_mesh(recipe):
  """TP-row with per-tensor FP8: the contraction is sharded, so the layer takes the output
  sharding as `lax.dot_general` does; the amaxes are global, so the scales, the output
  and the DelayedScaling state are one device's, and the gradients are typed as their
  operands."""
  mesh = make_mesh("explicit")
  layer = mxjax.Dense(128)
  x = jax.random.normal(jax.random.key(5), (64, 256))
  with mxjax.autocast(recipe=recipe):
    variables = layer.init(jax.random.key(0), x)

    def loss(params, state, x, out_sharding=None):
      y, new = layer.apply({"params": params, **state}, x, out_sharding=out_sharding,
                           mutable=list(state))
      return jnp.sum(jnp.square(y.astype(jnp.float32))), (y, new)

    params, state = variables["params"], {k: v for k, v in variables.items() if k != "params"}
    grad = jax.grad(loss, argnums=(0, 2), has_aux=True)
    (want_dw, want_dx), (want, want_state) = jax.jit(grad)(params, state, x)
    with jax.set_mesh(mesh):
      ps = {"kernel": jax.device_put(params["kernel"], P("model", None)),
            "bias": jax.device_put(params["bias"], P())}
      xs = jax.device_put(x, P("data", "model"))
      (dw, dx), (got, got_state) = jax.jit(
          lambda p, s, x: grad(p, s, x, out_sharding=P("data", None)))(ps, state, xs)
  assert spec_of(got) == ("data", None)
  assert spec_of(dx) == ("data", "model") and spec_of(dw["kernel"]) == ("model", None)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert_grads_close(dx, want_dx)
  assert_grads_close(dw["kernel"], want_dw["kernel"])
  assert jax.tree.structure(got_state) == jax.tree.structure(want_state)
  for a, b in zip(jax.tree.leaves(got_state), jax.tree.leaves(want_state)):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  if isinstance(recipe, mxjax.DelayedScaling):  # the amaxes were recorded
    assert jax.tree.leaves(got_state) and any(
        bool(jnp.any(a != b)) for a, b in zip(jax.tree.leaves(got_state),
                                               jax.tree.leaves(state)))
