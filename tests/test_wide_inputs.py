"""f32 and f16 inputs through the CPU's bf16 fast paths equal the oracle bit for bit.

The kernels quantize whole f32 / f16 blocks of 32 from x narrowed to bf16 rounded to odd
(ffi/cpu/bf16_odd.h) and redo from x the blocks whose scales that argument does not cover.
These inputs sit where a narrowing would go wrong: every rounding midpoint of each element
format, exactly and about one input ulp to either side (below bf16's precision, so rounding
to nearest or truncating would land on the midpoint), under block scales in the fast paths'
range and below it (tiny blocks), with amax one ulp above and below each format's max (the
RCEIL boundary), input subnormals, NaN with a payload only in the low bits, and Inf. Laid
out along rows and down columns, wide enough for whole tiles of the SIMD paths (512
columns) plus ragged ends; rowwise, columnwise, quantize_2x and fake_quantize; and a 32 MiB
f32 input, whose outputs are streamed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import jax.numpy as jnp
from conftest import FORMAT_NAMES, SCALE_MODES, assert_same_floats, wide_mixed_blocks
from mxjax import reference
from mxjax._src import formats
from mxjax._src.quantize import fake_quantize, quantize, quantize_2x
from test_quantize_exact import assert_same_quantized

pytestmark = pytest.mark.usefixtures("simd_level")

ELEMENT_DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
                  "e3m2": ml_dtypes.float6_e3m2fn, "e2m3": ml_dtypes.float6_e2m3fn,
                  "e2m1": ml_dtypes.float4_e2m1fn}


def element_midpoints(fmt: str) -> np.ndarray:
  """The midpoints between consecutive finite non-negative values of fmt (f64)."""
  codes = np.arange(1 << formats.element_format(fmt).bits).astype(np.uint8)
  values = np.unique(np.abs(codes.view(ELEMENT_DTYPES[fmt]).astype(np.float64)))
  values = values[np.isfinite(values)]
  return (values[:-1] + values[1:]) / 2


def midpoint_blocks(fmt: str, dtype) -> np.ndarray:
  """[k, 32] blocks of dtype: under each scale 2^s, a block of max * 2^s (its amax: the block
  scale is 2^s) and 31 midpoints * 2^s, exact or times 1 -+ 2^-mant of dtype (about an ulp),
  both signs; blocks whose amax is that much above or below max * 2^s; blocks with dtype's subnormals among
  normal values; tiny, NaN (payload in the low bits only) and Inf blocks."""
  dtype = np.dtype(dtype)
  fi = ml_dtypes.finfo(dtype)
  f = formats.element_format(fmt)
  rng = np.random.default_rng(7)
  mids = element_midpoints(fmt)
  ulp = 2.0 ** -fi.nmant
  top = int(np.floor(np.log2(float(fi.max) / f.max)))  # largest s with max * 2^s finite
  scales = sorted({top, top // 2, 0, -3, fi.minexp + 12, fi.minexp + 2})
  blocks = []
  for s in scales:
    vals = np.concatenate([mids * (1 + d * ulp) for d in (-1.0, 0.0, 1.0)])
    vals = vals * rng.choice([-1.0, 1.0], size=vals.size) * 2.0 ** s
    vals = np.concatenate([vals, np.zeros(-vals.size % 31)])
    body = vals.reshape(-1, 31)
    amax = np.full((body.shape[0], 1), f.max * 2.0 ** s)
    blocks.append(np.concatenate([amax, body], axis=1))
    for d in (-1.0, 1.0):  # amax one ulp off max * 2^s: RCEIL's boundary
      b = np.concatenate([[f.max * 2.0 ** s * (1 + d * ulp)], body[0]])
      blocks.append(b[None])
    sub = rng.integers(1, 2 ** fi.nmant, size=31) * float(fi.smallest_subnormal)
    blocks.append(np.concatenate([[f.max * 2.0 ** s], sub * rng.choice([-1.0, 1.0], 31)])[None])
  blocks.append((rng.integers(1, 2 ** fi.nmant, size=32) * float(fi.smallest_subnormal))[None])
  out = np.concatenate(blocks).astype(dtype)
  specials = np.tile(out[:1], (3, 1))
  specials[0, 5] = np.inf
  specials[1, 9] = -np.inf
  bits = specials.view(np.uint32 if dtype.itemsize == 4 else np.uint16)
  bits[2, 17] = 0x7F800001 if dtype.itemsize == 4 else 0x7C01  # NaN, lowest payload bit
  return np.concatenate([out, specials])


def layouts(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The blocks along rows ([r, 32 * 80]: runs of 64 blocks and a shorter one) and down
  columns ([32 * g, 560]: a whole 512-column tile, one more strip and 16 ragged columns),
  padded with zero blocks."""
  def padded(n):
    out = np.zeros((-(-blocks.shape[0] // n) * n, 32), blocks.dtype)
    out[:blocks.shape[0]] = blocks
    return out
  rows = padded(80).reshape(-1, 32 * 80)
  cols = padded(560).reshape(-1, 560, 32).transpose(0, 2, 1).reshape(-1, 560)
  return rows, cols


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_midpoints_through_the_bf16_paths(fmt, dtype):
  for x in map(jnp.asarray, layouts(midpoint_blocks(fmt, dtype))):
    for mode in SCALE_MODES:
      want_rows = reference.quantize(x, fmt, axis=1, scale_mode=mode)
      want_cols = reference.quantize(x, fmt, axis=0, scale_mode=mode)
      assert_same_quantized(quantize(x, fmt, axis=1, scale_mode=mode), *want_rows)
      assert_same_quantized(quantize(x, fmt, axis=0, scale_mode=mode), *want_cols)
      rows, cols = quantize_2x(x, fmt, scale_mode=mode)
      assert_same_quantized(rows, *want_rows)
      assert_same_quantized(cols, *want_cols)
      for axis, (data, scales) in ((1, want_rows), (0, want_cols)):
        want = reference.dequantize(data, scales, fmt, axis=axis, shape=x.shape, dtype=x.dtype)
        assert_same_floats(fake_quantize(x, fmt, axis=axis, scale_mode=mode), want)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_f32_inputs_past_the_streaming_store_size(fmt):
  """An f32 input of 32 MiB: the outputs go out with streaming stores, and the blocks redone
  from x (tiny, NaN / Inf) rewrite streamed lines. Mixed blocks (conftest's
  wide_mixed_blocks) with random low bits below bf16's precision."""
  rng = np.random.default_rng(3)
  x = wide_mixed_blocks(1024, 8200, seed=5).astype(np.float32)
  noise = rng.integers(0, 1 << 16, size=x.shape, dtype=np.uint32)
  x = jnp.asarray((x.view(np.uint32) | np.where(np.isfinite(x), noise, 0)).view(np.float32))
  assert x.nbytes >= 32 << 20
  rows, cols = quantize_2x(x, fmt)
  for axis, got in [(-1, quantize(x, fmt, axis=-1)), (-2, quantize(x, fmt, axis=-2)),
                    (-1, rows), (-2, cols)]:
    assert_same_quantized(got, *reference.quantize(x, fmt, axis=axis))
