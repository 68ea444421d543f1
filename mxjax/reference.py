"""The MX numerics oracle: DESIGN.md's rules in plain jax.numpy, on integer bit patterns.

Every kernel, on every backend, must equal these functions bit for bit. They are written
from the spec, not from any kernel, and favour obviousness over speed.

XLA CPU runs with FTZ/DAZ set, so no float arithmetic touches a value here: inputs are
widened to f32 *bit patterns* (uint32), and every rounding (to the element grid, to f32,
to bf16 / f16) is one integer routine, `round_to_grid`: significand, shift, round half to
even. A magnitude is carried as `sig * 2**exp2` with an unsigned integer `sig`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mxjax import formats

_U32 = jnp.uint32
_I32 = jnp.int32
_F32_ABS = 0x7FFFFFFF
_F32_INF = 0x7F800000
_F32_QNAN = 0x7FC00000


# ---------------------------------------------------------------------------------------
# Integer building blocks


def floor_log2(sig: jax.Array) -> jax.Array:
  """floor(log2(sig)) of a uint32 array (int32; -1 where sig == 0)."""
  return 31 - lax.clz(sig.astype(_U32)).astype(_I32)


def round_to_grid(sig, exp2, emin: int, man_bits: int) -> jax.Array:
  """Rounds the magnitude `sig * 2**exp2` to a binary float grid, half to even.

  The grid is that of a float format with `man_bits` mantissa bits and smallest normal
  exponent `emin` (so with subnormals), and no largest exponent: the caller saturates or
  overflows. Returns the magnitude's code, `(biased exponent << man_bits) | mantissa`
  with biased exponent `ev - emin + 1` (0 for subnormals), as uint32.

  Args:
    sig: uint32 significands, < 2**24.
    exp2: int32 exponents (broadcastable with sig).
  """
  sig = sig.astype(_U32)
  exp2 = exp2.astype(_I32)
  ev = jnp.maximum(floor_log2(sig) + exp2, emin)  # exponent of the value's binade
  shift = ev - man_bits - exp2  # quantum is 2**(ev - man_bits)
  right = jnp.clip(shift, 0, 31).astype(_U32)
  left = jnp.clip(-shift, 0, 31).astype(_U32)  # only when exact (bounded by man_bits)
  kept = jnp.right_shift(sig, right)
  rem = sig - jnp.left_shift(kept, right)
  half = jnp.left_shift(_U32(1), jnp.maximum(right, 1) - 1)
  up = (right > 0) & ((rem > half) | ((rem == half) & ((kept & 1) == 1)))
  n = jnp.where(shift < 0, jnp.left_shift(sig, left), kept + up.astype(_U32))
  # n < 2**(man_bits + 1), or == that after a carry: adding the binade offset handles
  # normals (hidden bit in n), subnormals (ev == emin, n < 2**man_bits) and carries alike.
  code = jnp.left_shift((ev - emin).astype(_U32), _U32(man_bits)) + n
  return jnp.where(sig == 0, _U32(0), code)


def f32_sig_exp(bits) -> tuple[jax.Array, jax.Array]:
  """Splits finite f32 magnitudes (uint32 bits, sign ignored) into (sig, exp2)."""
  e = jnp.right_shift(bits, _U32(23)) & 0xFF
  man = bits & 0x7FFFFF
  sig = jnp.where(e > 0, man | 0x800000, man)
  return sig, jnp.maximum(e.astype(_I32), 1) - 150


def to_f32_bits(x: jax.Array) -> jax.Array:
  """Widens a bf16 / f16 / f32 array exactly to f32 bit patterns (uint32, same shape)."""
  dtype = jnp.dtype(x.dtype)
  if dtype == jnp.float32:
    return lax.bitcast_convert_type(x, _U32)
  if dtype == jnp.bfloat16:
    return jnp.left_shift(lax.bitcast_convert_type(x, jnp.uint16).astype(_U32), _U32(16))
  if dtype == jnp.float16:
    h = lax.bitcast_convert_type(x, jnp.uint16).astype(_U32)
    sign = jnp.left_shift(jnp.right_shift(h, _U32(15)), _U32(31))
    e = jnp.right_shift(h, _U32(10)) & 0x1F
    man = h & 0x3FF
    sig = jnp.where(e > 0, man | 0x400, man)
    finite = round_to_grid(sig, jnp.maximum(e.astype(_I32), 1) - 25, -126, 23)
    special = _F32_INF | jnp.left_shift(man, _U32(13))  # Inf, NaN keeps its payload
    return sign | jnp.where(e == 0x1F, special, finite)
  raise TypeError(f"reference needs a bfloat16, float16 or float32 input, got {dtype.name}")


def from_f32_bits(bits: jax.Array, dtype) -> jax.Array:
  """Rounds f32 bit patterns (uint32) to `dtype` (bf16 / f16 / f32) RNE; keeps
  subnormals, overflows to Inf, NaN -> quiet NaN of the same sign."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return lax.bitcast_convert_type(bits.astype(_U32), jnp.float32)
  man_bits, emin, inf = {jnp.dtype(jnp.bfloat16): (7, -126, 0x7F80),
                         jnp.dtype(jnp.float16): (10, -14, 0x7C00)}[dtype]
  mag = bits & _F32_ABS
  sig, exp2 = f32_sig_exp(mag)
  code = jnp.minimum(round_to_grid(sig, exp2, emin, man_bits), _U32(inf))
  code = jnp.where(mag > _F32_INF, _U32(inf | (1 << (man_bits - 1))), code)
  code = jnp.where(mag == _F32_INF, _U32(inf), code)
  sign = jnp.left_shift(jnp.right_shift(bits, _U32(31)), _U32(15))
  return lax.bitcast_convert_type((code | sign).astype(jnp.uint16), dtype)


# ---------------------------------------------------------------------------------------
# The MX rules


def shared_exponent(amax_bits, fmt, scale_mode) -> jax.Array:
  """The block's shared exponent e from its amax (f32 bits, finite, sign cleared).

  FLOOR: floor(log2(amax)) - emax. RCEIL: the smallest e with amax <= max * 2**e. Both
  clamped to [-127, 127]; amax == 0 gives -127. Returns int32 of amax_bits' shape.
  """
  fmt = formats.element_format(fmt)
  mode = formats.scale_mode(scale_mode)
  sig, exp2 = f32_sig_exp(amax_bits)
  log2 = floor_log2(sig) + exp2
  e = log2 - fmt.emax
  if mode is formats.ScaleMode.RCEIL:
    # max = max_sig * 2**(emax - 23) with max_sig < 2**24; compare significands aligned
    # to 24 bits: amax > max * 2**e  <=>  amax's normalized significand > max_sig.
    max_sig = round(fmt.max * 2.0 ** (23 - fmt.emax))
    norm = jnp.left_shift(sig, (23 - floor_log2(sig)).clip(0, 31).astype(_U32))
    e = e + (norm > max_sig).astype(_I32)
  e = jnp.clip(e, formats.SCALE_EXP_MIN, formats.SCALE_EXP_MAX)
  return jnp.where(amax_bits == 0, formats.SCALE_EXP_MIN, e).astype(_I32)


def encode_elements(bits, e, fmt) -> jax.Array:
  """Codes (uint8) of finite f32 values `bits * 2**-e`: RNE to the element grid with its
  subnormals, saturated to +-max, sign kept. `e` (int32) broadcasts against `bits`."""
  fmt = formats.element_format(fmt)
  sig, exp2 = f32_sig_exp(bits & _F32_ABS)
  mag = jnp.minimum(round_to_grid(sig, exp2 - e, fmt.emin, fmt.man_bits), _U32(fmt.max_code))
  sign = jnp.left_shift(jnp.right_shift(bits, _U32(31)), _U32(fmt.bits - 1))
  return (mag | sign).astype(jnp.uint8)


def decode_elements(codes, e, fmt) -> jax.Array:
  """f32 bit patterns (uint32) of decode(code) * 2**e, rounded once to f32 (RNE,
  subnormals, overflow -> Inf). e4m3 / e5m2 NaN codes give NaN, e5m2 Inf codes +-Inf."""
  fmt = formats.element_format(fmt)
  c = codes.astype(_U32)
  mag = c & ((1 << (fmt.bits - 1)) - 1)
  ef = jnp.right_shift(mag, _U32(fmt.man_bits))
  man = mag & ((1 << fmt.man_bits) - 1)
  sig = jnp.where(ef > 0, man | (1 << fmt.man_bits), man)
  exp2 = jnp.maximum(ef.astype(_I32), 1) - fmt.bias - fmt.man_bits + e
  out = jnp.minimum(round_to_grid(sig, exp2, -126, 23), _U32(_F32_INF))
  if fmt.has_inf or fmt.has_nan:
    top = mag > fmt.max_code  # codes quantize never makes
    is_inf = top & (man == 0) if fmt.has_inf else jnp.zeros_like(top)
    out = jnp.where(top, jnp.where(is_inf, _U32(_F32_INF), _U32(_F32_QNAN)), out)
  sign = jnp.left_shift(jnp.right_shift(c, _U32(fmt.bits - 1)), _U32(31))
  return out | sign


# ---------------------------------------------------------------------------------------
# Blocking, packing and the public API


def _blocks(a, block_size: int, fill=0):
  """[..., n] -> [..., nb, block_size], zero padded."""
  n = a.shape[-1]
  nb = -(-n // block_size)
  pad = [(0, 0)] * (a.ndim - 1) + [(0, nb * block_size - n)]
  return jnp.pad(a, pad, constant_values=fill).reshape(*a.shape[:-1], nb, block_size)


def _merge_last_two(a):
  """[..., nb, k] -> [..., nb * k] (also when some dim is 0)."""
  return a.reshape(*a.shape[:-2], a.shape[-2] * a.shape[-1])


@functools.partial(jax.jit, static_argnames=("fmt", "axis", "block_size", "mode"))
def _encode(x, fmt, axis, block_size, mode):
  fmt = formats.element_format(fmt)
  bits = jnp.moveaxis(to_f32_bits(x), axis, -1)
  n = bits.shape[-1]
  blk = _blocks(bits, block_size)
  amax = jnp.max(blk & _F32_ABS, axis=-1)  # uint32 order is magnitude order; NaN largest
  special = amax >= _F32_INF
  e = shared_exponent(jnp.where(special, _U32(0), amax), fmt, mode)
  codes = encode_elements(blk, e[..., None], fmt)
  codes = jnp.where(special[..., None], jnp.uint8(0), codes)
  codes = _merge_last_two(codes)[..., :n]
  scales = jnp.where(special, jnp.uint8(formats.E8M0_NAN),
                     (e + formats.E8M0_BIAS).astype(jnp.uint8))
  return jnp.moveaxis(codes, -1, axis), jnp.moveaxis(scales, -1, axis)


def _norm_axis(axis: int, ndim: int) -> int:
  if not -ndim <= axis < ndim:
    raise ValueError(f"axis {axis} out of range for rank {ndim}")
  return axis % ndim


def encode_codes(x, format="e4m3", *, axis: int = -1, block_size: int = 32,
                 scale_mode="rceil") -> tuple[jax.Array, jax.Array]:
  """Quantizes `x` (bf16 / f16 / f32, rank >= 1) along `axis`, unpacked.

  Returns:
    codes: uint8 of x's shape, one element code each (sign in bit `bits - 1`).
    scale_bytes: uint8, x's shape with ceil(n / block_size) along axis; e + 127, or 0xFF
      for a block holding NaN / Inf (whose codes are all 0).
  """
  fmt = formats.element_format(format)
  return _encode(x, fmt.name, _norm_axis(axis, x.ndim), int(block_size),
                 formats.scale_mode(scale_mode).value)


def pack_codes(codes, format, axis: int = -1) -> jax.Array:
  """Codes (uint8, n along axis) -> the storage layout: float8 for e4m3 / e5m2 (bitcast),
  uint8 packed along `axis` for FP6 (4 codes in 3 bytes, little-endian 24-bit word) and
  FP4 (2 codes per byte, low nibble first); missing codes past n are 0."""
  return _pack(codes, formats.element_format(format).name, _norm_axis(axis, codes.ndim))


@functools.partial(jax.jit, static_argnames=("fmt", "axis"))
def _pack(codes, fmt, axis):
  fmt = formats.element_format(fmt)
  if not fmt.packed:
    return lax.bitcast_convert_type(codes.astype(jnp.uint8), fmt.storage_dtype)
  groups = _blocks(jnp.moveaxis(codes, axis, -1).astype(_U32), fmt.codes_per_group)
  shifts = jnp.arange(fmt.codes_per_group, dtype=_U32) * fmt.bits
  word = jnp.sum(jnp.left_shift(groups, shifts), axis=-1, dtype=_U32)  # disjoint bits
  nbytes = fmt.bytes_per_group
  out = jnp.right_shift(word[..., None], jnp.arange(nbytes, dtype=_U32) * 8) & 0xFF
  out = _merge_last_two(out.astype(jnp.uint8))
  return jnp.moveaxis(out, -1, axis)


def unpack_codes(data, format, axis: int = -1, n: int | None = None) -> jax.Array:
  """Inverse of `pack_codes`: storage -> uint8 codes with `n` entries along axis
  (default: every code the storage holds)."""
  return _unpack(data, formats.element_format(format).name, _norm_axis(axis, data.ndim), n)


@functools.partial(jax.jit, static_argnames=("fmt", "axis", "n"))
def _unpack(data, fmt, axis, n):
  fmt = formats.element_format(fmt)
  if not fmt.packed:
    return lax.bitcast_convert_type(data, jnp.uint8)
  d = jnp.moveaxis(data, axis, -1).astype(_U32)
  d = d.reshape(*d.shape[:-1], d.shape[-1] // fmt.bytes_per_group, fmt.bytes_per_group)
  word = jnp.sum(jnp.left_shift(d, jnp.arange(fmt.bytes_per_group, dtype=_U32) * 8), axis=-1,
                 dtype=_U32)
  shifts = jnp.arange(fmt.codes_per_group, dtype=_U32) * fmt.bits
  codes = jnp.right_shift(word[..., None], shifts) & ((1 << fmt.bits) - 1)
  codes = _merge_last_two(codes.astype(jnp.uint8))
  if n is not None:
    codes = codes[..., :n]
  return jnp.moveaxis(codes, -1, axis)


def quantize(x, format="e4m3", *, axis: int = -1, block_size: int = 32,
             scale_mode="rceil") -> tuple[jax.Array, jax.Array]:
  """Quantizes `x` (bf16 / f16 / f32, rank >= 1) to an MX format along `axis`.

  Returns:
    data: float8_e4m3fn / float8_e5m2 of x's shape, or uint8 packed along axis (FP6:
      ceil(n/4)*3 bytes, FP4: ceil(n/2) bytes) with the other dims of x.
    scales: float8_e8m0fnu, x's shape with ceil(n / block_size) along axis.
  """
  fmt = formats.element_format(format)
  return _quantize(x, fmt.name, _norm_axis(axis, x.ndim), int(block_size),
                   formats.scale_mode(scale_mode).value)


@functools.partial(jax.jit, static_argnames=("fmt", "axis", "block_size", "mode"))
def _quantize(x, fmt, axis, block_size, mode):
  codes, scale_bytes = _encode(x, fmt, axis, block_size, mode)
  return _pack(codes, fmt, axis), lax.bitcast_convert_type(scale_bytes, jnp.float8_e8m0fnu)


@functools.partial(jax.jit, static_argnames=("fmt", "axis", "block_size", "n", "dtype"))
def _decode(data, scales, fmt, axis, block_size, n, dtype):
  codes = jnp.moveaxis(_unpack(data, fmt, axis, n), axis, -1)
  sbytes = jnp.moveaxis(lax.bitcast_convert_type(scales, jnp.uint8), axis, -1)
  blk = _blocks(codes, block_size)
  e = sbytes.astype(_I32)[..., None] - formats.E8M0_BIAS
  out = decode_elements(blk, e, fmt)
  out = jnp.where(sbytes[..., None] == formats.E8M0_NAN, _U32(_F32_QNAN), out)
  out = _merge_last_two(out)[..., :n]
  return jnp.moveaxis(from_f32_bits(out, dtype), -1, axis)


def dequantize(data, scales, format="e4m3", *, axis: int = -1, block_size: int = 32,
               shape=None, dtype=jnp.float32) -> jax.Array:
  """Decodes MX storage to `dtype` (bf16 / f16 / f32) of the logical `shape`.

  Each element is decode(code) * 2**e rounded once to f32 (RNE, subnormals, overflow ->
  Inf), then rounded to `dtype` (RNE, subnormals kept). A scale byte 0xFF gives NaN for
  the block; codes quantize never makes decode as their format says (e4m3 / e5m2 NaN codes
  -> NaN, e5m2 Inf codes -> +-Inf).

  Args:
    data, scales: as returned by `quantize`.
    shape: the logical shape (needed for packed formats whose n is not a multiple of the
      packing group; defaults to every code the storage holds).
  """
  fmt = formats.element_format(format)
  axis = _norm_axis(axis, scales.ndim)
  if shape is None:
    n = data.shape[axis] // fmt.bytes_per_group * fmt.codes_per_group
  else:
    n = int(tuple(shape)[axis])
  if math.ceil(n / block_size) != scales.shape[axis]:
    raise ValueError(f"{scales.shape[axis]} scales along axis {axis} do not fit n={n}, "
                     f"block_size={block_size}")
  return _decode(data, scales, fmt.name, axis, int(block_size), n, jnp.dtype(dtype))


def group_quantized(x, format, group_sizes, *, block_size: int = 32,
                    scale_mode="rceil") -> jax.Array:
  """x [M, C] quantized along M group by group and dequantized to f32: the operands of a
  grouped GEMM's weight gradient (`mxjax.ragged_dot`).

  Group g holds rows [sum(group_sizes[:g]), sum(group_sizes[:g+1])); rows past the last
  group form one more group. Each group is quantized on its own, along M, as a tensor of
  its own length: its blocks start at its first row and its last block ends at its
  boundary, zero-padded; an empty group has no blocks. `group_sizes` must be concrete.
  """
  sizes = [int(n) for n in np.asarray(group_sizes)]
  sizes.append(x.shape[0] - sum(sizes))
  parts, start = [], 0
  for n in sizes:
    if n:
      data, scales = quantize(x[start:start + n], format, axis=0, block_size=block_size,
                              scale_mode=scale_mode)
      parts.append(dequantize(data, scales, format, axis=0, block_size=block_size,
                              shape=(n, x.shape[1])))
    start += n
  return jnp.concatenate(parts, axis=0) if parts else jnp.zeros(x.shape, jnp.float32)
