"""The oracle (mxjax.reference) against independent facts.

The independent model is numpy float64 + ml_dtypes, run outside of XLA (numpy keeps
subnormals): amax and the shared exponent from np.frexp, v = x * 2**-e exactly in float64,
clipped to +-max, then ml_dtypes' round-to-nearest-even cast to the element dtype; decode
is ml_dtypes' value * 2**e in float64, cast by numpy to f32 and then to the target dtype.
Plus hand-computed cases, packing layouts and round-trip error bounds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from conftest import (DTYPE_IDS, DTYPES, FORMAT_NAMES, SCALE_MODES, all_bf16_patterns,
                      all_f16_patterns, assert_same_floats, bits_of, f32_patterns, float_arrays,
                      shapes_and_axes, special_blocks)
from mxjax import reference
from mxjax._src import formats

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
      "e3m2": ml_dtypes.float6_e3m2fn, "e2m3": ml_dtypes.float6_e2m3fn,
      "e2m1": ml_dtypes.float4_e2m1fn}


# ---------------------------------------------------------------------------------------
# The float64 model


def model_encode(x, fmt_name, mode, block_size):
  """numpy model of encode_codes along the last axis: (codes uint8, scale bytes uint8)."""
  fmt = formats.element_format(fmt_name)
  with np.errstate(invalid="ignore"):
    x = np.asarray(x).astype(np.float64)
  n = x.shape[-1]
  nb = -(-n // block_size)
  xb = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, nb * block_size - n)])
  xb = xb.reshape(*x.shape[:-1], nb, block_size)
  special = ~np.all(np.isfinite(xb), axis=-1)
  amax = np.max(np.where(np.isfinite(xb), np.abs(xb), 0), axis=-1)
  _, p = np.frexp(amax)  # amax = m * 2**p with m in [0.5, 1): floor(log2) = p - 1
  e = p - 1 - fmt.emax
  if mode == "rceil":
    e = e + (amax > fmt.max * np.exp2(e.astype(np.float64)))
  e = np.where(amax == 0, -127, np.clip(e, -127, 127))
  with np.errstate(invalid="ignore"):
    v = np.ldexp(xb, -e[..., None])
  v = np.clip(v, -fmt.max, fmt.max)  # saturation; |v| <= max is unchanged by the clip
  codes = bits_of(v.astype(ML[fmt_name]))
  codes = np.where(special[..., None], 0, codes).astype(np.uint8)
  codes = codes.reshape(*x.shape[:-1], -1)[..., :n]
  scales = np.where(special, 255, e + 127).astype(np.uint8)
  return codes, scales


def model_decode(codes, scale_bytes, fmt_name, block_size, dtype):
  """numpy model of dequantize along the last axis (codes unpacked) -> numpy `dtype`."""
  n = codes.shape[-1]
  vals = np.asarray(codes, np.uint8).view(ML[fmt_name]).astype(np.float64)
  sb = np.repeat(np.asarray(scale_bytes), block_size, axis=-1)[..., :n].astype(np.int64)
  with np.errstate(invalid="ignore", over="ignore"):
    out = np.ldexp(vals, sb - 127).astype(np.float32)  # one RNE rounding, subnormals kept
  out = np.where(sb == 255, np.float32(np.nan), out)
  with np.errstate(over="ignore"):
    return out.astype(dtype)


def _inputs(dtype_id):
  if dtype_id == "bf16":
    return np.concatenate([all_bf16_patterns(), all_bf16_patterns("strided"),
                           special_blocks(ml_dtypes.bfloat16)])
  if dtype_id == "f16":
    return np.concatenate([all_f16_patterns(), all_f16_patterns("strided"),
                           special_blocks(np.float16)])
  return f32_patterns()


# ---------------------------------------------------------------------------------------
# Exhaustive / large batches against the model


@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("dtype_id", DTYPE_IDS)
def test_encode_matches_float64_model(dtype_id, fmt, mode):
  x = _inputs(dtype_id)
  codes, scales = reference.encode_codes(jnp.asarray(x), fmt, scale_mode=mode)
  want_codes, want_scales = model_encode(x, fmt, mode, 32)
  np.testing.assert_array_equal(np.asarray(scales), want_scales)
  np.testing.assert_array_equal(np.asarray(codes), want_codes)


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_encode_block_sizes(fmt, block_size):
  x = all_bf16_patterns("strided").reshape(-1, block_size * 4)
  for mode in SCALE_MODES:
    codes, scales = reference.encode_codes(jnp.asarray(x), fmt, scale_mode=mode,
                                           block_size=block_size)
    want_codes, want_scales = model_encode(x, fmt, mode, block_size)
    np.testing.assert_array_equal(np.asarray(scales), want_scales)
    np.testing.assert_array_equal(np.asarray(codes), want_codes)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_dequantize_every_code_and_scale(fmt):
  """All codes x all 256 scale bytes (incl. 0xFF, subnormal / overflowing products)."""
  width = formats.element_format(fmt).bits
  codes = np.tile(np.arange(1 << width, dtype=np.uint8), max(1, 64 >> width))
  codes = np.broadcast_to(codes, (256, codes.size))
  scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], codes.shape[1] // 32, axis=1)
  data = reference.pack_codes(jnp.asarray(codes), fmt)
  scales_e8 = jnp.asarray(scales).view(jnp.float8_e8m0fnu)
  for dtype in DTYPES:
    got = reference.dequantize(data, scales_e8, fmt, block_size=32, shape=codes.shape,
                               dtype=dtype)
    assert_same_floats(got, model_decode(codes, scales, fmt, 32, dtype))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_dequantize_of_quantize_matches_model(fmt):
  x = np.concatenate([all_bf16_patterns("strided"), special_blocks(ml_dtypes.bfloat16)])
  for mode in SCALE_MODES:
    data, scales = reference.quantize(jnp.asarray(x), fmt, scale_mode=mode)
    codes, sb = model_encode(x, fmt, mode, 32)
    for dtype in DTYPES:
      got = reference.dequantize(data, scales, fmt, shape=x.shape, dtype=dtype)
      assert_same_floats(got, model_decode(codes, sb, fmt, 32, dtype))


def test_widening_is_exact():
  for x in (all_bf16_patterns(), all_f16_patterns()):
    got = np.asarray(reference.to_f32_bits(jnp.asarray(x)))
    want = bits_of(x.astype(np.float32))
    np.testing.assert_array_equal(np.where(np.isnan(x.astype(np.float32)), 0, got),
                                  np.where(np.isnan(x.astype(np.float32)), 0, want))


def test_narrowing_from_f32_bits_is_rne_with_subnormals():
  rng = np.random.default_rng(3)
  f16_ties = (rng.integers(0, 1 << 19, 1 << 16, dtype=np.uint32) << 13 | 0x1000).view(np.float32)
  bf16_ties = (np.arange(1 << 16, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
  k = np.arange(-2048, 2048, dtype=np.float64)
  f16_sub_ties = ((k + 0.5) * 2.0 ** -24).astype(np.float32)  # f16 subnormal halves
  edges = np.array([65504, 65519, 65520, 65536, 2.0 ** -25, 3 * 2.0 ** -26], np.float32)
  x = np.concatenate([f32_patterns().ravel(), f16_ties, bf16_ties, f16_sub_ties, edges, -edges])
  bits = jnp.asarray(bits_of(x))
  for dtype in (ml_dtypes.bfloat16, np.float16):
    with np.errstate(over="ignore", invalid="ignore"):
      want = x.astype(dtype)
    assert_same_floats(reference.from_f32_bits(bits, dtype), want)


# ---------------------------------------------------------------------------------------
# Hand-computed cases


def _one_block(values, dtype=np.float32, block_size=32):
  x = np.zeros(block_size, np.float64)
  x[: len(values)] = values
  return jnp.asarray(x.astype(dtype))[None]


def _enc(values, fmt, mode="rceil", dtype=np.float32):
  codes, scales = reference.encode_codes(_one_block(values, dtype), fmt, scale_mode=mode)
  return [int(c) for c in np.asarray(codes)[0, : len(values)]], int(np.asarray(scales)[0, 0])


@pytest.mark.parametrize("values,mode,codes,scale", [
    ([448.0], "rceil", [0x7E], 127),          # max: e = 0, no saturation
    ([448.0], "floor", [0x7E], 127),
    ([449.0], "rceil", [0x76], 128),          # 449 > 448 -> e = 1; 224.5 -> 224
    ([449.0], "floor", [0x7E], 127),          # floor keeps e = 0 and saturates to 448
    ([480.0], "rceil", [0x77], 128),          # 240 = 1.111b * 2**7
    ([480.0], "floor", [0x7E], 127),
    ([464.0], "rceil", [0x76], 128),          # 232: tie between 224 and 240 -> even 224
    ([1.0, -0.0, 0.0], "rceil", [0x78, 0x80, 0x00], 119),  # 1 <= 448 * 2**-8: v = 256
    ([256.0, -2.0 ** -10, 1.5 * 2.0 ** -10, 2.5 * 2.0 ** -9], "floor",
     [0x78, 0x80, 0x01, 0x02], 127),          # quantum 2**-9: ties to even, -tiny -> -0
    ([2.0 ** -127, 2.0 ** -130], "rceil", [0x38, 0x20], 0),  # f32 subnormals, e = -127
    ([2.0 ** -149], "floor", [0x00], 0),      # subnormal amax: e clamps at -127
    ([float(np.finfo(np.float32).max)], "rceil", [0x78], 247),  # e = 120, 511.99.. -> 256
    ([float(np.finfo(np.float32).max)], "floor", [0x7E], 246),  # e = 119, saturates
])
def test_e4m3_hand_cases(values, mode, codes, scale):
  assert _enc(values, "e4m3", mode) == (codes, scale)


@pytest.mark.parametrize("fmt,values,mode,codes,scale", [
    ("e5m2", [57344.0, 1.0], "rceil", [0x7B, 0x3C], 127),
    ("e5m2", [61440.0], "rceil", [0x78], 128),   # 30720 = 1.111b * 2**14: tie -> 2**15
    ("e5m2", [61440.0], "floor", [0x7B], 127),
    ("e3m2", [28.0, -0.0], "rceil", [0x1F, 0x20], 127),
    ("e3m2", [30.0], "floor", [0x1F], 127),
    ("e2m3", [7.5, 0.0625, 0.1875], "rceil", [0x1F, 0x00, 0x02], 127),  # quantum 1/8: tie->0, 1.5->2
    ("e2m3", [8.0], "rceil", [0x18], 128),     # 4.0 = 1.000b * 2**2
    ("e2m1", [6.0, 0.25, 0.75, -5.0], "rceil", [0x7, 0x0, 0x2, 0xE], 127),  # 0.25 tie->0, 0.75->1.0, 5->4 (tie, even)
    ("e2m1", [7.0], "rceil", [0x6], 128),      # 3.5 -> 4 (tie to even mantissa)
    ("e2m1", [7.0], "floor", [0x7], 127),      # saturates to 6
    ("e2m1", [float(np.finfo(np.float32).max)], "rceil", [0x6], 253),
    ("e2m1", [float(np.finfo(np.float32).max)], "floor", [0x7], 252),
])
def test_other_format_hand_cases(fmt, values, mode, codes, scale):
  assert _enc(values, fmt, mode) == (codes, scale)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_inf_blocks(fmt, bad):
  x = np.array([[1.0, bad, -3.0, 0.0] + [2.0] * 28, [1.0] * 32], np.float32)
  data, scales = reference.quantize(jnp.asarray(x), fmt)
  codes = np.asarray(reference.unpack_codes(data, fmt, n=32))
  assert np.asarray(scales).view(np.uint8)[:, 0].tolist() == [0xFF, 127 - formats.element_format(fmt).emax]
  assert not codes[0].any()
  out = np.asarray(reference.dequantize(data, scales, fmt, shape=x.shape))
  assert np.isnan(out[0]).all() and (out[1] == 1.0).all()


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_zero_blocks_keep_signs(fmt):
  f = formats.element_format(fmt)
  x = np.array([[0.0, -0.0] * 16], np.float32)
  for mode in SCALE_MODES:
    codes, scales = reference.encode_codes(jnp.asarray(x), fmt, scale_mode=mode)
    assert int(scales[0, 0]) == 0
    assert np.asarray(codes)[0].tolist() == [0, 1 << (f.bits - 1)] * 16
    out = reference.dequantize(*reference.quantize(jnp.asarray(x), fmt, scale_mode=mode), fmt,
                               shape=x.shape)
    assert bits_of(np.asarray(out)).tolist() == bits_of(x).tolist()


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_power_of_two_boundaries(fmt):
  """amax = 2**k: both modes give e = k - emax; amax = max * 2**k: both k; one ulp above
  max * 2**k: FLOOR k (saturating), RCEIL k + 1. Clamped to [-127, 127]."""
  f = formats.element_format(fmt)
  ks = np.arange(-149, 128)
  at_pow = np.exp2(ks.astype(np.float64)).astype(np.float32)
  ks_m = np.arange(-126 - f.emax, 128 - f.emax)  # max * 2**k is a normal f32
  at_max = (f.max * np.exp2(ks_m.astype(np.float64))).astype(np.float32)
  above = np.nextafter(at_max, np.float32(np.inf))
  x = np.concatenate([at_pow, at_max, above])[:, None] * np.eye(1, 32, dtype=np.float32)
  want_pow = np.clip(ks - f.emax, -127, 127)
  want_max = np.clip(ks_m, -127, 127)
  for mode in SCALE_MODES:
    _, scales = reference.encode_codes(jnp.asarray(x), fmt, scale_mode=mode)
    e = np.asarray(scales)[:, 0].astype(int) - 127
    want_above = np.clip(ks_m + (mode == "rceil"), -127, 127)
    np.testing.assert_array_equal(e, np.concatenate([want_pow, want_max, want_above]))


# ---------------------------------------------------------------------------------------
# Packing, layout, padding, transforms


def test_pack_layout_by_hand():
  fp6 = reference.pack_codes(jnp.array([1, 2, 3, 4, 63], jnp.uint8), "e2m3")
  assert np.asarray(fp6).tolist() == [0x81, 0x30, 0x10, 63, 0, 0]  # w = 0x103081
  fp4 = reference.pack_codes(jnp.array([[1, 0xA, 0xF]], jnp.uint8), "e2m1")
  assert np.asarray(fp4).tolist() == [[0xA1, 0x0F]]


@given(shape_axis=shapes_and_axes(max_size=2048), fmt=st.sampled_from(FORMAT_NAMES),
       seed=st.integers(0, 2 ** 31))
def test_pack_unpack_round_trip(shape_axis, fmt, seed):
  shape, axis = shape_axis
  f = formats.element_format(fmt)
  codes = np.random.default_rng(seed).integers(0, 1 << f.bits, size=shape).astype(np.uint8)
  data = reference.pack_codes(jnp.asarray(codes), fmt, axis)
  want_shape = list(shape)
  want_shape[axis] = f.storage_length(shape[axis])
  assert data.shape == tuple(want_shape) and data.dtype == f.storage_dtype
  back = reference.unpack_codes(data, fmt, axis, shape[axis])
  np.testing.assert_array_equal(np.asarray(back), codes)


@given(shape_axis=shapes_and_axes(), fmt=st.sampled_from(FORMAT_NAMES),
       mode=st.sampled_from(SCALE_MODES), dtype=st.sampled_from(DTYPES), data=st.data())
def test_any_axis_and_padding_match_model(shape_axis, fmt, mode, dtype, data):
  """Along any axis, a ragged length equals the model on the zero-padded input."""
  shape, axis = shape_axis
  x = data.draw(float_arrays(shape, dtype))
  block_size = data.draw(st.sampled_from(formats.BLOCK_SIZES))
  q_data, scales = reference.quantize(jnp.asarray(x), fmt, axis=axis, block_size=block_size,
                                      scale_mode=mode)
  codes, sb = model_encode(np.moveaxis(x, axis, -1), fmt, mode, block_size)
  assert scales.dtype == jnp.float8_e8m0fnu
  np.testing.assert_array_equal(np.asarray(scales).view(np.uint8), np.moveaxis(sb, -1, axis))
  got_codes = reference.unpack_codes(q_data, fmt, axis, shape[axis])
  np.testing.assert_array_equal(np.asarray(got_codes), np.moveaxis(codes, -1, axis))
  out = reference.dequantize(q_data, scales, fmt, axis=axis, block_size=block_size,
                             shape=shape, dtype=dtype)
  assert_same_floats(out, np.moveaxis(model_decode(codes, sb, fmt, block_size, dtype), -1, axis))


def test_jit_and_vmap():
  x = jnp.asarray(f32_patterns(64, 32)[:64].reshape(4, 16, 32))
  f = lambda a: reference.quantize(a, "e2m3", axis=0, block_size=16, scale_mode="floor")
  want = [f(a) for a in x]
  for got in (jax.vmap(f)(x), jax.jit(jax.vmap(f))(x)):
    for i in range(len(want)):
      np.testing.assert_array_equal(np.asarray(got[0][i]), np.asarray(want[i][0]))
      np.testing.assert_array_equal(np.asarray(got[1][i]).view(np.uint8),
                                    np.asarray(want[i][1]).view(np.uint8))


# ---------------------------------------------------------------------------------------
# Round-trip error bounds


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_round_trip_error_bounds(fmt):
  """Per element |deq - x| <= half a quantum of the element grid at the block scale; with
  RCEIL nothing saturates; with FLOOR an element above max * 2**e lands on +-max * 2**e.
  Relative error <= 2**-(man_bits + 1) for elements in the element's normal range."""
  f = formats.element_format(fmt)
  rng = np.random.default_rng(7)
  x = (rng.standard_normal((512, 32)) * np.exp2(rng.integers(-60, 60, (512, 1)))).astype(np.float32)
  for mode in SCALE_MODES:
    data, scales = reference.quantize(jnp.asarray(x), fmt, scale_mode=mode)
    deq = np.asarray(reference.dequantize(data, scales, fmt, shape=x.shape)).astype(np.float64)
    e = np.asarray(scales).view(np.uint8).astype(np.int64)[:, :1] - 127
    xd = x.astype(np.float64)
    v = np.abs(xd) * np.exp2(-e)
    ev = np.maximum(np.floor(np.log2(np.maximum(v, 1e-300))), f.emin)
    half_q = np.exp2(ev - f.man_bits - 1 + e)
    err = np.abs(deq - xd)
    sat = v > f.max
    if mode == "rceil":
      assert not sat.any()
    np.testing.assert_array_equal(np.abs(deq[sat]), f.max * np.exp2(e + 0 * deq)[sat])
    assert np.all(err[~sat] <= half_q[~sat])
    normal = ~sat & (v >= 2.0 ** f.emin)
    assert np.all(err[normal] <= np.abs(xd[normal]) * 2.0 ** -(f.man_bits + 1))
    assert np.all(np.sign(deq[deq != 0]) == np.sign(xd[deq != 0]))
    # The largest element of each block survives within one quantum of its binade.
    amax = np.max(np.abs(xd), axis=1)
    dmax = np.max(np.abs(deq), axis=1)
    assert np.all(np.abs(dmax - amax) <= amax * 2.0 ** -f.man_bits)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_representable_values_round_trip_exactly(fmt):
  """decode(code) * 2**e for every finite code and a few scales quantizes back to itself."""
  f = formats.element_format(fmt)
  vals = np.arange(1 << f.bits, dtype=np.uint8).view(ML[fmt]).astype(np.float64)
  vals = vals[np.isfinite(vals)]
  vals = np.concatenate([vals, [f.max]])  # every block holds max so e = k for RCEIL
  block = np.zeros((4, 64 * ((vals.size + 63) // 64)))
  for row, k in enumerate((-120, -20, 0, 100)):  # -120: f32 subnormal products
    block[row, : vals.size] = vals * 2.0 ** k
  x = block.astype(np.float32)
  assert np.array_equal(x.astype(np.float64), block)  # exact in f32 (subnormals included)
  data, scales = reference.quantize(jnp.asarray(x), fmt, block_size=64)
  deq = reference.dequantize(data, scales, fmt, block_size=64, shape=x.shape)
  np.testing.assert_array_equal(bits_of(np.asarray(deq)), bits_of(x))
