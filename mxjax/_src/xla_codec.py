"""The MX ops in plain XLA: the path for platforms without mxjax kernels (TPU, ROCm, ...).

Bit-identical to the FFI kernels and to the oracle (`mxjax.reference`), and written to
fuse: every step is an elementwise integer op or a reduction over a block axis, done in
place along the quantized axis (no transposes), with no gather and no Python loop.

Only integer arithmetic touches values, because XLA's CPU (and some accelerators) flush
f32 subnormals: a scaled magnitude is rebuilt from the f32 bit fields and rounded with
one shift (`_round_shift`), not multiplied. This is a separate formulation from the
oracle's (which rounds a general `sig * 2**exp2` to any grid); the tests hold the two
equal on every bf16 / f16 bit pattern.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from mxjax._src import formats

_U32 = jnp.uint32
_I32 = jnp.int32
_ABS = 0x7FFFFFFF
_INF = 0x7F800000
_QNAN = 0x7FC00000
_FRAC = 0x7FFFFF
_HIDDEN = 0x800000


def _u32(v) -> jax.Array:
  return jnp.asarray(v).astype(_U32)


def _round_shift(u, shift) -> jax.Array:
  """`u >> shift` rounded half to even (uint32 u < 2**31; shift an int32 array, >= 1)."""
  s = _u32(jnp.clip(shift, 1, 31))
  odd = jnp.right_shift(u, s) & 1
  return jnp.right_shift(u + (jnp.left_shift(_U32(1), s - 1) - 1) + odd, s)


def _exponent_and_fraction(mag) -> tuple[jax.Array, jax.Array]:
  """(floor(log2 |v|) int32, 23-bit fraction of |v| normalized) of nonzero f32 magnitudes
  (uint32 bits, sign clear); subnormals are normalized with a count of leading zeros."""
  field = jnp.right_shift(mag, _U32(23))
  top = 31 - lax.clz(mag).astype(_I32)  # highest set bit of a subnormal's fraction
  subnormal = field == 0
  exponent = jnp.where(subnormal, top - 149, field.astype(_I32) - 127)
  normalized = jnp.left_shift(mag, _u32(jnp.clip(23 - top, 0, 31))) & _FRAC
  return exponent, jnp.where(subnormal, normalized, mag & _FRAC)


def f32_bits(x) -> jax.Array:
  """bf16 / f16 / f32 array -> the f32 bit patterns of its values (uint32), exactly."""
  dtype = jnp.dtype(x.dtype)
  if dtype == jnp.float32:
    return lax.bitcast_convert_type(x, _U32)
  h = lax.bitcast_convert_type(x, jnp.uint16).astype(_U32)
  if dtype == jnp.bfloat16:
    return jnp.left_shift(h, _U32(16))
  # f16: rebias normals; normalize subnormals (their value is frac * 2**-24).
  sign = jnp.left_shift(h & 0x8000, _U32(16))
  field = jnp.right_shift(h, _U32(10)) & 0x1F
  frac = h & 0x3FF
  top = 31 - lax.clz(frac).astype(_I32)
  sub = jnp.left_shift(_u32(top + 103), _U32(23)) | (
      jnp.left_shift(frac, _u32(jnp.clip(23 - top, 0, 31))) & _FRAC)
  normal = jnp.left_shift(field + 112, _U32(23)) | jnp.left_shift(frac, _U32(13))
  special = _INF | jnp.left_shift(frac, _U32(13))
  mag = jnp.where(field == 0x1F, special, jnp.where(field > 0, normal,
                                                   jnp.where(frac == 0, _U32(0), sub)))
  return sign | mag


def from_f32_bits(bits, dtype) -> jax.Array:
  """f32 bit patterns (uint32) -> `dtype`, rounded half to even with subnormals, overflow
  to Inf, NaN to the quiet NaN of the same sign."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return lax.bitcast_convert_type(bits, jnp.float32)
  mag = bits & _ABS
  sign = jnp.right_shift(bits, _U32(31))
  if dtype == jnp.bfloat16:  # same exponent range: one rounding of the low 16 bits
    half = jnp.where(mag > _INF, _U32(0x7FC0), _round_shift(mag, 16))
  elif dtype == jnp.float16:
    exponent = jnp.right_shift(mag, _U32(23)).astype(_I32) - 127
    normal = jnp.minimum(_round_shift(mag - (112 << 23), 13), _U32(0x7C00))
    subnormal = _round_shift((mag & _FRAC) | _HIDDEN, -1 - exponent)  # quantum 2**-24
    half = jnp.where(exponent >= -14, normal, subnormal)
    half = jnp.where(mag > _INF, _U32(0x7E00), jnp.where(mag == _INF, _U32(0x7C00), half))
  else:
    raise TypeError(f"no MX dequantize to {dtype.name}")
  out = (half | jnp.left_shift(sign, _U32(15))).astype(jnp.uint16)
  return lax.bitcast_convert_type(out, dtype)


# ---------------------------------------------------------------------------------------
# Blocks along an axis, in place


def _pad_axis(a, axis: int, length: int):
  pad = [(0, 0)] * a.ndim
  pad[axis] = (0, length - a.shape[axis])
  return jnp.pad(a, pad) if length > a.shape[axis] else a


def _split_axis(a, axis: int, inner: int):
  """[..., n, ...] -> [..., n / inner, inner, ...] (n a multiple of inner)."""
  return a.reshape(*a.shape[:axis], a.shape[axis] // inner, inner, *a.shape[axis + 1:])


def _merge_axis(a, axis: int):
  """Inverse of `_split_axis`."""
  return a.reshape(*a.shape[:axis], a.shape[axis] * a.shape[axis + 1], *a.shape[axis + 2:])


# ---------------------------------------------------------------------------------------
# Quantize


def _shared_exponent(amax, fmt: formats.ElementFormat, mode: formats.ScaleMode):
  """The block exponent e (int32) from amax (finite f32 magnitude bits)."""
  exponent, fraction = _exponent_and_fraction(amax)
  e = exponent - fmt.emax
  if mode is formats.ScaleMode.RCEIL:  # one more where amax > max * 2**e
    max_fraction = round(fmt.max * 2.0 ** (23 - fmt.emax)) - _HIDDEN
    e = e + (fraction > max_fraction).astype(_I32)
  e = jnp.clip(e, formats.SCALE_EXP_MIN, formats.SCALE_EXP_MAX)
  return jnp.where(amax == 0, formats.SCALE_EXP_MIN, e)


def _encode(bits, e, fmt: formats.ElementFormat):
  """Element codes (uint32, sign in bit `bits - 1`) of the f32 values `bits * 2**-e`:
  round half to even on the element grid (subnormals too), saturated to +-max."""
  mag = bits & _ABS
  exponent, fraction = _exponent_and_fraction(mag)
  scaled = exponent - e  # the exponent of v = |x| * 2**-e
  m = fmt.man_bits
  # A normal element: the fraction under the element's biased exponent, rounded to m
  # bits (a carry moves into the exponent). A subnormal one: the significand shifted
  # down to the subnormal quantum 2**(emin - m).
  normal = jnp.left_shift(_u32(jnp.maximum(scaled - fmt.emin + 1, 0)), _U32(23)) | fraction
  code = jnp.where(scaled >= fmt.emin, _round_shift(normal, 23 - m),
                   _round_shift(fraction | _HIDDEN, 23 - m + fmt.emin - scaled))
  code = jnp.where(mag == 0, _U32(0), jnp.minimum(code, _U32(fmt.max_code)))
  return code | jnp.left_shift(jnp.right_shift(bits, _U32(31)), _U32(fmt.bits - 1))


def _along(values, ndim: int, axis: int):
  """A 1-D array shaped to broadcast along dimension `axis` of a rank-`ndim` array."""
  return values.reshape([-1 if d == axis else 1 for d in range(ndim)])


def _pack(codes, fmt: formats.ElementFormat, axis: int):
  """uint32 codes (a whole number of packing groups along axis) -> storage."""
  if not fmt.packed:
    return lax.bitcast_convert_type(codes.astype(jnp.uint8), fmt.storage_dtype)
  groups = _split_axis(codes, axis, fmt.codes_per_group)
  shifts = _along(jnp.arange(fmt.codes_per_group, dtype=_U32) * fmt.bits, groups.ndim, axis + 1)
  word = jnp.sum(jnp.left_shift(groups, shifts), axis=axis + 1, keepdims=True, dtype=_U32)
  byte_shifts = _along(jnp.arange(fmt.bytes_per_group, dtype=_U32) * 8, groups.ndim, axis + 1)
  return _merge_axis((jnp.right_shift(word, byte_shifts) & 0xFF).astype(jnp.uint8), axis)


def quantize(x, fmt: formats.ElementFormat, block_size: int, mode: formats.ScaleMode,
             axis: int) -> tuple[jax.Array, jax.Array]:
  """MX quantization of `x` (bf16 / f16 / f32) in blocks along `axis` (non-negative).

  Returns (data, scales) exactly as the FFI kernels do: data float8 of x's shape or uint8
  packed along axis (`fmt.storage_length(n)` entries); scales float8_e8m0fnu with
  ceil(n / block_size) entries along axis. A block holding NaN / Inf gets scale 0xFF and
  zero codes; a ragged last block is padded with zeros.
  """
  n = x.shape[axis]
  num_blocks = -(-n // block_size)
  blocks = _split_axis(_pad_axis(f32_bits(x), axis, num_blocks * block_size), axis, block_size)
  amax = jnp.max(blocks & _ABS, axis=axis + 1, keepdims=True)  # integer order = magnitude
  special = amax >= _INF
  e = _shared_exponent(jnp.where(special, _U32(0), amax), fmt, mode)
  codes = jnp.where(special, _U32(0), _encode(blocks, e, fmt))
  data = _pack(_merge_axis(codes, axis), fmt, axis)
  data = lax.slice_in_dim(data, 0, fmt.storage_length(n), axis=axis)
  scale_bytes = jnp.where(special, _U32(formats.E8M0_NAN), _u32(e + formats.E8M0_BIAS))
  scales = lax.bitcast_convert_type(jnp.squeeze(scale_bytes, axis + 1).astype(jnp.uint8),
                                    jnp.float8_e8m0fnu)
  return data, scales


# ---------------------------------------------------------------------------------------
# Dequantize


def _unpack(data, fmt: formats.ElementFormat, axis: int):
  """Storage -> uint32 codes, every code the storage holds along axis."""
  if not fmt.packed:
    return lax.bitcast_convert_type(data, jnp.uint8).astype(_U32)
  groups = _split_axis(data.astype(_U32), axis, fmt.bytes_per_group)
  byte_shifts = _along(jnp.arange(fmt.bytes_per_group, dtype=_U32) * 8, groups.ndim, axis + 1)
  word = jnp.sum(jnp.left_shift(groups, byte_shifts), axis=axis + 1, keepdims=True, dtype=_U32)
  shifts = _along(jnp.arange(fmt.codes_per_group, dtype=_U32) * fmt.bits, groups.ndim, axis + 1)
  return _merge_axis(jnp.right_shift(word, shifts) & ((1 << fmt.bits) - 1), axis)


def _decode(codes, e, fmt: formats.ElementFormat):
  """f32 bits (uint32) of decode(code) * 2**e. Exact: an element has at most 4
  significant bits and its smallest quantum times 2**-127 is 2**-143, inside f32's
  subnormal range; only overflow (to Inf) can occur. NaN / Inf codes decode as such."""
  mag = codes & ((1 << (fmt.bits - 1)) - 1)
  field = jnp.right_shift(mag, _U32(fmt.man_bits))
  frac = mag & ((1 << fmt.man_bits) - 1)
  sig = jnp.where(field > 0, frac | (1 << fmt.man_bits), frac)
  exp2 = jnp.maximum(field.astype(_I32), 1) - fmt.bias - fmt.man_bits + e  # value sig*2**exp2
  top = 31 - lax.clz(sig).astype(_I32)
  exponent = top + exp2
  normal = jnp.left_shift(_u32(jnp.clip(exponent + 127, 0, 255)), _U32(23)) | (
      jnp.left_shift(sig, _u32(jnp.clip(23 - top, 0, 31))) & _FRAC)
  subnormal = jnp.left_shift(sig, _u32(jnp.clip(exp2 + 149, 0, 31)))
  out = jnp.where(exponent >= -126, normal, subnormal)
  out = jnp.where((exponent > 127) & (sig > 0), _U32(_INF), jnp.where(sig == 0, _U32(0), out))
  if fmt.has_inf or fmt.has_nan:
    top_codes = mag > fmt.max_code  # codes quantize never makes
    inf = (frac == 0) if fmt.has_inf else False
    out = jnp.where(top_codes, jnp.where(inf, _U32(_INF), _U32(_QNAN)), out)
  return out | jnp.left_shift(jnp.right_shift(codes, _U32(fmt.bits - 1)), _U32(31))


def dequantize(data, scales, fmt: formats.ElementFormat, block_size: int, axis: int,
               length: int, dtype) -> jax.Array:
  """`decode(code) * 2**e` as `dtype`, `length` entries along `axis` (non-negative).

  A block with scale 0xFF decodes to NaN (the quiet NaN 0x7FC00000, rounded to dtype).
  """
  num_blocks = scales.shape[axis]
  codes = _pad_axis(_unpack(data, fmt, axis), axis, num_blocks * block_size)
  codes = lax.slice_in_dim(codes, 0, num_blocks * block_size, axis=axis)
  scale_bytes = jnp.expand_dims(lax.bitcast_convert_type(scales, jnp.uint8).astype(_U32),
                                axis + 1)
  bits = _decode(_split_axis(codes, axis, block_size),
                 scale_bytes.astype(_I32) - formats.E8M0_BIAS, fmt)
  bits = jnp.where(scale_bytes == formats.E8M0_NAN, _U32(_QNAN), bits)
  bits = lax.slice_in_dim(_merge_axis(bits, axis), 0, length, axis=axis)
  return from_f32_bits(bits, dtype)
