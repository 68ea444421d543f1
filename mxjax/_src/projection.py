"""The quantized projection the Flax modules share: `x[..., K] . kernel[K, N]` under a
recipe (framework-free: the modules call `reconcile_state` and `project`)."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from mxjax._src import state as state_lib
from mxjax._src import fp8, products
from mxjax._src.dot import dot_general
from mxjax._src.mxarray import MXArray
from mxjax._src.quantize import quantize, quantize_2x
from mxjax._src.recipes import Recipe, recipe_for_weight

_DIMS = lambda x: (((x.ndim - 1,), (0,)), ((), ()))  # noqa: E731  x[..., K] . w[K, N]


def flat_features_sharding(out_sharding, n_lead: int, n_features: int):
  """The sharding of an output [*lead, *features] with the features flattened to one dim."""
  if out_sharding is None or n_features == 1:
    return out_sharding
  named = isinstance(out_sharding, NamedSharding)
  spec = tuple(out_sharding.spec if named else out_sharding)
  spec += (None,) * (n_lead + n_features - len(spec))
  if any(entry is not None for entry in spec[n_lead:]):
    raise ValueError(f"out_sharding {out_sharding} shards a feature dim of a multi-dim "
                     "features output; only the leading dims can be sharded there")
  spec = PartitionSpec(*spec[:n_lead], None)
  return NamedSharding(out_sharding.mesh, spec) if named else spec


def is_quantized(kernel) -> bool:
  """Whether a kernel was stored quantized (an MXArray or an MXArray pair)."""
  return isinstance(kernel, MXArray) or (
      isinstance(kernel, tuple) and kernel and isinstance(kernel[0], MXArray))


def promote_operands(promote: Callable, x, kernel, bias, param_dtype):
  """(x, kernel, bias, product dtype) after Flax's `promote` `(x, kernel, bias) -> same`;
  a quantized kernel is kept (a `param_dtype` scalar stands in for it)."""
  quantized = is_quantized(kernel)
  stand_in = jnp.zeros((), param_dtype) if quantized else kernel
  x, promoted, bias = promote((x, stand_in, bias))
  return (x, kernel if quantized else promoted, bias,
          jnp.result_type(x.dtype, promoted.dtype))


def quantize_kernel(w, recipe: Recipe, columnwise: bool = False):
  """A [K, N] kernel in `recipe`'s weight format: 2-D tiles, the pair (along K, along N)
  with `columnwise`, else the along-K MXArray."""
  fmt = weight_format(recipe, "quantize_kernel")
  if fmt.two_d:
    return quantize(w, fmt)
  along_k, along_n = quantize_2x(w, fmt, axes=(0, 1))
  return (along_k, along_n) if columnwise else along_k


def weight_format(recipe: Recipe, where: str):
  """The format a recipe's weights are stored in (its weight role's)."""
  roles = recipe.roles()
  if roles is None:
    raise ValueError(f"{where}: {recipe} has no block-scaled weights to store (per-tensor "
                     "FP8 quantizes with a scale of the current step); use a block-scaled "
                     "recipe (MX, NVFP4, FP8 blocks)")
  return roles.w


def kernel_2d(kernel, n_in: int, where: str):
  """A quantized kernel in 2-D form `[K, N]`: an MXArray `[in_dim, *features]` along axis 0
  with its feature dims merged."""
  if isinstance(kernel, tuple) or kernel.ndim == 2:
    return kernel
  if n_in != 1 or kernel.axis != 0 or kernel.format.two_d:
    raise ValueError(
        f"{where}: its quantized kernel of shape {kernel.shape} (blocks along axis "
        f"{kernel.axis}) does not fit a product contracting {n_in} dims: quantize it in "
        f"2-D form (mxjax.quantize_params(..., contract_ndim={n_in}))")
  k = kernel.shape[0]
  return dataclasses.replace(kernel, data=kernel.data.reshape(kernel.data.shape[0], -1),
                             scales=kernel.scales.reshape(kernel.scales.shape[0], -1),
                             axis_from_end=-2, length=k)


def weight_recipe(kernel) -> Recipe:
  """A recipe whose weights a quantized kernel holds."""
  first = kernel[0] if isinstance(kernel, tuple) else kernel
  return recipe_for_weight(first.format)


def check_quantized_kernel(kernel, recipe: Recipe | None, where: str) -> None:
  """Raises `ValueError("Recipe mismatch ...")` where a quantized kernel cannot run."""
  if recipe is None:
    return
  first = kernel[0] if isinstance(kernel, tuple) else kernel
  roles = recipe.roles()
  if roles is None or roles.w != first.format:
    raise ValueError(
        f"Recipe mismatch for {where}: its kernel was quantized (quantized_model_init or "
        f"quantize_params) for [{weight_recipe(kernel)}], but the current recipe is "
        f"[{recipe}]. Apply it under a matching recipe, or initialize it in high precision.")


def reconcile_state(stored: state_lib.RecipeState | None, recipe: Recipe | None,
                    where: str, can_write: bool):
  """The state to run `recipe` with, and whether it replaces `stored`.

  `replaced`: write it back (none stored, or another kind). Warns `Recipe type changed`
  where arrays are discarded or made afresh.
  """
  if stored is not None and not isinstance(stored, state_lib.RecipeState):
    raise TypeError(
        f"The recipe state of {where} is a {type(stored).__name__}, not a "
        "mxjax.state.RecipeState: was it restored from a checkpoint without a target? "
        "Restore the state collection into the model's initialized variables (orbax: the "
        "variables as the restore target; flax.serialization.from_state_dict(variables, "
        "restored)).")
  kind = state_lib.kind_of(recipe)
  fresh = state_lib.init(recipe)
  if stored is not None and stored.kind == kind and (
      jax.tree.map(jnp.shape, stored) == jax.tree.map(jnp.shape, fresh)):
    return stored, False
  if recipe is None:  # high precision: a stored state is left as it is
    return fresh, stored is None
  # Switching between stateless recipes loses nothing: no warning then.
  if stored is not None and stored.kind != state_lib.HIGH_PRECISION and (
      jax.tree.leaves(stored) or recipe.stateful()):
    action = ("is replaced by its initial state" if can_write else
              "cannot be replaced (the state collection is not mutable)")
    warnings.warn(f"Recipe type changed for {where}: its state was made for {stored.kind}, "
                  f"the current recipe is {recipe}; the state {action}.", UserWarning,
                  stacklevel=2)
  if recipe.stateful() and not can_write:
    raise ValueError(
        f"{where} runs {kind}, which needs its recipe state, but the state collection "
        f"holds {stored.kind if stored else 'nothing'} and is not mutable: initialize the "
        "model under this autocast, or apply it once with the collection mutable; inside "
        "a lifted transform (nn.scan, nn.vmap, nn.remat, ...) also give the collection to "
        "the transform (e.g. nn.scan's variable_axes={'params': 0, 'mx_state': 0}).")
  return fresh, True


@jax.custom_vjp
def _attach(y, tree):
  """`y`, with the gradient of `tree` being `tree` itself (held under gradient overwrite)."""
  del tree
  return y


def _attach_fwd(y, tree):
  return y, tree


def _attach_bwd(tree, g):
  return g, tree


_attach.defvjp(_attach_fwd, _attach_bwd)


def project(x, kernel, recipe: Recipe | None, recipe_state: state_lib.RecipeState,
            held_state=None, *, dtype, where: str, dimension_numbers=None, precision=None,
            out_sharding=None, rng=None, path: str | None = None):
  """`x . kernel` under `recipe`.

  Args:
    x: [..., K] array of the computation dtype (any layout with `dimension_numbers`).
    kernel: [K, N] array of the computation dtype, or a quantized kernel (MXArray pair).
    recipe: None (high precision), an MX recipe or a per-tensor FP8 recipe.
    recipe_state: the state for `recipe` (`reconcile_state`).
    held_state: a stored state this step does not advance (its gradient is itself).
    dtype: the output dtype.
    where: the module's name, for errors.
    dimension_numbers: as in `lax.dot_general`; default `x[..., K] . kernel[K, N]`.
    precision: passed to `lax.dot_general` in high precision.
    out_sharding: the output's sharding under Explicit mesh axes.
    rng: a JAX key for recipes with stochastic rounding (`recipe.needs_rng()`).
    path: the product's path, for `mxjax.coverage` (None: named by its scope).

  Returns:
    (y [..., N] of `dtype`, state after the forward (input / kernel amaxes recorded)).
  """
  quantized = is_quantized(kernel)
  if quantized:
    check_quantized_kernel(kernel, recipe, where)
  dims = dimension_numbers or _DIMS(x)
  next_state = recipe_state
  if recipe is None:
    if quantized:
      kernel = (kernel[0] if isinstance(kernel, tuple) else kernel).dequantize(x.dtype)
    scope = contextlib.nullcontext() if path is None else products.marked(
        "dot_general", x.shape, kernel.shape, products.dot_flops(x.shape, kernel.shape, dims),
        None, "high precision by its layer's rule or recipe", path)
    with scope:
      y = lax.dot_general(x, kernel, dims, precision=precision, preferred_element_type=dtype,
                          out_sharding=out_sharding)
  elif path is not None:
    with products.label(path, "dot_general", recipe):
      return project(x, kernel, recipe, recipe_state, held_state, dtype=dtype, where=where,
                     dimension_numbers=dimension_numbers, out_sharding=out_sharding, rng=rng)
  elif recipe.roles() is not None:
    y = dot_general(x, kernel, dims, recipe=recipe, rng=rng, name=where,
                    preferred_element_type=dtype, out_sharding=out_sharding)
  elif recipe.fp8():
    y, amaxes = fp8.dot_general(x, kernel, dims, recipe, recipe_state.tensors or None,
                                preferred_element_type=dtype, out_sharding=out_sharding)
    next_state = state_lib.forward_record(recipe_state, amaxes, recipe)  # data, not loss
  else:  # reachable: layer rules and module fields take any Recipe, a bare one included
    raise ValueError(f"{where}: no GEMM for recipe {recipe}")
  if held_state is not None and jax.tree.leaves(held_state):
    y = _attach(y, held_state)
  return y.astype(dtype), next_state
