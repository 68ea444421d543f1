"""mxjax.state: init / update of DelayedScaling state, the gradient-overwrite convention
(mxjax.fp8), the mutable-collection convention, TrainState, and amax reduction."""

import contextlib

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT
from flax.training.train_state import TrainState
from jax.sharding import PartitionSpec as P

from mxjax import linen as mxl
from mxjax._src import state as state_lib
from mxjax._src import context, fp8
from mxjax._src.recipes import DelayedScaling, Float8CurrentScaling, Format, MXFP8BlockScaling
from mx_products import count_mx_products

DIMS = (((1,), (0,)), ((), ()))


def test_init_delayed_and_stateless():
  s = state_lib.init(DelayedScaling(amax_history_len=8))
  assert s.kind == "DelayedScaling" and set(s.tensors) == {"input", "kernel", "grad"}
  for t in s.tensors.values():
    assert t.amax_history.shape == (8,) and t.amax_history.dtype == jnp.float32
    assert t.scale.shape == () and float(t.scale) == 1.0
  for recipe in (MXFP8BlockScaling(), Float8CurrentScaling(), None):
    s = state_lib.init(recipe)
    assert jax.tree.leaves(s) == [] and s.kind == state_lib.kind_of(recipe)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 2])
def test_update_rolls_history_and_sets_scale(algo, margin):
  recipe = DelayedScaling(amax_history_len=3, amax_compute_algo=algo, margin=margin)
  s = state_lib.init(recipe)
  amaxes = [4.0, 1.0, 2.0, 0.5]
  expected_history = [[4, 0, 0], [1, 4, 0], [2, 1, 4], [0.5, 2, 1]]
  update = jax.jit(state_lib.update, static_argnums=2)
  for amax, history in zip(amaxes, expected_history):
    s = update(s, {"input": amax, "grad": amax}, recipe)
    np.testing.assert_array_equal(s.tensors["input"].amax_history, history)
    ref = max(history) if algo == "max" else history[0]
    assert float(s.tensors["input"].scale) == pytest.approx(448.0 / ref / 2 ** margin)
    assert float(s.tensors["grad"].scale) == pytest.approx(57344.0 / ref / 2 ** margin)
    np.testing.assert_array_equal(s.tensors["kernel"].amax_history, [0, 0, 0])  # not given
    assert float(s.tensors["kernel"].scale) == 1.0


def test_update_keeps_scale_for_zero_or_nonfinite_amax():
  recipe = DelayedScaling(amax_history_len=2, amax_compute_algo="most_recent")
  s = state_lib.update(state_lib.init(recipe), {"input": 2.0}, recipe)
  for bad in (0.0, jnp.inf, jnp.nan):
    s2 = state_lib.update(s, {"input": bad}, recipe)
    assert float(s2.tensors["input"].scale) == 224.0


def test_update_refuses_another_kind():
  with pytest.raises(ValueError, match="made for MXFP8BlockScaling"):
    state_lib.update(state_lib.init(MXFP8BlockScaling()), {}, DelayedScaling())


def test_fp8_dot_gradient_is_the_next_state():
  """Gradient overwrite: d(loss)/d(state) is the state with the input, kernel and
  output-gradient amaxes recorded and the scales the recipe gives."""
  recipe = DelayedScaling(amax_history_len=4)
  x = jax.random.normal(jax.random.key(0), (8, 64))
  w = jax.random.normal(jax.random.key(1), (64, 16)) * 0.1
  tensors = state_lib.init(recipe).tensors

  def loss(x, w, tensors):
    return 3.0 * fp8.dot_general(x, w, DIMS, recipe, tensors)[0].sum()

  new = jax.grad(loss, argnums=2)(x, w, tensors)
  for role, amax in (("input", jnp.max(jnp.abs(x))), ("kernel", jnp.max(jnp.abs(w))),
                     ("grad", 3.0)):
    np.testing.assert_allclose(new[role].amax_history, [amax, 0, 0, 0], rtol=1e-6)
    limit = 57344.0 if role == "grad" else 448.0
    np.testing.assert_allclose(new[role].scale, limit / amax, rtol=1e-6)


@pytest.mark.parametrize("recipe", [DelayedScaling(), Float8CurrentScaling()],
                         ids=["delayed", "current"])
def test_per_tensor_fp8_runs_the_one_block_scaled_product(recipe):
  """Per-tensor FP8 is a thin layer over mxjax's one product (its custom VJP and config),
  not a product of its own."""
  x, w = jnp.ones((8, 64)), jnp.ones((64, 16))
  tensors = state_lib.init(recipe).tensors or None
  assert count_mx_products(lambda x, w: fp8.dot_general(x, w, DIMS, recipe, tensors)[0],
                           x, w) == 1


def test_fp8_dot_uses_the_state_scale():
  """A scale that makes every input saturate changes the result: the state is used."""
  recipe = DelayedScaling(amax_history_len=1)
  x = jnp.full((2, 32), 2.0)
  w = jnp.ones((32, 4))
  tensors = state_lib.init(recipe).tensors
  out, _ = fp8.dot_general(x, w, DIMS, recipe, tensors)
  np.testing.assert_allclose(out, 64.0)
  tensors = dict(tensors, input=state_lib.TensorScaling(jnp.ones((1,)), jnp.float32(448.0),
                                                           jnp.float32(1.0)))
  out, _ = fp8.dot_general(x, w, DIMS, recipe, tensors)
  np.testing.assert_allclose(out, 32.0)  # 2 * 448 saturates to 448, / 448 = 1 per element


@pytest.mark.parametrize("margin", [0, 2])
def test_fp8_dot_roles_with_no_amax_recorded_scale_from_their_own(margin):
  """A fresh state (nothing recorded: the unit scales would flush this product's tiny
  gradients to zero and saturate its input) gives Float8CurrentScaling's product and
  gradients, bit for bit."""
  x = 1000.0 * jax.random.normal(jax.random.key(0), (8, 64))  # saturates E4M3 at scale 1
  w = jax.random.normal(jax.random.key(1), (64, 16)) * 0.1
  delayed = DelayedScaling(amax_history_len=4, margin=margin)
  current = Float8CurrentScaling(margin=margin)

  def loss(recipe, tensors):
    def f(x, w):
      return 1e-9 * jnp.sum(fp8.dot_general(x, w, DIMS, recipe, tensors)[0] ** 2)
    return jax.value_and_grad(f, argnums=(0, 1))

  got = loss(delayed, state_lib.init(delayed).tensors)(x, w)
  want = loss(current, None)(x, w)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(a, b)
  assert np.all(np.asarray(got[1][1]) != 0)  # E5M2 at scale 1 flushed every one


def test_forward_only_state_updates_keep_small_gradients():
  """`apply(mutable=["mx_state"])` alone (as for batch_stats) records only the forward's
  amaxes; the gradient, with none recorded, scales from its own and is not flushed."""
  recipe = DelayedScaling(amax_history_len=4)
  model, variables, x = _dense_variables(recipe)
  params, st = variables["params"], variables["mx_state"]

  def loss(params, st, enabled):
    with context.autocast(enabled, recipe=recipe):
      y, mutated = model.apply({"params": params, "mx_state": st}, x, mutable=["mx_state"])
    return 1e-4 * jnp.mean(jnp.square(y - 1.0)), mutated["mx_state"]

  step = jax.jit(jax.grad(loss, has_aux=True), static_argnums=2)
  for _ in range(3):
    grads, st = step(params, st, True)
  np.testing.assert_array_equal(st["recipe_state"].tensors["grad"].amax_history, 0)
  want, _ = jax.grad(loss, has_aux=True)(params, st, False)  # high precision
  for name in ("kernel", "bias"):  # FP8 error (E5M2: 2 mantissa bits); flushed: 1.0
    error = np.linalg.norm(grads[name] - want[name]) / np.linalg.norm(want[name])
    assert error < 0.2, (name, error)


def _dense_variables(recipe, collection=state_lib.STATE_COLLECTION):
  x = jax.random.normal(jax.random.key(0), (4, 32))
  model = mxl.Dense(8, state_collection=collection)
  with context.autocast(recipe=recipe):
    variables = model.init(jax.random.key(1), x)
  return model, variables, x


@pytest.mark.parametrize("recipe", [Float8CurrentScaling(), DelayedScaling(amax_history_len=4)],
                         ids=["current", "delayed"])
def test_a_zero_size_batch_runs_as_in_stock_dense(recipe):
  """A batch of 0 rows: stock's empty output and zero kernel gradient, and a delayed state
  that stays finite (an empty tensor's amax is 0, as an all-zero tensor's)."""
  model, variables, x = _dense_variables(recipe)
  empty = x[:0]

  def loss(params, x):
    with context.autocast(recipe=recipe):
      y = model.apply({**variables, "params": params}, x)
    return jnp.sum(y), y

  grads, y = jax.grad(loss, has_aux=True)(variables["params"], empty)
  stock = nn.Dense(8).apply({"params": variables["params"]}, empty)
  assert y.shape == stock.shape == (0, 8)
  np.testing.assert_array_equal(grads["kernel"], np.zeros((32, 8)))
  if recipe.stateful():
    with context.autocast(recipe=recipe):
      _, mutated = model.apply(variables, empty, mutable=["mx_state"])
    for tensor in mutated["mx_state"]["recipe_state"].tensors.values():
      assert np.isfinite(tensor.scale).all() and np.isfinite(tensor.amax_history).all()


def test_mutable_apply_records_forward_amaxes():
  recipe = DelayedScaling(amax_history_len=4)
  model, variables, x = _dense_variables(recipe)
  with context.autocast(recipe=recipe):
    _, mutated = model.apply(variables, x, mutable=["mx_state"])
  s = mutated["mx_state"]["recipe_state"]
  assert float(s.tensors["input"].amax_history[0]) == pytest.approx(float(jnp.max(jnp.abs(x))))
  w = variables["params"]["kernel"]
  assert float(s.tensors["kernel"].amax_history[0]) == pytest.approx(float(jnp.max(jnp.abs(w))))
  np.testing.assert_array_equal(s.tensors["grad"].amax_history, 0)  # backward-only


def test_train_state_overwrite_with_gradient():
  """With the collection named OVERWRITE_WITH_GRADIENT, flax's TrainState advances the
  state from the gradient while optax updates only the params."""
  recipe = DelayedScaling(amax_history_len=5)
  model, variables, x = _dense_variables(recipe, OVERWRITE_WITH_GRADIENT)
  assert set(variables) == {"params", OVERWRITE_WITH_GRADIENT}
  ts = TrainState.create(apply_fn=model.apply, params=variables, tx=optax.sgd(0.1))

  @jax.jit
  def step(ts, x):
    grads = jax.grad(lambda v: jnp.sum(ts.apply_fn(v, x) ** 2))(ts.params)
    return ts.apply_gradients(grads=grads)

  with context.autocast(recipe=recipe):
    for _ in range(3):
      ts = step(ts, x)
  s = ts.params[OVERWRITE_WITH_GRADIENT]["recipe_state"]
  history = np.asarray(s.tensors["input"].amax_history)
  np.testing.assert_allclose(history[:3], float(jnp.max(jnp.abs(x))), rtol=1e-6)
  np.testing.assert_array_equal(history[3:], 0)
  assert np.all(np.asarray(s.tensors["grad"].amax_history[:3]) > 0)
  np.testing.assert_allclose(s.tensors["grad"].scale,
                             57344.0 / np.max(s.tensors["grad"].amax_history), rtol=1e-6)
  assert not np.allclose(ts.params["params"]["kernel"], variables["params"]["kernel"])


def _micro_batch_loss(model, how: str, n: int):
  """sum(y**2) of `model` over n copies of a batch, all in one differentiated loss: one
  batch, a lax.scan, a Python loop, or a vmap sharing the variables."""
  def one(variables, x):
    return jnp.sum(model.apply(variables, x) ** 2)

  def loss(variables, x):
    copies = jnp.stack([x] * n)
    if how == "scan":
      return jax.lax.scan(lambda total, xb: (total + one(variables, xb), None), 0.0, copies)[0]
    if how == "loop":
      return sum(one(variables, xb) for xb in copies)
    if how == "vmap":
      return jnp.sum(jax.vmap(one, in_axes=(None, 0))(variables, copies))
    return one(variables, x)
  return loss


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("how", ["scan", "loop", "vmap"])
def test_micro_batches_in_one_loss_advance_the_state_once(how, n):
  """A loss that applies the layer to n identical micro-batches. A scan or a loop: JAX sums
  the n next states into the overwrite, and step after step the state reads back (`settle`)
  as one step's record: the kernel's history as with one batch, the input's and the
  gradient's with the sum of the n (equal) amaxes. A vmap sharing the state records the
  max over the mapped axis: the one-batch state itself. The kernel gradient stays n times
  the one-batch gradient. Before, the scales were summed and the history multiplied by n
  every step."""
  recipe = DelayedScaling(amax_history_len=4)
  model, variables, x = _dense_variables(recipe)
  micro = jax.jit(jax.grad(_micro_batch_loss(model, how, n)))
  single = jax.jit(jax.grad(_micro_batch_loss(model, "single", 1)))
  micro_vars = single_vars = variables
  with context.autocast(recipe=recipe):
    for _ in range(6):  # params fixed: only the state advances
      g_micro, g_single = micro(micro_vars, x), single(single_vars, x)
      want_kernel = n * g_single["params"]["kernel"]  # up to the FP8 rounding of other scales
      error = jnp.linalg.norm(g_micro["params"]["kernel"] - want_kernel)
      assert error < 0.1 * jnp.linalg.norm(want_kernel)
      micro_vars = {**variables, "mx_state": g_micro["mx_state"]}
      single_vars = {**variables, "mx_state": g_single["mx_state"]}
  summed = micro_vars["mx_state"]["recipe_state"]
  want = single_vars["mx_state"]["recipe_state"].tensors
  uses = 1 if how == "vmap" else n
  assert float(summed.tensors["grad"].uses) == uses
  got = state_lib.settle(summed, recipe).tensors
  for name in ("amax_history", "scale", "uses"):
    np.testing.assert_allclose(getattr(got["kernel"], name), getattr(want["kernel"], name),
                               rtol=1e-6)
  np.testing.assert_allclose(got["input"].amax_history, uses * want["input"].amax_history,
                             rtol=1e-6)
  np.testing.assert_allclose(got["grad"].amax_history, uses * want["grad"].amax_history,
                             rtol=0.05)
  np.testing.assert_allclose(got["input"].scale, want["input"].scale / uses, rtol=1e-6)


def test_per_example_nn_vmap_with_a_broadcast_state_records_the_whole_batch():
  """`nn.vmap` over the examples with `variable_axes={"params": None, "mx_state": None}`:
  the forward record and the gradient overwrite are the whole batch's (input and kernel
  bit for bit). Before, vmap refused the batched record in the broadcast collection."""
  recipe = DelayedScaling(amax_history_len=4)
  model, variables, x = _dense_variables(recipe)
  per_example = nn.vmap(mxl.Dense, in_axes=0, out_axes=0, split_rngs={"params": False},
                        variable_axes={"params": None, state_lib.STATE_COLLECTION: None})(8)
  with context.autocast(recipe=recipe):
    records = [m.apply(variables, x, mutable=[state_lib.STATE_COLLECTION])[1]
               for m in (per_example, model)]
    overwrites = [jax.grad(lambda v, m=m: jnp.sum(m.apply(v, x) ** 2))(variables)
                  for m in (per_example, model)]
  for got, want in (records, overwrites):
    got, want = (t[state_lib.STATE_COLLECTION]["recipe_state"].tensors for t in (got, want))
    for role in ("input", "kernel"):
      for a, b in zip(jax.tree.leaves(got[role]), jax.tree.leaves(want[role]), strict=True):
        np.testing.assert_array_equal(a, b)
    assert float(got["grad"].uses) == 1


class _Twice(nn.Module):
  """One layer called on its own output (weight sharing): `d(d(x))`."""
  stock: bool

  @nn.compact
  def __call__(self, x, twice: bool = True):
    d = (nn.Dense if self.stock else mxl.Dense)(32, kernel_init=nn.initializers.normal(1.0))
    return d(d(x)) if twice else d(x)


def _recipe_states(collection) -> list:
  return jax.tree.leaves(collection, is_leaf=lambda t: isinstance(t, state_lib.RecipeState))


@pytest.mark.parametrize("stock", [True, False], ids=["intercepted nn.Dense", "mxjax.Dense"])
def test_a_layer_called_on_its_own_output_scales_each_call_from_the_steps_state(stock):
  """`d(d(x))` under DelayedScaling, the second input about 6 times the first's amax. Each
  call runs on the state the step started with: from a fresh state each scales from its
  own amax (bit for bit Float8CurrentScaling's forward); the forward record holds the
  larger amax, the overwrite both calls (2 uses); over steps the output stays as close to
  high precision as current scaling's. Before, the second call took the first call's scale
  and saturated (67% error), step after step."""
  hybrid = dict(fp8_format=Format.HYBRID)
  model, x = _Twice(stock), jax.random.normal(jax.random.key(0), (4, 32))
  delayed = DelayedScaling(amax_history_len=4, **hybrid)
  intercepted = mxl.intercept if stock else contextlib.nullcontext
  with context.autocast(recipe=delayed), intercepted():
    variables = model.init(jax.random.key(1), x)
  params = {"params": variables["params"]}
  exact = model.apply(params, x)
  with context.autocast(recipe=Float8CurrentScaling(**hybrid)), intercepted():
    want, first = model.apply(params, x), model.apply(params, x, twice=False)

  def loss(p, s):
    out, mutated = model.apply({"params": p, "mx_state": s}, x, mutable=["mx_state"])
    return jnp.sum(out ** 2), (out, mutated["mx_state"])

  step = jax.jit(jax.grad(loss, argnums=1, has_aux=True))
  state = variables["mx_state"]
  with context.autocast(recipe=delayed), intercepted():
    for i in range(4):
      grads, (out, mutated) = step(variables["params"], state)
      if i == 0:
        np.testing.assert_array_equal(out, want)
        (record,), (overwrite,) = _recipe_states(mutated), _recipe_states(grads)
        amaxes = float(jnp.max(jnp.abs(x))), float(jnp.max(jnp.abs(first)))
        assert amaxes[1] > 4 * amaxes[0]
        assert float(record.tensors["input"].amax_history[0]) == max(amaxes)
        assert float(overwrite.tensors["input"].uses) == 2
        np.testing.assert_allclose(overwrite.tensors["input"].amax_history[0], sum(amaxes),
                                   rtol=1e-6)
      state = state_lib.next_state(grads, mutated)
  error = lambda y: float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact))  # noqa: E731
  assert error(out) < 2 * error(want) < 0.2


def test_next_state_takes_the_record_where_the_gradient_has_no_state():
  """A stock-initialized model (no `mx_state`) applied with the collection mutable, as the
  error of an immutable first apply advises: the gradient of the empty state is {}, and
  `next_state` takes the state the forward made; the next step's takes the gradient (it
  raised a pytree-structure error)."""
  model, x = nn.Dense(8), jax.random.normal(jax.random.key(0), (4, 32))
  params = model.init(jax.random.key(1), x)["params"]

  def loss(p, s):
    out, mutated = model.apply({"params": p, "mx_state": s}, x, mutable=["mx_state"])
    return jnp.sum(out ** 2), mutated["mx_state"]

  step = jax.grad(loss, argnums=1, has_aux=True)
  with context.autocast(recipe=DelayedScaling(amax_history_len=4)), mxl.intercept():
    grads, mutated = step(params, {})
    assert grads == {}
    state = state_lib.next_state(grads, mutated)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(mutated), strict=True):
      np.testing.assert_array_equal(a, b)
    grads, mutated = step(params, state)
  (advanced,) = _recipe_states(state_lib.next_state(grads, mutated))
  (want,) = _recipe_states(grads)
  for a, b in zip(jax.tree.leaves(advanced), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(a, b)
  assert float(advanced.tensors["grad"].amax_history[0]) > 0


class _Recurrent(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.RNN(nn.LSTMCell(16), variable_broadcast=("params", "mx_state"))(x)


def test_a_recurrent_cell_shares_one_state_over_its_time_steps():
  """A stock `nn.RNN(nn.LSTMCell)` (a scan over 5 time steps) under `intercept`, its state
  broadcast like its params and advanced by the gradient overwrite: every GEMM's overwrite
  holds 5 uses, one per time step, and over steps the output stays as close to high
  precision as current scaling's."""
  hybrid = dict(fp8_format=Format.HYBRID)
  model, x = _Recurrent(), jax.random.normal(jax.random.key(0), (2, 5, 8))
  delayed = DelayedScaling(amax_history_len=4, **hybrid)
  with context.autocast(recipe=delayed), mxl.intercept():
    variables = model.init(jax.random.key(1), x)
  params = {"params": variables["params"]}
  exact = model.apply(params, x)
  with context.autocast(recipe=Float8CurrentScaling(**hybrid)), mxl.intercept():
    current = model.apply(params, x)

  def loss(s):
    out = model.apply({**params, "mx_state": s}, x)
    return jnp.sum(out ** 2), out

  step = jax.jit(jax.grad(loss, has_aux=True))
  state = variables["mx_state"]
  with context.autocast(recipe=delayed), mxl.intercept():
    for _ in range(4):
      state, out = step(state)
  states = _recipe_states(state)
  assert len(states) == 8 and all(float(s.tensors["input"].uses) == 5 for s in states)
  error = lambda y: float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact))  # noqa: E731
  assert error(out) < 2 * error(current) < 0.2


def test_an_ensembles_overwrite_keeps_its_members_apart():
  """An ensemble under `jax.vmap` (params, state and input all mapped) whose members see
  inputs 10^4 apart: each member's next state equals the one it gets alone, bit for bit,
  step after step. Before, the backward read its state settled (`uses` unmapped) and took
  each amax's max over the members: the smallest member's scales fell 10^4 times short."""
  recipe = DelayedScaling(amax_history_len=4)
  model, variables, x = _dense_variables(recipe)
  xs = jnp.stack([x * 0.01, x, x * 100])

  def step(variables, x):
    grads = jax.grad(lambda v: jnp.sum(model.apply(v, x) ** 2))(variables)
    return {**variables, "mx_state": grads["mx_state"]}

  members = jax.tree.map(lambda a: jnp.stack([a] * 3), variables)
  alone = [variables] * 3
  with context.autocast(recipe=recipe):
    for _ in range(3):
      members = jax.jit(jax.vmap(step))(members, xs)
      alone = [jax.jit(step)(v, xi) for v, xi in zip(alone, xs)]
  for i, v in enumerate(alone):
    for a, b in zip(jax.tree.leaves(v["mx_state"]),
                    jax.tree.leaves(members["mx_state"]), strict=True):
      np.testing.assert_array_equal(a, b[i])


@pytest.mark.parametrize("mutable", [False, True], ids=["overwrite", "forward record"])
def test_nested_per_example_vmaps_of_a_shared_layer_record_the_whole_batch(mutable):
  """Two nested `jax.vmap`s over a batch [2, 4, ...] sharing one state: the overwrite (and
  the forward record) is the one call on the whole batch gives. Before, the outer axis was
  summed (a scale twice too small), or the record was refused."""
  recipe = DelayedScaling(amax_history_len=4)
  model, variables, x = _dense_variables(recipe)
  x = jax.random.normal(jax.random.key(2), (2, 4, 32)) * jnp.arange(1, 9).reshape(2, 4, 1)

  def loss(v, x):
    if mutable:
      y, mutated = model.apply(v, x, mutable=["mx_state"])
      return jnp.sum(y ** 2), mutated["mx_state"]
    return jnp.sum(model.apply(v, x) ** 2), {}

  def nested(v):
    one = lambda xi: loss(v, xi[None])  # noqa: E731
    losses, records = jax.vmap(jax.vmap(one))(x)
    return jnp.sum(losses), records

  with context.autocast(recipe=recipe):
    (grads, got), (want_grads, want) = (
        jax.grad(nested, has_aux=True)(variables),
        jax.grad(lambda v: loss(v, x.reshape(8, 1, 32)), has_aux=True)(variables))
  pairs = [(grads["mx_state"], want_grads["mx_state"])] + ([(got, want)] if mutable else [])
  for got_state, want_state in pairs:
    for a, b in zip(_recipe_states(got_state), _recipe_states(want_state), strict=True):
      for role in ("input", "kernel"):
        for name in ("amax_history", "scale", "uses"):
          got_leaf, want_leaf = getattr(a.tensors[role], name), getattr(b.tensors[role], name)
          # vmap's out_axes=0 repeats the (one) record per example
          np.testing.assert_array_equal(got_leaf, jnp.broadcast_to(want_leaf, got_leaf.shape))


class _WithHead(nn.Module):
  @nn.compact
  def __call__(self, x, head: bool = True):
    x = mxl.Dense(16, name="body")(x)
    return mxl.Dense(4, name="head")(x) if head else x


def test_next_state_keeps_the_state_of_a_layer_the_step_skipped():
  """A step that skips a layer (an auxiliary head, layer drop) gives it a zero gradient
  (`uses` 0): `next_state` keeps its state as the step found it, and advances the rest.
  Before, it stored the zeros: the history lost and a scale of 0."""
  recipe = DelayedScaling(amax_history_len=4)
  model, x = _WithHead(), jax.random.normal(jax.random.key(0), (4, 32))

  def loss(s, head):
    out, mutated = model.apply({**params, "mx_state": s}, x, head, mutable=["mx_state"])
    return jnp.sum(out ** 2), mutated["mx_state"]

  with context.autocast(recipe=recipe):
    variables = model.init(jax.random.key(1), x)
    params = {"params": variables["params"]}
    state = variables["mx_state"]
    for head in (True, True, False):
      before = state
      state = state_lib.next_state(*jax.grad(loss, has_aux=True)(state, head))
  for a, b in zip(jax.tree.leaves(state["head"]), jax.tree.leaves(before["head"]),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  head = state["head"]["recipe_state"].tensors
  assert float(head["input"].scale) > 0 and float(head["input"].amax_history[1]) > 0
  body, body_before = (s["body"]["recipe_state"].tensors["input"] for s in (state, before))
  np.testing.assert_array_equal(body.amax_history[1:], body_before.amax_history[:-1])


def test_settle_reads_a_sum_of_uses_as_one():
  """Three next states of one state, summed: the older entries come back exactly; the
  kernel's newest amax is their mean (the same kernel in every use), the input's their sum
  (at least the largest); the scale follows that history. The sum scaled by 2^-20 (as a
  gradient tree can be) reads the same, up to the newest input amax (then the mean); a
  stacked state settles per layer; one use is left as it is."""
  recipe = DelayedScaling(amax_history_len=3, amax_compute_algo="most_recent")
  start = state_lib.update(state_lib.init(recipe), {"input": 8.0, "kernel": 8.0}, recipe)
  uses = [state_lib.update(start, {"input": a, "kernel": a}, recipe) for a in (1.0, 2.0, 6.0)]
  summed = jax.tree.map(lambda *t: sum(t), *uses)
  got = state_lib.settle(summed, recipe).tensors
  np.testing.assert_array_equal(got["input"].amax_history, [9.0, 8.0, 0.0])
  np.testing.assert_array_equal(got["kernel"].amax_history, [3.0, 8.0, 0.0])
  assert float(got["input"].scale) == pytest.approx(448.0 / 9.0, rel=1e-6)
  assert float(got["kernel"].scale) == pytest.approx(448.0 / 3.0, rel=1e-6)
  assert all(float(t.uses) == 1.0 for t in got.values())
  scaled = state_lib.settle(jax.tree.map(lambda t: t * 2.0 ** -20, summed), recipe).tensors
  np.testing.assert_allclose(scaled["input"].amax_history, [3.0, 8.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(scaled["kernel"].amax_history, [3.0, 8.0, 0.0], rtol=1e-6)
  stacked = state_lib.settle(jax.tree.map(lambda a, b: jnp.stack([a, b]), summed, uses[0]),
                             recipe)
  for layer, want in enumerate((state_lib.settle(summed, recipe), uses[0])):
    for a, b in zip(jax.tree.leaves(stacked), jax.tree.leaves(want), strict=True):
      np.testing.assert_array_equal(a[layer], b)
  one = state_lib.settle(uses[1], recipe)  # a single use is left as it is
  assert jax.tree.all(jax.tree.map(np.array_equal, one, uses[1]))


def test_state_of_an_unused_recipe_survives_gradient_overwrite():
  """Autocast off: the DelayedScaling state is not advanced, and its gradient is itself
  (not zeros), so overwriting with the gradient keeps it."""
  recipe = DelayedScaling(amax_history_len=2)
  model, variables, x = _dense_variables(recipe)
  grads = jax.grad(lambda v: model.apply(v, x).sum())(variables)
  assert jax.tree.all(jax.tree.map(np.array_equal, grads["mx_state"], variables["mx_state"]))


def test_reduce_amax_over_bound_named_axes():
  """Inside a named axis (vmap / shard_map / pmap), the amax is the max over all of it;
  under plain jit the array is global already."""
  recipe = DelayedScaling()
  x = jnp.arange(12.0).reshape(3, 4) - 5.0
  per_row = jax.vmap(lambda r: state_lib.tensor_amax(r, recipe), axis_name="data")(x)
  np.testing.assert_array_equal(per_row, [6.0, 6.0, 6.0])
  local = jax.vmap(lambda r: state_lib.tensor_amax(r, DelayedScaling(reduce_amax=False)),
                   axis_name="data")(x)
  np.testing.assert_array_equal(local, [5.0, 2.0, 6.0])
  assert float(jax.jit(state_lib.tensor_amax, static_argnums=1)(x, recipe)) == 6.0


@pytest.mark.parametrize("reduce_amax", [True, False])
def test_current_scaling_ensemble_under_a_named_vmap(reduce_amax):
  """Float8CurrentScaling over a named vmap axis (an ensemble): members share the amax by
  default; with reduce_amax=False each member's product is its product run alone."""
  recipe = Float8CurrentScaling(reduce_amax=reduce_amax)
  xs = jax.random.normal(jax.random.key(0), (2, 8, 64)) * jnp.array([1.0, 300.0])[:, None, None]
  w = jax.random.normal(jax.random.key(1), (64, 16))
  product = lambda x: fp8.dot_general(x, w, DIMS, recipe)[0]  # noqa: E731
  ensemble = jax.vmap(product, axis_name="member")(xs)
  alone = jnp.stack([product(x) for x in xs])
  np.testing.assert_array_equal(ensemble[1], alone[1])  # the larger amax: the same either way
  assert np.array_equal(ensemble[0], alone[0]) == (not reduce_amax)


@pytest.mark.parametrize("private_core", [True, False], ids=["core", "public-fallback"])
def test_reduce_amax_over_shard_map_axes(monkeypatch, private_core):
  """Inside shard_map over a 2-D jax.make_mesh, the amax is the max over the mapped axes only;
  also when jax's private axis listing is gone (the public abstract-mesh fallback)."""
  if not private_core:
    def gone():
      raise ImportError("no private axis listing")
    monkeypatch.setattr(state_lib, "_core_axis_names", gone)
  mesh = jax.make_mesh((2, 4), ("data", "model"))
  x = jnp.arange(32.0).reshape(8, 4) - 20.0  # |x| largest (20) in row 0
  amax = jax.jit(jax.shard_map(lambda s: state_lib.tensor_amax(s, DelayedScaling())[None],
                               mesh=mesh, in_specs=P("data"), out_specs=P("data"),
                               axis_names={"data"}))(x)
  np.testing.assert_array_equal(amax, [20.0, 20.0])
  per_shard = jnp.max(jnp.abs(x).reshape(2, 16), axis=1)  # without the reduction: 20, 11
  assert not np.array_equal(per_shard, amax)


def test_describe_lists_every_gemm():
  class Two(nn.Module):

    @nn.compact
    def __call__(self, x):
      return mxl.Dense(4, name="b")(mxl.Dense(8, name="a")(x))

  with context.autocast(recipe=DelayedScaling(amax_history_len=2)):
    variables = Two().init(jax.random.key(0), jnp.ones((2, 32)))
  assert state_lib.describe(variables) == {"mx_state/a/recipe_state": "DelayedScaling",
                                           "mx_state/b/recipe_state": "DelayedScaling"}


def test_state_restored_without_a_target_is_named():
  """A checkpoint restored as plain dicts lost each RecipeState's kind: the error says so
  and how to restore; restoring into the initialized variables gives the same state."""
  model, x = nn.Dense(32), jnp.ones((4, 64))
  with context.autocast(recipe=DelayedScaling()), mxl.intercept():
    variables = model.init(jax.random.key(0), x)
    restored = flax.serialization.msgpack_restore(flax.serialization.to_bytes(variables))
    with pytest.raises(TypeError, match="is a dict, not a mxjax.state.RecipeState.*target"):
      model.apply(restored, x, mutable=["mx_state"])
    into_target = flax.serialization.from_state_dict(variables, restored)
    assert jax.tree.structure(into_target) == jax.tree.structure(variables)
    out, _ = model.apply(into_target, x, mutable=["mx_state"])
    expected, _ = model.apply(variables, x, mutable=["mx_state"])
    np.testing.assert_array_equal(out, expected)


def test_lifted_transform_without_the_state_collection_is_named():
  """nn.scan whose variable_axes omit the state collection: the error points there."""
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      return x + nn.Dense(64)(x), None

  class Stack(nn.Module):
    @nn.compact
    def __call__(self, x):
      scan = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
      return scan()(x, None)[0]

  with context.autocast(recipe=DelayedScaling()), mxl.intercept():
    with pytest.raises(ValueError, match="lifted transform.*variable_axes"):
      Stack().init(jax.random.key(0), jnp.ones((4, 64)))
