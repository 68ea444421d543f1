"""The block-scaled formats' CPU kernels (ffi/cpu/block_kernels.cc through
`mxjax._src.ops`) against the oracle (`mxjax.reference.block_quantize` /
`block_dequantize`), bit for bit, at every SIMD level this build and CPU run: rows,
strided columns, both in one pass (quantize_2x), 2-D tiles, whole work units, odd blocks,
stochastic rounding given its bits, the tensor scale (computed or given), ragged edges,
zero / subnormal / Inf / NaN blocks, every bf16 pattern; the packed codes' bytes against
the oracle's codes packed by `reference.pack_codes`; the tensor amax
(ffi/cpu/amax_kernels.cc) against the oracle's; proof that the kernels ran; their
sharding."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import mxjax
from conftest import all_bf16_patterns, all_f16_patterns, bits_of, special_blocks
from mxjax import reference
from mxjax._src import backend, codec, formats as bfmt, hadamard, ops, stochastic
import oracle_layout
from mxjax._src.formats import BlockFormat, ScaleFormat
from sharding_helpers import compiled_collectives
from test_block_formats import _awkward

at_every_level = pytest.mark.usefixtures("simd_level")  # the exactness tests; the others
                                                        # run at the level in use

KERNELS = "cpu" in backend.ffi_platforms()

FORMATS = {  # name: BlockFormat (every scale kind, 1-D and 2-D, every element width)
    "nvfp4": bfmt.NVFP4, "nvfp4_2d": bfmt.NVFP4_2D, "fp8_1x128": bfmt.FP8_1X128,
    "fp8_128x128": bfmt.FP8_128X128, "mxfp8_2d": bfmt.MXFP8_2D,
    "e4m3_fp32_1x16": BlockFormat("e4m3", ScaleFormat.FP32, (1, 16)),
    "e5m2_fp32_32x32": BlockFormat("e5m2", ScaleFormat.FP32, (32, 32)),
    "e2m3_e4m3_1x16": BlockFormat("e2m3", ScaleFormat.E4M3, (1, 16)),
    "mxfp4": bfmt.mx("e2m1"), "mxfp6_floor": bfmt.mx("e3m2", scale_mode="floor"),
}


def _u(a) -> np.ndarray:
  a = np.asarray(a)
  return a.view(np.uint32) if a.dtype == np.float32 else a


def _oracle(x, bf, axis, rand, ts=None):
  q = reference.block_quantize(x, bf, axis=axis, rand=rand, tensor_scale_bits=ts)
  return (*q[:2], reference.block_dequantize(*q, bf, axis=axis),
          reference.block_dequantize(*q, bf, axis=axis, apply_tensor_scale=False))


def _kernels(x, bf, axis, rand, ts=None):
  codes, scales, ts = oracle_layout.quantize(x, bf, axis, rand, ts)
  return (codes, scales, oracle_layout.dequantize(codes, scales, ts, bf, axis),
          oracle_layout.fake_quantize(x, bf, axis, rand)[0],
          *(oracle_layout.dequantize(codes, scales, ts, bf, axis, dtype=d)
            for d in (jnp.bfloat16, jnp.float16)))


_oracle_jit = jax.jit(_oracle, static_argnums=(1, 2))
_kernels_jit = jax.jit(_kernels, static_argnums=(1, 2))
_wanted = {}  # the oracle's results, computed once for every SIMD level


_SEED = jnp.asarray([5, 6], jnp.uint32)


def _assert_same(x, bf, axis, sr, what="", ts=None):
  """Codes, scales, dequantize (to f32, and to bf16 and f16: the oracle's f32 values
  narrowed by ml_dtypes) and fake_quantize; `ts`: a given tensor scale's f32 bits
  (quantize and dequantize; fake_quantize computes its own)."""
  rand = stochastic.random_bits(_SEED, x.shape) if sr else None
  key = (bf, axis, sr, what, x.shape, x.dtype, None if ts is None else int(ts), None)
  if key not in _wanted:
    want = _oracle_jit(x, bf, axis, rand, ts)
    if ts is not None:
      want = (*want[:3], _oracle_jit(x, bf, axis, rand)[3])
    with np.errstate(over="ignore"):  # past f16's max: Inf
      narrowed = [np.asarray(want[2]).astype(d) for d in (ml_dtypes.bfloat16, np.float16)]
    _wanted[key] = [_u(w) for w in want] + [bits_of(w) for w in narrowed]
  got = _kernels_jit(x, bf, axis, rand, ts)
  names = ("codes", "scales", "dequantize", "fake_quantize", "dequantize to bf16",
           "dequantize to f16")
  for name, w, g in zip(names, _wanted[key], got):
    g = bits_of(g) if name.endswith("16") else _u(g)
    np.testing.assert_array_equal(g, w, err_msg=f"{bf} axis {axis} SR {sr} {what}: {name}")


_counter_jit = jax.jit(
    lambda x, seed, bf, axis, strides: _kernels(x, bf, axis, stochastic.Counter(seed, strides)),
    static_argnums=(2, 3, 4))


def _assert_counter_same(x, bf, axis, strides=None, what=""):
  """As `_assert_same` under stochastic rounding, the kernels given a `stochastic.Counter`
  (the bits made as they round) and the oracle `stochastic.random_bits`' bits."""
  key = (bf, axis, True, what, x.shape, x.dtype, None, strides)
  if key not in _wanted:
    rand = stochastic.random_bits(_SEED, x.shape, strides)
    _wanted[key] = [_u(w) for w in _oracle_jit(x, bf, axis, rand)]
  got = _counter_jit(x, _SEED, bf, axis, strides)
  for name, w, g in zip(("codes", "scales", "dequantize", "fake_quantize"), _wanted[key], got):
    np.testing.assert_array_equal(_u(g), w, err_msg=f"{bf} axis {axis} {strides} {what}: {name}")


def _awkward_3d(dtype):
  """[2, 37, 45]: a batch dim, ragged edges for every block shape, the awkward rows."""
  x = jnp.stack([_awkward((37, 45), jnp.float32, 0), _awkward((37, 45), jnp.float32, 1)])
  return x.astype(dtype)


@at_every_level
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_kernels_equal_the_oracle(name):
  """Every format, rows and columns (1-D) or tiles (2-D), nearest even and stochastic,
  bf16 / f16 / f32 inputs, a batch dim and ragged edges."""
  bf = FORMATS[name]
  for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
    x = _awkward_3d(dtype)
    for axis in ((-1,) if bf.two_d else (-1, 1)):
      for sr in (False, True):
        _assert_same(x, bf, axis, sr, jnp.dtype(dtype).name)
  if not bf.two_d:  # the leading axis: columns with no batch
    _assert_same(_awkward_3d(jnp.float32), bf, 0, True, "float32")


@at_every_level
@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_2d", "mxfp4", "mxfp6_floor", "fp8_1x128",
                                  "e2m3_e4m3_1x16"])
def test_counter_bits_equal_the_given_bits(name):
  """Stochastic rounding's bits made inside the kernels from a counter (seed, index
  strides) round as the oracle does with `stochastic.random_bits`' bits: rows and columns,
  a batch dim, ragged edges, bf16 and f32, rows shorter and longer than kShortRun (64);
  and permuted strides: [B, runs, N, n] along n with the index of [B, runs, n, N] (short
  rows end to end)."""
  bf = FORMATS[name]
  for dtype in (jnp.float32, jnp.bfloat16):
    x = _awkward_3d(dtype)
    for axis in ((-1,) if bf.two_d else (-1, 1, 0)):
      _assert_counter_same(x, bf, axis, None, jnp.dtype(dtype).name)
  for axis in ((-1,) if bf.two_d else (-1, 0)):
    _assert_counter_same(_awkward((40, 160), jnp.bfloat16, 3), bf, axis, None, "long rows")
  rows = jnp.reshape(_awkward((48, 80), jnp.float32, 2), (2, 3, 20, 32))
  runs, n, cols = 3, 32, 20
  strides = (runs * n * cols, n * cols, 1, cols)
  _assert_counter_same(rows, bf, -1, strides, "permuted rows")


@at_every_level
def test_counter_base_in_the_kernel():
  """The kernel's counter operand (uint32[3]: seed, base) and `strides` (one per dim; here
  past 2**32 and 0) give the bits form's results for the bits of those indices."""
  if not KERNELS:
    pytest.skip("no CPU kernels in use")
  bf = FORMATS["nvfp4"]
  x = _awkward_3d(jnp.bfloat16)
  strides, base = (2 ** 33 + 7, 0, 45), 123456789
  attrs = dict(format=np.int32(bf.element_format.ffi_id), scale=np.int32(bf.scale.ffi_id),
               scale_mode=np.int32(bfmt.scale_mode(bf.scale_mode).ffi_id),
               block_rows=np.int64(1), block_cols=np.int64(16), axis=np.int64(2),
               stochastic_rounding=True)
  data, scales = ops.quantized_types(x.shape, bf, 2)
  types = (jax.ShapeDtypeStruct(data.shape, jnp.uint8), jax.ShapeDtypeStruct(scales.shape,
                                                                             jnp.uint8))
  call = jax.jit(lambda x, rand, strides: jax.ffi.ffi_call("mxjax_block_quantize", types)(
      x, rand, jnp.zeros((1,), jnp.uint32), **attrs, strides=np.asarray(strides, np.int64)),
      static_argnums=2)
  bits = stochastic.random_bits(_SEED, x.shape, strides, base)
  want = call(x, bits, ())
  got = call(x, jnp.asarray([5, 6, base], jnp.uint32), strides)
  for w, g in zip(want, got):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@at_every_level
@pytest.mark.parametrize("name", ["nvfp4", "fp8_1x128", "mxfp8_2d", "e4m3_fp32_1x16"])
def test_every_bf16_and_f16_pattern(name):
  """All 65,536 bf16 and f16 patterns, in blocks of neighbours and in blocks spanning
  every exponent (NaN / Inf / subnormal / zero blocks among them)."""
  bf = FORMATS[name]
  for patterns in (all_bf16_patterns, all_f16_patterns):
    for arrangement in ("sequential", "strided"):
      x = jnp.asarray(patterns(arrangement).reshape(512, 128))
      _assert_same(x, bf, -1, False, f"{patterns.__name__} {arrangement}")
  x = jnp.asarray(all_bf16_patterns("strided").reshape(512, 128))
  _assert_same(x, bf, -1, True, "bf16 strided")


@at_every_level
@pytest.mark.parametrize("name", ["nvfp4", "fp8_1x128", "e2m3_e4m3_1x16"])
def test_special_blocks(name):
  """The corners of the scale rules: amax at and around every power of two and every
  format's max, subnormal-only blocks, the dtype's max, NaN / Inf."""
  bf = FORMATS[name]
  b = bf.block[1]
  for dtype in (np.float32, ml_dtypes.bfloat16):
    x = jnp.asarray(special_blocks(dtype, b))
    _assert_same(x, bf, -1, False, np.dtype(dtype).name)
    _assert_same(jnp.asarray(np.ascontiguousarray(x.T)), bf, 0, True, np.dtype(dtype).name)


def _wide(blocks: np.ndarray, width: int = 1024) -> np.ndarray:
  """Rows of 1-D blocks laid end to end into rows of `width` (zero blocks pad the end)."""
  flat = blocks.reshape(-1)
  flat = np.concatenate([flat, np.zeros(-flat.size % width, flat.dtype)])
  return flat.reshape(-1, width)


def _assert_2x(x, bf, what=""):
  """quantize_2x's rows and columns against the oracle's quantize along each axis."""
  rows, cols, _ = _quantize_2x_jit(x, bf)
  for axis, got in ((-1, rows), (-2, cols)):
    key = (bf, "2x", axis, what, x.shape, x.dtype)
    if key not in _wanted:
      _wanted[key] = [_u(w) for w in reference.block_quantize(x, bf, axis=axis)[:2]]
    for w, g in zip(_wanted[key], got):
      np.testing.assert_array_equal(_u(g), w, err_msg=f"{bf} 2x axis {axis} {what}")


@at_every_level
@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_2d", "mxfp4", "e2m3_e4m3_1x16", "fp8_1x128",
                                  "mxfp8_2d", "e4m3_fp32_1x16"])
def test_whole_units(name):
  """Rows of whole work units (512 columns and more) and a ragged one, where narrow tiles
  reduce in registers and FP4 codes come from thresholds (AVX-512): every bf16 pattern
  (rows of neighbours, rows spanning every exponent), the special blocks end to end, random
  rows of bf16 / f16 / f32, given tensor scales; quantize_2x."""
  bf = FORMATS[name]
  for arrangement in ("sequential", "strided"):
    x = jnp.asarray(all_bf16_patterns(arrangement).reshape(-1, 512))
    _assert_same(x, bf, -1, False, f"bf16 {arrangement} wide")
  for dtype in (np.float32, ml_dtypes.bfloat16):
    _assert_same(jnp.asarray(_wide(special_blocks(dtype, 16))), bf, -1, False,
                 f"{np.dtype(dtype).name} special wide")
  for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
    x = _awkward((48, 1040), jnp.float32, 2).astype(dtype)  # 2 whole units and 16 columns
    _assert_same(x, bf, -1, False, f"{jnp.dtype(dtype).name} 1040")
  if bf.tensor_scale:
    x = _awkward((32, 1024), jnp.float32, 3).astype(jnp.bfloat16)
    for ts in (0x3F800000, 0x00000001, 0x7F7FFFFF, 0x4A000000):
      _assert_same(x, bf, -1, False, "bf16 given", ts=jnp.uint32(ts))
  if not bf.two_d:  # quantize_2x's rowwise units are whole too
    _assert_2x(_awkward((48, 1040), jnp.float32, 4).astype(jnp.bfloat16), bf, "1040")


@at_every_level
@pytest.mark.parametrize("ts", [0x3F800000, 0x00000001, 0x00800000, 0x38000000, 0x71800000,
                                0x7F7FFFFF])
def test_given_tensor_scales(ts):
  """A given tensor scale (1, the smallest subnormal, 2^-126, 2^-15, 2^100, FLT_MAX): the
  E4M3 scales' f32 path where it is exact, the exact path where not, and products far past
  the element grid (they saturate)."""
  x = _awkward_3d(jnp.float32)
  fp6 = dataclasses.replace(FORMATS["e2m3_e4m3_1x16"], tensor_scale=True)
  for bf in (FORMATS["nvfp4"], FORMATS["nvfp4_2d"], fp6):
    for axis in ((-1,) if bf.two_d else (-1, 1)):
      _assert_same(x, bf, axis, False, "given", ts=jnp.uint32(ts))


ODD_BLOCKS = {  # blocks of a few packing groups, of no power of two, of one element
    "e2m1_e4m3_1x6": BlockFormat("e2m1", ScaleFormat.E4M3, (1, 6), tensor_scale=True),
    "e3m2_e8m0_1x12": BlockFormat("e3m2", ScaleFormat.E8M0, (1, 12)),
    "e2m3_fp32_1x4": BlockFormat("e2m3", ScaleFormat.FP32, (1, 4)),
    "e5m2_fp32_1x3": BlockFormat("e5m2", ScaleFormat.FP32, (1, 3)),
    "e4m3_fp32_1x1": BlockFormat("e4m3", ScaleFormat.FP32, (1, 1)),
    "e2m1_e8m0_6x6": BlockFormat("e2m1", ScaleFormat.E8M0, (6, 6)),
}


@at_every_level
@pytest.mark.parametrize("name", sorted(ODD_BLOCKS))
def test_odd_blocks(name):
  """Blocks the fast paths do not take (the kernels' generic paths) equal the oracle's
  along every axis; quantize_2x too where its one-pass kernel takes the block."""
  bf = ODD_BLOCKS[name]
  x = _awkward_3d(jnp.float32)
  for axis in ((-1,) if bf.two_d else (-1, 1, 0)):
    _assert_same(x, bf, axis, axis == 1, "float32")
  if not bf.two_d and 512 % bf.block[1] == 0:
    _assert_2x(x, bf)


_packed_oracle = jax.jit(lambda x, bf, axis, a: reference.pack_codes(
    reference.block_quantize(x, bf, axis=axis)[0], bf.element, axis=a), static_argnums=(1, 2, 3))


@at_every_level
def test_packed_codes_layout():
  """The kernels' codes are MXArray's data: the element format's storage dtype, packed
  along the quantized axis (2-D tiles: the last) to its storage length, byte for byte the
  oracle's codes packed by `reference.pack_codes` (the padding codes 0)."""
  x = _awkward_3d(jnp.float32)
  for name, bf in {**FORMATS, **ODD_BLOCKS}.items():
    for axis in ((2,) if bf.two_d else (2, 1)):
      data = jax.jit(ops.quantize_raw, static_argnums=(1, 2))(x, bf, axis)[0]
      a = 2 if bf.two_d else axis
      want = _packed_oracle(x, bf, axis, a)
      assert data.dtype == bf.element_format.storage_dtype == want.dtype, (name, data.dtype)
      assert data.shape[a] == bf.element_format.storage_length(x.shape[a]), (name, data.shape)
      np.testing.assert_array_equal(np.asarray(data).view(np.uint8),
                                    np.asarray(want).view(np.uint8), err_msg=f"{name} {axis}")


_quantize_2x_jit = jax.jit(oracle_layout.quantize_2x, static_argnums=(1,))


@at_every_level
@pytest.mark.parametrize("name", ["nvfp4", "fp8_1x128", "mxfp4", "e4m3_fp32_1x16"])
def test_quantize_2x_equals_the_oracle_both_ways(name):
  """Rowwise and columnwise quantizations of one input in one pass: each equals the
  oracle's along its axis (a batch dim, ragged edges, the awkward rows, the tensor scale)."""
  bf = FORMATS[name]
  for dtype in (jnp.float32, jnp.bfloat16):
    x = _awkward_3d(dtype)
    key = (bf, "2x", x.dtype)
    if key not in _wanted:
      _wanted[key] = [[_u(a) for a in reference.block_quantize(x, bf, axis=axis)[:2]]
                      for axis in (-1, -2)]
    rows, cols, ts = _quantize_2x_jit(x, bf)
    for what, want, got in (("rows", _wanted[key][0], rows), ("columns", _wanted[key][1], cols)):
      for w, g in zip(want, got):
        np.testing.assert_array_equal(_u(g), w, err_msg=f"{bf} {what} {jnp.dtype(dtype).name}")
    assert (ts is None) == (not bf.tensor_scale)


def test_quantize_2x_refuses_what_it_cannot_do():
  with pytest.raises(ValueError, match="serves both orientations"):
    mxjax.quantize_2x(jnp.ones((32, 32)), bfmt.MXFP8_2D)
  with pytest.raises(ValueError, match="rank >= 2"):
    mxjax.quantize_2x(jnp.ones((32,)), bfmt.NVFP4)


def test_quantize_2x_of_blocks_the_kernel_does_not_take():
  """Blocks of 48 (not dividing 512: no one-pass kernel) run the XLA path, both ways."""
  bf = BlockFormat("e4m3", ScaleFormat.FP32, (1, 48))
  x = _awkward((48, 96), jnp.float32)
  (rc, rs), (cc, cs), _ = oracle_layout.quantize_2x(x, bf)
  for (codes, scales), axis in (((rc, rs), -1), ((cc, cs), 0)):
    want = reference.block_quantize(x, bf, axis=axis)[:2]
    np.testing.assert_array_equal(_u(codes), _u(want[0]))
    np.testing.assert_array_equal(_u(scales), _u(want[1]))


RHT_FORMATS = {  # name: (format, the transform's n): runs of 16 (the fast path) and others
    "nvfp4": (bfmt.NVFP4, 16), "mxfp4": (bfmt.mx("e2m1"), 16),
    "mxfp8_16": (bfmt.mx("e4m3", 16), 16), "nvfp4_rht8": (bfmt.NVFP4, 8),
    "e4m3_fp32_1x16_rht2": (BlockFormat("e4m3", ScaleFormat.FP32, (1, 16)), 2),
}


def _rht_xla(x, bf, signs, rand):
  """The plain-XLA path: the transform along axis 1, its tensor scale, the codec."""
  y = hadamard.rht(x, 1, signs)
  ts = codec.tensor_scale(codec.tensor_amax(y), bf) if bf.tensor_scale else None
  return (*codec.quantize(y, bf, 1, rand, ts)[:2], ts)


@at_every_level
@pytest.mark.parametrize("name", sorted(RHT_FORMATS))
def test_the_rht_kernels_equal_the_xla_path(name):
  """mxjax_rht_quantize and mxjax_rht_amax (the transform fused into the column quantize
  and the tensor amax) give the codes, scales and tensor scale of quantizing
  `hadamard.rht(x)` in XLA: bf16 / f16 / f32, a batch dim, widths that end in a partial
  vector, a last block shorter than the others (MXFP4's 32 over 48 rows), runs of NaN, Inf,
  zeros and subnormals (flushed), nearest even and stochastic (bits given, or made in the
  kernel from a counter)."""
  bf, n = RHT_FORMATS[name]
  signs = hadamard.rht_signs(5, "layer", n)
  fused = jax.jit(lambda x, r: ops.quantize_raw(x, bf, 1, r, rht=signs))
  counted = jax.jit(lambda x, seed: ops.quantize_raw(x, bf, 1, stochastic.Counter(seed),
                                                     rht=signs))
  plain = jax.jit(lambda x, r: _rht_xla(x, bf, signs, r))
  for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
    for x in (_awkward_3d(dtype), jnp.swapaxes(_awkward_3d(dtype), 1, 2)):  # [2, 37 | 45, ..]
      x = hadamard.padded(x, 1, 16)
      seed = jnp.asarray([7, 8], jnp.uint32)
      bits = stochastic.random_bits(seed, x.shape)
      for sr, got, rand in (("none", fused(x, None), None), ("bits", fused(x, bits), bits),
                            ("counter", counted(x, seed), bits)):
        for what, g, w in zip(("codes", "scales", "tensor scale"), got, plain(x, rand)):
          if w is not None:
            np.testing.assert_array_equal(bits_of(g), bits_of(w), err_msg=f"{name} {x.shape} "
                                          f"{jnp.dtype(dtype).name} SR {sr}: {what}")


def test_the_rht_needs_whole_runs():
  with pytest.raises(ValueError, match="not a multiple of its 16"):
    ops.quantize_raw(jnp.ones((40, 8)), bfmt.NVFP4, 0, rht=hadamard.rht_signs(0, "a", 16))


@pytest.mark.skipif(not KERNELS, reason="the CPU kernels are not in use (MXJAX_KERNELS)")
@pytest.mark.parametrize("signs, shape, match", [
    (np.ones(3, np.float32), (48, 8), "power of two"),
    (np.full(16, 0.5, np.float32), (48, 8), "[+]1 or -1"),
    (np.ones(16, np.float32), (40, 8), "axis of whole runs"),
    (np.ones(32, np.float32), (64, 8), "1-D blocks of whole runs"),  # runs past NVFP4's 16
])
def test_the_rht_kernels_refuse_what_they_cannot_do(signs, shape, match):
  """Called directly with bad signs or shapes, the kernels answer with what they need."""
  from mxjax._src import extension  # noqa: PLC0415
  extension.load()
  x = jnp.ones(shape, jnp.bfloat16)
  types = tuple(ops._raw(t) for t in ops.quantized_types(shape, bfmt.NVFP4, 0))
  quantize = jax.ffi.ffi_call("mxjax_rht_quantize", types)
  with pytest.raises(Exception, match=match):
    jax.block_until_ready(jax.jit(lambda x: quantize(
        x, np.zeros(1, np.uint32), np.zeros(1, np.uint32), **ops._block_attrs(bfmt.NVFP4, 0),
        stochastic_rounding=False, signs=signs, strides=np.zeros(0, np.int64)))(x))
  amax = jax.ffi.ffi_call("mxjax_rht_amax", jax.ShapeDtypeStruct((1,), jnp.uint32))
  if match in ("power of two", "[+]1 or -1", "axis of whole runs"):
    with pytest.raises(Exception, match=match.replace("axis of whole runs", "whole runs")):
      jax.block_until_ready(jax.jit(lambda x: amax(x, axis=np.int64(0), signs=signs))(x))


@pytest.mark.skipif(not KERNELS, reason="the CPU kernels are not in use (MXJAX_KERNELS)")
def test_the_rht_kernels_run():
  """The transform's kernels where they apply (no f32 copy of R x in the program); where
  the axis is the last, XLA's transform and the block kernels."""
  signs = hadamard.rht_signs(0, "a", 16)
  x = jnp.ones((64, 48), jnp.bfloat16)
  text = jax.jit(lambda x: ops.quantize_raw(x, bfmt.NVFP4, 0, rht=signs)).lower(
      x).compile().as_text()
  assert "mxjax_rht_quantize" in text and "mxjax_rht_amax" in text
  assert "f32[64,48]" not in text
  text = jax.jit(lambda x: ops.quantize_raw(x, bfmt.NVFP4, 1, rht=signs)).lower(
      x).compile().as_text()
  assert "mxjax_rht_quantize" not in text and "mxjax_block_quantize" in text


@pytest.mark.skipif(not KERNELS, reason="the CPU kernels are not in use (MXJAX_KERNELS)")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_the_kernels_run(dtype):
  """The compiled programs call the block kernels (their results are the custom calls'),
  f16 inputs too: widened to f32 (the kernels are compiled for bf16 and f32)."""
  x = jnp.ones((64, 64), dtype)
  rand = jnp.zeros((64, 64), jnp.uint32)
  for bf in (bfmt.NVFP4, bfmt.MXFP8_2D):
    text = jax.jit(lambda x, r, bf=bf: (oracle_layout.quantize(x, bf, -1, r),
                                        oracle_layout.fake_quantize(x, bf, -1))).lower(
                                            x, rand).compile().as_text()
    assert "mxjax_block_quantize" in text and "mxjax_block_fake_quantize" in text
  text = jax.jit(lambda x: oracle_layout.quantize_2x(x, bfmt.NVFP4)).lower(x).compile().as_text()
  assert "mxjax_block_quantize_2x" in text
  if dtype == jnp.float16:
    assert "f32[64,64]{1,0} convert(" in text


def test_under_vmap_the_ops_equal_the_oracle():
  x = _awkward_3d(jnp.float32)
  got = jax.vmap(lambda x: oracle_layout.fake_quantize(x, bfmt.NVFP4, -1)[0])(x)
  want = jnp.stack([reference.block_dequantize(*reference.block_quantize(xi, bfmt.NVFP4),
                                               bfmt.NVFP4, apply_tensor_scale=False)
                    for xi in x])
  np.testing.assert_array_equal(_u(got), _u(want))


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="2-D tiles.*need an array of rank >= 2"):
    mxjax.quantize(jnp.ones((32,)), bfmt.MXFP8_2D)
  with pytest.raises(ValueError, match="axis 2 is out of range"):
    mxjax.quantize(jnp.ones((4, 32)), bfmt.NVFP4, axis=2)
  a = mxjax.quantize(jnp.ones((4, 32)), bfmt.NVFP4)
  with pytest.raises(ValueError, match="needs its tensor scale"):
    mxjax.dequantize(dataclasses.replace(a, tensor_scale=None))
  with pytest.raises(TypeError, match="has no derivative"):
    jax.grad(lambda x: jnp.sum(oracle_layout.fake_quantize(x, bfmt.FP8_1X128)[0]))(jnp.ones((4, 128)))


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")
@pytest.mark.parametrize("name, spec", [("nvfp4", ("d", None)), ("fp8_1x128", (None, "d")),
                                        ("nvfp4_2d", ("d", None))])
def test_sharded_fake_quantize_keeps_its_sharding(name, spec):
  """On an 8-device mesh (Auto and Explicit axes) fake_quantize equals one device's, its
  result keeps the operand's sharding, and where shards hold whole blocks it adds no
  collective besides the tensor
  amax's all-reduce (NVFP4)."""
  bf = FORMATS[name]
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((128, 1024)) * np.exp2(rng.integers(-8, 8, (128, 1024))),
                  jnp.float32)
  rand = stochastic.random_bits(jnp.asarray([1, 2], jnp.uint32), x.shape)
  f = lambda x, r: oracle_layout.fake_quantize(x, bf, -1, r)[0]  # noqa: E731
  want = jax.jit(f)(x, rand)
  for kind in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
    mesh = jax.make_mesh((8,), ("d",), axis_types=(kind,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    xs, rs = jax.device_put(x, sharding), jax.device_put(rand, sharding)
    with jax.set_mesh(mesh):
      got = jax.jit(f)(xs, rs)
      ops = compiled_collectives(f, xs, rs)
    np.testing.assert_array_equal(_u(got), _u(want), err_msg=str(kind))
    assert got.sharding.is_equivalent_to(sharding, 2), (kind, got.sharding)
    assert all(op == "all-reduce" and shape == () for op, shape, _ in ops), (kind, ops)
    assert bool(ops) == bf.tensor_scale, (kind, ops)


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")
def test_sharded_quantize_2x_keeps_its_sharding():
  """Rows sharded over 8 devices, whole blocks on each: the same results as one device,
  the operand's sharding kept, no collective but the tensor amax's all-reduce."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((2, 128, 256)), jnp.bfloat16)
  f = lambda x: oracle_layout.quantize_2x(x, bfmt.NVFP4)  # noqa: E731
  want = jax.jit(f)(x)
  for kind in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
    mesh = jax.make_mesh((8,), ("d",), axis_types=(kind,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "d"))
    xs = jax.device_put(x, sharding)
    with jax.set_mesh(mesh):
      got = jax.jit(f)(xs)
      ops = compiled_collectives(f, xs)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=str(kind))
    assert got[0][0].sharding.is_equivalent_to(sharding, 3), (kind, got[0][0].sharding)
    assert all(op == "all-reduce" and shape == () for op, shape, _ in ops), (kind, ops)


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")
def test_two_d_quantize_on_a_mesh():
  """2-D tiles' quantize and dequantize take a sharded operand whole (Auto and Explicit
  axes) and equal the oracle."""
  x = _awkward((64, 45), jnp.float32)  # 64 rows: 8 per device, half a tile
  want = reference.block_quantize(x, bfmt.NVFP4_2D)
  want_deq = reference.block_dequantize(*want, bfmt.NVFP4_2D)
  for kind in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
    mesh = jax.make_mesh((8,), ("d",), axis_types=(kind,))
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    with jax.set_mesh(mesh):
      got = jax.jit(lambda x: oracle_layout.quantize(x, bfmt.NVFP4_2D))(xs)
      deq = jax.jit(lambda c, s, t: oracle_layout.dequantize(c, s, t, bfmt.NVFP4_2D))(*got)
    for w, g in zip((*want, want_deq), (*got, deq)):
      np.testing.assert_array_equal(_u(g), _u(w), err_msg=str(kind))


_oracle_f32_bits = jax.jit(reference.to_f32_bits)  # one compile a shape, not one an op


def _oracle_amax(x) -> np.uint32:
  """The oracle's amax (`reference.tensor_scale`'s): the largest f32 bits of |x| over x's
  finite elements, 0 for none."""
  mag = np.asarray(_oracle_f32_bits(jnp.asarray(x))).astype(np.uint32) & 0x7FFFFFFF
  return np.uint32(np.max(np.where(mag < 0x7F800000, mag, 0), initial=0))


def _amax_cases():
  """(name, array) pairs: special values, odd shapes, every bf16 / f16 pattern."""
  rng = np.random.default_rng(3)
  cases = []
  for dtype in (np.float32, ml_dtypes.bfloat16, np.float16):
    info = ml_dtypes.finfo(dtype)
    tiny = np.asarray(info.smallest_subnormal, dtype)
    cases += [
        ("empty", np.zeros((0,), dtype)), ("empty 2-D", np.zeros((3, 0), dtype)),
        ("zeros", np.zeros((7,), dtype)), ("-0", np.full((5, 3), -0.0, dtype)),
        ("NaN", np.full((9,), np.nan, dtype)), ("Inf", np.asarray([np.inf, -np.inf], dtype)),
        ("NaN Inf and a value", np.asarray([np.nan, -np.inf, -2.5, np.inf, 1], dtype)),
        ("subnormals", np.asarray([tiny, -3 * tiny, 2 * tiny], dtype)),
        ("max", np.asarray([1, -info.max, 2], dtype)), ("one", np.ones((1,), dtype)),
    ]
    for shape in ((1001,), (3, 5, 7), (3, 70001), (2, 65536, 2)):  # over several threads
      x = (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, shape))).astype(dtype)
      cases.append((f"random {shape}", x))
      x = x.copy().reshape(-1)
      x[-1] = -info.max  # the max last, NaN / Inf first
      x[0], x[1] = np.nan, np.inf
      cases.append((f"max last {shape}", x.reshape(shape)))
  for patterns in (all_bf16_patterns, all_f16_patterns):
    cases.append((patterns.__name__, patterns("sequential")))
  return cases


_AMAX_CASES = _amax_cases()
_tensor_scale_bits = jax.jit(lambda x: jax.lax.bitcast_convert_type(
    ops.tensor_scale(x, bfmt.NVFP4), jnp.uint32))


@at_every_level
def test_tensor_amax_equals_the_oracle():
  """mxjax_tensor_amax (bf16, f16, f32; any shape) equals the oracle's amax bit for bit, and
  the tensor scale made from it the oracle's."""
  amax = jax.jit(ops.tensor_amax)
  for name, x in _AMAX_CASES:
    x = jnp.asarray(x)
    got = amax(x)
    assert got.dtype == jnp.uint32 and got.shape == (), name
    assert np.uint32(got) == _oracle_amax(x), (name, x.dtype, hex(int(got)))
    assert int(_tensor_scale_bits(x)) == int(reference.tensor_scale(x, bfmt.NVFP4)), name


@pytest.mark.skipif(not KERNELS, reason="the CPU kernels are not in use (MXJAX_KERNELS)")
def test_the_amax_kernel_runs():
  """NVFP4's quantize reduces the amax in the kernel; under vmap the amax is per row."""
  x = jnp.ones((64, 64))
  assert "mxjax_tensor_amax" in jax.jit(ops.tensor_amax).lower(x).compile().as_text()
  text = jax.jit(lambda x: mxjax.quantize(x, bfmt.NVFP4)).lower(x).compile().as_text()
  assert "mxjax_tensor_amax" in text
  got = jax.vmap(ops.tensor_amax)(jnp.asarray([[1.0, -3.0], [np.inf, 2.0]]))
  np.testing.assert_array_equal(np.asarray(got), [0x40400000, 0x40000000])


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")
@pytest.mark.parametrize("mesh_shape, spec", [((8,), ("a", None)), ((8,), (None, "a")),
                                              ((2, 4), ("a", "b")), ((2, 4), (("a", "b"),)),
                                              ((2, 4), (None, "b"))])
def test_sharded_tensor_amax(mesh_shape, spec):
  """On a mesh (Auto and Explicit axes) the amax is the max over the shards of each shard's:
  equal to one device's and the oracle's, wherever the largest element (and NaN / Inf)
  lies, with one all-reduce of a scalar and no other collective."""
  rng = np.random.default_rng(4)
  names = ("a", "b")[:len(mesh_shape)]
  for where in ((0, 0), (63, 999), (17, 500)):
    x = rng.standard_normal((64, 1000)).astype(np.float32)
    x[where] = 1e30
    x[(where[0] + 5) % 64, 3] = np.inf
    x[3, (where[1] + 7) % 1000] = np.nan
    x = jnp.asarray(x).astype(jnp.bfloat16)
    want = jax.jit(ops.tensor_amax)(x)
    assert np.uint32(want) == _oracle_amax(x)
    for kind in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
      mesh = jax.make_mesh(mesh_shape, names, axis_types=(kind,) * len(names))
      sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
      xs = jax.device_put(x, sharding)
      with jax.set_mesh(mesh):
        got = jax.jit(ops.tensor_amax)(xs)
        scale = _tensor_scale_bits(xs)
        collectives = compiled_collectives(ops.tensor_amax, xs)
      assert np.uint32(got) == np.uint32(want), (kind, where, hex(int(got)))
      assert int(scale) == int(reference.tensor_scale(x, bfmt.NVFP4)), (kind, where)
      assert len(collectives) == 1 and collectives[0][:2] == ("all-reduce", ()), (
          kind, collectives)


_TRAINING_STEPS = """
import hashlib, jax, jax.numpy as jnp, numpy as np
import mxjax
from mxjax import Float8BlockScaling, NVFP4BlockScaling
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((64, 256)), jnp.bfloat16)
ws = [jnp.asarray(rng.standard_normal((256, 256)) / 16, jnp.float32) for _ in range(2)]
dims = (((1,), (0,)), ((), ()))
digest = hashlib.sha256()
for recipe in (NVFP4BlockScaling(), Float8BlockScaling()):
  def loss(ws, key):
    h = x
    for i, w in enumerate(ws):
      h = jax.nn.gelu(mxjax.dot_general(h, w, dims, recipe=recipe, name=f"l{i}",
                                        rng=jax.random.fold_in(key, i)))
    return jnp.mean(h.astype(jnp.float32) ** 2)
  step = jax.jit(jax.value_and_grad(loss))
  params = ws
  for s in range(3):
    value, grads = step(params, jax.random.key(s))
    params = [w - 0.1 * g for w, g in zip(params, grads)]
    digest.update(np.asarray(value).tobytes())
    for g in grads:
      digest.update(np.asarray(g).tobytes())
print(mxjax.backend_info()["ops"]["quantize"].split(" ")[0], digest.hexdigest())
"""


@pytest.mark.skipif(not KERNELS, reason="the CPU kernels are not in use (MXJAX_KERNELS)")
def test_training_steps_are_the_same_bits_with_and_without_the_kernels(tmp_path):
  """Three steps of NVFP4 (SR, RHT, 2-D weights, tensor scales) and FP8-block training:
  losses and gradients from the kernels and from the plain-XLA path, byte for byte."""
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  from conftest import child_env  # noqa: PLC0415
  out = {}
  for kernels in ("auto", "xla"):
    run = subprocess.run([sys.executable, "-c", _TRAINING_STEPS], capture_output=True,
                         text=True, cwd=tmp_path, env=child_env(MXJAX_KERNELS=kernels),
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out[kernels] = run.stdout.split()
  assert out["auto"][0] == "C++" and out["xla"][0] == "plain", out
  assert out["auto"][-1] == out["xla"][-1], out
