"""mxjax's NNX `Linear`, whose GEMM follows the active recipe (`mxjax.autocast`).

The recipe state lives in the `RecipeStateVar` variable `recipe_state`. Each call stores
the state with this call's input and kernel amaxes recorded (the forward half of
`mxjax.state`); a call under another recipe kind replaces it (warning `Recipe type
changed`). The gradient of `recipe_state` is the fully advanced state (gradient
overwrite), as in the linen modules: take `nnx.grad` with respect to
`nnx.Any(nnx.Param, RecipeStateVar)` and assign the state part back to advance the
gradient's amax history too.

A kernel made under `mxjax.quantized_model_init` (an MXArray pair, or one MXArray) is held
in a `QuantizedKernel` variable, not an `nnx.Param`: it is frozen, so `nnx.grad` (whose
default `wrt` is `nnx.Param`) and `nnx.Optimizer(model, tx, wrt=nnx.Param)` leave it alone.
A `kernel_init` annotated with `nnx.with_partitioning` shards it per array at creation
(`mxjax.sharding.leaf_specs`: the scales only where the mesh splits them evenly).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import meta
from jax.sharding import AxisType, NamedSharding

from mxjax import _gemm, context, sharding, state as state_lib
from mxjax.recipes import Recipe


class RecipeStateVar(nnx.Variable):
  """Holds a `mxjax.state.RecipeState`."""


class QuantizedKernel(nnx.Variable):
  """Holds a kernel made under `mxjax.quantized_model_init`: frozen, not an `nnx.Param`
  (an optimizer update of its E8M0 scales, even a zero one, would be NaN)."""


class Linear(nnx.Module):
  """`x[..., in_features] . kernel[in, out] + bias` under the recipe.

  Args:
    in_features, out_features: the kernel is f32[in_features, out_features] (param_dtype);
      under `mxjax.quantized_model_init`, quantized and held in a `QuantizedKernel`.
    use_bias: add a bias [out_features].
    dtype: computation / output dtype; None: promoted from input and params.
    param_dtype, kernel_init, bias_init: as in `flax.nnx.Linear`.
    recipe: None means the autocast recipe (none: high precision).
    rngs: `nnx.Rngs` for the initializers.
  """

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               kernel_init: Callable = nnx.initializers.lecun_normal(),
               bias_init: Callable = nnx.initializers.zeros_init(),
               recipe: Recipe | None = None, rngs: nnx.Rngs):
    self.in_features, self.out_features = in_features, out_features
    self.dtype, self.param_dtype, self.recipe = dtype, param_dtype, recipe
    w = kernel_init(rngs.params(), (in_features, out_features), param_dtype)
    qinit = context.get_quantized_init()
    if qinit is not None:
      self.kernel = QuantizedKernel(_quantized_kernel(w, qinit))
    else:
      self.kernel = nnx.Param(w)
    self.bias = (nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype))
                 if use_bias else None)
    init_recipe = self._recipe() or (qinit.recipe if qinit is not None else None)
    self.recipe_state = RecipeStateVar(state_lib.init(init_recipe))

  def _recipe(self) -> Recipe | None:
    return self.recipe if self.recipe is not None else context.get_recipe()

  def __call__(self, x: jax.Array, out_sharding=None) -> jax.Array:
    """x [..., in_features] -> [..., out_features]; `out_sharding` (Explicit mesh axes) as
    in `flax.nnx.Linear`."""
    kernel = self.kernel.get_value()
    bias = self.bias.get_value() if self.bias is not None else None
    quantized = _gemm.is_quantized(kernel)
    dtype = self.dtype or jnp.result_type(
        x.dtype, self.param_dtype if quantized else kernel.dtype,
        *([bias.dtype] if bias is not None else []))
    if not quantized:
      kernel = kernel.astype(dtype)
    recipe, where = self._recipe(), f"nnx.Linear({self.in_features}, {self.out_features})"
    if quantized:
      _gemm.check_quantized_kernel(kernel, recipe, where)
    stored = self.recipe_state.get_value()
    run_state, replaced = _gemm.reconcile_state(stored, recipe, where, can_write=True)
    held = stored if run_state is not stored else None
    y, forward_state = _gemm.project(x.astype(dtype), kernel, recipe, run_state, held,
                                     dtype=dtype, where=where, out_sharding=out_sharding)
    if replaced or run_state is stored:
      self.recipe_state.set_value(forward_state)
    if bias is not None:
      y = y + bias.astype(dtype)
    return y


def _quantized_kernel(w, qinit: context.QuantizedInit):
  """`w` quantized under `qinit`. Where `w` carries an `nnx.with_partitioning` annotation
  (an `nnx.VariableMetadata`), each array is sharded as nnx shards an annotated variable
  at creation (eager sharding), by its own spec (`mxjax.sharding.leaf_specs`)."""
  metadata = w.metadata if isinstance(w, nnx.VariableMetadata) else {}
  w = w.raw_value if isinstance(w, nnx.VariableMetadata) else w
  kernel = _gemm.quantize_kernel(w, qinit.recipe, qinit.columnwise)
  if not (metadata.get("out_sharding")
          and metadata.get("eager_sharding", nnx.using_eager_sharding())):
    return kernel
  mesh = metadata.get("mesh") or meta.get_global_mesh()
  if mesh is None:
    raise ValueError(f"mxjax.nnx.Linear: the kernel's annotation {metadata['out_sharding']} "
                     "needs a mesh: set one with jax.set_mesh (or give with_partitioning "
                     "a mesh).")
  spec = tuple(nnx.spmd.get_var_pspec(nnx.Param(w, **{**metadata, "eager_sharding": False})))
  specs = sharding.leaf_specs(kernel, spec, [sharding.shard_count(mesh, e) for e in spec])
  explicit = all(t == AxisType.Explicit for t in mesh.axis_types)
  place = jax.sharding.reshard if explicit else jax.lax.with_sharding_constraint
  return jax.tree.map(lambda a, s: place(a, NamedSharding(mesh, s)), kernel, specs)
