"""The MX numerics oracle: DESIGN.md's rules in plain jax.numpy, on integer bit patterns.

Every kernel, on every backend, must equal these functions bit for bit. They are written
from the spec, not from any kernel, and favour obviousness over speed.

XLA CPU runs with FTZ/DAZ set, so no float arithmetic touches a value here: inputs are
widened to f32 *bit patterns* (uint32), and every rounding (to the element grid, to f32,
to bf16 / f16) is one integer routine, `round_to_grid`: significand, shift, round half to
even. A magnitude is carried as `sig * 2**exp2` with an unsigned integer `sig`.

The quantize / dequantize functions are jitted (one compile per format, axis and block),
so that called eagerly they run as one program, not op by op.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mxjax._src import formats

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


# ---------------------------------------------------------------------------------------
# Block-scaled formats (mxjax.block_format): any element x E8M0 / E4M3 / FP32 scale x 1-D
# or 2-D blocks x an optional FP32 tensor scale (NVFP4, DeepSeek FP8 blocks, 2-D MX).
#
# A nonzero magnitude is `sig * 2**exp` with sig in [2**23, 2**24) ("normalized"); the f32
# products and quotients the rules name (TE's NVFP4 / FP8-block math) are rounded to 24
# bits, RNE, with an unbounded exponent, so no platform's FTZ can change them.

_F32_MAX_BITS = 0x7F7FFFFF


def _normalize(sig, exp2):
  """(sig, exp2) -> the same value with sig in [2**23, 2**24) (0 stays 0)."""
  sig = sig.astype(_U32)
  sh = 23 - floor_log2(sig)
  out = jnp.where(sh >= 0, jnp.left_shift(sig, sh.clip(0, 31).astype(_U32)),
                  jnp.right_shift(sig, (-sh).clip(0, 31).astype(_U32)))
  return jnp.where(sig == 0, _U32(0), out), jnp.where(sig == 0, 0, exp2 - sh).astype(_I32)


def _f32_op(a, b, op):
  """RNE-to-24-bits `op` (jnp.multiply, or jnp.divide: `f32_divide`) of normalized
  values: the product of the two significands as f32s in [1, 2) is exact-rounded and
  normal (no FTZ can touch it)."""
  if op is jnp.divide:
    return f32_divide(a, b)

  def unit(s):
    return lax.bitcast_convert_type(_U32(127 << 23) | (s & 0x7FFFFF), jnp.float32)

  r = lax.bitcast_convert_type(unit(a[0]) * unit(b[0]), _U32)  # in [1, 4): normal
  e = jnp.right_shift(r, _U32(23)).astype(_I32) - 127
  exp2 = a[1] + b[1] + 23
  zero = (a[0] == 0) | (b[0] == 0)
  return (jnp.where(zero, _U32(0), (r & 0x7FFFFF) | 0x800000),
          jnp.where(zero, 0, e + exp2).astype(_I32))


def f32_divide(a, b):
  """a / b of normalized (sig, exp2) values (b nonzero), rounded half to even to 24 bits,
  by integer long division (XLA may turn a float division into a reciprocal multiply)."""
  a_sig, b_sig = a[0].astype(_U32), b[0].astype(_U32)
  small = a_sig < b_sig
  r = jnp.where(small, jnp.left_shift(a_sig, _U32(1)), a_sig) - b_sig  # first bit is 1

  def step(_, carry):
    r, q = carry
    r = jnp.left_shift(r, _U32(1))
    bit = r >= b_sig
    return jnp.where(bit, r - b_sig, r), jnp.left_shift(q, _U32(1)) | bit.astype(_U32)

  r, q = lax.fori_loop(0, 23, step, (r, jnp.ones_like(r)))
  twice = jnp.left_shift(r, _U32(1))
  q = q + ((twice > b_sig) | ((twice == b_sig) & ((q & 1) == 1))).astype(_U32)
  exp2 = a[1] - b[1] - 23 - small.astype(_I32)
  carry = q >= (1 << 24)
  q = jnp.where(carry, _U32(1 << 23), q)
  exp2 = exp2 + carry.astype(_I32)
  zero = a_sig == 0
  return jnp.where(zero, _U32(0), q), jnp.where(zero, 0, exp2).astype(_I32)


def _const(v: float):
  """A positive float (exact in f32) as a normalized (sig, exp2) of scalars."""
  m, e = math.frexp(v)
  return jnp.uint32(int(m * 2 ** 24)), jnp.int32(e - 24)


def _f32_of(sig, exp2):
  """f32 bits of a normalized value: RNE with subnormals, overflow -> Inf."""
  return jnp.minimum(round_to_grid(sig, exp2, -126, 23), _U32(_F32_INF))


def round_to_grid_sr(sig, exp2, emin: int, man_bits: int, rand) -> jax.Array:
  """`round_to_grid` with stochastic rounding: up with probability rem / quantum, from
  the uint32 random bits `rand` (up iff rand < rem * 2**32 / quantum)."""
  sig, exp2 = sig.astype(_U32), exp2.astype(_I32)
  ev = jnp.maximum(floor_log2(sig) + exp2, emin)
  shift = ev - man_bits - exp2
  right = jnp.clip(shift, 0, 31).astype(_U32)
  kept = jnp.where(shift > 31, _U32(0), jnp.right_shift(sig, right))
  rem = jnp.where(shift > 31, sig, sig - jnp.left_shift(kept, right))
  # rem * 2**(32 - shift): exact for shift <= 32; for larger shifts rem >> (shift - 32).
  t = jnp.where(shift <= 32, jnp.left_shift(rem, jnp.clip(32 - shift, 0, 31).astype(_U32)),
                jnp.right_shift(rem, jnp.clip(shift - 32, 0, 31).astype(_U32)))
  t = jnp.where((shift == 0) | (shift == 32), jnp.where(shift == 0, _U32(0), rem), t)
  up = (shift > 0) & (rand.astype(_U32) < t)
  n = jnp.where(shift < 0, jnp.left_shift(sig, jnp.clip(-shift, 0, 31).astype(_U32)),
                kept + up.astype(_U32))
  code = jnp.left_shift((ev - emin).astype(_U32), _U32(man_bits)) + n
  return jnp.where(sig == 0, _U32(0), code)


def _tiles(a, block, axis):
  """[..., n at axis, ...] (1-D) or [..., R, C] (2-D) -> [..., nr, nc, rows*cols], padded
  with zeros."""
  if block[0] == 1:
    a = jnp.moveaxis(a, axis, -1)[..., None, :]
  r, c = a.shape[-2:]
  nr, nc = -(-r // block[0]), -(-c // block[1])
  a = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, nr * block[0] - r), (0, nc * block[1] - c)])
  a = a.reshape(*a.shape[:-2], nr, block[0], nc, block[1])
  a = jnp.swapaxes(a, -3, -2)
  return a.reshape(*a.shape[:-2], block[0] * block[1])


def _untiles(t, block, shape, axis):
  """Inverse of `_tiles` for an array of logical `shape`."""
  lead = t.shape[:-3]
  nr, nc = t.shape[-3:-1]
  t = jnp.swapaxes(t.reshape(*lead, nr, nc, *block), -3, -2)
  t = t.reshape(*lead, nr * block[0], nc * block[1])
  if block[0] == 1:
    n = shape[axis]
    return jnp.moveaxis(t[..., 0, :n], -1, axis)
  return t[..., :shape[-2], :shape[-1]]


def _scale_layout(s, block, axis):
  """Per-block array [..., nr, nc] -> the scales' layout (1-D: along `axis`)."""
  return jnp.moveaxis(s[..., 0, :], -1, axis) if block[0] == 1 else s


def _scale_tiles(s, block, axis):
  return jnp.moveaxis(s, axis, -1)[..., None, :] if block[0] == 1 else s


def _e4m3_value(code):
  """Normalized (sig, exp2) of unsigned E4M3 codes (no NaN)."""
  ef = jnp.right_shift(code, _U32(3))
  man = code & 7
  return _normalize(jnp.where(ef > 0, man | 8, man), jnp.maximum(ef.astype(_I32), 1) - 10)


@functools.partial(jax.jit, static_argnames=("bf",))
def tensor_scale(x, bf) -> jax.Array:
  """The FP32 tensor (encode) scale of x, f32 bits (uint32 scalar): elem_max * 448 /
  amax over x's finite elements, at most FLT_MAX; 1.0 where that amax is 0."""
  fmt = formats.element_format(bf.element)
  mag = to_f32_bits(x) & _F32_ABS
  amax = jnp.max(jnp.where(mag < _F32_INF, mag, _U32(0)), initial=_U32(0))
  s = _f32_op(_const(fmt.max * 448.0), _normalize(*f32_sig_exp(amax)), jnp.divide)
  bits = jnp.minimum(_f32_of(*s), _U32(_F32_MAX_BITS))
  return jnp.where(amax == 0, _U32(0x3F800000), bits)


@functools.partial(jax.jit, static_argnames=("bf", "axis"))
def block_quantize(x, bf, *, axis: int = -1, rand=None, tensor_scale_bits=None):
  """Quantizes x (bf16 / f16 / f32) to the block format `bf` (`mxjax.block_format`).

  1-D blocks run along `axis`; 2-D tiles cover the last two axes. Per block (amax: the
  largest magnitude; S: the tensor scale, 1 without one):
    E8M0       d = 2**e (`shared_exponent`), m = 2**-e
    E4M3       d = e4m3(amax / elem_max * S) (RNE, saturated to 448), m = S / d
    FP32       m = elem_max / amax (FP32_POW2: rounded down to a power of two; 1 where
               amax is 0; at most FLT_MAX), d = f32(1 / m)
  and each element's code is the element grid's rounding of x * m (RNE, or stochastic
  with the uint32 `rand` of x's shape), saturated to +-max. A block holding NaN / Inf has
  zero codes and a NaN scale (0xFF, 0x7F, f32 NaN).

  Returns:
    (codes uint8 of x's shape, scales: uint8 (E8M0 / E4M3 bytes) or uint32 (f32 bits) of
    x's shape with ceil(n / b) along axis (1-D) or [..., ceil(R/b), ceil(C/b)] (2-D),
    tensor scale: f32 bits (uint32 scalar), or None without one).
  """
  fmt = formats.element_format(bf.element)
  axis = axis % x.ndim
  bits = to_f32_bits(x)
  ts = None
  if bf.tensor_scale:
    ts = tensor_scale(x, bf) if tensor_scale_bits is None else tensor_scale_bits
  s_enc = _normalize(*f32_sig_exp(ts)) if ts is not None else _const(1.0)
  blk = _tiles(bits, bf.block, axis)
  amax = jnp.max(blk & _F32_ABS, axis=-1)
  special = amax >= _F32_INF
  amax = jnp.where(special, _U32(0), amax)
  amax_n = _normalize(*f32_sig_exp(amax))
  kind = bf.scale.value
  if kind == "e8m0":
    e = shared_exponent(amax, fmt, bf.scale_mode)
    m = (jnp.full(e.shape, 0x800000, _U32), -e - 23)
    stored = (e + formats.E8M0_BIAS).astype(_U32)
    nan_code = formats.E8M0_NAN
  elif kind == "e4m3":
    t = _f32_op(amax_n, _const(fmt.max), jnp.divide)
    t = _f32_op(t, s_enc, jnp.multiply)
    stored = jnp.minimum(round_to_grid(*t, -6, 3), _U32(0x7E))
    d = _e4m3_value(stored)
    m = _f32_op((jnp.broadcast_to(s_enc[0], d[0].shape), s_enc[1]), d, jnp.divide)
    m = (jnp.where(d[0] == 0, _U32(0), m[0]), m[1])
    nan_code = 0x7F
  else:
    m = _f32_op(_const(fmt.max), amax_n, jnp.divide)
    m = (jnp.where(amax == 0, _U32(0x800000), m[0]), jnp.where(amax == 0, -23, m[1]))
    if kind == "fp32_pow2":
      m = (jnp.full(m[0].shape, 0x800000, _U32), jnp.minimum(m[1], 127 - 23))
    else:  # at most FLT_MAX
      over = m[1] > 127 - 23
      m = (jnp.where(over, _U32(0xFFFFFF), m[0]), jnp.where(over, 104, m[1]))
    stored = _f32_of(*_f32_op(_const(1.0), m, jnp.divide))
    nan_code = _F32_QNAN
  v = _f32_op(_normalize(*f32_sig_exp(blk & _F32_ABS)),
              (m[0][..., None], m[1][..., None]), jnp.multiply)
  if rand is None:
    mag = round_to_grid(*v, fmt.emin, fmt.man_bits)
  else:
    mag = round_to_grid_sr(*v, fmt.emin, fmt.man_bits, _tiles(rand, bf.block, axis))
  mag = jnp.minimum(mag, _U32(fmt.max_code))
  codes = (mag | jnp.left_shift(jnp.right_shift(blk, _U32(31)), _U32(fmt.bits - 1)))
  codes = jnp.where(special[..., None], _U32(0), codes)
  scales = jnp.where(special, _U32(nan_code), stored)
  scales = scales if kind.startswith("fp32") else scales.astype(jnp.uint8)
  return (_untiles(codes, bf.block, x.shape, axis).astype(jnp.uint8),
          _scale_layout(scales, bf.block, axis), ts)


@functools.partial(jax.jit, static_argnames=("bf", "axis", "apply_tensor_scale"))
def block_dequantize(codes, scales, tensor_scale_bits, bf, *, axis: int = -1,
                     apply_tensor_scale: bool = True) -> jax.Array:
  """Decodes `block_quantize`'s output to f32: `code * d` (RNE to 24 bits), divided by the
  tensor scale where there is one (and `apply_tensor_scale`), rounded once to f32
  (subnormals kept, overflow -> Inf); NaN where the block's scale is NaN."""
  fmt = formats.element_format(bf.element)
  axis = axis % codes.ndim
  c = _tiles(codes.astype(_U32), bf.block, axis)
  s = _scale_tiles(scales, bf.block, axis).astype(_U32)
  mag = c & ((1 << (fmt.bits - 1)) - 1)
  ef = jnp.right_shift(mag, _U32(fmt.man_bits))
  man = mag & ((1 << fmt.man_bits) - 1)
  q = _normalize(jnp.where(ef > 0, man | (1 << fmt.man_bits), man),
                 jnp.maximum(ef.astype(_I32), 1) - fmt.bias - fmt.man_bits)
  kind = bf.scale.value
  if kind == "e8m0":
    d = (jnp.full(s.shape, 0x800000, _U32), s.astype(_I32) - formats.E8M0_BIAS - 23)
    nan = s == formats.E8M0_NAN
  elif kind == "e4m3":
    d, nan = _e4m3_value(s), s == 0x7F
  else:
    d, nan = _normalize(*f32_sig_exp(s)), (s & _F32_ABS) > _F32_INF
  v = _f32_op(q, (d[0][..., None], d[1][..., None]), jnp.multiply)
  if bf.tensor_scale and apply_tensor_scale:
    v = _f32_op(v, _normalize(*f32_sig_exp(tensor_scale_bits)), jnp.divide)
  out = _f32_of(*v) | jnp.left_shift(jnp.right_shift(c, _U32(fmt.bits - 1)), _U32(31))
  out = jnp.where(nan[..., None], _U32(_F32_QNAN), out)
  return lax.bitcast_convert_type(_untiles(out, bf.block, codes.shape, axis), jnp.float32)


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
