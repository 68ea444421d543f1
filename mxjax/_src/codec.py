"""Every block-scaled format in plain XLA: the path for platforms without mxjax kernels
(TPU, ROCm, ...), and the kernels' twin everywhere else.

Bit for bit `mxjax.reference.block_quantize` / `block_dequantize` (the oracle) and the
FFI kernels (tests hold them equal on every bf16 / f16 pattern), written to fuse: 1-D
blocks are split in place along their axis (no transposes), 2-D tiles over the last two
axes, every step an elementwise integer op or a reduction over a block axis, with no
gather and no Python loop (`mxjax._src.float_bits` says why integers).

MX (E8M0 scales) is the short path: the scale is a power of two, so an element's code is
rounded straight from its f32 bits; the other scales multiply in `(u, e)` form first.
Codes are stored packed along the packed axis (the quantized axis of 1-D blocks, the last
axis of tiles): FP8 one per byte (float8 dtypes), FP6 four in three bytes, FP4 two per
byte, low code first. Per-tensor FP8 (one f32 scale per tensor: DelayedScaling,
Float8CurrentScaling) closes the module: a multiply, a clip and a cast.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from mxjax._src import float_bits as fb
from mxjax._src import formats
from mxjax._src.float_bits import ABS, FRAC, HIDDEN, I32, INF, QNAN, U32, u32
from mxjax._src.formats import BlockFormat, ElementFormat, ScaleFormat

# ---------------------------------------------------------------------------------------
# Blocks in place


def pad_axis(a, axis: int, length: int):
  pad = [(0, 0)] * a.ndim
  pad[axis] = (0, length - a.shape[axis])
  return jnp.pad(a, pad) if length > a.shape[axis] else a


def split_axis(a, axis: int, inner: int):
  """[..., n, ...] -> [..., n / inner, inner, ...] (n a multiple of inner)."""
  return a.reshape(*a.shape[:axis], a.shape[axis] // inner, inner, *a.shape[axis + 1:])


def merge_axis(a, axis: int):
  """Inverse of `split_axis`."""
  return a.reshape(*a.shape[:axis], a.shape[axis] * a.shape[axis + 1], *a.shape[axis + 2:])


def _blocks(a, fmt: BlockFormat, axis: int):
  """1-D: `axis` split into (n/b, b) in place, zero padded -> block axis axis + 1.
  2-D: [..., R, C] -> [..., R/b, b, C/b, b] -> block axes (-3, -1)."""
  b = fmt.block_size
  if not fmt.two_d:
    return split_axis(pad_axis(a, axis, -(-a.shape[axis] // b) * b), axis, b)
  r, c = a.shape[-2:]
  a = pad_axis(pad_axis(a, a.ndim - 2, -(-r // b) * b), a.ndim - 1, -(-c // b) * b)
  return a.reshape(*a.shape[:-2], a.shape[-2] // b, b, a.shape[-1] // b, b)


def _block_axes(fmt: BlockFormat, axis: int):
  return (-3, -1) if fmt.two_d else (axis + 1,)


def _unblocks(a, fmt: BlockFormat, shape, axis: int):
  if not fmt.two_d:
    return lax.slice_in_dim(merge_axis(a, axis), 0, shape[axis], axis=axis)
  a = a.reshape(*a.shape[:-4], a.shape[-4] * a.shape[-3], a.shape[-2] * a.shape[-1])
  return a[..., :shape[-2], :shape[-1]]


# ---------------------------------------------------------------------------------------
# Elements


def shared_exponent(amax, elem: ElementFormat, mode: formats.ScaleMode):
  """The E8M0 block exponent e (int32) from amax (finite f32 magnitude bits)."""
  exponent, fraction = fb.exponent_and_fraction(amax)
  e = exponent - elem.emax
  if mode is formats.ScaleMode.RCEIL:  # one more where amax > max * 2**e
    max_fraction = round(elem.max * 2.0 ** (23 - elem.emax)) - HIDDEN
    e = e + (fraction > max_fraction).astype(I32)
  e = jnp.clip(e, formats.SCALE_EXP_MIN, formats.SCALE_EXP_MAX)
  return jnp.where(amax == 0, formats.SCALE_EXP_MIN, e)


def _grid_position(bits, e, elem: ElementFormat):
  """(magnitude bits, significand u with its quantum shift) of `bits * 2**-e` on the
  element grid: normals keep their fraction under the element's biased exponent,
  subnormals the whole significand shifted down to the quantum 2**(emin - m)."""
  mag = bits & ABS
  exponent, fraction = fb.exponent_and_fraction(mag)
  scaled = exponent - e  # the exponent of v = |x| * 2**-e
  m = elem.man_bits
  normal = jnp.left_shift(u32(jnp.maximum(scaled - elem.emin + 1, 0)), U32(23)) | fraction
  u = jnp.where(scaled >= elem.emin, normal, fraction | HIDDEN)
  shift = jnp.where(scaled >= elem.emin, 23 - m, 23 - m + elem.emin - scaled)
  return mag, u, shift


def _signed(code, mag, bits, elem: ElementFormat):
  code = jnp.where(mag == 0, U32(0), jnp.minimum(code, U32(elem.max_code)))
  return code | jnp.left_shift(jnp.right_shift(bits, U32(31)), U32(elem.bits - 1))


def encode(bits, e, elem: ElementFormat):
  """Element codes (uint32, sign in bit `bits - 1`) of the f32 values `bits * 2**-e`:
  round half to even on the element grid (subnormals too), saturated to +-max."""
  mag, u, shift = _grid_position(bits, e, elem)
  return _signed(fb.round_shift(u, shift), mag, bits, elem)


def encode_stochastic(bits, e, elem: ElementFormat, rand):
  """`encode` rounding up with probability remainder / quantum: iff uint32 `rand` <
  remainder * 2**32 / quantum."""
  mag, u, shift = _grid_position(bits, e, elem)
  s = u32(jnp.clip(shift, 0, 31))
  kept = jnp.right_shift(u, s)
  rem = u - jnp.left_shift(kept, s)  # shift >= 1 here (m <= 3 < 23)
  t = jnp.where(shift <= 32, jnp.left_shift(rem, u32(jnp.clip(32 - shift, 0, 31))),
                jnp.right_shift(rem, u32(jnp.clip(shift - 32, 0, 31))))
  t = jnp.where(shift == 32, rem, t)
  return _signed(kept + (rand < t).astype(U32), mag, bits, elem)


def decode(codes, e, elem: ElementFormat):
  """f32 bits (uint32) of decode(code) * 2**e. Exact: an element has at most 4
  significant bits and its smallest quantum times 2**-127 is 2**-143, inside f32's
  subnormal range; only overflow (to Inf) can occur. NaN / Inf codes decode as such."""
  mag = codes & ((1 << (elem.bits - 1)) - 1)
  field = jnp.right_shift(mag, U32(elem.man_bits))
  frac = mag & ((1 << elem.man_bits) - 1)
  sig = jnp.where(field > 0, frac | (1 << elem.man_bits), frac)
  exp2 = jnp.maximum(field.astype(I32), 1) - elem.bias - elem.man_bits + e  # sig * 2**exp2
  top = 31 - lax.clz(sig).astype(I32)
  exponent = top + exp2
  normal = jnp.left_shift(u32(jnp.clip(exponent + 127, 0, 255)), U32(23)) | (
      jnp.left_shift(sig, u32(jnp.clip(23 - top, 0, 31))) & FRAC)
  subnormal = jnp.left_shift(sig, u32(jnp.clip(exp2 + 149, 0, 31)))
  out = jnp.where(exponent >= -126, normal, subnormal)
  out = jnp.where((exponent > 127) & (sig > 0), U32(INF), jnp.where(sig == 0, U32(0), out))
  if elem.has_inf or elem.has_nan:
    top_codes = mag > elem.max_code  # codes quantize never makes
    inf = (frac == 0) if elem.has_inf else False
    out = jnp.where(top_codes, jnp.where(inf, U32(INF), U32(QNAN)), out)
  return out | jnp.left_shift(jnp.right_shift(codes, U32(elem.bits - 1)), U32(31))


def _along(values, ndim: int, axis: int):
  """A 1-D array shaped to broadcast along dimension `axis` of a rank-`ndim` array."""
  return values.reshape([-1 if d == axis else 1 for d in range(ndim)])


def pack(codes, elem: ElementFormat, axis: int):
  """uint32 codes along `axis` -> storage: `elem.storage_length(n)` entries (float8 for
  FP8; uint8 groups for FP6 / FP4, the last zero-padded)."""
  if not elem.packed:
    return lax.bitcast_convert_type(codes.astype(jnp.uint8), elem.storage_dtype)
  n = codes.shape[axis]
  codes = pad_axis(codes, axis, -(-n // elem.codes_per_group) * elem.codes_per_group)
  groups = split_axis(codes, axis, elem.codes_per_group)
  shifts = _along(jnp.arange(elem.codes_per_group, dtype=U32) * elem.bits, groups.ndim, axis + 1)
  word = jnp.sum(jnp.left_shift(groups, shifts), axis=axis + 1, keepdims=True, dtype=U32)
  byte_shifts = _along(jnp.arange(elem.bytes_per_group, dtype=U32) * 8, groups.ndim, axis + 1)
  return merge_axis((jnp.right_shift(word, byte_shifts) & 0xFF).astype(jnp.uint8), axis)


def unpack(data, elem: ElementFormat, axis: int):
  """Storage -> uint32 codes, every code the storage holds along `axis`."""
  if not elem.packed:
    return lax.bitcast_convert_type(data, jnp.uint8).astype(U32)
  groups = split_axis(data.astype(U32), axis, elem.bytes_per_group)
  byte_shifts = _along(jnp.arange(elem.bytes_per_group, dtype=U32) * 8, groups.ndim, axis + 1)
  word = jnp.sum(jnp.left_shift(groups, byte_shifts), axis=axis + 1, keepdims=True, dtype=U32)
  shifts = _along(jnp.arange(elem.codes_per_group, dtype=U32) * elem.bits, groups.ndim, axis + 1)
  return merge_axis(jnp.right_shift(word, shifts) & ((1 << elem.bits) - 1), axis)


# ---------------------------------------------------------------------------------------
# The tensor scale (NVFP4)


def tensor_amax(x) -> jax.Array:
  """uint32 scalar: the f32 bits of max |x| over finite elements (0 for none)."""
  mag = fb.f32_bits(x) & ABS
  return jnp.max(jnp.where(mag < INF, mag, U32(0)), initial=U32(0))


def tensor_scale(amax, fmt: BlockFormat) -> jax.Array:
  """f32 scalar `elem_max * 448 / amax` (1 where amax is 0; at most FLT_MAX) from
  `tensor_amax`'s bits."""
  s = fb.div(fb.const(fmt.element_format.max * 448.0), fb.split(amax))
  bits = jnp.where(amax == 0, U32(fb.ONE), jnp.minimum(fb.bits_of(s, False), U32(fb.F32_MAX)))
  return lax.bitcast_convert_type(bits, jnp.float32)


# ---------------------------------------------------------------------------------------
# Quantize / dequantize


def _scale_rule(amax, fmt: BlockFormat, s_enc):
  """(multiplier: an E8M0 exponent int32 or (u, e); stored scale bits uint32; mask of
  blocks whose codes are zero) of blocks with amax bits `amax` (finite)."""
  elem = fmt.element_format
  if fmt.scale is ScaleFormat.E8M0:
    e = shared_exponent(amax, elem, formats.scale_mode(fmt.scale_mode))
    return e, u32(e + formats.E8M0_BIAS), False
  if fmt.scale is ScaleFormat.E4M3:
    t_bits, t_e = fb.encode_operands(fb.mul(fb.div(fb.split(amax), fb.const(elem.max)), s_enc))
    stored = jnp.where(amax == 0, U32(0), encode(t_bits, -t_e, formats.E4M3))
    d = fb.split(u32(decode(stored, jnp.int32(0), formats.E4M3)))
    return fb.div(s_enc, d), stored, stored == 0
  m = fb.div(fb.const(elem.max), fb.split(amax))
  m = (jnp.where(amax == 0, jnp.float32(1.0), m[0]), jnp.where(amax == 0, 0, m[1]))
  if fmt.scale is ScaleFormat.FP32_POW2:
    m = (jnp.ones_like(m[0]), jnp.minimum(m[1], 127))
  else:
    over = m[1] > 127
    m = (jnp.where(over, jnp.float32(2 - 2 ** -23), m[0]), jnp.where(over, 127, m[1]))
  return m, fb.bits_of(fb.div(fb.const(1.0), m), False), False


_NAN_SCALE = {ScaleFormat.E8M0: formats.E8M0_NAN, ScaleFormat.E4M3: 0x7F,
              ScaleFormat.FP32: QNAN, ScaleFormat.FP32_POW2: QNAN}


def _stored_scales(bits, fmt: BlockFormat):
  """Stored scale bits (uint32) -> the scales' dtype (the decode scales' values)."""
  if fmt.scale.bytes == 4:
    return lax.bitcast_convert_type(bits, jnp.float32)
  return lax.bitcast_convert_type(bits.astype(jnp.uint8), fmt.scale.dtype)


def _scale_bits(scales):
  """The scales' stored bits (uint32)."""
  width = {1: jnp.uint8, 4: jnp.uint32}[jnp.dtype(scales.dtype).itemsize]
  return lax.bitcast_convert_type(scales, width).astype(U32)


def quantize(x, fmt: BlockFormat, axis: int, rand=None, ts=None):
  """x (bf16 / f16 / f32) -> (data, scales, tensor scale), as `reference.block_quantize`.

  Args:
    x: the input; `axis` (non-negative) is the quantized axis of 1-D blocks (tiles take
      the last two axes).
    rand: uint32 bits of x's shape for stochastic rounding, or None (nearest even).
    ts: a given f32 tensor scale (formats with one), else x's own.

  Returns:
    data: packed codes along the packed axis (`axis`, or the last for tiles);
    scales: `fmt.scale.dtype`, one per block (NaN where the block held NaN / Inf);
    tensor scale: an f32 scalar, or None.
  """
  elem = fmt.element_format
  if fmt.tensor_scale and ts is None:
    ts = tensor_scale(tensor_amax(x), fmt)
  blocks = _blocks(fb.f32_bits(x), fmt, axis)
  amax = jnp.max(blocks & ABS, axis=_block_axes(fmt, axis), keepdims=True)
  special = amax >= INF
  m, stored, zero = _scale_rule(
      jnp.where(special, U32(0), amax), fmt,
      fb.split(lax.bitcast_convert_type(jnp.asarray(ts, jnp.float32), U32)) if fmt.tensor_scale
      else fb.const(1.0))
  if fmt.scale is ScaleFormat.E8M0:  # a power of two: round straight from the f32 bits
    v_bits, v_e = blocks, m
  else:
    v_bits, v_e = fb.encode_operands(fb.mul(fb.split(blocks & ABS), m))
    v_bits, v_e = v_bits | (blocks & U32(0x80000000)), -v_e
  codes = (encode(v_bits, v_e, elem) if rand is None else
           encode_stochastic(v_bits, v_e, elem, _blocks(u32(rand), fmt, axis)))
  sign_only = codes & u32(1 << (elem.bits - 1))
  zero = zero | ((blocks & ABS) == 0)  # (u, e) holds zeros as 1: their codes are +-0
  codes = jnp.where(special, U32(0), jnp.where(zero, sign_only, codes))
  packed_axis = x.ndim - 1 if fmt.two_d else axis
  data = pack(_unblocks(codes, fmt, x.shape, axis), elem, packed_axis)
  scales = jnp.squeeze(jnp.where(special, U32(_NAN_SCALE[fmt.scale]), stored),
                       _block_axes(fmt, axis))
  return data, _stored_scales(scales, fmt), ts


def _decode_scale(bits, fmt: BlockFormat):
  """(decode scale as (u, e), zero mask, NaN mask) of stored scale bits (uint32)."""
  if fmt.scale is ScaleFormat.E4M3:
    return fb.split(decode(bits, jnp.int32(0), formats.E4M3)), bits == 0, bits == 0x7F
  return fb.split(bits & ABS), (bits & ABS) == 0, (bits & ABS) > INF


def dequantize(data, scales, ts, fmt: BlockFormat, axis: int, length: int, dtype,
               apply_tensor_scale: bool = True) -> jax.Array:
  """`decode(code) * scale` (divided by the tensor scale where there is one and
  `apply_tensor_scale`), rounded once to f32 and then to `dtype`, `length` entries along
  the packed axis (`axis`: non-negative; the last for tiles), as
  `reference.block_dequantize`. A block whose scale is NaN decodes to NaN."""
  elem = fmt.element_format
  packed_axis = data.ndim - 1 if fmt.two_d else axis
  codes = lax.slice_in_dim(unpack(data, elem, packed_axis), 0, length, axis=packed_axis)
  shape = codes.shape
  c = _blocks(codes, fmt, axis)
  bits = jnp.expand_dims(_scale_bits(scales), _block_axes(fmt, axis))
  if fmt.scale is ScaleFormat.E8M0:
    out = decode(c, bits.astype(I32) - formats.E8M0_BIAS, elem)
    nan = bits == formats.E8M0_NAN
  else:
    d, d_zero, nan = _decode_scale(bits, fmt)
    q_bits = decode(c & u32((1 << (elem.bits - 1)) - 1), jnp.int32(0), elem)
    v = fb.mul(fb.split(q_bits), d)
    if fmt.tensor_scale and apply_tensor_scale:
      v = fb.div(v, fb.split(lax.bitcast_convert_type(jnp.asarray(ts, jnp.float32), U32)))
    out = fb.bits_of(v, (q_bits == 0) | d_zero)
    out = out | jnp.left_shift(jnp.right_shift(c, U32(elem.bits - 1)), U32(31))
  out = jnp.where(nan, U32(QNAN), out)
  return fb.from_f32_bits(_unblocks(out, fmt, shape, axis), dtype)


# ---------------------------------------------------------------------------------------
# Per-tensor FP8 (DelayedScaling, Float8CurrentScaling): one f32 scale per tensor

_FP8_DTYPES = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}


def quantize_per_tensor(x, scale, format: str = "e4m3") -> jax.Array:
  """`x * scale` (f32) saturated to ±max and cast to FP8 (float8_e4m3fn / float8_e5m2)."""
  fmt = formats.element_format(format)
  if fmt.name not in _FP8_DTYPES:
    raise ValueError(f"per-tensor FP8 needs e4m3 or e5m2, got {fmt.name}")
  scaled = jnp.asarray(x).astype(jnp.float32) * jnp.asarray(scale, jnp.float32)
  return jnp.clip(scaled, -fmt.max, fmt.max).astype(_FP8_DTYPES[fmt.name])


def dequantize_per_tensor(q, scale, dtype=jnp.float32) -> jax.Array:
  """`q / scale` in `dtype`."""
  return (q.astype(jnp.float32) / jnp.asarray(scale, jnp.float32)).astype(dtype)
