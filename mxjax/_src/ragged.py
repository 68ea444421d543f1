"""MX grouped GEMM for mixture-of-experts: `ragged_dot(lhs [M, K], rhs [G, K, N], group_sizes)`.

Rows `lhs[start_g : start_g + group_sizes[g]]` meet expert `rhs[g]` (`jax.lax.ragged_dot`'s
contract; rows past the last group give zeros). Each product quantizes along its own
contraction, as `mxjax.dot_general` does:

  forward   out[m]  = q(lhs, K)[m] . q(rhs[g(m)], K)           fwd_format
  dgrad     dlhs[m] = q(g, N)[m]   . q(rhs[g(m)], N)^T         g in bwd_format
  wgrad     drhs[g] = q_g(lhs, M)^T . q_g(g, M)                 g in bwd_format

The wgrad contracts the rows of one group: its blocks run along M inside the group,
starting at the group's first row and ending at its boundary, the last one zero-padded
(`mxjax.reference.group_fake_quantize` states it), so group boundaries need not be
multiples of the block and a group may be empty. Operands are dequantized to f32 and the
products accumulate in f32 (`jax.lax.ragged_dot` / `ragged_dot_general`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from mxjax._src import formats, products
from mxjax._src.quantize import fake_quantize

_RAGGED_CONTRACTING = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=(0,),
    rhs_group_dimensions=())


@dataclasses.dataclass(frozen=True)
class _Config:
  fwd_format: str
  bwd_format: str
  block_size: int
  scale_mode: str
  out_dtype: Any
  lhs_dtype: Any
  rhs_dtype: Any


def standard_form(dimension_numbers, lhs_ndim: int, rhs_ndim: int) -> bool:
  """Whether a `ragged_dot_general` is `ragged_dot`'s [M, K] x [G, K, N] (what MoE uses)."""
  (lc, rc), (lb, rb) = dimension_numbers.dot_dimension_numbers
  return (lhs_ndim == 2 and rhs_ndim == 3 and tuple(lc) == (1,) and tuple(rc) == (1,)
          and not lb and not rb and tuple(dimension_numbers.lhs_ragged_dimensions) == (0,)
          and tuple(dimension_numbers.rhs_group_dimensions) == (0,))


def ragged_dot(lhs, rhs, group_sizes, *, fwd_format="e4m3", bwd_format="e5m2",
               block_size: int = formats.DEFAULT_BLOCK_SIZE, scale_mode="rceil",
               preferred_element_type=None) -> jax.Array:
  """`jax.lax.ragged_dot(lhs, rhs, group_sizes)` with MX operands, and an MX gradient.

  Args:
    lhs: [M, K] bf16 / f16 / f32: the rows, grouped consecutively.
    rhs: [G, K, N] of the same dtypes: one matrix per group (expert).
    group_sizes: [G] int32, the rows of each group (sum <= M; any may be 0).
    fwd_format, bwd_format, block_size, scale_mode: as in `mxjax.dot_general`.
    preferred_element_type: the output dtype; default the operands' result type.

  Returns:
    [M, N] of `preferred_element_type`.

  Raises:
    ValueError: operands that are not [M, K], [G, K, N] and [G].
    TypeError: operands that are not bf16 / f16 / f32, or group sizes not integers.
  """
  lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
  if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.shape != (rhs.shape[0],) or (
      lhs.shape[1] != rhs.shape[1]):
    raise ValueError("mxjax.ragged_dot needs lhs [M, K], rhs [G, K, N] and group_sizes [G]; "
                     f"got {lhs.shape}, {rhs.shape}, {group_sizes.shape}")
  for name, x in (("lhs", lhs), ("rhs", rhs)):
    if jnp.dtype(x.dtype) not in formats.HIGH_PRECISION_DTYPES:
      raise TypeError(f"mxjax.ragged_dot needs bfloat16, float16 or float32 operands; {name} "
                      f"has dtype {jnp.dtype(x.dtype).name}")
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"mxjax.ragged_dot: group_sizes must be integers, got {group_sizes.dtype}")
  fwd, bwd = formats.element_format(fwd_format), formats.element_format(bwd_format)
  for fmt in (fwd, bwd):
    formats.check_block_size(block_size, fmt)
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs, rhs))
  config = _Config(fwd.name, bwd.name, int(block_size), formats.scale_mode(scale_mode).value,
                   out_dtype, jnp.dtype(lhs.dtype), jnp.dtype(rhs.dtype))
  flops = 2 * math.prod(lhs.shape) * rhs.shape[2]
  with products.marked("ragged_dot", lhs.shape, rhs.shape, flops,
                       f"MX {fwd.name}/{bwd.name}, block {block_size}"):
    return _ragged(config, lhs, rhs, group_sizes.astype(jnp.int32))


def group_fake_quantize(x, format, group_sizes, *, block_size: int, scale_mode) -> jax.Array:
  """x [M, C] quantized and dequantized (f32) along M in blocks that restart at each
  group's first row (rows past the last group form one more group).

  The groups are laid out in a zero buffer, each starting at a multiple of `block_size`,
  quantized along M there with `mxjax.fake_quantize`, and read back.
  """
  m = x.shape[0]
  sizes = jnp.concatenate([group_sizes, (m - jnp.sum(group_sizes))[None]]).astype(jnp.int32)
  padded = (sizes + block_size - 1) // block_size * block_size
  starts, padded_starts = jnp.cumsum(sizes) - sizes, jnp.cumsum(padded) - padded
  rows = jnp.arange(m, dtype=jnp.int32)
  group = jnp.searchsorted(jnp.cumsum(sizes), rows, side="right")
  dest = padded_starts[group] + rows - starts[group]
  length = -(-(m + len(sizes) * (block_size - 1)) // block_size) * block_size
  laid_out = jnp.zeros((length, x.shape[1]), x.dtype).at[dest].set(x)
  q = fake_quantize(laid_out, format, axis=0, block_size=block_size, scale_mode=scale_mode,
                    dtype=jnp.float32)
  return q[dest]


def _quantized(x, format, axis: int, config: _Config):
  return fake_quantize(x, format, axis=axis, block_size=config.block_size,
                       scale_mode=config.scale_mode, dtype=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ragged(config: _Config, lhs, rhs, group_sizes):
  return _forward(config, lhs, rhs, group_sizes)


def _forward(config, lhs, rhs, group_sizes):
  out = lax.ragged_dot(_quantized(lhs, config.fwd_format, 1, config),
                       _quantized(rhs, config.fwd_format, 1, config), group_sizes,
                       precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  return out.astype(config.out_dtype)


def _ragged_fwd(config, lhs, rhs, group_sizes):
  return _forward(config, lhs, rhs, group_sizes), (lhs, rhs, group_sizes)


def _ragged_bwd(config: _Config, residuals, g):
  lhs, rhs, group_sizes = residuals
  if g.dtype not in formats.HIGH_PRECISION_DTYPES:
    g = g.astype(jnp.float32)
  rhs_n = jnp.swapaxes(_quantized(rhs, config.fwd_format, 2, config), 1, 2)  # [G, N, K]
  dlhs = lax.ragged_dot(_quantized(g, config.bwd_format, 1, config), rhs_n, group_sizes,
                        precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  quantize = functools.partial(group_fake_quantize, group_sizes=group_sizes,
                               block_size=config.block_size, scale_mode=config.scale_mode)
  drhs = lax.ragged_dot_general(quantize(lhs, config.fwd_format),
                                quantize(g, config.bwd_format), group_sizes,
                                _RAGGED_CONTRACTING, precision=lax.Precision.HIGHEST,
                                preferred_element_type=jnp.float32)
  return dlhs.astype(config.lhs_dtype), drhs.astype(config.rhs_dtype), None


_ragged.defvjp(_ragged_fwd, _ragged_bwd)
