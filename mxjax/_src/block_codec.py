"""Block-scaled formats (`mxjax.block_format`) in plain XLA: quantize, dequantize, the
stochastic-rounding bits and the random Hadamard transform.

Bit for bit `mxjax.reference.block_quantize` / `block_dequantize` (tests hold them equal),
formulated for XLA: 1-D blocks are split in place along their axis (no transpose), and a
nonzero magnitude is carried as `(u, e)`, an f32 `u` in [1, 2) and an int32 exponent, so
the f32 products and quotients of the rules are exact-rounded whatever the platform's FTZ.
Element codes come from `mxjax.xla_codec`'s encoder (round to nearest even) or its
stochastic twin here.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mxjax import reference
from mxjax._src import formats, xla_codec
from mxjax._src.block_format import BlockFormat
from mxjax._src.xla_codec import _ABS, _FRAC, _HIDDEN, _INF, _QNAN, _I32, _U32, _u32

_ONE = 0x3F800000
_F32_MAX = 0x7F7FFFFF


# ---------------------------------------------------------------------------------------
# (u, e) arithmetic


def _split(mag):
  """Finite f32 magnitude bits -> (u f32 in [1, 2), e int32); u = 1, e = 0 for zero
  (callers mask zeros)."""
  e, frac = xla_codec._exponent_and_fraction(jnp.where(mag == 0, _U32(_ONE), mag))
  return lax.bitcast_convert_type(_U32(_ONE) | frac, jnp.float32), e


def _renorm(r, e):
  """(r in [0.5, 4), e) -> (u in [1, 2), e') exactly."""
  rb = lax.bitcast_convert_type(r, _U32)
  k = jnp.right_shift(rb, _U32(23)).astype(_I32) - 127
  return lax.bitcast_convert_type(_U32(_ONE) | (rb & _FRAC), jnp.float32), e + k


def _mul(a, b):
  return _renorm(a[0] * b[0], a[1] + b[1])


def _sig(a):
  return lax.bitcast_convert_type(a[0], _U32) & _FRAC | _HIDDEN


def _div(a, b):
  """Correctly rounded (XLA may rewrite a float division as a reciprocal multiply)."""
  q, e = reference.f32_divide((_sig(a), a[1] - 23), (_sig(b), b[1] - 23))
  return lax.bitcast_convert_type(_U32(_ONE) | (q & _FRAC), jnp.float32), e + 23


def _const(v: float):
  m, e = np.frexp(np.float32(v))
  return jnp.float32(m * 2), jnp.int32(e - 1)


def _bits(a, zero):
  """f32 bits of (u, e): normals, subnormals rounded half to even, Inf past FLT_MAX."""
  frac = lax.bitcast_convert_type(a[0], _U32) & _FRAC
  e = a[1]
  normal = jnp.left_shift(_u32(jnp.clip(e + 127, 0, 255)), _U32(23)) | frac
  sub = xla_codec._round_shift(frac | _HIDDEN, -126 - e)
  out = jnp.where(e >= -126, jnp.where(e > 127, _U32(_INF), normal), sub)
  return jnp.where(zero, _U32(0), out)


def _as_bits_for_encode(a):
  """An f32 whose exponent field carries e - so `xla_codec._encode(bits, -shift)` sees
  the value u * 2**e: bits of u (exponent 0) and the shift e."""
  return lax.bitcast_convert_type(a[0], _U32), a[1]


# ---------------------------------------------------------------------------------------
# Blocks


def _blocks(a, bf: BlockFormat, axis: int):
  """1-D: split `axis` into (n/b, b) in place -> block axis axis+1. 2-D: [..., R, C] ->
  [..., R/b, b, C/b, b], block axes (-3, -1). Zero padded."""
  if not bf.two_d:
    b = bf.block[1]
    a = xla_codec._pad_axis(a, axis, -(-a.shape[axis] // b) * b)
    return xla_codec._split_axis(a, axis, b)
  b = bf.block[0]
  r, c = a.shape[-2:]
  a = xla_codec._pad_axis(xla_codec._pad_axis(a, a.ndim - 2, -(-r // b) * b), a.ndim - 1,
                          -(-c // b) * b)
  return a.reshape(*a.shape[:-2], a.shape[-2] // b, b, a.shape[-1] // b, b)


def _block_axes(bf: BlockFormat, axis: int):
  return (axis + 1,) if not bf.two_d else (-3, -1)


def _unblocks(a, bf: BlockFormat, shape, axis: int):
  if not bf.two_d:
    return lax.slice_in_dim(xla_codec._merge_axis(a, axis), 0, shape[axis], axis=axis)
  a = a.reshape(*a.shape[:-4], a.shape[-4] * a.shape[-3], a.shape[-2] * a.shape[-1])
  return a[..., :shape[-2], :shape[-1]]


def _squeeze(s, bf, axis):
  return jnp.squeeze(s, _block_axes(bf, axis))


def _expand(s, bf, axis):
  return jnp.expand_dims(s, _block_axes(bf, axis) if not bf.two_d else (-3, -1))


# ---------------------------------------------------------------------------------------
# Quantize / dequantize


def tensor_scale(x, bf: BlockFormat) -> jax.Array:
  """f32 bits (uint32 scalar) of the tensor scale `elem_max * 448 / amax` (finite
  elements; 1 where amax is 0; at most FLT_MAX)."""
  mag = xla_codec.f32_bits(x) & _ABS
  amax = jnp.max(jnp.where(mag < _INF, mag, _U32(0)), initial=_U32(0))
  s = _div(_const(bf.element_format.max * 448.0), _split(amax))
  return jnp.where(amax == 0, _U32(_ONE), jnp.minimum(_bits(s, False), _U32(_F32_MAX)))


def _sr_encode(bits, e, fmt, rand):
  """`xla_codec._encode` with stochastic rounding from uint32 `rand`."""
  mag = bits & _ABS
  exponent, fraction = xla_codec._exponent_and_fraction(mag)
  scaled = exponent - e
  m = fmt.man_bits
  normal = jnp.left_shift(_u32(jnp.maximum(scaled - fmt.emin + 1, 0)), _U32(23)) | fraction
  shift = jnp.where(scaled >= fmt.emin, 23 - m, 23 - m + fmt.emin - scaled)
  u = jnp.where(scaled >= fmt.emin, normal, fraction | _HIDDEN)
  s = _u32(jnp.clip(shift, 0, 31))
  kept = jnp.right_shift(u, s)
  rem = u - jnp.left_shift(kept, s)  # shift >= 1 here (m <= 3 < 23)
  t = jnp.where(shift <= 32, jnp.left_shift(rem, _u32(jnp.clip(32 - shift, 0, 31))),
                jnp.right_shift(rem, _u32(jnp.clip(shift - 32, 0, 31))))
  t = jnp.where(shift == 32, rem, t)
  code = kept + (rand < t).astype(_U32)
  code = jnp.where(mag == 0, _U32(0), jnp.minimum(code, _U32(fmt.max_code)))
  return code | jnp.left_shift(jnp.right_shift(bits, _U32(31)), _U32(fmt.bits - 1))


def quantize(x, bf: BlockFormat, axis: int = -1, rand=None, tensor_scale_bits=None):
  """As `mxjax.reference.block_quantize` (the same results, bit for bit)."""
  fmt = bf.element_format
  axis = axis % x.ndim
  ts = None
  if bf.tensor_scale:
    ts = tensor_scale(x, bf) if tensor_scale_bits is None else tensor_scale_bits
  s_enc = _split(ts) if ts is not None else _const(1.0)
  blocks = _blocks(xla_codec.f32_bits(x), bf, axis)
  baxes = _block_axes(bf, axis)
  amax = jnp.max(blocks & _ABS, axis=baxes, keepdims=True)
  special = amax >= _INF
  amax = jnp.where(special, _U32(0), amax)
  kind = bf.scale.value
  if kind == "e8m0":
    e = xla_codec._shared_exponent(amax, fmt, formats.scale_mode(bf.scale_mode))
    m, m_zero = (jnp.float32(1.0), -e), False
    stored, nan_code = _u32(e + formats.E8M0_BIAS), formats.E8M0_NAN
  elif kind == "e4m3":
    t = _mul(_div(_split(amax), _const(fmt.max)), s_enc)
    t_bits, t_e = _as_bits_for_encode(t)
    stored = jnp.where(amax == 0, _U32(0), xla_codec._encode(t_bits, -t_e, formats.E4M3))
    d = _split(_u32(xla_codec._decode(stored, jnp.int32(0), formats.E4M3)))
    m, m_zero = _div(s_enc, d), stored == 0
    nan_code = 0x7F
  else:
    m = _div(_const(fmt.max), _split(amax))
    m = (jnp.where(amax == 0, jnp.float32(1.0), m[0]), jnp.where(amax == 0, 0, m[1]))
    if kind == "fp32_pow2":
      m = (jnp.ones_like(m[0]), jnp.minimum(m[1], 127))
    else:
      over = m[1] > 127
      m = (jnp.where(over, jnp.float32(np.float32(2 - 2 ** -23)), m[0]),
           jnp.where(over, 127, m[1]))
    stored, m_zero = _bits(_div(_const(1.0), m), False), False
    nan_code = _QNAN
  mag = blocks & _ABS
  v = _mul(_split(mag), m)
  v_bits, v_e = _as_bits_for_encode(v)
  v_bits = v_bits | (blocks & _U32(0x80000000))
  if rand is None:
    codes = xla_codec._encode(v_bits, -v_e, fmt)
  else:
    codes = _sr_encode(v_bits, -v_e, fmt, _blocks(rand.astype(_U32), bf, axis))
  codes = jnp.where((mag == 0) | m_zero | special,
                    jnp.where(special, _U32(0), codes & _u32(1 << (fmt.bits - 1))), codes)
  codes = jnp.where(special, _U32(0), codes)
  codes = _unblocks(codes, bf, x.shape, axis).astype(jnp.uint8)
  scales = _squeeze(jnp.where(special, _U32(nan_code), stored), bf, axis)
  return codes, (scales if kind.startswith("fp32") else scales.astype(jnp.uint8)), ts


def _decode_scale(s, bf):
  """(d as (u, e), zero mask, nan mask) of stored scales (uint32)."""
  kind = bf.scale.value
  if kind == "e8m0":
    return (jnp.float32(1.0), s.astype(_I32) - formats.E8M0_BIAS), False, s == formats.E8M0_NAN
  if kind == "e4m3":
    return (_split(xla_codec._decode(s, jnp.int32(0), formats.E4M3)), s == 0, s == 0x7F)
  return _split(s & _ABS), (s & _ABS) == 0, (s & _ABS) > _INF


def dequantize(codes, scales, tensor_scale_bits, bf: BlockFormat, axis: int = -1,
               apply_tensor_scale: bool = True) -> jax.Array:
  """As `mxjax.reference.block_dequantize`: f32 of codes' shape."""
  fmt = bf.element_format
  axis = axis % codes.ndim
  c = _blocks(codes.astype(_U32), bf, axis)
  d, d_zero, nan = _decode_scale(_expand(scales.astype(_U32), bf, axis), bf)
  q_bits = xla_codec._decode(c & _u32((1 << (fmt.bits - 1)) - 1), jnp.int32(0), fmt)
  q = _split(q_bits)
  v = _mul(q, d)
  if bf.tensor_scale and apply_tensor_scale:
    v = _div(v, _split(tensor_scale_bits))
  out = _bits(v, (q_bits == 0) | d_zero)
  out = out | jnp.left_shift(jnp.right_shift(c, _U32(fmt.bits - 1)), _U32(31))
  out = jnp.where(nan, _U32(_QNAN), out)
  return lax.bitcast_convert_type(_unblocks(out, bf, codes.shape, axis), jnp.float32)


def fake_quantize(x, bf: BlockFormat, axis: int = -1, rand=None):
  """(dequantize(quantize(x)) without the tensor scale, f32; the tensor's decode factor
  `1 / S` as f32, or None): what a GEMM multiplies, and what scales its output."""
  codes, scales, ts = quantize(x, bf, axis, rand)
  y = dequantize(codes, scales, ts, bf, axis, apply_tensor_scale=False)
  inv = None if ts is None else 1.0 / lax.bitcast_convert_type(ts, jnp.float32)
  return y, inv


# ---------------------------------------------------------------------------------------
# Stochastic-rounding bits and the random Hadamard transform


def _mix(h):
  """A 32-bit integer hash (lowbias32: xor-shift-multiply)."""
  h = h ^ jnp.right_shift(h, _U32(16))
  h = h * _U32(0x7FEB352D)
  h = h ^ jnp.right_shift(h, _U32(15))
  h = h * _U32(0x846CA68B)
  return h ^ jnp.right_shift(h, _U32(16))


def random_bits(seed, shape) -> jax.Array:
  """uint32 bits of `shape` from a counter on the global (row-major) element index:
  `mix(mix(index * golden ^ seed[0]) ^ seed[1])`. `seed` is uint32[2] (e.g.
  `jax.random.key_data(key)`); the bits depend on the index only, so any sharding of the
  result (any mesh) gives the same values. Indices wrap at 2**32 elements."""
  seed = jnp.asarray(seed).astype(_U32).reshape(-1)
  idx = jnp.zeros(shape, _U32)
  stride = 1
  for d in reversed(range(len(shape))):
    idx = idx + lax.broadcasted_iota(_U32, shape, d) * _U32(stride % 2 ** 32)
    stride *= shape[d]
  return _mix(_mix(idx * _U32(0x9E3779B9) ^ seed[0]) ^ seed[1])


def hadamard(n: int) -> np.ndarray:
  """The n x n Sylvester Hadamard matrix (n a power of two), entries +-1."""
  if n < 1 or n & (n - 1):
    raise ValueError(f"the Hadamard size must be a power of two, got {n}")
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


def rht_signs(seed: int, name: str, n: int) -> np.ndarray:
  """The random signs (+-1, float32[n]) of one GEMM's transform: fixed by `seed` and the
  GEMM's name."""
  rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
  return np.where(rng.random(n) < 0.5, -1.0, 1.0).astype(np.float32)


def rht(x, axis: int, signs: np.ndarray) -> jax.Array:
  """`x` with a block Hadamard transform along `axis`: each run of n = len(signs)
  elements times `H diag(signs) / sqrt(n)` (orthogonal), in f32; the axis is zero padded
  to a multiple of n (the padding stays). Applying it to both operands along their
  contraction leaves the product unchanged in exact arithmetic."""
  n = len(signs)
  axis = axis % x.ndim
  x = x.astype(jnp.float32)
  length = -(-x.shape[axis] // n) * n
  blocks = xla_codec._split_axis(xla_codec._pad_axis(x, axis, length), axis, n)
  mat = jnp.asarray(hadamard(n) * signs[None, :] / np.sqrt(np.float32(n)), jnp.float32)
  out = jnp.moveaxis(jnp.tensordot(blocks, mat, axes=([axis + 1], [1]),
                                   precision=lax.Precision.HIGHEST), -1, axis + 1)
  return xla_codec._merge_axis(out, axis)
