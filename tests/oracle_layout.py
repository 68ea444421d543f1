"""The library's block-format ops in the oracle's layout, so tests compare them with
`mxjax.reference.block_quantize` / `block_dequantize` as they are.

The oracle returns one code per uint8 of x's shape, scales as stored bits (uint8 for E8M0
/ E4M3, uint32 f32 bits for FP32 scales) and the tensor scale as uint32 f32 bits; the
library packs codes along the packed axis and holds scales and the tensor scale as
values. These functions only convert between the two (unpack, bitcast); the values are
the library's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mxjax._src import codec, ops


def _packed_axis(bf, ndim: int, axis: int) -> int:
  return ndim - 1 if bf.two_d else axis % ndim


def to_oracle(data, scales, ts, bf, shape, axis):
  """(codes uint8 of `shape`, scale bits, tensor scale bits or None) of a quantization."""
  packed = _packed_axis(bf, len(shape), axis)
  codes = codec.unpack(data, bf.element_format, packed)
  codes = jax.lax.slice_in_dim(codes, 0, shape[packed], axis=packed).astype(jnp.uint8)
  width = jnp.uint32 if bf.scale.bytes == 4 else jnp.uint8
  bits = jax.lax.bitcast_convert_type(scales, width)
  ts_bits = None if ts is None else jax.lax.bitcast_convert_type(
      jnp.asarray(ts, jnp.float32), jnp.uint32)
  return codes, bits, ts_bits


def from_oracle(codes, scales, ts_bits, bf, axis):
  """(data, scales, tensor scale) in the library's layout from the oracle's."""
  packed = _packed_axis(bf, codes.ndim, axis)
  data = codec.pack(codes.astype(jnp.uint32), bf.element_format, packed)
  values = jax.lax.bitcast_convert_type(scales, bf.scale.dtype) if bf.scale.bytes == 4 else (
      jax.lax.bitcast_convert_type(scales.astype(jnp.uint8), bf.scale.dtype))
  ts = None if ts_bits is None else jax.lax.bitcast_convert_type(
      jnp.asarray(ts_bits, jnp.uint32), jnp.float32)
  return data, values, ts


def quantize(x, bf, axis=-1, rand=None, ts_bits=None):
  """The ops' quantize (kernels where in use) in the oracle's layout; `ts_bits`: a given
  tensor scale (f32 bits), else x's."""
  ts = None if ts_bits is None else jax.lax.bitcast_convert_type(
      jnp.asarray(ts_bits, jnp.uint32), jnp.float32)
  data, scales, ts = ops.quantize_raw(x, bf, axis % x.ndim, rand, ts)
  return to_oracle(data, scales, ts, bf, x.shape, axis)


def dequantize(codes, scales, ts_bits, bf, axis=-1, apply_tensor_scale=True,
               dtype=jnp.float32):
  """The ops' dequantize (to `dtype`) of a quantization in the oracle's layout."""
  data, values, ts = from_oracle(codes, scales, ts_bits, bf, axis)
  a = ops.as_mxarray(data, values, ts, bf, axis % codes.ndim,
                     jax.ShapeDtypeStruct(codes.shape, jnp.float32))
  return ops.dequantize_raw(a, dtype, apply_tensor_scale)


def fake_quantize(x, bf, axis=-1, rand=None):
  """The ops' (values without the tensor scale, f32; 1 / S or None)."""
  return ops.values(x, bf, axis % x.ndim, jnp.float32, rand)


def quantize_2x(x, bf):
  """The ops' one-pass quantize_2x in the oracle's layout: ((rows), (cols), ts bits)."""
  ts = ops.tensor_scale(x, bf)
  rd, rs, cd, cs = ops.quantize_2x_raw(x, bf, ts)
  rows = to_oracle(rd, rs, ts, bf, x.shape, -1)
  cols = to_oracle(cd, cs, ts, bf, x.shape, -2)
  return rows[:2], cols[:2], rows[2]


def codec_quantize(x, bf, axis=-1, rand=None):
  """The plain-XLA codec's quantize in the oracle's layout."""
  return to_oracle(*codec.quantize(x, bf, axis % x.ndim, rand), bf, x.shape, axis)


def codec_dequantize(codes, scales, ts_bits, bf, axis=-1, apply_tensor_scale=True):
  """The plain-XLA codec's dequantize (f32) of a quantization in the oracle's layout."""
  data, values, ts = from_oracle(codes, scales, ts_bits, bf, axis)
  packed = _packed_axis(bf, codes.ndim, axis)
  return codec.dequantize(data, values, ts, bf, axis % codes.ndim, codes.shape[packed],
                          jnp.float32, apply_tensor_scale)
