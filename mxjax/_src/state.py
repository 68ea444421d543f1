"""Recipe state as data: `init` / `update`, like optax (conventions: `mxjax.state`)."""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax
from jax.custom_batching import custom_vmap

from mxjax._src import export_pytrees, formats
from mxjax._src.recipes import Recipe

STATE_COLLECTION = "mx_state"
ROLES = ("input", "kernel", "grad")
#: The recipe kind of a state made outside any recipe (high precision).
HIGH_PRECISION = "HighPrecision"

__all__ = ["STATE_COLLECTION", "ROLES", "HIGH_PRECISION", "TensorScaling", "RecipeState",
           "init", "update", "settle", "next_state", "describe", "kind_of", "fp8_max",
           "scale_from_amax", "settle_tensor", "update_tensor", "tensor_amax", "reduce_amax"]


@struct.dataclass
class TensorScaling:
  """Delayed-scaling state of one tensor role.

  Attributes:
    amax_history: f32[amax_history_len], newest amax first.
    scale: f32[], the scale the next step quantizes with (`fp8 = cast(x * scale)`).
    uses: f32[], how many next states this one sums (N for a GEMM applied N times).
  """

  amax_history: jax.Array
  scale: jax.Array
  uses: jax.Array


@struct.dataclass
class RecipeState:
  """State of one quantized GEMM.

  Attributes:
    tensors: role -> TensorScaling for DelayedScaling; empty for stateless recipes.
    kind: the recipe class name the state was made for (static, part of the treedef).
  """

  tensors: Mapping[str, TensorScaling]
  kind: str = struct.field(pytree_node=False)


export_pytrees.register(TensorScaling, "TensorScaling")
export_pytrees.register(RecipeState, "RecipeState")


def kind_of(recipe: Recipe | None) -> str:
  """The state kind of a recipe: its class name, or HIGH_PRECISION for None."""
  return HIGH_PRECISION if recipe is None else type(recipe).__name__


def init(recipe: Recipe | None) -> RecipeState:
  """The initial state: per role a zero amax history, unit scale, one use (DelayedScaling)."""
  tensors = {}
  if recipe is not None and recipe.delayed():
    one = jnp.ones((), jnp.float32)
    tensors = {role: TensorScaling(jnp.zeros((recipe.amax_history_len,), jnp.float32), one,
                                   one) for role in ROLES}
  return RecipeState(tensors=tensors, kind=kind_of(recipe))


def fp8_max(recipe: Recipe, role: str) -> float:
  """Largest finite value of the element format `recipe` uses for tensor `role`."""
  name = recipe.bwd_format if role == "grad" else recipe.fwd_format
  return formats.element_format(name).max


def scale_from_amax(amax, recipe: Recipe, role: str, previous_scale=1.0) -> jax.Array:
  """`fp8_max / amax / 2**margin` (f32[]); `previous_scale` where amax is 0 or not finite."""
  amax = jnp.asarray(amax, jnp.float32)
  scale = jnp.float32(fp8_max(recipe, role)) / amax / jnp.float32(2.0 ** recipe.margin)
  ok = (amax > 0) & jnp.isfinite(amax) & jnp.isfinite(scale)
  return jnp.where(ok, scale, jnp.asarray(previous_scale, jnp.float32))


def _reference_amax(history, recipe: Recipe) -> jax.Array:
  """The amax a scale is computed from: the history's max (`max`) or its newest entry."""
  return jnp.max(history, axis=-1) if recipe.amax_compute_algo == "max" else history[..., 0]


def settle_tensor(tensor: TensorScaling, recipe: Recipe, role: str) -> TensorScaling:
  """`tensor` as one use, its scale computed afresh from the history it then has.

  A state whose `uses` u is neither 1 nor 0 sums u next states: its history comes back
  divided by u, except the input's and the gradient's newest entry (the uses' amaxes
  summed, divided by u only where u < 1: at least the largest, so never a scale that
  saturates more). u 1 or 0 is read as it is; leading dims (`nn.scan`) are kept.
  """
  uses = tensor.uses
  several = (uses > 0) & (uses != 1)
  n = jnp.where(several, uses, 1.0)
  newest_n = n if role == "kernel" else jnp.minimum(n, 1.0)
  history = tensor.amax_history / n[..., None]
  history = history.at[..., 0].set(tensor.amax_history[..., 0] / newest_n)
  recomputed = scale_from_amax(_reference_amax(history, recipe), recipe, role,
                               tensor.scale / n)
  return TensorScaling(history, jnp.where(several, recomputed, tensor.scale),
                       jnp.ones_like(uses))


def update_tensor(tensor: TensorScaling, amax, recipe: Recipe, role: str) -> TensorScaling:
  """`tensor` settled, then `amax` (f32[]) recorded newest and the next scale computed."""
  tensor = settle_tensor(tensor, recipe, role)
  amax = jnp.asarray(amax, jnp.float32)
  history = jnp.concatenate([amax.reshape((1,)), tensor.amax_history[:-1]])
  scale = scale_from_amax(_reference_amax(history, recipe), recipe, role, tensor.scale)
  return TensorScaling(history, scale, _one_use_like(amax))


def _one_use_like(amax) -> jax.Array:
  """f32[] 1.0 batched under `vmap` where `amax` is (so a vmap's transpose sums uses)."""
  return jnp.where(jnp.isnan(amax), 1.0, 1.0).astype(jnp.float32)


def _check_kind(state: RecipeState, recipe: Recipe, what: str) -> None:
  if state.kind != kind_of(recipe):
    raise ValueError(f"mxjax.state.{what}: the state was made for {state.kind}, the recipe "
                     f"is {kind_of(recipe)}")


def settle(state: RecipeState, recipe: Recipe) -> RecipeState:
  """`state` with every role as one use (`settle_tensor`): the state a step reads, and what
  to inspect after a gradient overwrite. Stateless states are returned as they are.

  Args:
    state: a `RecipeState`, e.g. the sum of N next states of a gradient overwrite.
    recipe: the recipe the state was made for.

  Raises:
    ValueError: the state was made for another recipe kind.
  """
  _check_kind(state, recipe, "settle")
  if not state.tensors:
    return state
  tensors = {role: settle_tensor(t, recipe, role) for role, t in state.tensors.items()}
  return RecipeState(tensors=tensors, kind=state.kind)


def update(state: RecipeState, amaxes: Mapping[str, Any], recipe: Recipe) -> RecipeState:
  """The next state, as one use: each role in `amaxes` (role -> f32[]) recorded, the others
  settled (`settle`).

  Args:
    state: the `RecipeState` the step started with.
    amaxes: role ("input", "kernel", "grad") -> f32[] amax of this step.
    recipe: the recipe the state was made for.

  Raises:
    ValueError: the state was made for another recipe kind.

  Pure (jit- and grad-safe). Stateless states are returned as they are.
  """
  _check_kind(state, recipe, "update")
  if not state.tensors:
    return state
  tensors = {role: update_tensor(t, amaxes[role], recipe, role) if role in amaxes
             else settle_tensor(t, recipe, role) for role, t in state.tensors.items()}
  return RecipeState(tensors=tensors, kind=state.kind)


def forward_record(state: RecipeState, amaxes: Mapping[str, Any],
                   recipe: Recipe) -> RecipeState:
  """The state a forward call stores: `update` with its input and kernel amaxes (data)."""
  if not state.tensors:
    return state
  return lax.stop_gradient(update(state, batch_amaxes(amaxes, state), recipe))


def merge_records(start: RecipeState, earlier: RecipeState, later: RecipeState,
                  recipe: Recipe) -> RecipeState:
  """One forward record of two calls that both ran on `start`: the larger amaxes recorded."""
  if not start.tensors:
    return later
  amaxes = {role: jnp.maximum(earlier.tensors[role].amax_history[0],
                              later.tensors[role].amax_history[0])
            for role in ("input", "kernel")}
  return forward_record(start, amaxes, recipe)


def batch_amaxes(amaxes: Mapping[str, Any], state: RecipeState) -> dict:
  """`amaxes` (role -> f32[]), max-reduced over a `vmap` axis that maps them but not
  `state` (a shared layer under a per-example vmap)."""
  return {role: _unbatched_like(*lax.stop_gradient((amax, state.tensors[role])))
          for role, amax in amaxes.items()}


@custom_vmap
def _unbatched_like(amax, like):
  """`amax`; under `vmap` max-reduced where no array of `like` is mapped."""
  del like
  return amax


@_unbatched_like.def_vmap
def _unbatched_like_vmap(axis_size, in_batched, amax, like):
  del axis_size
  amax_batched, like_batched = in_batched
  if amax_batched and not any(jax.tree.leaves(like_batched)):
    # Called again, so that an enclosing vmap (a nested one) applies this rule too.
    return _unbatched_like(jnp.max(amax, axis=0), like), False
  return amax, amax_batched


def _core_axis_names() -> tuple:
  """Every named axis bound here (a named vmap's too), from `jax.extend.core`."""
  from jax.extend import core  # noqa: PLC0415
  return tuple(core.unsafe_get_axis_names_DO_NOT_USE())


def manual_mesh_axes() -> tuple:
  """The mesh axes bound here by shard_map or pmap (public API; not a named vmap's), or ()."""
  mesh = jax.sharding.get_abstract_mesh()
  return () if mesh.empty else tuple(getattr(mesh, "manual_axes", ()))


def bound_axis_names() -> tuple:
  """Named axes bound here (shard_map / pmap / named vmap), or (); `manual_mesh_axes`
  where `jax.extend.core` lacks the listing."""
  try:
    return _core_axis_names()
  except Exception:
    return manual_mesh_axes()


def reduce_amax(amax, recipe: Recipe) -> jax.Array:
  """`amax` max-reduced over all bound named axes when the recipe asks for it."""
  names = bound_axis_names()
  if names and getattr(recipe, "reduce_amax", True):
    amax = lax.pmax(amax, names)
  return amax


def tensor_amax(x, recipe: Recipe) -> jax.Array:
  """max(abs(x)) as f32[] (over all devices, see `reduce_amax`); 0 for an empty x."""
  return reduce_amax(jnp.max(jnp.abs(x), initial=0).astype(jnp.float32), recipe)


def step_scale(x, recipe: Recipe, role: str, tensor: TensorScaling | None = None):
  """(scale, amax), f32[] each, of `x` as tensor `role`: `tensor`'s scale once it has an
  amax recorded (DelayedScaling), else the scale of x's own amax."""
  amax = tensor_amax(x, recipe)
  current = scale_from_amax(amax, recipe, role)
  if tensor is None:
    return current, amax
  return jnp.where(jnp.any(tensor.amax_history > 0), tensor.scale, current), amax


def _is_state(x) -> bool:
  return isinstance(x, RecipeState)


def next_state(state_grads, mutated):
  """The state after a step that used both conventions.

  Args:
    state_grads: the gradient of the state collection (the gradient-overwrite update).
    mutated: the collection `apply(..., mutable=[...])` returned.

  Returns:
    `mutated`, each GEMM's state replaced by its gradient where that is of the same kind
    (not a state made in this step) and used (`uses` > 0).
  """
  flat = jax.tree_util.tree_flatten_with_path(state_grads, is_leaf=_is_state)[0]
  grads = {path: g for path, g in flat if _is_state(g)}

  def pick(path, m):
    g = grads.get(path)
    if not (_is_state(m) and g is not None and g.kind == m.kind):
      return m
    return RecipeState(tensors={role: _used_or(t, m.tensors[role])
                                for role, t in g.tensors.items()}, kind=g.kind)

  return jax.tree_util.tree_map_with_path(pick, mutated, is_leaf=_is_state)


def _used_or(grad: TensorScaling, kept: TensorScaling) -> TensorScaling:
  """`grad` where it holds a use (per layer of a stacked state), else `kept`."""
  used = grad.uses > 0
  return TensorScaling(jnp.where(used[..., None], grad.amax_history, kept.amax_history),
                       jnp.where(used, grad.scale, kept.scale),
                       jnp.where(used, grad.uses, kept.uses))


def describe(variables) -> dict[str, str]:
  """'module/path' -> recipe kind of every RecipeState in `variables` (any collection).

  Args:
    variables: any pytree, e.g. linen variables or one collection of them.

  Returns:
    e.g. `{"hidden/recipe_state": "DelayedScaling"}`.
  """
  out = {}
  flat = jax.tree_util.tree_flatten_with_path(variables, is_leaf=_is_state)[0]
  for path, leaf in flat:
    if _is_state(leaf):
      keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
      out["/".join(keys)] = leaf.kind
  return out
