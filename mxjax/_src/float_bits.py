"""Exact f32 arithmetic on bit patterns, for the plain-XLA codec (`mxjax._src.codec`).

XLA's CPU flushes f32 subnormals, so values are handled as f32 bits with integer shifts,
and a magnitude to multiply as `(u, e)` (f32 u in [1, 2), int32 e): every product and
quotient is rounded to 24 bits exactly whatever the FTZ setting.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mxjax import reference

U32 = jnp.uint32
I32 = jnp.int32
ABS = 0x7FFFFFFF
INF = 0x7F800000
QNAN = 0x7FC00000
FRAC = 0x7FFFFF
HIDDEN = 0x800000
ONE = 0x3F800000
F32_MAX = 0x7F7FFFFF


def u32(v) -> jax.Array:
  return jnp.asarray(v).astype(U32)


def round_shift(u, shift) -> jax.Array:
  """`u >> shift` rounded half to even (uint32 u < 2**31; shift an int32 array, >= 1)."""
  s = u32(jnp.clip(shift, 1, 31))
  odd = jnp.right_shift(u, s) & 1
  return jnp.right_shift(u + (jnp.left_shift(U32(1), s - 1) - 1) + odd, s)


def exponent_and_fraction(mag) -> tuple[jax.Array, jax.Array]:
  """(floor(log2 |v|) int32, normalized 23-bit fraction) of nonzero f32 magnitude bits."""
  field = jnp.right_shift(mag, U32(23))
  top = 31 - lax.clz(mag).astype(I32)  # highest set bit of a subnormal's fraction
  subnormal = field == 0
  exponent = jnp.where(subnormal, top - 149, field.astype(I32) - 127)
  normalized = jnp.left_shift(mag, u32(jnp.clip(23 - top, 0, 31))) & FRAC
  return exponent, jnp.where(subnormal, normalized, mag & FRAC)


def f32_bits(x) -> jax.Array:
  """bf16 / f16 / f32 array -> the f32 bit patterns of its values (uint32), exactly."""
  dtype = jnp.dtype(x.dtype)
  if dtype == jnp.float32:
    return lax.bitcast_convert_type(x, U32)
  h = lax.bitcast_convert_type(x, jnp.uint16).astype(U32)
  if dtype == jnp.bfloat16:
    return jnp.left_shift(h, U32(16))
  # f16: rebias normals; normalize subnormals (their value is frac * 2**-24).
  sign = jnp.left_shift(h & 0x8000, U32(16))
  field = jnp.right_shift(h, U32(10)) & 0x1F
  frac = h & 0x3FF
  top = 31 - lax.clz(frac).astype(I32)
  sub = jnp.left_shift(u32(top + 103), U32(23)) | (
      jnp.left_shift(frac, u32(jnp.clip(23 - top, 0, 31))) & FRAC)
  normal = jnp.left_shift(field + 112, U32(23)) | jnp.left_shift(frac, U32(13))
  special = INF | jnp.left_shift(frac, U32(13))
  mag = jnp.where(field == 0x1F, special, jnp.where(field > 0, normal,
                                                  jnp.where(frac == 0, U32(0), sub)))
  return sign | mag


def from_f32_bits(bits, dtype) -> jax.Array:
  """f32 bit patterns (uint32) -> `dtype`, rounded half to even (NaN: quiet, same sign)."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return lax.bitcast_convert_type(bits, jnp.float32)
  mag = bits & ABS
  sign = jnp.right_shift(bits, U32(31))
  if dtype == jnp.bfloat16:  # same exponent range: one rounding of the low 16 bits
    half = jnp.where(mag > INF, U32(0x7FC0), round_shift(mag, 16))
  elif dtype == jnp.float16:
    exponent = jnp.right_shift(mag, U32(23)).astype(I32) - 127
    normal = jnp.minimum(round_shift(mag - (112 << 23), 13), U32(0x7C00))
    subnormal = round_shift((mag & FRAC) | HIDDEN, -1 - exponent)  # quantum 2**-24
    half = jnp.where(exponent >= -14, normal, subnormal)
    half = jnp.where(mag > INF, U32(0x7E00), jnp.where(mag == INF, U32(0x7C00), half))
  else:
    raise TypeError(f"no dequantize to {dtype.name}")
  out = (half | jnp.left_shift(sign, U32(15))).astype(jnp.uint16)
  return lax.bitcast_convert_type(out, dtype)


# ---------------------------------------------------------------------------------------
# (u, e): a nonzero magnitude u * 2**e, u an f32 in [1, 2)


def split(mag):
  """Finite f32 magnitude bits -> (u, e); u = 1, e = 0 for zero (callers mask zeros)."""
  e, frac = exponent_and_fraction(jnp.where(mag == 0, U32(ONE), mag))
  return lax.bitcast_convert_type(U32(ONE) | frac, jnp.float32), e


def _renorm(r, e):
  """(r in [0.5, 4), e) -> (u in [1, 2), e') exactly."""
  rb = lax.bitcast_convert_type(r, U32)
  k = jnp.right_shift(rb, U32(23)).astype(I32) - 127
  return lax.bitcast_convert_type(U32(ONE) | (rb & FRAC), jnp.float32), e + k


def mul(a, b):
  """a * b rounded to 24 bits (one f32 multiply of values in [1, 2): always normal)."""
  return _renorm(a[0] * b[0], a[1] + b[1])


def _sig(a):
  return lax.bitcast_convert_type(a[0], U32) & FRAC | HIDDEN


def div(a, b):
  """a / b correctly rounded to 24 bits (integer long division, never a reciprocal)."""
  q, e = reference.f32_divide((_sig(a), a[1] - 23), (_sig(b), b[1] - 23))
  return lax.bitcast_convert_type(U32(ONE) | (q & FRAC), jnp.float32), e + 23


def const(v: float):
  """(u, e) of a positive constant exact in f32."""
  m, e = np.frexp(np.float32(v))
  return jnp.float32(m * 2), jnp.int32(e - 1)


def bits_of(a, zero):
  """f32 bits of (u, e) (subnormals rounded half to even, Inf past FLT_MAX; 0 where `zero`)."""
  frac = lax.bitcast_convert_type(a[0], U32) & FRAC
  e = a[1]
  normal = jnp.left_shift(u32(jnp.clip(e + 127, 0, 255)), U32(23)) | frac
  sub = round_shift(frac | HIDDEN, -126 - e)
  out = jnp.where(e >= -126, jnp.where(e > 127, U32(INF), normal), sub)
  return jnp.where(zero, U32(0), out)


def encode_operands(a):
  """(u's f32 bits, e): the value of (u, e) as f32(bits) * 2**e, for an encoder."""
  return lax.bitcast_convert_type(a[0], U32), a[1]
