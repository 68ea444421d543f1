"""Block-scaled `dot_general` and `matmul`: the product (`mxjax._src.product`) of any
format, from its arguments or a recipe, in the canonical form `[*B, M, K] x [*B, K, N]`
(`mxjax._src.contraction`), so blocks run along the flattened contraction.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp

from mxjax._src import contraction, formats, operands, product, products, sharding
from mxjax._src.roles import Roles, TensorRoles, mx_roles

DimensionNumbers = tuple[tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], Sequence[int]]]


def roles_of(fwd_format, bwd_format, block_size, scale_mode, recipe=None) -> Roles:
  """The roles of `dot_general`'s format arguments (MX names, or `BlockFormat`s: the
  forward's for x and w, the backward's for the gradient), or of a block-scaled `recipe`."""
  if isinstance(recipe, Roles):
    return recipe
  if recipe is not None:
    roles = recipe.roles()
    if not isinstance(roles, Roles):
      raise ValueError(f"mxjax.dot_general: recipe {recipe} has no block-scaled product "
                       "(per-tensor FP8 runs in mxjax's modules and interception)")
    return roles
  if isinstance(fwd_format, formats.BlockFormat) or isinstance(bwd_format, formats.BlockFormat):
    fwd, bwd = (formats.as_block_format(f) if isinstance(f, formats.BlockFormat)
                else formats.as_block_format(f, block_size, scale_mode)
                for f in (fwd_format, bwd_format))
    return Roles(fwd.with_block((1, fwd.block_size)), fwd, bwd)
  fwd, bwd = formats.element_format(fwd_format), formats.element_format(bwd_format)
  for fmt in (fwd, bwd):
    formats.check_block_size(block_size, fmt)
  return mx_roles(fwd.name, bwd.name, int(block_size), formats.scale_mode(scale_mode).value)


def dot_general(lhs, rhs, dimension_numbers: DimensionNumbers, *, fwd_format="e4m3",
                bwd_format="e5m2", block_size: int = formats.DEFAULT_BLOCK_SIZE,
                scale_mode="rceil", precision=None, preferred_element_type=None,
                out_sharding=None, recipe=None, rng=None, name: str = "") -> jax.Array:
  """`lax.dot_general` with both operands block-quantized along the contraction.

  Args:
    lhs, rhs: bfloat16 / float16 / float32 arrays, or `MXArray`s quantized along their
      single contracting dim (or in 2-D tiles), or a pair `(along_contraction,
      along_free)` of MXArrays (`quantize_2x`). MXArray operands are constants.
    dimension_numbers: `((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))` as
      in `lax.dot_general`; any number of contracting and batch dims, any order.
    fwd_format: element format of both operands in the forward product (an MX name), or
      a `BlockFormat` (the input's 1-D, the weight's as given).
    bwd_format: element format (or `BlockFormat`) of the output gradient in dgrad and
      wgrad.
    block_size, scale_mode: as in `mxjax.quantize` (MX names only).
    precision: accepted as `lax.dot_general` does; the products are exact, f32-accumulated.
    preferred_element_type: output dtype; default: the operands' result type.
    out_sharding: the output's sharding under Explicit mesh axes, as in `lax.dot_general`.
    recipe: a block-scaled recipe (`MXFP8BlockScaling()`, `NVFP4BlockScaling()`, ...), or
      `Roles`, whose formats replace the format arguments.
    rng: a JAX key for recipes with stochastic rounding (a new one per step).
    name: the product's name, for errors and the random signs of its Hadamard transform.

  Returns:
    An array of shape `batch + lhs free + rhs free` (as `lax.dot_general`).
  """
  del precision  # see Args
  roles = roles_of(fwd_format, bwd_format, block_size, scale_mode, recipe)
  config = make_config(lhs, rhs, dimension_numbers, roles, preferred_element_type,
                       out_sharding, where=name,
                       recipe_name=type(recipe).__name__ if recipe is not None and not
                       isinstance(recipe, Roles) else "",
                       has_key=rng is not None)
  return run(config, lhs, rhs, dimension_numbers, rng)


def run(config: product.Config, lhs, rhs, dimension_numbers, rng=None, tensors=None):
  """`product.run` of `make_config`'s config, marked for `mxjax.coverage`."""
  # shard_map: cast to varying outside the custom VJP (the cast's transpose psums).
  lhs, rhs = operands.promote_weak(lhs, rhs)
  with products.marked("dot_general", config.lhs.shape, config.rhs.shape,
                       products.dot_flops(config.lhs.shape, config.rhs.shape,
                                          dimension_numbers),
                       config.roles.describe()):
    return product.run(config, *sharding.vary_alike(lhs, rhs), rng, tensors)


def make_config(lhs, rhs, dimension_numbers, roles: Roles | TensorRoles,
                preferred_element_type=None, out_sharding=None, *, where: str = "",
                recipe_name: str = "", has_key: bool = False) -> product.Config:
  """The product's `Config` of two operands, checked (shapes, dtypes, sizes)."""
  (lc, rc), (lb, rb) = dimension_numbers
  lhs, rhs = operands.promote_weak(lhs, rhs)
  lhs_info, rhs_info = operands.info(lhs, "lhs"), operands.info(rhs, "rhs")
  lhs_layout = contraction.layout(lhs_info[0], lc, lb, "lhs", contract_first=False)
  rhs_layout = contraction.layout(rhs_info[0], rc, rb, "rhs", contract_first=True)
  for what, dims_l, dims_r in (("contracting", lc, rc), ("batch", lb, rb)):
    sizes_l, sizes_r = lhs_layout.sizes(tuple(dims_l)), rhs_layout.sizes(tuple(dims_r))
    if sizes_l != sizes_r:
      raise ValueError(f"mxjax.dot_general: {what} dimension sizes differ: lhs {sizes_l} "
                       f"(dims {tuple(dims_l)}) vs rhs {sizes_r} (dims {tuple(dims_r)})")
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs_info[1], rhs_info[1]))
  if out_sharding is None and operands.typed_sharding(lhs) and operands.typed_sharding(rhs):
    # The type `lax.dot_general` gives its result (quantized operands may be gathered).
    out_sharding = jax.eval_shape(functools.partial(
        jax.lax.dot_general, dimension_numbers=dimension_numbers), lhs, rhs).sharding
  return product.Config(lhs_layout, rhs_layout, roles, out_dtype, lhs_info[1], rhs_info[1],
                        operands.typed_sharding(lhs), operands.typed_sharding(rhs),
                        operands.named(out_sharding), operands.is_array(lhs),
                        operands.is_array(rhs), where, recipe_name, has_key)


def matmul(a, b, **kwargs) -> jax.Array:
  """`a @ b` with `jnp.matmul`'s shapes, via `dot_general` (keyword arguments as there).

  Batch dims broadcast as in `jnp.matmul`; an MXArray (pair) operand or `out_sharding`
  needs b [K, N] or equal batch dims.

  Args:
    a: bf16 / f16 / f32 array [..., M, K] or [K], or an MXArray (pair) quantized along K.
    b: bf16 / f16 / f32 array [..., K, N] or [K], or an MXArray (pair) quantized along K.
    **kwargs: `dot_general`'s keyword arguments (`fwd_format`, `recipe`, ...).

  Returns:
    An array of `jnp.matmul(a, b)`'s shape and (by default) result dtype.

  Raises:
    ValueError: a scalar operand, or batch dims that do not broadcast (or cannot here).
  """
  a, b = operands.promote_weak(a, b)
  a_shape, b_shape = operands.info(a, "a")[0], operands.info(b, "b")[0]
  if not a_shape or not b_shape:
    raise ValueError(f"mxjax.matmul needs operands of rank >= 1; got {a_shape}, {b_shape}")
  if kwargs.get("preferred_element_type") is None:
    kwargs["preferred_element_type"] = operands.result_dtype(a, b)
  if len(b_shape) == 2 or (len(a_shape) == len(b_shape) and a_shape[:-2] == b_shape[:-2]):
    batch = tuple(range(len(b_shape) - 2))
    dims = (((len(a_shape) - 1,), (len(b_shape) - 2,)), (batch, batch))
    return dot_general(a, b, dims, **kwargs)
  if not all(operands.is_array(x) for x in (a, b)) or kwargs.get("out_sharding") is not None:
    raise ValueError(
        f"mxjax.matmul: operands {a_shape} @ {b_shape} need a vector operand or broadcast "
        "batch dims, which only arrays without out_sharding take; quantize after "
        "broadcasting, or broadcast first")
  a2 = a[None, :] if len(a_shape) == 1 else a
  b2 = b[:, None] if len(b_shape) == 1 else b
  try:
    batch_shape = jnp.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
  except ValueError:
    raise ValueError(f"mxjax.matmul: batch dims of {a_shape} and {b_shape} do not "
                     "broadcast") from None
  if len(b2.shape) > 2 or len(a2.shape) > 2:
    a2 = jnp.broadcast_to(a2, batch_shape + a2.shape[-2:])
    b2 = jnp.broadcast_to(b2, batch_shape + b2.shape[-2:])
  y = matmul(a2, b2, **kwargs)
  if len(b_shape) == 1:  # drop the vectors' dims
    y = y[..., 0]
  if len(a_shape) == 1:
    y = y[..., 0, :] if len(b_shape) > 1 else y[..., 0]
  return y
