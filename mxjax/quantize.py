"""MX quantize / dequantize / fake_quantize: JAX ops lowered per platform to the FFI kernels
or plain XLA.

Each op's call is a `jax.ffi.ffi_call` (CPU kernels in C++, CUDA kernels under the same
target names) on the platforms that use the kernels (`mxjax.backend`) and the plain-XLA
path (`mxjax.xla_codec`, the same bits) on the others, chosen at lowering time inside one
program. It is wrapped with a batching rule (`custom_vmap`: vmap moves the quantized axis
instead of looping) and a sharding rule (see `mxjax.sharding`) that serve both paths.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from mxjax import _ffi, backend, formats, sharding, xla_codec
from mxjax.mxarray import MXArray
from mxjax.sharding import blockwise_partitioned


def _check_input(x, what: str = "quantize") -> jax.Array:
  x = jnp.asarray(x)
  dtype = jnp.dtype(x.dtype)
  if dtype not in formats.HIGH_PRECISION_DTYPES:
    kind = ("an integer" if jnp.issubdtype(dtype, jnp.integer) else
            "a complex" if jnp.issubdtype(dtype, jnp.complexfloating) else "an unsupported")
    raise TypeError(f"mxjax.{what} needs a bfloat16, float16 or float32 input; got {kind} "
                    f"array of dtype {dtype.name}")
  if x.ndim == 0:
    raise ValueError(f"mxjax.{what} needs an array of rank >= 1; got a scalar (rank 0)")
  return x


def _codec(format, block_size: int, scale_mode):
  """(ElementFormat, block size, ScaleMode) of the public arguments, checked."""
  fmt = formats.element_format(format)
  return fmt, formats.check_block_size(block_size, fmt), formats.scale_mode(scale_mode)


def _normalize_axis(axis: int, ndim: int) -> int:
  if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
    raise ValueError(f"axis {axis!r} is out of range for an array of rank {ndim}")
  return int(axis) % ndim


def _blocked_shape(shape, axis: int, length: int) -> tuple[int, ...]:
  shape = list(shape)
  shape[axis] = length
  return tuple(shape)


def _quantized_types(x, fmt: formats.ElementFormat, block_size: int, axis: int):
  n = x.shape[axis]
  data = jax.ShapeDtypeStruct(_blocked_shape(x.shape, axis, fmt.storage_length(n)),
                              fmt.storage_dtype)
  scales = jax.ShapeDtypeStruct(_blocked_shape(x.shape, axis, math.ceil(n / block_size)),
                                jnp.float8_e8m0fnu)
  return data, scales


def _per_block(fmt, block_size: int) -> int:
  """Data entries per block along the quantized axis."""
  return fmt.storage_length(block_size)


def _attrs(fmt, block_size, mode):
  return dict(format=np.int32(fmt.ffi_id), scale_mode=np.int32(mode.ffi_id),
              block_size=np.int64(block_size))


def _per_platform(ffi_fn, xla_fn, *args, cpu_fn=None):
  """`ffi_fn(*args)` lowered for the platforms that use the FFI kernels (`cpu_fn(*args)`
  instead on "cpu" where given: a CPU-only target), `xla_fn(*args)` for every other
  platform (none other under MXJAX_KERNELS=ffi)."""
  platforms = backend.ffi_platforms()
  if not platforms:
    return xla_fn(*args)
  _ffi.load()
  default = None if backend.get_kernels() == "ffi" else xla_fn
  kernel_fn = lambda p: cpu_fn if p == "cpu" and cpu_fn else ffi_fn  # noqa: E731
  return jax.lax.platform_dependent(
      *args, default=default, **{p: _varying_like(kernel_fn(p), args) for p in platforms})


def _varying_like(ffi_fn, args):
  """`ffi_fn` whose results vary over the manual mesh axes (shard_map) its operands vary
  over, as the XLA path's results do: the branches of one program must have equal types."""
  axes = frozenset().union(*map(sharding.varying_axes, args))
  return lambda *operands: sharding.vary_over(ffi_fn(*operands), axes)


def _quantize_call(x, fmt, block_size: int, mode, axis: int):
  """The mxjax_quantize kernel: x -> (data, scales) along `axis`."""
  return jax.ffi.ffi_call("mxjax_quantize", _quantized_types(x, fmt, block_size, axis))(
      x, axis=np.int64(axis), **_attrs(fmt, block_size, mode))


def _dequantize_call(data, scales, fmt, block_size: int, axis: int, length: int, dtype):
  """The mxjax_dequantize kernel: (data, scales) -> x[..., length, ...] of `dtype`."""
  out = jax.ShapeDtypeStruct(_blocked_shape(scales.shape, axis, length), dtype)
  return jax.ffi.ffi_call("mxjax_dequantize", out)(
      data, scales, format=np.int32(fmt.ffi_id), block_size=np.int64(block_size),
      axis=np.int64(axis))


# ---------------------------------------------------------------------------------------
# The kernel calls, each with its batching rule. Static arguments select a cached
# op, so vmap's rule can ask for the same op one axis further in. Each op is jitted: an
# eager call then reuses the compiled program (tracing the stack below costs ~30 ms a call),
# and inside another jit it is inlined.


_STRAIGHT_THROUGH_HINT = ("For a straight-through gradient use mxjax.fake_quantize; to "
                          "quantize a value as a constant, pass it through "
                          "jax.lax.stop_gradient first.")


def _no_derivative(op, name: str, hint: str = _STRAIGHT_THROUGH_HINT):
  """`op` with a JVP rule that raises a TypeError naming `name` and saying what to do
  (`hint`); without it, differentiating the op fails inside `custom_partitioning` with
  JAX's own message."""
  op = jax.custom_jvp(op)

  @op.defjvp
  def _jvp(primals, tangents):
    del primals, tangents
    raise TypeError(
        f"{name} has no derivative (its codes are piecewise constant), and mxjax's products "
        f"(dot_general, einsum, Dense) differentiate once, in reverse mode (jax.grad, "
        f"jax.vjp). {hint}")

  return op


@functools.lru_cache(maxsize=None)
def _quantize_op(fmt, block_size: int, mode, axis: int):
  """(x[..., n, ...]) -> (data, scales) along `axis`."""

  def call(x):
    return _per_platform(lambda x: _quantize_call(x, fmt, block_size, mode, axis),
                         lambda x: xla_codec.quantize(x, fmt, block_size, mode, axis), x)

  partitioned = blockwise_partitioned(call, (axis,), block_size, _per_block(fmt, block_size))

  @custom_vmap
  def op(x):
    return partitioned(x)

  @op.def_vmap
  def _batched(axis_size, in_batched, x):
    del axis_size, in_batched
    return _quantize_op(fmt, block_size, mode, axis + 1)(x), (True, True)

  return jax.jit(_no_derivative(op, "mxjax.quantize"))


@functools.lru_cache(maxsize=None)
def _quantize_2x_op(fmt, block_size: int, mode):
  """(x[..., M, K]) -> (row data, row scales, col data, col scales)."""

  def ffi(x):
    row = _quantized_types(x, fmt, block_size, x.ndim - 1)
    col = _quantized_types(x, fmt, block_size, x.ndim - 2)
    return jax.ffi.ffi_call("mxjax_quantize_2x", (*row, *col))(
        x, **_attrs(fmt, block_size, mode))

  def xla(x):
    return (*xla_codec.quantize(x, fmt, block_size, mode, x.ndim - 1),
            *xla_codec.quantize(x, fmt, block_size, mode, x.ndim - 2))

  def call(x):
    return _per_platform(ffi, xla, x)

  partitioned = blockwise_partitioned(call, (-1, -2), block_size, _per_block(fmt, block_size))

  @custom_vmap
  def op(x):
    return partitioned(x)

  @op.def_vmap
  def _batched(axis_size, in_batched, x):
    del axis_size, in_batched
    return op(x), (True,) * 4  # batch axes lead; the kernel's axes count from the end

  return jax.jit(_no_derivative(op, "mxjax.quantize_2x"))


@functools.lru_cache(maxsize=None)
def _dequantize_op(fmt, block_size: int, axis: int, length: int, dtype):
  """(data, scales) -> x[..., length, ...] of `dtype`."""

  def call(data, scales):
    # A shard of whole blocks holds `blocks * block_size` elements; the whole axis `length`.
    local_length = min(length, scales.shape[axis] * block_size)

    def ffi(data, scales):
      return _dequantize_call(data, scales, fmt, block_size, axis, local_length, dtype)

    def xla(data, scales):
      return xla_codec.dequantize(data, scales, fmt, block_size, axis, local_length, dtype)

    return _per_platform(ffi, xla, data, scales)

  partitioned = blockwise_partitioned(call, (axis,), block_size, _per_block(fmt, block_size),
                                      kind="dequantize")

  @custom_vmap
  def op(data, scales):
    return partitioned(data, scales)

  @op.def_vmap
  def _batched(axis_size, in_batched, data, scales):
    data, scales = (a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
                    for a, b in zip((data, scales), in_batched))
    return _dequantize_op(fmt, block_size, axis + 1, length, dtype)(data, scales), True

  return jax.jit(_no_derivative(op, "mxjax.dequantize"))


@functools.lru_cache(maxsize=None)
def _fake_quantize_op(fmt, block_size: int, mode, axis: int, dtype):
  """(x[..., n, ...]) -> dequantize(quantize(x along `axis`)) of `dtype`: one pass of the
  fused kernel on the CPU (the MX values stay in cache), the quantize and dequantize
  kernels one after the other on CUDA, plain XLA elsewhere."""

  def fused(x):
    return jax.ffi.ffi_call("mxjax_fake_quantize", jax.ShapeDtypeStruct(x.shape, dtype))(
        x, axis=np.int64(axis), **_attrs(fmt, block_size, mode))

  def two_kernels(x):
    data, scales = _quantize_call(x, fmt, block_size, mode, axis)
    return _dequantize_call(data, scales, fmt, block_size, axis, x.shape[axis], dtype)

  def xla(x):
    data, scales = xla_codec.quantize(x, fmt, block_size, mode, axis)
    return xla_codec.dequantize(data, scales, fmt, block_size, axis, x.shape[axis], dtype)

  def call(x):
    return _per_platform(two_kernels, xla, x, cpu_fn=fused)

  partitioned = blockwise_partitioned(call, (axis,), block_size, _per_block(fmt, block_size),
                                      kind="fake_quantize")

  @custom_vmap
  def op(x):
    return partitioned(x)

  @op.def_vmap
  def _batched(axis_size, in_batched, x):
    del axis_size, in_batched
    return _fake_quantize_op(fmt, block_size, mode, axis + 1, dtype)(x), True

  return jax.jit(_no_derivative(
      op, "mxjax.fake_quantize's quantizer",
      "fake_quantize's straight-through gradient is its one derivative, in reverse mode: "
      "forward mode (jax.jvp, jax.jacfwd) and a second derivative (jax.hessian, grad of "
      "grad) have none."))


# ---------------------------------------------------------------------------------------
# Public API


def quantize(x, format="e4m3", *, axis: int = -1, block_size: int = formats.DEFAULT_BLOCK_SIZE,
             scale_mode="rceil") -> MXArray:
  """Quantizes `x` to an MX format in blocks along `axis`.

  Args:
    x: bfloat16, float16 or float32 array of rank >= 1, any shape.
    format: element format: "e4m3", "e5m2", "e3m2", "e2m3" or "e2m1".
    axis: the axis whose consecutive `block_size` elements share one E8M0 scale. Its
      length need not be a multiple of the block (the kernel pads with zeros).
    block_size: 16, 32 or 64.
    scale_mode: "rceil" (no element saturates; NVIDIA's rule) or "floor" (OCP's rule).

  Returns:
    An `MXArray` with `data` (float8 of x's shape, or packed uint8 for FP6 / FP4) and
    `scales` (float8_e8m0fnu, `ceil(n / block_size)` along `axis`).
  """
  x = _check_input(x)
  fmt, block_size, mode = _codec(format, block_size, scale_mode)
  axis = _normalize_axis(axis, x.ndim)
  data, scales = _quantize_op(fmt, block_size, mode, axis)(x)
  return _mxarray(data, scales, fmt, block_size, axis, x, mode)


def quantize_2x(x, format="e4m3", *, axes: tuple[int, int] = (-1, -2),
                block_size: int = formats.DEFAULT_BLOCK_SIZE,
                scale_mode="rceil") -> tuple[MXArray, MXArray]:
  """Quantizes `x` along two axes at once, both from the high-precision input.

  The usual pair is rowwise (along the last axis) and columnwise (along the one before):
  what a GEMM operand needs for the forward and for the backward. With the default axes
  this is a single pass over memory.

  Args:
    x: bfloat16, float16 or float32 array of rank >= 2.
    axes: the two distinct quantized axes (first result along `axes[0]`).
    format, block_size, scale_mode: as in `quantize`.

  Returns:
    `(along axes[0], along axes[1])`, two `MXArray` of x's logical shape.
  """
  x = _check_input(x, "quantize_2x")
  if x.ndim < 2:
    raise ValueError(f"mxjax.quantize_2x needs an array of rank >= 2; got shape {x.shape}")
  fmt, block_size, mode = _codec(format, block_size, scale_mode)
  a0, a1 = (_normalize_axis(a, x.ndim) for a in axes)
  if a0 == a1:
    raise ValueError(f"quantize_2x needs two distinct axes; got {axes}")
  last, second = x.ndim - 1, x.ndim - 2
  if {a0, a1} == {last, second}:  # the kernel's own axes: no transpose
    row_data, row_scales, col_data, col_scales = _quantize_2x_op(fmt, block_size, mode)(x)
    rows = _mxarray(row_data, row_scales, fmt, block_size, last, x, mode)
    cols = _mxarray(col_data, col_scales, fmt, block_size, second, x, mode)
    return (rows, cols) if a0 == last else (cols, rows)
  # Otherwise bring axes[0] to the end and axes[1] just before it, and back after.
  perm = [d for d in range(x.ndim) if d not in (a0, a1)] + [a1, a0]
  inverse = np.argsort(perm).tolist()
  row_data, row_scales, col_data, col_scales = _quantize_2x_op(fmt, block_size, mode)(
      jnp.transpose(x, perm))
  back = lambda a: jnp.transpose(a, inverse)  # noqa: E731
  rows = _mxarray(back(row_data), back(row_scales), fmt, block_size, a0, x, mode)
  cols = _mxarray(back(col_data), back(col_scales), fmt, block_size, a1, x, mode)
  return rows, cols


def dequantize(a: MXArray, dtype=jnp.float32) -> jax.Array:
  """Decodes an `MXArray` to a `dtype` array of its logical shape: `decode(code) * 2^e`.

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
  op = _dequantize_op(a.element_format, a.block_size, a.axis, a.length, dtype)
  return op(a.data, a.scales)


def _check_storage(a: MXArray) -> None:
  """The data and scales of `a` have the shapes its format, block and length imply."""
  fmt = a.element_format
  want = _quantized_types(jax.ShapeDtypeStruct(a.shape, a.dtype), fmt, a.block_size, a.axis)
  for name, got, spec in (("data", a.data, want[0]), ("scales", a.scales, want[1])):
    if tuple(got.shape) != spec.shape or jnp.dtype(got.dtype) != spec.dtype:
      raise ValueError(
          f"mxjax.dequantize: the MXArray's {name} is {jnp.dtype(got.dtype).name}"
          f"{list(got.shape)}, but {fmt.name} with block_size {a.block_size} along axis "
          f"{a.axis} of logical shape {a.shape} needs {spec.dtype.name}{list(spec.shape)}")


def fake_quantize(x, format="e4m3", *, axis: int = -1,
                  block_size: int = formats.DEFAULT_BLOCK_SIZE, scale_mode="rceil",
                  dtype=None) -> jax.Array:
  """Quantize-dequantize, with a straight-through gradient (for QAT).

  The forward value is `dequantize(quantize(x, ...), dtype)` bit for bit; on the CPU one
  kernel pass makes it (the MX values never reach memory). The gradient passes unchanged
  (in x's dtype), as if the op were the identity.

  Args:
    x, format, axis, block_size, scale_mode: as in `quantize`.
    dtype: the result's dtype, bfloat16, float16 or float32; default x's.

  Returns:
    An array of x's shape and `dtype`.
  """
  x = _check_input(x, "fake_quantize")
  fmt, block_size, mode = _codec(format, block_size, scale_mode)
  axis = _normalize_axis(axis, x.ndim)
  dtype = jnp.dtype(x.dtype if dtype is None else dtype)
  if dtype not in formats.HIGH_PRECISION_DTYPES:
    raise TypeError(f"fake_quantize produces bfloat16, float16 or float32, not {dtype.name}")
  return _fake_quantize(x, _fake_quantize_op(fmt, block_size, mode, axis, dtype),
                        jnp.dtype(x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _fake_quantize(x, op, x_dtype):
  del x_dtype
  return op(x)


def _fake_quantize_fwd(x, op, x_dtype):
  del x_dtype
  return op(x), None


def _fake_quantize_bwd(op, x_dtype, _, g):
  del op
  return (g.astype(x_dtype),)


_fake_quantize.defvjp(_fake_quantize_fwd, _fake_quantize_bwd)


def _mxarray(data, scales, fmt, block_size, axis, x, mode) -> MXArray:
  return MXArray(data=data, scales=scales, format=fmt.name, block_size=block_size,
                 axis_from_end=axis - x.ndim, length=x.shape[axis], dtype=jnp.dtype(x.dtype),
                 scale_mode=mode.value)
