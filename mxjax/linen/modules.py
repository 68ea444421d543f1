"""Flax linen modules whose GEMMs follow the active recipe: Dense, DenseGeneral,
LayerNormDense, LayerNormMLP.

The recipe is the module's `recipe`, else its path's under the layer rules of an enclosing
`mxjax.linen.intercept`, else the enclosing `mxjax.autocast`'s. Params are named like
Flax's; each GEMM's recipe state is the variable `recipe_state` in `state_collection`
("mx_state", see `mxjax.state`). Kernels made under `mxjax.quantized_model_init` are frozen
MXArrays in 2-D form `[prod(in dims), prod(features)]` in the collection "mx_kernels"
(`apply` needs it next to "params"), their `kernel_axes` per array (`QuantizedPartitioned`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
from flax.linen import dtypes as linen_dtypes
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from mxjax._src import state as state_lib
from mxjax._src import projection, repeated_calls, context, sharding
from mxjax._src.recipes import Recipe

default_kernel_init = nn.initializers.lecun_normal()
_STATE_NAME = "recipe_state"


def _module_path(module: nn.Module) -> str:
  path = layer_path(module)
  return f"{type(module).__name__} '{path}'" if path else f"{type(module).__name__} (top level)"


def _canonical_axes(axes, ndim: int) -> tuple[int, ...]:
  axes = (axes,) if isinstance(axes, int) else tuple(axes)
  return tuple(sorted(a % ndim for a in axes))


class QuantizedPartitioned(nn.LogicallyPartitioned):
  """The logical axes of a quantized kernel (an MXArray pair, or one MXArray), per array.

  `get_partition_spec` gives a PartitionSpec of logical names per array
  (`sharding.leaf_specs`): the data keeps the kernel's names; a scales dim keeps its name
  only where every shard holds whole scales under the mesh and rules in effect.
  """

  def get_partition_spec(self) -> QuantizedPartitioned:
    """This box with a PartitionSpec in place of each array (a prefix of this box)."""
    return self.replace_boxed(self._leaf_specs())

  def get_sharding(self, mesh: jax.sharding.Mesh) -> QuantizedPartitioned:
    """This box with a NamedSharding (names as mesh axes) in place of each array."""
    return self.replace_boxed(jax.tree.map(lambda spec: NamedSharding(mesh, spec),
                                           self._leaf_specs(mesh)))

  def unbox(self, apply_constraint=True):
    """The value; arrays constrained to their specs under a mesh."""
    arrays = all(isinstance(a, jax.Array) for a in jax.tree.leaves(self.value))
    if apply_constraint and arrays and (nn.meta.global_mesh_defined() or self.mesh is not None):
      return nn.with_logical_constraint(self.value, self._leaf_specs(), rules=self.rules,
                                        mesh=self.mesh)
    return self.value

  def _leaf_specs(self, mesh_of_axes=None):
    return sharding.leaf_specs(self.value, self.names, self._shard_counts(mesh_of_axes))

  def _shard_counts(self, mesh_of_axes=None) -> list[int | None]:
    """Per name: its dim's shard count, or None; `mesh_of_axes`: names are its axes."""
    if mesh_of_axes is not None:
      return [sharding.shard_count(mesh_of_axes, n) for n in self.names]
    mesh = self.mesh if self.mesh is not None else nn.meta.get_global_mesh()
    if mesh is None:
      return [None] * len(self.names)
    rules = self.rules or nn.get_logical_axis_rules()
    if not rules:  # a name may go to any mesh axes: their shards divide the mesh's
      return [None if n is None else mesh.size for n in self.names]
    axes = nn.logical_to_mesh_axes(self.names, rules)
    return [sharding.shard_count(mesh, e)
            if all(a in mesh.shape for a in sharding.axis_names(e)) else None for e in axes]


def _flat_init(init: Callable, flat_shape: tuple[int, ...]) -> Callable:
  """`init` run on `flat_shape` and reshaped (as `nn.DenseGeneral`'s `kernel_init_wrap`),
  keeping a box's metadata."""
  def init_flat(key, shape, dtype=jnp.float32):
    value = init(key, flat_shape, dtype)
    if isinstance(value, nn.meta.AxisMetadata):
      return nn.meta.replace_boxed(value, jnp.reshape(value.unbox(), shape))
    return jnp.reshape(value, shape)
  return init_flat


class DenseGeneral(nn.Module):
  """A linear map over the input axes `axis` to output dims `features`, under the recipe.

  Attributes:
    features: int or tuple of output dims; the one positional field.
    axis: input axes contracted (int or tuple).
    use_bias: add a bias of shape `features`.
    dtype: computation / output dtype; None: promoted from input and params.
    param_dtype: dtype of the high-precision params.
    kernel_init, bias_init: Flax initializers, called on the 2-D shape as
      `nn.DenseGeneral` calls them.
    kernel_axes, bias_axes: logical axis names (nn.with_logical_partitioning), or ().
    recipe: None means the autocast recipe.
    state_collection: the variable collection of the recipe state.
    precision: `lax.dot_general`'s, for the high-precision product, as in `nn.Dense`.
    promote_dtype: as in `nn.Dense` (a quantized kernel passes as a `param_dtype` scalar).
  """

  features: int | Sequence[int]
  _: dataclasses.KW_ONLY
  axis: int | Sequence[int] = -1
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init
  bias_init: Callable = nn.initializers.zeros_init()
  kernel_axes: tuple[str, ...] = ()
  bias_axes: tuple[str, ...] = ()
  recipe: Recipe | None = None
  state_collection: str = state_lib.STATE_COLLECTION
  precision: jax.lax.PrecisionLike = None
  promote_dtype: Callable = linen_dtypes.promote_dtype

  def __post_init__(self):
    try:
      super().__post_init__()
    except ValueError as error:  # Flax's `parent` follows the keyword-only fields
      if "parent must be" not in str(error):
        raise
      raise TypeError(
          f"mxjax.{type(self).__name__} takes `features` positionally and every other field "
          f"by keyword (nn.Dense and nn.DenseGeneral order theirs differently); got a second "
          f"positional argument {self.parent!r}") from None

  @nn.compact
  def __call__(self, x: jax.Array, out_sharding=None) -> jax.Array:
    """x [..., *in_dims] -> [..., *features]; `out_sharding` as in `mxjax.dot_general`."""
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    axes = _canonical_axes(self.axis, x.ndim)
    in_dims = tuple(x.shape[a] for a in axes)
    k, n = math.prod(in_dims), math.prod(features)
    kernel = self._kernel(in_dims + features, (k, n), len(in_dims))
    bias = None
    if self.use_bias:
      bias_init = _flat_init(self.bias_init, (n,))
      if self.bias_axes:
        bias_init = nn.with_logical_partitioning(bias_init, self.bias_axes)
      bias = self.param("bias", bias_init, features, self.param_dtype)

    batch = [d for d in range(x.ndim) if d not in axes]
    x2 = jnp.transpose(x, batch + list(axes)).reshape(*(x.shape[d] for d in batch), k)
    kernel = (projection.kernel_2d(kernel, len(in_dims), _module_path(self))
              if projection.is_quantized(kernel) else kernel.reshape(k, n))
    x2, kernel, bias, dtype = projection.promote_operands(
        lambda args: self.promote_dtype(*args, dtype=self.dtype), x2, kernel, bias,
        self.param_dtype)
    y = self._project(x2, kernel, dtype,
                      projection.flat_features_sharding(out_sharding, len(batch), len(features)))
    y = y.reshape(*y.shape[:-1], *features)
    if bias is not None:
      y = y + bias
    return y

  def _kernel(self, shape, shape_2d, n_in):
    """The param `kernel` of `shape` (`n_in` input dims first), or a quantized kernel: in
    `QUANTIZED_KERNELS` (`quantized_model_init`) or in `params` (`quantize_params`)."""
    collection = context.QUANTIZED_KERNELS
    if self.has_variable(collection, "kernel"):
      return self.variable(collection, "kernel").value
    if self.has_variable("params", "kernel"):  # quantize_params' MXArray, as it is
      stored = nn.meta.unbox(self.get_variable("params", "kernel"))
      if projection.is_quantized(stored):
        return stored
    qinit = context.get_quantized_init()
    if qinit is not None and not self.has_variable("params", "kernel"):
      if not self.is_mutable_collection(collection):
        raise ValueError(
            f"{_module_path(self)}: quantized_model_init stores its kernel in the collection "
            f"'{collection}', which is not mutable here: inside a lifted transform (nn.scan, "
            f"nn.vmap, ...) give it to the transform too (e.g. nn.scan's variable_axes="
            f"{{'params': 0, '{collection}': 0}}).")
      def quantized_init(key, shape, dtype):
        # The initializer sees the 2-D form, as nn.DenseGeneral's: the same values.
        w = self.kernel_init(key, shape_2d, dtype)
        names, box = self.kernel_axes, {}
        if isinstance(w, nn.meta.AxisMetadata):  # e.g. nn.with_logical_partitioning's
          if self.kernel_axes or not isinstance(w, nn.LogicallyPartitioned):
            raise TypeError(
                f"{_module_path(self)}: under quantized_model_init, a kernel_init that "
                f"returns {type(w).__name__} is supported only as nn.with_logical_"
                f"partitioning's, without kernel_axes; give the logical axes as "
                f"kernel_axes instead")
          names, box = tuple(w.names), dict(mesh=w.mesh, rules=w.rules)
          w = w.value
        w = projection.quantize_kernel(w, qinit.recipe, qinit.columnwise)
        if not names:
          return w
        # the 2-D form keeps the axes of the leading in / feature dims
        return QuantizedPartitioned(w, (names[0], names[n_in]), **box)
      # The same "params" rng as `self.param` would draw: the same initial value.
      return self.variable(collection, "kernel", quantized_init, self.make_rng("params"),
                           shape, self.param_dtype).value
    if not (self.has_variable("params", "kernel") or self.is_mutable_collection("params")):
      raise ValueError(
          f"{_module_path(self)} finds no kernel in 'params' or '{collection}': apply it "
          f"with all the collections init returned (a model initialized under "
          f"quantized_model_init keeps its frozen kernels in '{collection}').")
    kernel_init = _flat_init(self.kernel_init, shape_2d)
    if self.kernel_axes:
      kernel_init = nn.with_logical_partitioning(kernel_init, self.kernel_axes)
    return self.param("kernel", kernel_init, shape, self.param_dtype)

  def _recipe(self) -> Recipe | None:
    return self.recipe if self.recipe is not None else context.recipe_for(layer_path(self))

  def _project(self, x2, kernel, dtype, out_sharding=None):
    recipe = self._recipe()
    if recipe is None and self.is_initializing() and context.get_quantized_init() is not None:
      recipe = context.get_quantized_init().recipe  # the state made at init follows it
    return project_with_state(self, x2, kernel, recipe, collection=self.state_collection,
                              dtype=dtype, where=_module_path(self), precision=self.precision,
                              out_sharding=out_sharding)


def layer_path(module: nn.Module) -> str:
  """The module's path from the root, its scope names joined by "/" (what rules match)."""
  return "/".join(str(p) for p in module.scope.path) if module.scope else ""


def project_with_state(module: nn.Module, x, kernel, recipe: Recipe | None, *,
                       collection: str, dtype, where: str, dimension_numbers=None,
                       precision=None, store_stateless: bool = True, out_sharding=None,
                       path: str | None = None):
  """`projection.project` for the bound linen `module`, whose recipe state is the variable
  `recipe_state` in `collection` (read, reconciled with `recipe`, written back when it is
  mutable). `store_stateless=False` writes nothing where no state is needed (Flax's hooks).
  """
  if projection.is_quantized(kernel):
    projection.check_quantized_kernel(kernel, recipe, where)
  has_state = module.has_variable(collection, _STATE_NAME)
  stored = module.get_variable(collection, _STATE_NAME) if has_state else None
  gemm = dict(dtype=dtype, where=where, dimension_numbers=dimension_numbers,
              precision=precision, out_sharding=out_sharding,
              path=layer_path(module) if path is None else path)
  if recipe is not None and recipe.needs_rng() and module.has_rng("mx"):
    gemm["rng"] = module.make_rng("mx")  # Flax's rng-stream convention (as Dropout's)
  if not (store_stateless or has_state or (recipe is not None and recipe.stateful())):
    return projection.project(x, kernel, recipe, state_lib.init(recipe), **gemm)[0]
  can_write = module.is_mutable_collection(collection)
  forward, layer = module.scope.root, (module.scope.path, collection)
  start, repeated = repeated_calls.started_from(forward, layer, stored)
  run_state, replaced = projection.reconcile_state(start, recipe, where, can_write)
  held = start if (start is not None and run_state is not start) else None
  y, forward_state = projection.project(x, kernel, recipe, run_state, held, **gemm)
  if can_write and (replaced or run_state is start):
    if module.is_initializing():  # like BatchNorm's statistics: without this batch
      module.put_variable(collection, _STATE_NAME, run_state)
    else:
      if repeated:
        forward_state = state_lib.merge_records(run_state, stored, forward_state, recipe)
      module.put_variable(collection, _STATE_NAME, forward_state)
      if jax.tree.leaves(forward_state):
        repeated_calls.note_record(forward, layer, run_state, forward_state)
  return y


class Dense(DenseGeneral):
  """`x[..., K] . kernel[K, features] + bias` under the recipe (the linen Dense API): a
  DenseGeneral over the last axis. `features` is positional, the other fields keywords
  (as in `DenseGeneral`): `Dense(features)(x)`, x [..., K] -> [..., features].
  """


class LayerNormDense(nn.Module):
  """LayerNorm or RMSNorm, then a DenseGeneral (the norm runs in high precision).

  The other fields are as in DenseGeneral (its submodule `dense`).

  Attributes:
    norm_type: "layernorm" or "rmsnorm" (submodule `norm`, normalizing the last axis).
    epsilon: the norm's epsilon.
  """

  features: int | Sequence[int]
  axis: int | Sequence[int] = -1
  norm_type: str = "layernorm"
  epsilon: float = 1e-6
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init
  bias_init: Callable = nn.initializers.zeros_init()
  kernel_axes: tuple[str, ...] = ()
  bias_axes: tuple[str, ...] = ()
  recipe: Recipe | None = None
  state_collection: str = state_lib.STATE_COLLECTION

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x [..., *in_dims] -> [..., *features]."""
    x = _norm(self.norm_type, self.epsilon, self.dtype, self.param_dtype)(x)
    return DenseGeneral(self.features, axis=self.axis, use_bias=self.use_bias,
                        dtype=self.dtype, param_dtype=self.param_dtype,
                        kernel_init=self.kernel_init, bias_init=self.bias_init,
                        kernel_axes=self.kernel_axes, bias_axes=self.bias_axes,
                        recipe=self.recipe, state_collection=self.state_collection,
                        name="dense")(x)


def _norm(norm_type: str, epsilon: float, dtype, param_dtype) -> nn.Module:
  if norm_type == "layernorm":
    return nn.LayerNorm(epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, name="norm")
  if norm_type == "rmsnorm":
    return nn.RMSNorm(epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, name="norm")
  raise ValueError(f"norm_type must be 'layernorm' or 'rmsnorm', got {norm_type!r}")


ACTIVATIONS: dict[str, Callable] = {
    "linear": lambda x: x,
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "squared_relu": lambda x: jnp.square(jax.nn.relu(x)),
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}


class LayerNormMLP(nn.Module):
  """norm -> Dense `wi` -> activation(s) -> Dense `wo`, back to the input width.

  Several `activations` (e.g. `("gelu", "linear")`: GeGLU) make `wi` one GEMM of one
  `intermediate_dim` slice each, the activated slices multiplied together.

  Attributes:
    intermediate_dim: the hidden width.
    activations: names from `ACTIVATIONS`.
    norm_type, epsilon: as in LayerNormDense.
    use_bias, dtype, param_dtype, kernel_init, bias_init, recipe, state_collection: as in
      DenseGeneral, for both GEMMs.
    kernel_axes_1, kernel_axes_2: logical axes of `wi` / `wo` kernels, or ().
  """

  intermediate_dim: int = 256
  activations: Sequence[str] = ("relu",)
  norm_type: str = "layernorm"
  epsilon: float = 1e-6
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable = default_kernel_init
  bias_init: Callable = nn.initializers.zeros_init()
  kernel_axes_1: tuple[str, ...] = ()
  kernel_axes_2: tuple[str, ...] = ()
  recipe: Recipe | None = None
  state_collection: str = state_lib.STATE_COLLECTION

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x [..., D] -> [..., D]."""
    unknown = [a for a in self.activations if a not in ACTIVATIONS]
    if unknown or not self.activations:
      raise ValueError(f"activations must be a non-empty sequence of {sorted(ACTIVATIONS)}; "
                       f"got {tuple(self.activations)}")
    common = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
                  kernel_init=self.kernel_init, bias_init=self.bias_init, recipe=self.recipe,
                  state_collection=self.state_collection)
    h = _norm(self.norm_type, self.epsilon, self.dtype, self.param_dtype)(x)
    num = len(self.activations)
    h = Dense(num * self.intermediate_dim, kernel_axes=self.kernel_axes_1, name="wi",
              **common)(h)
    h = h.reshape(*h.shape[:-1], num, self.intermediate_dim)
    out = ACTIVATIONS[self.activations[0]](h[..., 0, :])
    for i, name in enumerate(self.activations[1:], 1):
      out = out * ACTIVATIONS[name](h[..., i, :])
    return Dense(x.shape[-1], kernel_axes=self.kernel_axes_2, name="wo", **common)(out)
