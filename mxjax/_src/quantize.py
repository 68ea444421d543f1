"""The public quantize ops: `quantize`, `quantize_2x`, `dequantize`, `fake_quantize`, for
every block-scaled format (an MX element name with a block size and scale mode, or any
`BlockFormat`: `mx(...)`, `nvfp4(...)`, `fp8_block(...)`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from mxjax._src import formats, ops, stochastic
from mxjax._src.mxarray import MXArray


def quantize(x, format="e4m3", *, axis: int = -1, block_size: int | None = None,
             scale_mode=None, rng=None) -> MXArray:
  """Quantizes `x` to a block-scaled format in blocks along `axis`.

  Args:
    x: bfloat16, float16 or float32 array of rank >= 1 (>= 2 for 2-D tiles).
    format: an MX element format ("e4m3", "e5m2", "e3m2", "e2m3" or "e2m1", with E8M0
      scales), or a `BlockFormat` (`mxjax.nvfp4()`, `mxjax.fp8_block()`, ...).
    axis: the axis of 1-D blocks (tiles take the last two axes). Its length need not be a
      multiple of the block (the kernel pads with zeros).
    block_size: MX formats: 16, 32 (default) or 64.
    scale_mode: MX formats: "rceil" (default: no element saturates; NVIDIA's rule) or
      "floor" (OCP's rule).
    rng: a JAX key for stochastic rounding (bits from a counter on each element's global
      index: the same on any mesh); None rounds to nearest even.

  Returns:
    An `MXArray`: `data` (float8 of x's shape, or packed uint8 for FP6 / FP4), `scales`
    (`ceil(n / b)` along `axis`) and, for NVFP4, `tensor_scale`.
  """
  x = ops.check_input(x)
  fmt = formats.as_block_format(format, block_size, scale_mode)
  axis = ops.normalize_axis(axis, x.ndim)
  if fmt.two_d and x.ndim < 2:
    raise ValueError(f"mxjax.quantize: {fmt} has 2-D tiles over the last two axes, which "
                     f"need an array of rank >= 2; got shape {x.shape}")
  data, scales, ts = ops.quantize_raw(x, fmt, axis, stochastic.counter(rng))
  return ops.as_mxarray(data, scales, ts, fmt, axis, x)


def quantize_2x(x, format="e4m3", *, axes: tuple[int, int] = (-1, -2),
                block_size: int | None = None, scale_mode=None) -> tuple[MXArray, MXArray]:
  """Quantizes `x` along two axes at once, both from the high-precision input.

  The usual pair is rowwise (along the last axis) and columnwise (along the one before):
  what a GEMM operand needs for the forward and for the backward. With the default axes
  this is a single pass over memory.

  Args:
    x: bfloat16, float16 or float32 array of rank >= 2.
    axes: the two distinct quantized axes (first result along `axes[0]`).
    format, block_size, scale_mode: as in `quantize`; 1-D blocks only (a 2-D tile's one
      quantization serves both orientations: `quantize` makes it).

  Returns:
    `(along axes[0], along axes[1])`, two `MXArray` of x's logical shape (one tensor
    scale, x's, for both).
  """
  x = ops.check_input(x, "quantize_2x")
  if x.ndim < 2:
    raise ValueError(f"mxjax.quantize_2x needs an array of rank >= 2; got shape {x.shape}")
  fmt = formats.as_block_format(format, block_size, scale_mode)
  if fmt.two_d:
    raise ValueError(f"mxjax.quantize_2x: {fmt} has 2-D tiles, whose one quantization "
                     "serves both orientations; use mxjax.quantize")
  a0, a1 = (ops.normalize_axis(a, x.ndim) for a in axes)
  if a0 == a1:
    raise ValueError(f"quantize_2x needs two distinct axes; got {axes}")
  last, second = x.ndim - 1, x.ndim - 2
  perm = None
  if {a0, a1} != {last, second}:  # bring axes[0] to the end and axes[1] before it
    perm = [d for d in range(x.ndim) if d not in (a0, a1)] + [a1, a0]
  ts = ops.tensor_scale(x, fmt)
  xt = x if perm is None else jnp.transpose(x, perm)
  rd, rs, cd, cs = ops.quantize_2x_raw(xt, fmt, ts)
  if perm is not None:
    back = lambda a: jnp.transpose(a, np.argsort(perm).tolist())  # noqa: E731
    rd, rs, cd, cs = map(back, (rd, rs, cd, cs))
    return (ops.as_mxarray(rd, rs, ts, fmt, a0, x), ops.as_mxarray(cd, cs, ts, fmt, a1, x))
  rows = ops.as_mxarray(rd, rs, ts, fmt, last, x)
  cols = ops.as_mxarray(cd, cs, ts, fmt, second, x)
  return (rows, cols) if a0 == last else (cols, rows)


def dequantize(a: MXArray, dtype=jnp.float32) -> jax.Array:
  """Decodes an `MXArray` to a `dtype` array of its logical shape: `decode(code) *
  scale` (divided by the tensor scale where the format has one).

  A block whose scale is NaN (its input held NaN or Inf) decodes to NaN.

  Args:
    a: an `MXArray` as `quantize` / `quantize_2x` made it (any format, block and axis).
    dtype: bfloat16, float16 or float32 (default); the f32 value is rounded once to it.

  Returns:
    A `dtype` array of `a.shape` (the logical shape, not the packed storage's).

  Raises:
    TypeError: `a` is not an MXArray, or `dtype` is not one of the three.
    ValueError: `a`'s data or scales have another dtype or shape than its format, block and
      axis give (e.g. replaced by a `jax.tree.map`).
  """
  if not isinstance(a, MXArray):
    raise TypeError(f"mxjax.dequantize needs an MXArray, got {type(a).__name__}")
  dtype = jnp.dtype(dtype)
  if dtype not in formats.HIGH_PRECISION_DTYPES:
    raise TypeError(f"dequantize produces bfloat16, float16 or float32, not {dtype.name}")
  _check_storage(a)
  return ops.dequantize_raw(a, dtype)


def _check_storage(a: MXArray) -> None:
  """The data and scales of `a` have the dtypes and shapes its format and length imply."""
  fmt = a.format
  want = ops.quantized_types(a.shape, fmt, a.axis)
  for name, got, spec in (("data", a.data, want[0]), ("scales", a.scales, want[1])):
    if tuple(got.shape) != spec.shape or jnp.dtype(got.dtype) != spec.dtype:
      raise ValueError(
          f"mxjax.dequantize: the MXArray's {name} is {jnp.dtype(got.dtype).name}"
          f"{list(got.shape)}, but {fmt} along axis {a.axis} of logical shape {a.shape} "
          f"needs {spec.dtype.name}{list(spec.shape)}")


def fake_quantize(x, format="e4m3", *, axis: int = -1, block_size: int | None = None,
                  scale_mode=None, dtype=None, rng=None) -> jax.Array:
  """Quantize-dequantize, with a straight-through gradient (for QAT).

  The forward value is `dequantize(quantize(x, ...), dtype)` bit for bit; one kernel pass
  makes it where the platform has the fused kernel (the quantized values never reach
  memory). The gradient passes unchanged (in x's dtype), as if the op were the identity.

  Args:
    x, format, axis, block_size, scale_mode, rng: as in `quantize`.
    dtype: the result's dtype, bfloat16, float16 or float32; default x's.

  Returns:
    An array of x's shape and `dtype`.
  """
  x = ops.check_input(x, "fake_quantize")
  fmt = formats.as_block_format(format, block_size, scale_mode)
  axis = ops.normalize_axis(axis, x.ndim)
  dtype = jnp.dtype(x.dtype if dtype is None else dtype)
  if dtype not in formats.HIGH_PRECISION_DTYPES:
    raise TypeError(f"fake_quantize produces bfloat16, float16 or float32, not {dtype.name}")
  if fmt.two_d and x.ndim < 2:
    raise ValueError(f"mxjax.fake_quantize: {fmt} has 2-D tiles, which need an array of "
                     f"rank >= 2; got shape {x.shape}")
  rand = stochastic.counter(rng)
  if fmt.tensor_scale:  # the tensor scale divides each value (rounded once): two passes
    run = lambda x: ops.dequantize_raw(  # noqa: E731
        ops.as_mxarray(*ops.quantize_raw(x, fmt, axis, rand), fmt, axis, x), dtype)
  else:
    run = lambda x: ops.values(x, fmt, axis, dtype, rand)[0]  # noqa: E731
  return _straight_through(x, run, jnp.dtype(x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _straight_through(x, run, x_dtype):
  del x_dtype
  return run(x)


def _straight_through_fwd(x, run, x_dtype):
  del x_dtype
  return run(x), None


def _straight_through_bwd(run, x_dtype, _, g):
  del run
  return (g.astype(x_dtype),)


_straight_through.defvjp(_straight_through_fwd, _straight_through_bwd)
