"""Recipe state as data: `init(recipe)` / `update(state, amaxes, recipe)`, like optax.

Each quantized GEMM of a module owns a `RecipeState`: the recipe kind it was made for and,
per tensor role ("input", "kernel", "grad"), a `TensorScaling` (amax history and scale)
when the recipe needs one. Only `DelayedScaling` does; MX block scaling and current
scaling carry no arrays (their `RecipeState` has no leaves).

The modules keep it in the Flax variable collection `STATE_COLLECTION` ("mx_state"), and
advance it in two ways, both computed from the state the step started with:

- `apply(..., mutable=["mx_state"])`: the forward writes the state with the input and
  kernel amaxes recorded (the gradient's amax is not known in the forward). A module whose
  recipe kind changed writes the new recipe's initial state.
- Gradient overwrite (Flax's `OVERWRITE_WITH_GRADIENT` convention, as in
  `flax.linen.fp8_ops`): the gradient of the state variables *is* the next state, all three
  roles advanced. Name the collection `flax.linen.fp8_ops.OVERWRITE_WITH_GRADIENT`
  (`state_collection=` on the modules) and `flax.training.train_state.TrainState` applies
  it; or take `jax.grad` with respect to the state and use `next_state`.

Amax reduction: under plain `jax.jit` with sharded arrays `jnp.max` already sees the
global array, so the amax is global. Inside `shard_map` / `pmap` the amax is local;
with `reduce_amax=True` it is `lax.pmax`-ed over every bound named axis (`reduce_amax`).

Limitation: a module applied twice in one step gets the sum of two next states as its
gradient; share a module's kernel but not its state under DelayedScaling.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from mxjax import _export_pytrees, formats
from mxjax.recipes import Recipe

STATE_COLLECTION = "mx_state"
ROLES = ("input", "kernel", "grad")
#: The recipe kind of a state made outside any recipe (high precision).
HIGH_PRECISION = "HighPrecision"


@struct.dataclass
class TensorScaling:
  """Delayed-scaling state of one tensor role.

  Attributes:
    amax_history: f32[amax_history_len], newest amax first.
    scale: f32[], the scale the next step quantizes with (`fp8 = cast(x * scale)`).
  """

  amax_history: jax.Array
  scale: jax.Array


@struct.dataclass
class RecipeState:
  """State of one quantized GEMM.

  Attributes:
    tensors: role -> TensorScaling for DelayedScaling; empty for stateless recipes.
    kind: the recipe class name the state was made for (static, part of the treedef).
  """

  tensors: Mapping[str, TensorScaling]
  kind: str = struct.field(pytree_node=False)


_export_pytrees.register(TensorScaling, "TensorScaling")
_export_pytrees.register(RecipeState, "RecipeState")


def kind_of(recipe: Recipe | None) -> str:
  """The state kind of a recipe: its class name, or HIGH_PRECISION for None."""
  return HIGH_PRECISION if recipe is None else type(recipe).__name__


def init(recipe: Recipe | None) -> RecipeState:
  """The initial state for `recipe`: zero amax histories and unit scales for
  DelayedScaling (f32[amax_history_len] and f32[] per role), no arrays otherwise."""
  tensors = {}
  if recipe is not None and recipe.delayed():
    tensors = {role: TensorScaling(jnp.zeros((recipe.amax_history_len,), jnp.float32),
                                   jnp.ones((), jnp.float32)) for role in ROLES}
  return RecipeState(tensors=tensors, kind=kind_of(recipe))


def fp8_max(recipe: Recipe, role: str) -> float:
  """Largest finite value of the element format `recipe` uses for tensor `role`."""
  name = recipe.bwd_format if role == "grad" else recipe.fwd_format
  return formats.element_format(name).max


def scale_from_amax(amax, recipe: Recipe, role: str, previous_scale=1.0) -> jax.Array:
  """`fp8_max / amax / 2**margin` (f32[]); keeps `previous_scale` where amax is 0 or not
  finite."""
  amax = jnp.asarray(amax, jnp.float32)
  scale = jnp.float32(fp8_max(recipe, role)) / amax / jnp.float32(2.0 ** recipe.margin)
  ok = (amax > 0) & jnp.isfinite(amax) & jnp.isfinite(scale)
  return jnp.where(ok, scale, jnp.asarray(previous_scale, jnp.float32))


def update_tensor(tensor: TensorScaling, amax, recipe: Recipe, role: str) -> TensorScaling:
  """Records `amax` (f32[]) as the newest history entry (the oldest drops out) and
  computes the next scale from the history (`max`) or from its newest entry."""
  amax = jnp.asarray(amax, jnp.float32).reshape((1,))
  history = jnp.concatenate([amax, tensor.amax_history[:-1]])
  if recipe.amax_compute_algo == "max":
    reference = jnp.max(history)
  else:
    reference = history[0]
  return TensorScaling(history, scale_from_amax(reference, recipe, role, tensor.scale))


def update(state: RecipeState, amaxes: Mapping[str, Any], recipe: Recipe) -> RecipeState:
  """The next state: each role in `amaxes` (role -> f32[]) recorded; others unchanged.

  Pure: no side effects, jit- and grad-safe. Stateless states are returned as they are.
  """
  if state.kind != kind_of(recipe):
    raise ValueError(f"mxjax.state.update: the state was made for {state.kind}, the recipe "
                     f"is {kind_of(recipe)}")
  if not state.tensors:
    return state
  tensors = dict(state.tensors)
  for role, amax in amaxes.items():
    tensors[role] = update_tensor(tensors[role], amax, recipe, role)
  return RecipeState(tensors=tensors, kind=state.kind)


def _core_axis_names() -> tuple:
  """Every named axis bound here, from jax's private core: no public API lists those of a
  named vmap."""
  from jax._src import core
  return tuple(core.unsafe_get_axis_names())


def manual_mesh_axes() -> tuple:
  """The mesh axes bound here by shard_map or pmap (public API; not a named vmap's), or ()."""
  mesh = jax.sharding.get_abstract_mesh()
  return () if mesh.empty else tuple(getattr(mesh, "manual_axes", ()))


def bound_axis_names() -> tuple:
  """Named axes bound here (inside shard_map / pmap / named vmap), or ().

  A jax whose private core lacks the listing falls back to the public `manual_mesh_axes`,
  which still covers shard_map and pmap.
  """
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
  """max |x| as f32[] (over all devices, see `reduce_amax`); 0 for an empty x (a zero-size
  batch)."""
  return reduce_amax(jnp.max(jnp.abs(x), initial=0).astype(jnp.float32), recipe)


def _is_state(x) -> bool:
  return isinstance(x, RecipeState)


def next_state(state_grads, mutated):
  """The state after a step that used both conventions.

  Args:
    state_grads: the gradient of the state collection (the gradient-overwrite update).
    mutated: the collection `apply(..., mutable=[...])` returned.

  Returns:
    Per GEMM: the gradient, except where the module replaced its state (its recipe kind
    changed, so the gradient still has the old kind): there the replacement.
  """
  return jax.tree.map(lambda g, m: g if g.kind == m.kind else m, state_grads, mutated,
                      is_leaf=_is_state)


def describe(variables) -> dict[str, str]:
  """'module/path' -> recipe kind of every RecipeState in `variables` (any collection)."""
  out = {}
  flat = jax.tree_util.tree_flatten_with_path(variables, is_leaf=_is_state)[0]
  for path, leaf in flat:
    if _is_state(leaf):
      keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
      out["/".join(keys)] = leaf.kind
  return out
