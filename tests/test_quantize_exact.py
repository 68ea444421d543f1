"""The quantize kernels (mxjax.quantize) equal the oracle (mxjax.reference) bit for bit.

Data and scales are compared as uint8 bit patterns; dequantized values bit for bit with NaN
positions equal. Exhaustive cases (all 65,536 bf16 / f16 bit patterns, special blocks) go
through one call per format x scale mode x dtype; hypothesis covers shapes and axes. Every
test runs at each CPU kernel level this machine runs (conftest's `simd_level` fixture).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from conftest import (DTYPE_IDS, DTYPES, FORMAT_NAMES, SCALE_MODES, assert_same_floats,
                      bits_of, every_code_under_every_scale, exhaustive_rows, f32_patterns,
                      float_arrays, shapes_and_axes, special_blocks, wide_mixed_blocks)
from mxjax import reference
from mxjax._src import formats
from mxjax._src.mxarray import MXArray
from mxjax._src.quantize import dequantize, quantize, quantize_2x

pytestmark = pytest.mark.usefixtures("simd_level")


def u8(a) -> np.ndarray:
  """Bit patterns of uint8 / float8 storage as a numpy uint8 array."""
  return np.asarray(a).view(np.uint8)


def assert_same_quantized(a: MXArray, data, scales, *, axis=None):
  """An MXArray equals the oracle's (data, scales) bit for bit."""
  assert a.data.dtype == data.dtype and a.data.shape == data.shape
  assert a.scales.dtype == jnp.float8_e8m0fnu and a.scales.shape == scales.shape
  np.testing.assert_array_equal(u8(a.scales), u8(scales))
  np.testing.assert_array_equal(u8(a.data), u8(data))
  if axis is not None:
    assert a.axis == axis


@pytest.fixture(scope="module", params=DTYPE_IDS)
def exhaustive_input(request):
  return request.param, jnp.asarray(exhaustive_rows(request.param))


# ---------------------------------------------------------------------------------------
# Exhaustive bit patterns


@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_all_bit_patterns(exhaustive_input, fmt, mode):
  dtype_id, x = exhaustive_input
  block_sizes = (32,) if dtype_id == "f16" else formats.BLOCK_SIZES
  for block_size in block_sizes:
    a = quantize(x, fmt, block_size=block_size, scale_mode=mode)
    assert_same_quantized(a, *reference.quantize(x, fmt, block_size=block_size,
                                                 scale_mode=mode))
    assert a.shape == x.shape and a.dtype == x.dtype and a.block_size == block_size
  # Dequantize of the block-32 result, to every dtype.
  a = quantize(x, fmt, scale_mode=mode)
  for dtype in DTYPES:
    want = reference.dequantize(a.data, a.scales, fmt, axis=1, block_size=32, shape=x.shape,
                                dtype=dtype)
    assert_same_floats(dequantize(a, dtype), want)
    assert_same_floats(a.dequantize(dtype), want)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_dequantize_every_code_and_scale(fmt):
  """Every code under every scale byte (0xFF, subnormal and overflowing products), bit for
  bit: NaNs too, whose sign and payload must be the oracle's."""
  f = formats.element_format(fmt)
  codes, scales, data = every_code_under_every_scale(fmt)
  for dtype in DTYPES:
    a = MXArray(data=data, scales=scales, format=fmt, block_size=32, axis_from_end=-1,
                length=codes.shape[1], dtype=jnp.dtype(dtype), scale_mode="rceil")
    want = reference.dequantize(data, scales, fmt, block_size=32, shape=codes.shape,
                                dtype=dtype)
    np.testing.assert_array_equal(bits_of(dequantize(a, dtype)), bits_of(want))
    if f.has_nan:  # e4m3 / e5m2 NaN codes keep their sign: NaNs of both signs compared
      w = np.asarray(want, np.float32)
      assert np.signbit(w[np.isnan(w)]).any() and not np.signbit(w[np.isnan(w)]).all()


# ---------------------------------------------------------------------------------------
# Random shapes, axes, values


@given(shape_axis=shapes_and_axes(), fmt=st.sampled_from(FORMAT_NAMES),
       mode=st.sampled_from(SCALE_MODES), dtype=st.sampled_from(DTYPES), data=st.data())
def test_random_shapes_and_axes(shape_axis, fmt, mode, dtype, data):
  shape, axis = shape_axis
  x = jnp.asarray(data.draw(float_arrays(shape, dtype)))
  block_size = data.draw(st.sampled_from(formats.BLOCK_SIZES))
  a = quantize(x, fmt, axis=axis, block_size=block_size, scale_mode=mode)
  want = reference.quantize(x, fmt, axis=axis, block_size=block_size, scale_mode=mode)
  assert_same_quantized(a, *want, axis=axis % x.ndim)
  assert a.shape == shape and a.dtype == x.dtype and a.format == formats.mx(fmt, block_size, mode)
  out_dtype = data.draw(st.sampled_from(DTYPES))
  assert_same_floats(a.dequantize(out_dtype),
                     reference.dequantize(*want, fmt, axis=axis, block_size=block_size,
                                          shape=shape, dtype=out_dtype))


@given(shape_axis=shapes_and_axes(min_rank=2, max_len=100), fmt=st.sampled_from(FORMAT_NAMES),
       mode=st.sampled_from(SCALE_MODES), dtype=st.sampled_from(DTYPES), data=st.data())
def test_quantize_2x_rowwise_and_columnwise(shape_axis, fmt, mode, dtype, data):
  """Both results equal the oracle of the high-precision input along their own axis."""
  shape, _ = shape_axis
  shape = list(shape)
  shape[-2] = data.draw(st.integers(1, 100))  # ragged M as well as ragged K
  x = jnp.asarray(data.draw(float_arrays(tuple(shape), dtype)))
  block_size = data.draw(st.sampled_from(formats.BLOCK_SIZES))
  axes = data.draw(st.sampled_from([(-1, -2), (-1, -2), (0, -1), (-2, -1)]))
  if len({ax % x.ndim for ax in axes}) < 2:
    axes = (-1, -2)
  rows, cols = quantize_2x(x, fmt, axes=axes, block_size=block_size, scale_mode=mode)
  for got, ax in ((rows, axes[0]), (cols, axes[1])):
    want = reference.quantize(x, fmt, axis=ax, block_size=block_size, scale_mode=mode)
    assert_same_quantized(got, *want, axis=ax % x.ndim)
    assert got.shape == x.shape


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_quantize_2x_special_blocks(fmt):
  """NaN / Inf / zero / subnormal tiles: each NaN poisons one row block and one column
  block, never the other direction's neighbours."""
  x = jnp.asarray(special_blocks(np.float32, 64)[:192].reshape(96, 128))
  for mode in SCALE_MODES:
    rows, cols = quantize_2x(x, fmt, scale_mode=mode)
    assert_same_quantized(rows, *reference.quantize(x, fmt, axis=1, scale_mode=mode))
    assert_same_quantized(cols, *reference.quantize(x, fmt, axis=0, scale_mode=mode))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_boundary_blocks_columnwise_and_2x(fmt, dtype):
  """The special blocks (saturation, max magnitude, the RCEIL / FLOOR boundary, subnormal,
  zero, NaN / Inf) laid out down the columns: columnwise quantize and quantize_2x's
  columnwise result get them as the rowwise path does, equal to the oracle."""
  x = jnp.asarray(special_blocks(dtype, 32).T)  # each column is one special block
  for mode in SCALE_MODES:
    want = reference.quantize(x, fmt, axis=0, scale_mode=mode)
    assert_same_quantized(quantize(x, fmt, axis=0, scale_mode=mode), *want)
    rows, cols = quantize_2x(x, fmt, scale_mode=mode)
    assert_same_quantized(cols, *want)
    assert_same_quantized(rows, *reference.quantize(x, fmt, axis=1, scale_mode=mode))


# ---------------------------------------------------------------------------------------
# Transformations


def test_jit_matches_eager():
  x = jnp.asarray(exhaustive_rows("bf16")[:256])
  for fmt in ("e4m3", "e3m2", "e2m1"):
    f = jax.jit(lambda v, fmt=fmt: quantize(v, fmt, axis=0, scale_mode="floor"))
    want = reference.quantize(x, fmt, axis=0, scale_mode="floor")
    assert_same_quantized(f(x), *want)
    g = jax.jit(lambda a: a.dequantize(jnp.bfloat16))
    assert_same_floats(g(f(x)), reference.dequantize(*want, fmt, axis=0, shape=x.shape,
                                                      dtype=jnp.bfloat16))


@pytest.mark.parametrize("fmt", ["e4m3", "e2m3", "e2m1"])
@pytest.mark.parametrize("in_axis,axis", [(0, -1), (0, 0), (1, 1), (2, -2)])
def test_vmap_equals_loop(fmt, in_axis, axis):
  """vmap of quantize / dequantize equals the per-example loop (and the oracle)."""
  x = jnp.asarray(f32_patterns(48, 40, seed=5)[:48].reshape(4, 12, 40))
  xs = jnp.moveaxis(x, in_axis, 0)
  q = lambda v: quantize(v, fmt, axis=axis, block_size=16)
  batched = jax.vmap(q, in_axes=in_axis)(x)
  deq = jax.vmap(lambda a: a.dequantize(jnp.float32))(batched)
  for i in range(xs.shape[0]):
    one = q(xs[i])
    np.testing.assert_array_equal(u8(batched.data[i]), u8(one.data))
    np.testing.assert_array_equal(u8(batched.scales[i]), u8(one.scales))
    assert_same_quantized(one, *reference.quantize(xs[i], fmt, axis=axis, block_size=16))
    assert_same_floats(deq[i], one.dequantize(jnp.float32))


def test_vmap_of_quantize_2x_equals_loop():
  x = jnp.asarray(f32_patterns(96, 32, seed=9)[:96].reshape(3, 32, 32))
  rows, cols = jax.vmap(lambda v: quantize_2x(v, "e5m2"))(x)
  for i in range(3):
    assert_same_quantized(jax.tree.map(lambda t: t[i], rows), *reference.quantize(x[i], "e5m2"))
    assert_same_quantized(jax.tree.map(lambda t: t[i], cols),
                          *reference.quantize(x[i], "e5m2", axis=0))


# ---------------------------------------------------------------------------------------
# Storage


@pytest.mark.parametrize("fmt,bytes_per_element", [
    ("e4m3", 1.0), ("e5m2", 1.0), ("e3m2", 0.75), ("e2m3", 0.75), ("e2m1", 0.5)])
@pytest.mark.parametrize("block_size", formats.BLOCK_SIZES)
def test_packed_storage_sizes(fmt, bytes_per_element, block_size):
  m, n = 6, 256
  a = quantize(jnp.ones((m, n), jnp.bfloat16), fmt, block_size=block_size)
  assert a.nbytes == m * n * bytes_per_element + m * n // block_size
  assert a.data.shape == (m, int(n * bytes_per_element))
  # Ragged lengths: ceil(n/4)*3 bytes (FP6), ceil(n/2) (FP4), scales ceil(n/B).
  f = formats.element_format(fmt)
  for n in (1, 3, 5, 33, 67):
    a = quantize(jnp.ones((2, n), jnp.float32), fmt, block_size=block_size)
    assert a.data.shape == (2, f.storage_length(n))
    assert a.scales.shape == (2, math.ceil(n / block_size))
    assert a.shape == (2, n)
    np.testing.assert_array_equal(np.asarray(a.dequantize()), np.ones((2, n), np.float32))


@pytest.mark.parametrize("shape", [(64, 1024), (40, 2087), (33, 544)])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_wide_rows_and_columns_with_mixed_blocks(shape, fmt):
  x = jnp.asarray(wide_mixed_blocks(*shape, seed=shape[1]))
  for mode in SCALE_MODES:
    got = {-1: quantize(x, fmt, axis=-1, scale_mode=mode),
           0: quantize(x, fmt, axis=0, scale_mode=mode)}
    rows, cols = quantize_2x(x, fmt, scale_mode=mode)
    for axis, a in [*got.items(), (-1, rows), (0, cols)]:
      data, scales = reference.quantize(x, fmt, axis=axis, scale_mode=mode)
      np.testing.assert_array_equal(np.asarray(a.data).view(np.uint8),
                                    np.asarray(data).view(np.uint8))
      np.testing.assert_array_equal(np.asarray(a.scales).view(np.uint8),
                                    np.asarray(scales).view(np.uint8))


@pytest.mark.parametrize("shape", [(40, 2087), (3, 8200)])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_dequantize_wide_rows_with_mixed_blocks(shape, fmt):
  """Dequantize of rows (and columns) of 65-256 blocks that mix the blocks the vector paths
  take with those they leave to the scalar path (NaN scales, scales so small or large that
  some value is no normal bf16), in the same rounds of blocks; ragged ends."""
  x = jnp.asarray(wide_mixed_blocks(*shape, seed=shape[1] + 1))
  for axis in (1, 0):
    a = quantize(x, fmt, axis=axis)
    for dtype in DTYPES:
      want = reference.dequantize(a.data, a.scales, fmt, axis=axis, block_size=32,
                                  shape=x.shape, dtype=dtype)
      assert_same_floats(dequantize(a, dtype), want)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_dequantize_columnwise_every_code_and_scale(fmt):
  """Along axis 0, every code under every scale byte, in 16- and 32-column SIMD strips and
  their scalar remainder: columns c and 256 + c have scale byte c; columns from 256 on have
  no NaN / Inf codes (such codes send a whole strip to the scalar path)."""
  f = formats.element_format(fmt)
  n = max(64, 1 << f.bits)
  codes = np.broadcast_to((np.arange(n) % (1 << f.bits)).astype(np.uint8)[:, None], (n, 256))
  sign = np.uint8(1 << (f.bits - 1))
  finite = np.minimum(codes & (sign - 1), f.max_code).astype(np.uint8) | (codes & sign)
  codes = jnp.asarray(np.concatenate([codes, finite], axis=1)[:, :500])
  scale_bytes = np.broadcast_to(np.tile(np.arange(256, dtype=np.uint8), 2)[:500], (n // 32, 500))
  scales = jnp.asarray(np.ascontiguousarray(scale_bytes)).view(jnp.float8_e8m0fnu)
  data = reference.pack_codes(codes, fmt, axis=0)
  for dtype in DTYPES:
    a = MXArray(data=data, scales=scales, format=fmt, block_size=32, axis_from_end=-2,
                length=n, dtype=jnp.dtype(dtype), scale_mode="rceil")
    want = reference.dequantize(data, scales, fmt, axis=0, block_size=32, shape=codes.shape,
                                dtype=dtype)
    assert_same_floats(dequantize(a, dtype), want)


@pytest.mark.parametrize("shape", [(4096, 4096), (2048, 8200), (2, 2048, 4096)])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_inputs_past_the_streaming_store_size(shape, fmt):
  """Inputs of 32 MiB and more (ffi/cpu/kernels.h, kStreamMinBytes) have their outputs written
  with streaming stores: whole aligned lines from a staging buffer or straight from the
  column strips, the ragged line ends (8200 columns) with ordinary stores."""
  x = jnp.asarray(wide_mixed_blocks(math.prod(shape[:-1]), shape[-1], seed=shape[-1]))
  x = x.reshape(shape)
  assert x.nbytes >= 32 << 20
  rows, cols = quantize_2x(x, fmt)
  want = {axis: reference.quantize(x, fmt, axis=axis) for axis in (-1, -2)}
  for axis, got in [(-1, quantize(x, fmt, axis=-1)), (-2, quantize(x, fmt, axis=-2)),
                    (-1, rows), (-2, cols)]:
    assert_same_quantized(got, *want[axis])


@pytest.mark.parametrize("shape_dtype", [((2048, 8200), jnp.bfloat16), ((1024, 8200), jnp.float32)],
                         ids=["bf16", "f32"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_dequantize_outputs_past_the_streaming_store_size(shape_dtype, fmt):
  """Dequantize outputs of 32 MiB and more go out with streaming stores, in rows whose blocks
  are whole aligned lines (here every 4th row: 8200 columns), with the ragged row ends, the
  other rows and the blocks left to the scalar path written with ordinary stores."""
  shape, dtype = shape_dtype
  x = jnp.asarray(wide_mixed_blocks(*shape, seed=shape[0]))
  assert math.prod(shape) * jnp.dtype(dtype).itemsize >= 32 << 20
  a = quantize(x, fmt)
  want = reference.dequantize(a.data, a.scales, fmt, axis=1, block_size=32, shape=shape,
                              dtype=dtype)
  assert_same_floats(dequantize(a, dtype), want)



@pytest.mark.parametrize("shape_dtype", [((4096, 4096), jnp.bfloat16), ((2048, 4112), jnp.float32)],
                         ids=["bf16", "f32"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_columnwise_dequantize_outputs_past_the_streaming_store_size(shape_dtype, fmt):
  """Columnwise dequantize outputs of 32 MiB and more, rows a whole number of lines apart, go
  out from the column strips with streaming stores; the strips left to the scalar path and the
  columns past the last strip (f32: 4112 = 8 x 512 + 16) with ordinary stores after a fence."""
  shape, dtype = shape_dtype
  x = jnp.asarray(wide_mixed_blocks(*shape, seed=shape[1]))
  assert math.prod(shape) * jnp.dtype(dtype).itemsize >= 32 << 20
  a = quantize(x, fmt, axis=0)
  want = reference.dequantize(a.data, a.scales, fmt, axis=0, block_size=32, shape=shape,
                              dtype=dtype)
  assert_same_floats(dequantize(a, dtype), want)

def small_scale_blocks(rows: int, blocks: int) -> np.ndarray:
  """[rows, 32 * blocks] bf16: blocks whose amax has exponent field 1 .. 32 (scale bytes at the
  low end that the SIMD encoders take), the other elements bf16 subnormals and normals one to
  four binades below the amax, signs mixed."""
  r, b, i = np.meshgrid(np.arange(rows), np.arange(blocks), np.arange(32), indexing="ij")
  e = 1 + b % 32
  amax = e << 7 | ((r * 37 + b) & 127)
  subnormal = (r * 19 + b * 7 + i * 13) & 127
  below = np.maximum(e - 1 - i % 4, 0) << 7 | ((i * 29 + r) & 127)
  bits = np.where(i == 0, amax, np.where(i < 20, subnormal, below))
  bits = bits | np.where((i + r) % 3 == 0, 0x8000, 0)
  return bits.astype(np.uint16).reshape(rows, 32 * blocks).view(ml_dtypes.bfloat16)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_small_scales_with_subnormal_elements(fmt):
  """Scale bytes around the smallest the SIMD paths take (simd256_encode.h, min_byte), with
  subnormal elements near the element grid's rounding boundaries: rowwise, columnwise, 2x."""
  x = jnp.asarray(small_scale_blocks(32, 64))
  for mode in SCALE_MODES:
    rows, cols = quantize_2x(x, fmt, scale_mode=mode)
    for axis, got in [(-1, quantize(x, fmt, axis=-1, scale_mode=mode)),
                      (0, quantize(x, fmt, axis=0, scale_mode=mode)), (-1, rows), (0, cols)]:
      assert_same_quantized(got, *reference.quantize(x, fmt, axis=axis, scale_mode=mode))


def lopsided_scale_tiles() -> np.ndarray:
  """[64, 512] bf16 whose rowwise and columnwise scales of one element differ by many binades:
  in rows 0-31 every row block starts with a large element (large rowwise scales, small
  columnwise ones elsewhere); row 32 is large throughout (large columnwise scales, small
  rowwise ones in rows 33-63). The other elements of row r span 2^-6 down 4 .. 32 binades
  (by r), signs mixed, so that in some rows of every format a whole block is element normals
  one way while some of it is element subnormals (or zero) the other way."""
  rng = np.random.default_rng(13)
  low = -6 - 4 * (1 + np.arange(64) % 8)[:, None]
  x = np.ldexp(1 + rng.random((64, 512)), rng.integers(low, -6, (64, 512)))
  x = x * np.where(rng.random((64, 512)) < 0.5, -1, 1)
  x[:32, ::32] = 1.5
  x[32, :] = -1.25
  return x.astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_quantize_2x_lopsided_scales(fmt):
  """quantize_2x encodes each element twice from one load (ffi/cpu/simd256_2x.h): with the
  rowwise scale and with the columnwise one, where one makes it an element subnormal and
  the other does not; both results equal the oracle."""
  x = jnp.asarray(lopsided_scale_tiles())
  for mode in SCALE_MODES:
    rows, cols = quantize_2x(x, fmt, scale_mode=mode)
    assert_same_quantized(rows, *reference.quantize(x, fmt, axis=1, scale_mode=mode))
    assert_same_quantized(cols, *reference.quantize(x, fmt, axis=0, scale_mode=mode))
