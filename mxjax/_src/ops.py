"""quantize / quantize_2x / dequantize / fake_quantize of every block-scaled format, as
JAX ops lowered per platform: the FFI kernels where `mxjax._src.backend` uses them, the
plain-XLA codec (`mxjax._src.codec`, the same bits) elsewhere, inside one program.

The kernel is picked per format: the MX kernels (`mxjax_quantize`, ...) for E8M0 scales
in 1-D blocks of 16, 32 or 64 (the fast path), the block-format kernels
(`mxjax_block_*`) for every other format, stochastic rounding included. Each op is
wrapped once, by `_op`: a jitted call with a batching rule (vmap moves the quantized
axis, or runs the XLA path), a sharding rule for Auto and Explicit mesh axes
(`mxjax._src.sharding`: each device quantizes its own whole blocks; 2-D tiles are
quantized whole), and no derivative (see `fake_quantize` for a straight-through one).

Every kernel writes and reads the codes as MXArray holds them: packed along the quantized
axis (2-D tiles: the last axis), the element format's `storage_length` entries along it.
NVFP4's tensor scale comes from `tensor_amax` (the mxjax_tensor_amax kernel per shard,
then the max over the shards). Stochastic rounding's bits come as an array or as a
`stochastic.Counter`, which the CPU block kernels turn into bits as they round (each
shard's from its first global index); elsewhere XLA makes them inside the op.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from mxjax._src import backend, codec, extension, formats, hadamard, sharding, stochastic
from mxjax._src import float_bits as fb
from mxjax._src.formats import BlockFormat
from mxjax._src.mxarray import MXArray

_NO_BITS = np.zeros((1,), np.uint32)  # the rand operand without stochastic rounding


def per_platform(target: str, ffi_fn, xla_fn, *args):
  """`ffi_fn(*args)` (a dict: `ffi_fn[platform](*args)`) lowered for the platforms whose
  kernels are in use and have `target`, `xla_fn(*args)` for every other platform."""
  platforms = [p for p in backend.ffi_platforms() if backend.uses_kernel(p, target)]
  if not platforms:
    return xla_fn(*args)
  extension.load()
  fns = ffi_fn if isinstance(ffi_fn, dict) else dict.fromkeys(platforms, ffi_fn)
  return jax.lax.platform_dependent(*args, default=xla_fn, **{
      p: _varying_like(fns[p], args) for p in platforms})


def _varying_like(ffi_fn, args):
  """`ffi_fn` whose results vary over the manual mesh axes (shard_map) its operands vary
  over, as the XLA path's results do: the branches of one program must have equal types."""
  axes = frozenset().union(*map(sharding.varying_axes, args))
  return lambda *operands: sharding.vary_over(ffi_fn(*operands), axes)


STRAIGHT_THROUGH_HINT = ("For a straight-through gradient use mxjax.fake_quantize; to "
                         "quantize a value as a constant, pass it through "
                         "jax.lax.stop_gradient first.")


def no_derivative(op, name: str, hint: str = STRAIGHT_THROUGH_HINT):
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


_FAKE_QUANTIZE_HINT = (
    "fake_quantize's straight-through gradient is its one derivative, in reverse mode: "
    "forward mode (jax.jvp, jax.jacfwd) and a second derivative (jax.hessian, grad of "
    "grad) have none.")


def _op(call, name: str, batched=None, hint: str = STRAIGHT_THROUGH_HINT):
  """`call` jitted, without a derivative (differentiating it raises, with `hint`), batched
  by `batched(in_batched, *args)` (a rule returning results with leading batch axes) or
  else by vmap of `call` itself."""

  @custom_vmap
  def op(*args):
    return call(*args)

  @op.def_vmap
  def _batched(axis_size, in_batched, *args):
    if batched is not None:
      out = batched(in_batched, *args)
    else:
      args = [a if b else jnp.broadcast_to(a, (axis_size, *jnp.shape(a)))
              for a, b in zip(args, in_batched)]
      out = jax.vmap(call)(*args)
    return out, jax.tree.map(lambda _: True, out)

  return jax.jit(no_derivative(op, name, hint))


def _partitioned(call, fmt: BlockFormat, axes, kind: str, sr=None):
  """`call` with the sharding rule of `kind` over its blocked `axes` (and, for a counter
  `sr`, each shard's base; see `_sr_operand`); 2-D tiles (except fake_quantize, whose
  result is x-shaped) run on the whole array."""
  if fmt.two_d and kind != "fake_quantize":
    def whole(*args):
      if any(sharding.typed_spec(a) is not None for a in args):
        args = [jax.sharding.reshard(a, jax.sharding.PartitionSpec()) for a in args]
      return call(*args)
    return whole
  b = fmt.block_size
  return sharding.blockwise_partitioned(call, (-2, -1) if fmt.two_d else axes, b,
                                        fmt.element_format.storage_length(b), kind=kind,
                                        index_strides=sr if isinstance(sr, tuple) else None)


# ---------------------------------------------------------------------------------------
# Kernel calls


def quantized_types(shape, fmt: BlockFormat, axis: int):
  """(data, scales) ShapeDtypeStructs of `shape` quantized along `axis` (non-negative)."""
  packed = len(shape) - 1 if fmt.two_d else axis
  data = list(shape)
  data[packed] = fmt.element_format.storage_length(shape[packed])
  b = fmt.block_size
  if fmt.two_d:
    scales = (*shape[:-2], -(-shape[-2] // b), -(-shape[-1] // b))
  else:
    scales = tuple(-(-d // b) if i == axis else d for i, d in enumerate(shape))
  return (jax.ShapeDtypeStruct(tuple(data), fmt.element_format.storage_dtype),
          jax.ShapeDtypeStruct(scales, fmt.scale.dtype))


def _mx_attrs(fmt: BlockFormat, axis: int | None = None) -> dict:
  attrs = dict(format=np.int32(fmt.element_format.ffi_id),
               scale_mode=np.int32(formats.scale_mode(fmt.scale_mode).ffi_id),
               block_size=np.int64(fmt.block_size))
  return attrs if axis is None else dict(attrs, axis=np.int64(axis))


def _block_attrs(fmt: BlockFormat, axis: int) -> dict:
  return dict(format=np.int32(fmt.element_format.ffi_id), scale=np.int32(fmt.scale.ffi_id),
              scale_mode=np.int32(formats.scale_mode(fmt.scale_mode).ffi_id),
              block_rows=np.int64(fmt.block[0]), block_cols=np.int64(fmt.block[1]),
              axis=np.int64(axis))


def _raw(t: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
  """The block kernels' result type for `t`: bytes (uint8; codes packed as `t`'s) or f32
  bits (uint32)."""
  return jax.ShapeDtypeStruct(t.shape,
                              jnp.uint32 if jnp.dtype(t.dtype).itemsize == 4 else jnp.uint8)


def _from_raw(a, t: jax.ShapeDtypeStruct):
  """A block kernel's result as `t`."""
  return jax.lax.bitcast_convert_type(a, t.dtype) if a.dtype != t.dtype else a


def ts_bits(ts):
  """The tensor-scale operand: uint32[1] of the f32 bits (0: none)."""
  if ts is None:
    return jnp.zeros((1,), jnp.uint32)
  return jax.lax.bitcast_convert_type(jnp.reshape(ts, (1,)).astype(jnp.float32), jnp.uint32)


def _sr_operand(rand, shape):
  """(sr, the ops' rand operand) for stochastic rounding by `rand` of x of `shape`: None
  (nearest even; uint32[1] zeros), uint32 bits of x's shape ("bits"), or a
  `stochastic.Counter` (its index strides; uint32[3]: seed[0], seed[1], base 0)."""
  if rand is None:
    return None, _NO_BITS
  if isinstance(rand, stochastic.Counter):
    seed = jnp.asarray(rand.seed, jnp.uint32).reshape(2)
    return rand.strides_of(shape), jnp.concatenate([seed, jnp.zeros((1,), jnp.uint32)])
  return "bits", jnp.asarray(rand, jnp.uint32)


def _bits(sr, rand, x):
  """The bits the operand `rand` stands for under `sr` (`_sr_operand`), counters' made in
  XLA once x exists; None for nearest even."""
  if not isinstance(sr, tuple):
    return rand if sr else None
  return stochastic.after(stochastic.random_bits(rand[:2], x.shape, sr, rand[2]), x)


def _cpu_input(x):
  """x for a CPU block-format kernel: they are compiled for bf16 and f32 inputs, so f16
  comes widened to f32 (exact; a third input type would cost a third more of their
  build)."""
  return x.astype(jnp.float32) if x.dtype == jnp.float16 else x


def _block_kernel(target: str, types, post, fmt: BlockFormat, axis: int, sr, **attrs):
  """{platform: (x, rand, ts_bits) -> `post(results, x)` of the block kernel `target`
  (result types `types(x)`; `attrs` besides the format's)}: a counter goes to the CPU
  kernel, which makes its bits (x as `_cpu_input`), elsewhere XLA makes them first."""

  def call(platform, x, rand, ts):
    kw = dict(_block_attrs(fmt, axis), stochastic_rounding=sr is not None, **attrs)
    if platform == "cpu":
      kw["strides"] = np.asarray(sr if isinstance(sr, tuple) else (), np.int64)
      x = _cpu_input(x)
    elif isinstance(sr, tuple):
      rand = _bits(sr, rand, x)
    return post(jax.ffi.ffi_call(target, types(x))(x, rand, ts, **kw), x)

  return {p: functools.partial(call, p) for p in ("cpu", "cuda")}


def _batched_sr(sr):
  """`sr` under a new leading axis: each example's counter bits are those of its own index."""
  return (0, *sr) if isinstance(sr, tuple) else sr


def _columns_after(shape, axis: int) -> bool:
  """Whether x has a dimension longer than 1 after `axis` (non-negative): the RHT kernels
  run the transform down its columns (mxjax_rht_quantize, mxjax_rht_amax)."""
  return int(np.prod(shape[axis + 1:])) > 1


def fuses_rht(shape, fmt: BlockFormat, axis: int, n: int) -> bool:
  """Whether the CPU kernels quantize x's RHT along `axis` (non-negative) without an f32
  copy of it: 1-D blocks of whole runs and packing groups, columns after the axis."""
  return (not fmt.two_d and fmt.block_size % n == 0
          and fmt.block_size % fmt.element_format.codes_per_group == 0
          and _columns_after(shape, axis))


@functools.lru_cache(maxsize=None)
def _quantize_op(fmt: BlockFormat, axis: int, sr, rht: tuple[float, ...] | None = None):
  """(x, rand, ts_bits) -> (data, scales); `sr` and rand as `_sr_operand` makes them; of
  x's RHT along `axis` (`hadamard.rht`, the axis a whole number of runs) where `rht` (its
  signs) is given."""

  def xla(x, rand, ts):
    ts = jax.lax.bitcast_convert_type(ts[0], jnp.float32) if fmt.tensor_scale else None
    return codec.quantize(x, fmt, axis, _bits(sr, rand, x), ts)[:2]

  def types(x):
    return quantized_types(x.shape, fmt, axis)

  def raw_types(x):
    return tuple(map(_raw, types(x)))

  def from_raw(out, x):
    return tuple(map(_from_raw, out, types(x)))

  if fmt.mx_kernels and not sr:
    target = "mxjax_quantize"
    ffi = lambda x, rand, ts: jax.ffi.ffi_call(  # noqa: E731
        target, types(x))(x, **_mx_attrs(fmt, axis))
  else:
    target = "mxjax_block_quantize"
    ffi = _block_kernel(target, raw_types, from_raw, fmt, axis, sr)

  def local(x, rand, ts):
    if rht is None:
      return per_platform(target, ffi, xla, x, rand, ts)
    signs = np.asarray(rht, np.float32)
    rotated = lambda x, rand, ts: per_platform(  # noqa: E731
        target, ffi, xla, hadamard.rht(x, axis, signs), rand, ts)
    if not fuses_rht(x.shape, fmt, axis, len(signs)):
      return rotated(x, rand, ts)
    fused = _block_kernel("mxjax_rht_quantize", raw_types, from_raw, fmt, axis, sr,
                          signs=signs)
    return per_platform("mxjax_rht_quantize", {"cpu": fused["cpu"]}, rotated, x, rand, ts)

  call = _partitioned(local, fmt, (axis,), "quantize", sr)

  def batched(in_batched, x, rand, ts):
    if fmt.two_d or not in_batched[0] or any(in_batched[1:]):
      plain = xla if rht is None else lambda x, *a: xla(  # noqa: E731
          hadamard.rht(x, axis, np.asarray(rht, np.float32)), *a)
      return jax.vmap(plain, in_axes=tuple(0 if b else None for b in in_batched))(x, rand, ts)
    return _quantize_op(fmt, axis + 1, _batched_sr(sr), rht)(x, rand, ts)

  return _op(call, "mxjax.quantize", batched)


@functools.lru_cache(maxsize=None)
def _quantize_2x_op(fmt: BlockFormat):
  """(x[..., M, K], ts_bits) -> (row data, row scales, col data, col scales)."""

  def xla(x, ts):
    ts = jax.lax.bitcast_convert_type(ts[0], jnp.float32) if fmt.tensor_scale else None
    return (*codec.quantize(x, fmt, x.ndim - 1, None, ts)[:2],
            *codec.quantize(x, fmt, x.ndim - 2, None, ts)[:2])

  def ffi(x, ts):
    types = (*quantized_types(x.shape, fmt, x.ndim - 1),
             *quantized_types(x.shape, fmt, x.ndim - 2))
    if fmt.mx_kernels:
      return jax.ffi.ffi_call("mxjax_quantize_2x", types)(x, **_mx_attrs(fmt))
    out = jax.ffi.ffi_call("mxjax_block_quantize_2x", tuple(map(_raw, types)))(
        x, ts, **_block_attrs(fmt, x.ndim - 1))
    return tuple(map(_from_raw, out, types))

  target = "mxjax_quantize_2x" if fmt.mx_kernels else (
      "mxjax_block_quantize_2x" if 512 % fmt.block_size == 0 else "")
  kernel = ffi if fmt.mx_kernels else {"cpu": lambda x, ts: ffi(_cpu_input(x), ts), "cuda": ffi}
  call = _partitioned(lambda *a: per_platform(target, kernel, xla, *a), fmt, (-1, -2),
                      "quantize")
  return _op(call, "mxjax.quantize_2x",
             lambda in_batched, x, ts: _quantize_2x_op(fmt)(x, ts))  # batch axes lead


@functools.lru_cache(maxsize=None)
def _dequantize_op(fmt: BlockFormat, axis: int, length: int, dtype, apply_ts: bool):
  """(data, scales, ts_bits) -> x[..., length, ...] of `dtype`."""
  packed = -1 if fmt.two_d else axis

  def call(data, scales, ts):
    # A shard of whole blocks holds `blocks * block_size` elements; the whole axis `length`.
    local = min(length, scales.shape[packed] * fmt.block_size)

    def xla(data, scales, ts):
      ts = jax.lax.bitcast_convert_type(ts[0], jnp.float32)
      return codec.dequantize(data, scales, ts, fmt, axis, local, dtype, apply_ts)

    def ffi(data, scales, ts, out_dtype=jnp.float32):
      shape = list(data.shape)
      shape[packed] = local
      if fmt.mx_kernels:
        return jax.ffi.ffi_call("mxjax_dequantize", jax.ShapeDtypeStruct(tuple(shape), dtype))(
            data, scales, format=np.int32(fmt.element_format.ffi_id),
            block_size=np.int64(fmt.block_size), axis=np.int64(axis))
      codes = jax.lax.bitcast_convert_type(data, jnp.uint8)
      raw = jax.lax.bitcast_convert_type(scales, _raw(scales).dtype)
      out = jax.ffi.ffi_call("mxjax_block_dequantize",
                             jax.ShapeDtypeStruct(tuple(shape), out_dtype))(
          codes, raw, ts, **_block_attrs(fmt, axis), apply_tensor_scale=apply_ts)
      return to_dtype(out, dtype)

    if fmt.mx_kernels:
      return per_platform("mxjax_dequantize", ffi, xla, data, scales, ts)
    return per_platform("mxjax_block_dequantize", {  # CUDA's kernel writes f32
        "cpu": functools.partial(ffi, out_dtype=dtype), "cuda": ffi}, xla, data, scales, ts)

  def batched(in_batched, data, scales, ts):
    if fmt.two_d or in_batched[2]:
      return jax.vmap(call, in_axes=tuple(0 if b else None for b in in_batched))(
          data, scales, ts)
    n = (data if in_batched[0] else scales).shape[0]
    data, scales = (a if b else jnp.broadcast_to(a, (n, *a.shape))
                    for a, b in zip((data, scales), in_batched))
    return _dequantize_op(fmt, axis + 1, length, dtype, apply_ts)(data, scales, ts)

  call_p = _partitioned(call, fmt, (axis,), "dequantize")
  return _op(call_p, "mxjax.dequantize", batched)


@functools.lru_cache(maxsize=None)
def _fake_quantize_op(fmt: BlockFormat, axis: int, sr, dtype):
  """(x, rand, ts_bits) -> dequantize(quantize(x along `axis`)) of `dtype`, without the
  tensor scale: one kernel pass where the platform has the fused kernel (`sr` and rand as
  `_sr_operand` makes them)."""

  def xla(x, rand, ts):
    ts = jax.lax.bitcast_convert_type(ts[0], jnp.float32) if fmt.tensor_scale else None
    data, scales, _ = codec.quantize(x, fmt, axis, _bits(sr, rand, x), ts)
    return codec.dequantize(data, scales, ts, fmt, axis, x.shape[-1 if fmt.two_d else axis],
                            dtype, apply_tensor_scale=False)

  if fmt.mx_kernels and not sr:
    target = "mxjax_fake_quantize"
    ffi = lambda x, rand, ts: jax.ffi.ffi_call(  # noqa: E731
        target, jax.ShapeDtypeStruct(x.shape, dtype))(x, **_mx_attrs(fmt, axis))
  else:
    target = "mxjax_block_fake_quantize"
    ffi = _block_kernel(target, lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32),
                        lambda out, x: to_dtype(out, dtype), fmt, axis, sr)
  call = _partitioned(lambda *a: per_platform(target, ffi, xla, *a), fmt, (axis,),
                      "fake_quantize", sr)

  def batched(in_batched, x, rand, ts):
    if fmt.two_d or not in_batched[0] or any(in_batched[1:]):
      return jax.vmap(xla, in_axes=tuple(0 if b else None for b in in_batched))(x, rand, ts)
    return _fake_quantize_op(fmt, axis + 1, _batched_sr(sr), dtype)(x, rand, ts)

  return _op(call, "mxjax.fake_quantize's quantizer", batched, _FAKE_QUANTIZE_HINT)


def to_dtype(x, dtype):
  """An f32 array as `dtype`, rounded half to even with subnormals (whatever the
  platform's FTZ); an array of `dtype` as it is."""
  if x.dtype == jnp.dtype(dtype):
    return x
  return fb.from_f32_bits(jax.lax.bitcast_convert_type(x, jnp.uint32), dtype)


# ---------------------------------------------------------------------------------------
# The pieces of the public ops


def check_input(x, what: str = "quantize") -> jax.Array:
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


def normalize_axis(axis: int, ndim: int) -> int:
  if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
    raise ValueError(f"axis {axis!r} is out of range for an array of rank {ndim}")
  return int(axis) % ndim


def _amax_local(x, rht=None):
  """x's amax (or its shard's): the mxjax_tensor_amax kernel where in use, XLA elsewhere;
  of x's RHT along an axis where `rht` = (axis, signs) is given (mxjax_rht_amax where in
  use: no f32 copy of it)."""

  def ffi(x):
    amax = jax.ffi.ffi_call("mxjax_tensor_amax", jax.ShapeDtypeStruct((1,), jnp.uint32))(x)
    return jnp.reshape(amax, ())

  if rht is None:
    return per_platform("mxjax_tensor_amax", ffi, codec.tensor_amax, x)
  axis, signs = rht[0], np.asarray(rht[1], np.float32)
  rotated = lambda x: _amax_local(hadamard.rht(x, axis, signs))  # noqa: E731
  if not _columns_after(x.shape, axis):
    return rotated(x)

  def fused(x):
    amax = jax.ffi.ffi_call("mxjax_rht_amax", jax.ShapeDtypeStruct((1,), jnp.uint32))(
        _cpu_input(x), axis=np.int64(axis), signs=signs)
    return jnp.reshape(amax, ())

  return per_platform("mxjax_rht_amax", {"cpu": fused}, rotated, x)


@functools.lru_cache(maxsize=None)
def _amax_op(rht=None):
  def local(x):
    return _amax_local(x, rht)

  whole = None if rht is None else (rht[0], len(rht[1]))
  plain = codec.tensor_amax if rht is None else lambda x: codec.tensor_amax(  # noqa: E731
      hadamard.rht(x, rht[0], np.asarray(rht[1], np.float32)))
  return _op(sharding.max_over_shards(local, whole), "mxjax's tensor amax",
             lambda in_batched, x: jax.vmap(plain)(x))


def tensor_amax(x, rht=None) -> jax.Array:
  """uint32 scalar: the f32 bits of max |x| over x's finite elements (0 for none), each
  shard's on a mesh (Auto or Explicit axes), then the max over the shards; of x's RHT
  where `rht` = (axis, signs) is given (the axis a whole number of runs)."""
  if x.size == 0:
    return jnp.zeros((), jnp.uint32)
  return _amax_op(None if rht is None else (rht[0] % x.ndim, tuple(map(float, rht[1]))))(x)


def tensor_scale(x, fmt: BlockFormat, rht=None):
  """The f32 tensor scale of `x` (of its RHT, `rht` = (axis, signs)) for `fmt` (None for
  formats without one)."""
  if not fmt.tensor_scale:
    return None
  return codec.tensor_scale(tensor_amax(x, rht), fmt)


def quantize_raw(x, fmt: BlockFormat, axis: int, rand=None, ts=None, rht=None):
  """(data, scales, tensor scale) of x quantized along `axis` (non-negative): the op
  `quantize` wraps. `rand` (stochastic rounding): uint32 bits of x's shape or a
  `stochastic.Counter`. `rht`: the signs of an RHT along `axis` (`hadamard.rht`; the axis
  a whole number of runs) that x is quantized after, and the tensor scale is computed of."""
  if rht is not None:
    rht = tuple(map(float, rht))
    if x.shape[axis] % len(rht):
      raise ValueError(f"the RHT's axis has {x.shape[axis]} elements, not a multiple of "
                       f"its {len(rht)}")
  if fmt.tensor_scale and ts is None:
    ts = tensor_scale(x, fmt, None if rht is None else (axis, rht))
  sr, operand = _sr_operand(rand, x.shape)
  data, scales = _quantize_op(fmt, axis, sr, rht)(x, operand, ts_bits(ts))
  return data, scales, ts


def quantize_2x_raw(x, fmt: BlockFormat, ts):
  """(row data, row scales, col data, col scales) of x [..., M, K] quantized along K and
  along M in one pass (1-D blocks; `ts` the tensor scale or None)."""
  return _quantize_2x_op(fmt)(x, ts_bits(ts))


def as_mxarray(data, scales, ts, fmt: BlockFormat, axis: int, x) -> MXArray:
  packed = x.ndim - 1 if fmt.two_d else axis
  return MXArray(data=data, scales=scales, tensor_scale=ts, format=fmt,
                 axis_from_end=packed - x.ndim, length=x.shape[packed], dtype=jnp.dtype(x.dtype))


def values(x, fmt: BlockFormat, axis: int, dtype, rand=None):
  """(dequantize(quantize(x)) without the tensor scale, in `dtype`; the tensor's decode
  factor 1 / S as f32, or None): what a GEMM multiplies, and what scales its output."""
  ts = tensor_scale(x, fmt)
  sr, operand = _sr_operand(rand, x.shape)
  y = _fake_quantize_op(fmt, axis, sr, jnp.dtype(dtype))(x, operand, ts_bits(ts))
  return y, None if ts is None else 1.0 / ts


def dequantize_raw(a: MXArray, dtype, apply_tensor_scale: bool = True) -> jax.Array:
  """`a` decoded to `dtype` (the tensor scale applied unless told not to)."""
  fmt = a.format
  axis = a.axis if not fmt.two_d else a.ndim - 1
  apply = bool(fmt.tensor_scale and apply_tensor_scale)
  if apply and a.tensor_scale is None:
    raise ValueError(f"mxjax.dequantize: an MXArray of {fmt} needs its tensor scale")
  op = _dequantize_op(fmt, axis, a.length, jnp.dtype(dtype), apply)
  return op(a.data, a.scales, ts_bits(a.tensor_scale if apply else None))
