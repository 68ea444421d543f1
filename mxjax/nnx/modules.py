"""mxjax's NNX `Linear`, whose GEMM follows the active recipe (`mxjax.autocast`).

Every variable holds one array, so nnx's tools see each with its own sharding. The recipe
state `recipe_state` is a `mxjax.state.RecipeState` of `RecipeStateVar` variables: each
call stores it with its input and kernel amaxes recorded, and its gradient is the fully
advanced state (gradient overwrite: `nnx.grad` wrt `nnx.Any(nnx.Param, RecipeStateVar)`,
then `nnx.update`). A kernel made under `mxjax.quantized_model_init` is frozen: MXArrays
of `QuantizedKernel` variables (not `nnx.Param`), each annotated for its own sharding.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from flax.core import meta
from flax.nnx.nn import dtypes as nnx_dtypes

from mxjax._src import state as state_lib
from mxjax._src import projection, repeated_calls, context, sharding
from mxjax._src.recipes import Recipe


class RecipeStateVar(nnx.Variable):
  """One array of a `mxjax.state.RecipeState` (an amax history or a scale, f32)."""


class QuantizedKernel(nnx.Variable):
  """One array of a kernel made under `mxjax.quantized_model_init`: frozen, not a Param."""


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def _state_variables(recipe_state):
  """A `RecipeState` as a module attribute: each array in a `RecipeStateVar`."""
  return nnx.data(jax.tree.map(RecipeStateVar, recipe_state))


#: `Linear.rule_recipe` of a layer that no `mxjax.nnx.quantize` rule matched.
AUTOCAST = "autocast"


class Linear(nnx.Module):
  """`x[..., in_features] . kernel[in, out] + bias` under the recipe.

  Args:
    in_features, out_features: the kernel is f32[in_features, out_features] (param_dtype);
      under `mxjax.quantized_model_init`, quantized, each array in a `QuantizedKernel`.
    use_bias: add a bias [out_features].
    dtype: computation dtype; None: promoted from input and params.
    preferred_element_type: the product's output dtype (None: `dtype`).
    param_dtype, kernel_init, bias_init, kernel_metadata, bias_metadata: as in
      `flax.nnx.Linear`.
    precision: `lax.dot_general`'s, for the high-precision product.
    promote_dtype: as in `flax.nnx.Linear` (a quantized kernel passes as a scalar).
    recipe: None means the autocast recipe, or the rule's (`rule_recipe`, set by
      `mxjax.nnx.quantize`).
    rngs: `nnx.Rngs` for the initializers; its "mx" stream gives stochastic rounding's keys.
  """

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               kernel_init: Callable = nnx.initializers.lecun_normal(),
               bias_init: Callable = nnx.initializers.zeros_init(),
               kernel_metadata: Mapping[str, Any] = MappingProxyType({}),
               bias_metadata: Mapping[str, Any] = MappingProxyType({}),
               precision: lax.PrecisionLike = None, preferred_element_type: Any = None,
               promote_dtype: Callable = nnx_dtypes.promote_dtype,
               recipe: Recipe | None = None, rngs: nnx.Rngs):
    self.in_features, self.out_features, self.use_bias = in_features, out_features, use_bias
    self.dtype, self.param_dtype, self.precision = dtype, param_dtype, precision
    self.preferred_element_type, self.promote_dtype = preferred_element_type, promote_dtype
    self.recipe, self.rule_recipe = recipe, AUTOCAST
    self.mx_rngs = rngs["mx"] if "mx" in rngs else None  # stochastic rounding's keys
    w = kernel_init(rngs.params(), (in_features, out_features), param_dtype)
    qinit = context.get_quantized_init()
    if qinit is not None:
      self.kernel = nnx.data(_quantized_kernel(w, qinit, kernel_metadata))
    else:
      self.kernel = nnx.Param(w, **kernel_metadata)
    self.bias = (nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype),
                           **bias_metadata) if use_bias else None)
    init_recipe = self._recipe() or (qinit.recipe if qinit is not None else None)
    self.recipe_state = _state_variables(state_lib.init(init_recipe))

  def _recipe(self) -> Recipe | None:
    if self.recipe is not None:
      return self.recipe
    autocast = context.get_recipe()
    return autocast if autocast is None or self.rule_recipe == AUTOCAST else self.rule_recipe

  def __call__(self, x: jax.Array, out_sharding=None) -> jax.Array:
    """x [..., in_features] -> [..., out_features]; `out_sharding` as in `nnx.Linear`."""
    kernel = nnx.as_pure(self.kernel)
    bias = self.bias.get_value() if self.bias is not None else None
    quantized = projection.is_quantized(kernel)
    if not (quantized or hasattr(kernel, "dtype")):
      raise TypeError(
          f"mxjax.nnx.Linear({self.in_features}, {self.out_features}): the kernel holds "
          f"{type(kernel).__name__}, not an array: a quantized kernel's variables were given "
          "to a layer built outside mxjax.quantized_model_init (nnx.bridge.ToLinen builds "
          "the layer again in every apply: run apply under quantized_model_init too)")
    x, kernel, bias, dtype = projection.promote_operands(
        lambda args: self.promote_dtype(args, dtype=self.dtype), x, kernel, bias,
        self.param_dtype)
    recipe, where = self._recipe(), f"nnx.Linear({self.in_features}, {self.out_features})"
    if quantized:
      projection.check_quantized_kernel(kernel, recipe, where)
    stored = nnx.as_pure(self.recipe_state)
    in_transform = repeated_calls.traced((x, kernel, stored))
    start, repeated = (repeated_calls.started_from(self, None, stored) if in_transform
                       else (stored, False))
    run_state, replaced = projection.reconcile_state(start, recipe, where, can_write=True)
    held = start if run_state is not start else None
    rng = (self.mx_rngs() if recipe is not None and recipe.needs_rng()
           and getattr(self, "mx_rngs", None) is not None else None)
    y, forward_state = projection.project(x, kernel, recipe, run_state, held,
                                     dtype=self.preferred_element_type or dtype, where=where,
                                     precision=self.precision,
                                     out_sharding=out_sharding, rng=rng)
    if repeated:
      forward_state = state_lib.merge_records(run_state, stored, forward_state, recipe)
    if in_transform and jax.tree.leaves(forward_state):
      repeated_calls.note_record(self, None, run_state, forward_state)
    if replaced:
      self.recipe_state = _state_variables(forward_state)
    elif run_state is start:
      jax.tree.map(lambda var, value: var.set_value(value), self.recipe_state, forward_state,
                   is_leaf=_is_variable)
    if bias is not None:
      y = y + bias
    return y


def _quantized_kernel(w, qinit: context.QuantizedInit, kernel_metadata: Mapping[str, Any]):
  """`w` quantized under `qinit`, each array in a `QuantizedKernel` with the metadata (an
  `out_sharding` per array: `sharding.leaf_specs`)."""
  metadata = dict(kernel_metadata)
  if isinstance(w, nnx.VariableMetadata):
    metadata.update(w.metadata)
  w = w.raw_value if isinstance(w, nnx.VariableMetadata) else w
  kernel = projection.quantize_kernel(w, qinit.recipe, qinit.columnwise)
  annotation = metadata.get("out_sharding")
  if not annotation:
    return jax.tree.map(lambda a: QuantizedKernel(a, **metadata), kernel)
  mesh = metadata.get("mesh") or meta.get_global_mesh()
  on_mesh = nnx.spmd.get_var_pspec(nnx.Param(w, **{**metadata, "eager_sharding": False}))
  counts = [None if mesh is None else sharding.shard_count(mesh, e) for e in on_mesh]
  specs = sharding.leaf_specs(kernel, tuple(annotation), counts)
  return jax.tree.map(
      lambda a, s: QuantizedKernel(a, **{**metadata, "out_sharding": tuple(s)}), kernel, specs)
