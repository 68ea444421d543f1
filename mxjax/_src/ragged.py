"""Block-scaled grouped GEMM for mixture-of-experts: `ragged_dot(lhs [M, K], rhs [G, K, N],
group_sizes)` under roles (`mxjax._src.roles`), for every format.

Rows `lhs[start_g : start_g + group_sizes[g]]` meet expert `rhs[g]` (as `lax.ragged_dot`;
rows past the last group give zeros); each product quantizes along its contraction:

  forward   out[m]  = q(lhs, K)[m] . q(rhs[g(m)], K)           / (S_x S_w)
  dgrad     dlhs[m] = q(g, N; SR)[m] . q(rhs[g(m)], N)^T       / (S_g S_w)
  wgrad     drhs[g] = q_g(R lhs, M)^T . q_g(R g, M; SR)         / (S_x S_g)

The wgrad's blocks run along M inside each group, laid out in a zero buffer at a multiple
of the block (and Hadamard size), so groups may have any size
(`mxjax.reference.group_fake_quantize`). A 2-D weight format tiles each expert's [K, N].
Operands are dequantized to f32 and the products accumulate in f32.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from mxjax._src import formats, hadamard, ops, products, stochastic
from mxjax._src.dot import roles_of
from mxjax._src.formats import BlockFormat
from mxjax._src.roles import Roles

_RAGGED_CONTRACTING = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=(0,),
    rhs_group_dimensions=())


@dataclasses.dataclass(frozen=True)
class _Config:
  roles: Roles
  out_dtype: Any
  lhs_dtype: Any
  rhs_dtype: Any
  where: str = ""
  recipe_name: str = ""
  has_key: bool = False


def standard_form(dimension_numbers, lhs_ndim: int, rhs_ndim: int) -> bool:
  """Whether a `ragged_dot_general` is `ragged_dot`'s [M, K] x [G, K, N] (what MoE uses)."""
  (lc, rc), (lb, rb) = dimension_numbers.dot_dimension_numbers
  return (lhs_ndim == 2 and rhs_ndim == 3 and tuple(lc) == (1,) and tuple(rc) == (1,)
          and not lb and not rb and tuple(dimension_numbers.lhs_ragged_dimensions) == (0,)
          and tuple(dimension_numbers.rhs_group_dimensions) == (0,))


def unsupported(roles: Roles) -> str | None:
  """Why `roles` cannot run a grouped GEMM, or None."""
  if roles.x.two_d or roles.grad.two_d:
    return ("2-D tiles for the input or the gradient would cross the groups' row "
            "boundaries; ragged_dot takes 1-D blocks for them (2-D weights are fine)")
  return None


def ragged_dot(lhs, rhs, group_sizes, *, fwd_format="e4m3", bwd_format="e5m2",
               block_size: int = formats.DEFAULT_BLOCK_SIZE, scale_mode="rceil",
               preferred_element_type=None, recipe=None, rng=None,
               name: str = "") -> jax.Array:
  """`jax.lax.ragged_dot(lhs, rhs, group_sizes)` with block-scaled operands and gradient.

  Args:
    lhs: [M, K] bf16 / f16 / f32: the rows, grouped consecutively.
    rhs: [G, K, N] of the same dtypes: one matrix per group (expert).
    group_sizes: [G] int32, the rows of each group (sum <= M; any may be 0).
    fwd_format, bwd_format, block_size, scale_mode: as in `mxjax.dot_general`.
    preferred_element_type: the output dtype; default the operands' result type.
    recipe, rng, name: as in `mxjax.dot_general`.

  Returns:
    [M, N] of `preferred_element_type`.

  Raises:
    ValueError: other shapes; roles with 2-D input or gradient blocks.
    TypeError: operands not bf16 / f16 / f32, or group sizes not integers.
  """
  lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
  if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.shape != (rhs.shape[0],) or (
      lhs.shape[1] != rhs.shape[1]):
    raise ValueError("mxjax.ragged_dot needs lhs [M, K], rhs [G, K, N] and group_sizes [G]; "
                     f"got {lhs.shape}, {rhs.shape}, {group_sizes.shape}")
  for what, x in (("lhs", lhs), ("rhs", rhs)):
    if jnp.dtype(x.dtype) not in formats.HIGH_PRECISION_DTYPES:
      raise TypeError(f"mxjax.ragged_dot needs bfloat16, float16 or float32 operands; {what} "
                      f"has dtype {jnp.dtype(x.dtype).name}")
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"mxjax.ragged_dot: group_sizes must be integers, got {group_sizes.dtype}")
  roles = roles_of(fwd_format, bwd_format, block_size, scale_mode, recipe)
  if (why := unsupported(roles)) is not None:
    raise ValueError(f"mxjax.ragged_dot: {why}")
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs, rhs))
  config = _Config(roles, out_dtype, jnp.dtype(lhs.dtype), jnp.dtype(rhs.dtype), name,
                   type(recipe).__name__ if recipe is not None else "", rng is not None)
  flops = products.ragged_flops(lhs.shape, rhs.shape)
  with products.marked("ragged_dot", lhs.shape, rhs.shape, flops, roles.describe()):
    return _ragged(config, lhs, rhs, group_sizes.astype(jnp.int32), stochastic.seed_of(rng))


def group_layout(m: int, group_sizes, align: int):
  """(destination row of each of m rows, padded group sizes [G], buffer length) of groups
  laid out consecutively, each starting at a multiple of `align`."""
  sizes = jnp.concatenate([group_sizes, (m - jnp.sum(group_sizes))[None]]).astype(jnp.int32)
  padded = (sizes + align - 1) // align * align
  starts, padded_starts = jnp.cumsum(sizes) - sizes, jnp.cumsum(padded) - padded
  rows = jnp.arange(m, dtype=jnp.int32)
  group = jnp.searchsorted(jnp.cumsum(sizes), rows, side="right")
  length = -(-(m + len(sizes) * (align - 1)) // align) * align
  return padded_starts[group] + rows - starts[group], padded[:-1], length


def group_fake_quantize(x, format, group_sizes, *, block_size: int, scale_mode) -> jax.Array:
  """x [M, C] quantized and dequantized (f32) along M in MX blocks that restart at each
  group's first row (rows past the last group form one more group)."""
  fmt = formats.as_block_format(format, block_size, scale_mode)
  dest, _, length = group_layout(x.shape[0], group_sizes, fmt.block_size)
  laid_out = jnp.zeros((length, x.shape[1]), x.dtype).at[dest].set(x)
  return ops.values(laid_out, fmt, 0, jnp.float32)[0][dest]


def _scaled(out, *factors):
  for f in factors:
    if f is not None:
      out = out * f
  return out


def _values(x, fmt: BlockFormat, axis: int, rand=None):
  return ops.values(x, fmt, axis % x.ndim, jnp.float32, rand)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ragged(config: _Config, lhs, rhs, group_sizes, seed):
  return _forward(config, lhs, rhs, group_sizes)


def _forward(config, lhs, rhs, group_sizes):
  (x, sx), (w, sw) = _values(lhs, config.roles.x, 1), _values(rhs, config.roles.w, 1)
  out = lax.ragged_dot(x, w, group_sizes, precision=lax.Precision.HIGHEST,
                       preferred_element_type=jnp.float32)
  return _scaled(out, sx, sw).astype(config.out_dtype)


def _ragged_fwd(config, lhs, rhs, group_sizes, seed):
  return _forward(config, lhs, rhs, group_sizes), (lhs, rhs, group_sizes, seed)


def _ragged_bwd(config: _Config, residuals, g):
  lhs, rhs, group_sizes, seed = residuals
  roles = config.roles
  if g.dtype not in formats.HIGH_PRECISION_DTYPES:
    g = g.astype(jnp.float32)
  sr = roles.stochastic_rounding
  if sr and not config.has_key:
    raise ValueError(stochastic.MISSING_KEY.format(where=config.where or "mxjax.ragged_dot",
                                                   recipe=config.recipe_name or roles))
  bits = (lambda i, x: stochastic.bits_like(seed, i, x)) if sr else (lambda i, x: None)
  # dgrad: contract N.
  (gq, sg), (wq, sw) = _values(g, roles.grad, 1, bits(0, g)), _values(rhs, roles.w, 2)
  dlhs = lax.ragged_dot(gq, jnp.swapaxes(wq, 1, 2), group_sizes,
                        precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  dlhs = _scaled(dlhs, sg, sw)
  # wgrad: contract M within each group, on the groups laid out in zero buffers.
  align = max(roles.x.block_size, roles.grad.block_size,
              roles.hadamard_size if roles.random_hadamard_transform else 1)
  dest, padded_sizes, length = group_layout(lhs.shape[0], group_sizes, align)

  def laid_out(a):
    a = jnp.zeros((length, a.shape[1]), a.dtype).at[dest].set(a)
    if roles.random_hadamard_transform:
      signs = hadamard.rht_signs(roles.rht_seed, config.where, roles.hadamard_size)
      a = hadamard.rht(a, 0, signs)
    return a

  xm, gm = laid_out(lhs), laid_out(g)
  (xq, sx), (gq2, sg2) = _values(xm, roles.x, 0), _values(gm, roles.grad, 0, bits(1, gm))
  drhs = lax.ragged_dot_general(xq, gq2, padded_sizes, _RAGGED_CONTRACTING,
                                precision=lax.Precision.HIGHEST,
                                preferred_element_type=jnp.float32)
  drhs = _scaled(drhs, sx, sg2)
  return dlhs.astype(config.lhs_dtype), drhs.astype(config.rhs_dtype), None, None


_ragged.defvjp(_ragged_fwd, _ragged_bwd)
