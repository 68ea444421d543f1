"""Block-scaled formats: the oracle against hand-worked spec values, the plain-XLA path
against the oracle bit for bit, stochastic rounding, the random Hadamard transform."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mxjax import reference
from mxjax._src import formats as bfmt, hadamard, stochastic
import oracle_layout
from mxjax._src.formats import BlockFormat, ScaleFormat

E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)


def _bits(a):
  return np.asarray(a).view(np.uint32)


def test_byte_costs():
  assert bfmt.NVFP4.bytes_per_element() == 0.5 + 1 / 16
  assert bfmt.NVFP4_2D.bytes_per_element() == 0.5 + 1 / 256
  assert bfmt.FP8_1X128.bytes_per_element() == 1 + 4 / 128
  assert bfmt.FP8_128X128.bytes_per_element() == 1 + 4 / 128 ** 2
  assert bfmt.MXFP8_2D.bytes_per_element() == 1 + 1 / 1024
  assert bfmt.mx("e2m1").bytes_per_element() == 0.5 + 1 / 32


def test_nvfp4_oracle_matches_te_scale_math():
  """TE: S = 6 * 448 / amax_tensor; block scale e4m3(amax_b / 6 * S); x * S / s -> E2M1."""
  x = np.zeros((2, 16), np.float32)
  x[0, :4] = [3.0, 1.0, -0.74, 0.2]  # tensor amax 3: S = 896, block scale 3/6*896 = 448
  x[1, :3] = [0.3, 0.1, -0.05]  # block scale 0.05*896 = 44.8 -> e4m3 44 (RNE: grid step 4)
  codes, scales, ts = reference.block_quantize(jnp.asarray(x), bfmt.NVFP4)
  assert np.float32(np.asarray(ts).view(np.float32)) == np.float32(896.0)
  e4m3 = np.asarray(jax.lax.bitcast_convert_type(scales, jnp.float8_e4m3fn).astype(jnp.float32))
  np.testing.assert_array_equal(e4m3, [[448.0], [44.0]])
  y = np.asarray(reference.block_dequantize(codes, scales, ts, bfmt.NVFP4))
  # Row 0: x * 896 / 448 = 2x -> [6, 2, -1.48 -> -1.5, 0.4 -> 0.5]; decoded / 2.
  np.testing.assert_array_equal(y[0, :4], [3.0, 1.0, -0.75, 0.25])
  # Row 1: m = f32(896 / 44); x * m rounded to the E2M1 grid; decoded * 44 / 896.
  m = np.float32(896.0) / np.float32(44.0)
  want = []
  for v in x[1, :3]:
    a = abs(np.float32(v) * m)
    q = E2M1_GRID[np.argmin(np.abs(E2M1_GRID - a))]
    want.append(np.float32(np.sign(v) * np.float32(q * 44.0) / np.float32(896.0)))
  np.testing.assert_array_equal(y[1, :3], want)


def test_fp8_block_pow2_oracle():
  """Power-of-two FP32 scales: m = 2**floor(log2(448 / amax)), stored 1/m."""
  x = np.zeros((1, 200), np.float32)
  x[0, 0], x[0, 1], x[0, 130] = 3.0, 1.1, 0.001
  codes, scales, _ = reference.block_quantize(jnp.asarray(x), bfmt.FP8_1X128)
  d = np.asarray(scales).view(np.float32)
  np.testing.assert_array_equal(d, [[1 / 128, 2.0 ** -18]])  # 448/3 -> 128; 448/0.001 -> 2**18
  y = np.asarray(reference.block_dequantize(codes, scales, None, bfmt.FP8_1X128))
  assert y[0, 0] == 3.0 and y[0, 1] == np.float32(ml_e4m3(1.1 * 128) / 128)


def ml_e4m3(v):
  return float(jnp.asarray(v, jnp.float32).astype(jnp.float8_e4m3fn).astype(jnp.float32))


def _awkward(shape, dtype, seed=0):
  """Random magnitudes over 60 binades, a zero row, NaN / Inf / subnormal blocks, -0."""
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))).astype(np.float32)
  x[0] = 0.0
  x[1, :5] = [np.nan, 1.0, -2.0, 3.0, 0.0]
  x[2, :3] = [np.inf, 1e-40, -1e-42]
  x[3] = rng.standard_normal(shape[1]) * 1e-39
  x[4] = -0.0
  x[5, -1] = -np.inf
  return jnp.asarray(x).astype(dtype)


CASES = (  # (format, axis, stochastic rounding)
    (bfmt.NVFP4, -1, False), (bfmt.NVFP4, 0, True), (bfmt.NVFP4_2D, -1, True),
    (bfmt.FP8_1X128, 0, False), (BlockFormat("e4m3", "fp32", (1, 16)), -1, True),
    (BlockFormat("e5m2", ScaleFormat.FP32, (32, 32)), -1, False),
)


def _all(quantize, dequantize, x, rand):
  out = []
  for bf, axis, sr in CASES:
    q = quantize(x, bf, axis, rand if sr else None)
    out.append(q)
    out.append(dequantize(*q, bf, axis))
  return out


def test_xla_path_equals_oracle():
  """Zero / subnormal / Inf / NaN blocks, ragged edges (37 x 45), 2-D tiles, tensor scale
  and stochastic rounding given its bits, f32 and bf16 inputs: bit for bit."""
  x = jnp.concatenate([_awkward((37, 45), jnp.float32),
                       _awkward((37, 45), jnp.bfloat16, 1).astype(jnp.float32)])
  rand = stochastic.random_bits(jnp.asarray([1, 2], jnp.uint32), x.shape)
  oracle = jax.jit(lambda x, r: _all(
      lambda x, bf, a, r: reference.block_quantize(x, bf, axis=a, rand=r),
      lambda c, s, t, bf, a: reference.block_dequantize(c, s, t, bf, axis=a), x, r))(x, rand)
  xla = jax.jit(lambda x, r: _all(oracle_layout.codec_quantize, oracle_layout.codec_dequantize, x, r))(x, rand)
  for want, got in zip(jax.tree.leaves(oracle), jax.tree.leaves(xla)):
    np.testing.assert_array_equal(_bits(got) if got.dtype == jnp.float32 else got,
                                  _bits(want) if want.dtype == jnp.float32 else want)
  # The special blocks: NaN scale and NaN values; zero blocks stay zero.
  codes, scales, ts = oracle[0]
  deq = np.asarray(oracle[1])
  assert np.isnan(deq[1, :16]).all() and np.isnan(deq[2, :16]).all()
  assert (deq[0] == 0).all() and not np.isnan(deq[6:37]).any()
  assert np.asarray(scales)[1, 0] == 0x7F


def test_stochastic_rounding_is_unbiased():
  """The mean of 4096 draws is within 5 standard errors of x, for every element."""
  x = jnp.asarray(np.linspace(-5.9, 5.9, 64, dtype=np.float32).reshape(4, 16))
  bf = bfmt.mx("e2m1", 16)

  def draw(seed):
    r = stochastic.random_bits(jnp.stack([seed, seed * 7 + 1]), x.shape)
    c, s, _ = oracle_layout.codec_quantize(x, bf, -1, r)
    return oracle_layout.codec_dequantize(c, s, None, bf, -1)

  draws = np.asarray(jax.jit(jax.vmap(draw))(jnp.arange(4096, dtype=jnp.uint32)))
  mean = draws.mean(0)
  lo = np.asarray(draw(jnp.uint32(0)))  # every draw is one of the two neighbours
  step = np.maximum(np.abs(draws - lo).max(0), 1e-6)
  bound = 5 * step * 0.5 / np.sqrt(4096)
  amax_row = np.abs(np.asarray(x)).max(1, keepdims=True)
  assert (np.abs(mean - np.asarray(x)) <= bound + 1e-6 * amax_row).all()
  assert np.ptp(draws, axis=0).max() > 0  # it is stochastic
  # Round to nearest is biased on the same data.
  rtn = np.asarray(oracle_layout.codec_dequantize(*oracle_layout.codec_quantize(x, bf, -1), bf, -1))
  assert np.abs(rtn - np.asarray(x)).max() > bound.max()


def test_random_bits_same_on_one_device_and_a_mesh():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  mesh = jax.make_mesh((2, 4), ("a", "b"))
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("a", "b"))
  seed = jnp.asarray([5, 9], jnp.uint32)
  one = jax.jit(lambda s: stochastic.random_bits(s, (16, 24)))(seed)
  sharded = jax.jit(lambda s: stochastic.random_bits(s, (16, 24)), out_shardings=spec)(seed)
  assert len(sharded.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(one), np.asarray(sharded))
  assert len(np.unique(np.asarray(one))) == one.size  # distinct per element


def test_rht_cancels_along_the_contraction():
  """Both operands transformed along M: the product is unchanged (exact on integers);
  applying the transform twice with its transpose is the identity."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.integers(-8, 8, (40, 24)).astype(np.float32))
  g = jnp.asarray(rng.integers(-8, 8, (40, 8)).astype(np.float32))
  signs = hadamard.rht_signs(3, "layer", 16)
  rx, rg = hadamard.rht(x, 0, signs), hadamard.rht(g, 0, signs)
  assert rx.shape == (48, 24)  # padded to a multiple of 16
  np.testing.assert_array_equal(np.asarray(rx.T @ rg), np.asarray(x.T @ g))
  assert not np.array_equal(np.asarray(rx[:40]), np.asarray(x))
  h = hadamard.hadamard(16)
  assert (h @ h.T == 16 * np.eye(16)).all()


def _flush(v: np.ndarray) -> np.ndarray:
  """f32 subnormals as zeros of their sign."""
  return np.where(np.abs(v) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), v), v)


def _butterfly(runs: np.ndarray, signs: np.ndarray) -> np.ndarray:
  """The transform's definition in numpy f32 (IEEE, flushed by hand): [k, n] runs with
  their signs, the stages h = 1, 2, ..., n / 2 (i, i + h -> sum, difference), then the
  factor f32(1 / sqrt(n)), every result flushed."""
  v = _flush(runs.astype(np.float32) * signs.astype(np.float32))
  n = v.shape[1]
  h = 1
  with np.errstate(over="ignore", invalid="ignore"):  # sums of f32's max; Inf - Inf
    while h < n:
      for i in range(n):
        if not i & h:
          a, b = v[:, i].copy(), v[:, i + h].copy()
          v[:, i], v[:, i + h] = _flush(a + b), _flush(a - b)
      h *= 2
  return _flush(v * np.float32(1 / np.sqrt(n)))


@pytest.mark.parametrize("n", [2, 16, 64])
def test_rht_is_the_butterfly_in_f32_with_subnormals_flushed(n):
  """`hadamard.rht` in XLA gives the bits of the butterfly written out in numpy: random
  runs over 60 binades (sums that round), runs of subnormals and of values whose sums
  fall below 2^-126, of f32's max (sums that overflow), of +-0, one NaN or one Inf."""
  rng = np.random.default_rng(n)
  k = 64
  x = (rng.standard_normal((k, n)) * np.exp2(rng.integers(-30, 30, (k, n)))).astype(np.float32)
  tiny = np.finfo(np.float32).tiny
  x[0] = rng.uniform(-1, 1, n) * tiny  # subnormals: flushed on the way in
  x[1] = tiny * (1 + rng.integers(0, 4, n) / 8) * rng.choice([-1, 1], n)  # tiny differences
  x[2] = np.finfo(np.float32).max
  x[3] = -0.0
  x[4, n // 2], x[5, 0] = np.nan, -np.inf
  x[6] = 0.0
  signs = hadamard.rht_signs(9, "w", n)
  got = np.asarray(jax.jit(lambda a: hadamard.rht(a, 1, signs))(jnp.asarray(x)))
  want = _butterfly(x, signs)
  np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(want)],
                                want.view(np.uint32)[~np.isnan(want)])
  assert np.isnan(got[np.isnan(want)]).all() and np.isnan(want[4]).all()
  assert not np.isfinite(want[2]).all() and (want[0] == 0).all()
  h = hadamard.hadamard(n) * signs[None, :] / np.sqrt(n)  # the matrix it multiplies by
  np.testing.assert_allclose(got[7:], x[7:].astype(np.float64) @ h.T, rtol=1e-6,
                             atol=1e-6 * np.abs(x[7:]).max())


@pytest.mark.parametrize("fmt", [bfmt.NVFP4, bfmt.mx("e4m3", 16)], ids=["nvfp4", "mxfp8_16"])
@pytest.mark.parametrize("sr", [False, True], ids=["nearest", "sr"])
def test_the_products_rht_quantized_equals_quantizing_the_transform(fmt, sr):
  """The product's q(R x, M) (the transform fused into the quantize where the kernels
  are in use): the bytes, scales, tensor scale and SR bits of quantizing `rht(x)` along M
  (batch dims, M padded from 40 to 48, bf16 and f32)."""
  from mxjax._src import ops, product

  signs = hadamard.rht_signs(1, "layer", 16)
  seed = jnp.asarray([3, 4], jnp.uint32) if sr else None
  rng = np.random.default_rng(2)
  for shape, dtype in (((40, 24), jnp.float32), ((2, 64, 40), jnp.bfloat16)):
    x = jnp.asarray(rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape)), dtype)

    def moved(x):
      y = hadamard.rht(x, -2, signs)
      bits = stochastic.random_bits(stochastic.stream(seed, 1), y.shape) if sr else None
      return ops.quantize_raw(y, fmt, y.ndim - 2, bits)

    got = jax.jit(lambda x: product._rht_quantized(x, fmt, seed, signs=signs))(x)
    want = jax.jit(moved)(x)
    assert got.length == -(-shape[-2] // 16) * 16
    for a, b in zip((got.data, got.scales, got.tensor_scale), want):
      if b is not None:
        np.testing.assert_array_equal(np.atleast_1d(a).view(np.uint8), np.atleast_1d(b).view(np.uint8))


def test_rht_reduces_error_of_a_heavy_tailed_operand():
  """Outliers along M: the quantized wgrad product's error drops with the transform."""
  rng = np.random.default_rng(1)
  x = rng.standard_t(2, (256, 64)).astype(np.float32)
  x[rng.integers(0, 256, 20), rng.integers(0, 64, 20)] *= 50  # outliers
  g = rng.standard_normal((256, 32)).astype(np.float32)
  exact = x.astype(np.float64).T @ g
  signs = hadamard.rht_signs(0, "w", 16)
  errors = {}
  for bf in (bfmt.mx("e2m1"),):  # NVFP4's 1x16 E4M3 blocks: no gain measured (0.113 -> 0.117)
    for rht in (False, True):
      a, b = jnp.asarray(x), jnp.asarray(g)
      if rht:
        a, b = hadamard.rht(a, 0, signs), hadamard.rht(b, 0, signs)
      fq = jax.jit(oracle_layout.fake_quantize, static_argnums=(1, 2))
      qa, sa = fq(a, bf, 0)
      qb, sb = fq(b, bf, 0)
      prod = np.asarray(qa, np.float64).T @ np.asarray(qb, np.float64)
      prod *= float(sa if sa is not None else 1) * float(sb if sb is not None else 1)
      errors[str(bf), rht] = np.linalg.norm(prod - exact) / np.linalg.norm(exact)
  assert errors[str(bf), True] < 0.85 * errors[str(bf), False], errors  # 0.209 -> 0.167
