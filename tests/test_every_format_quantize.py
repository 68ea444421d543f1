"""Every format: the public ops (`mxjax.quantize`, `dequantize`, `fake_quantize`,
`quantize_2x`) of every role format of each recipe (x, w, grad), bit for bit against the
oracle (`mxjax.reference.block_quantize` / `block_dequantize`), on the CPU kernels and on
the plain-XLA path, with stochastic rounding given the oracle the same bits where the
recipe rounds gradients stochastically; on zero, -0, subnormal, NaN, Inf and huge blocks
with lengths off every block grid. Test ids are the recipes' case names
(`format_cases`)."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import mxjax
import oracle_layout
from format_cases import RECIPES, assert_bits_equal, every_format, role_formats
from mxjax import reference
from mxjax._src import backend, stochastic

KEY = jax.random.key(42)


def awkward(dtype, seed: int = 0) -> jax.Array:
  """[37, 300] (off the 16, 32 and 128 grids both ways): blocks of zeros, -0, subnormals
  only, a NaN, +-Inf, values near f32 max (huge), and rows over 60 binades."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((37, 300)) * np.exp2(rng.integers(-30, 30, (37, 1)))
  x[0] = 0.0
  x[1] = -0.0
  x[2] = rng.standard_normal(300) * 1e-39  # f32 subnormals (bf16 keeps them too)
  x[3, 5] = np.nan
  x[4, 200] = np.inf
  x[5, 299] = -np.inf
  x[6] = rng.uniform(-1, 1, 300) * 3.0e38  # huge: f32 max is 3.4e38
  x[7, :130] = rng.uniform(-1, 1, 130) * 1e-42  # a subnormal-only stretch in a row
  x = x.astype(np.float32)
  if dtype == jnp.bfloat16:
    x = x.astype(ml_dtypes.bfloat16)
  return jnp.asarray(x)


def finite_wide(seed: int = 1, shape=(37, 300)) -> jax.Array:
  """f32 without specials: a tensor scale (NVFP4) then spans normal data (a huge or
  infinite element would push every other block of the tensor towards zero); exact zeros
  inside blocks of normal data, and a subnormal stretch."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape[:1] + (1,)))
  x[0] = 0.0
  x[9, :20] = 1e-40
  x[rng.random(shape) < 0.05] = 0.0  # zeros among normal values: encoded as zero
  return jnp.asarray(x.astype(np.float32))


def cases(name: str) -> list[tuple[str, object, int, bool]]:
  """(roles, format, axis, stochastic rounding) of every quantization a recipe's product
  makes, each once: x along K (forward) and M (wgrad), w along K and N (2-D tiles: one
  tiling), the gradient along N (dgrad) and M (wgrad), stochastically where the recipe
  says so."""
  recipe = RECIPES[name]
  fmts, sr = role_formats(recipe), recipe.roles().stochastic_rounding
  out: dict = {}
  for role, axes in (("x", (1, 0)), ("w", (0, 1)), ("grad", (1, 0))):
    fmt = fmts[role]
    for axis in (axes[:1] if fmt.two_d else axes):
      key = (fmt, 1 if fmt.two_d else axis, sr and role == "grad")
      out[key] = f"{out[key]}+{role}" if key in out else role
  return [(roles, *key) for key, roles in out.items()]


@contextlib.contextmanager
def kernels(mode: str):
  """The ops on the CPU kernels ("auto") or on the plain-XLA path ("xla")."""
  before = backend.get_kernels()
  mxjax.set_kernels(mode)
  try:
    yield
  finally:
    mxjax.set_kernels(before)


MODES = ("auto", "xla")


def _oracle(x, fmt, axis, rand):
  codes, scales, ts = reference.block_quantize(x, fmt, axis=axis, rand=rand)
  return codes, scales, ts, reference.block_dequantize(codes, scales, ts, fmt, axis=axis)


@every_format
def test_quantize_dequantize_fake_quantize_equal_the_oracle(name):
  """All three inputs have one shape, so each op compiles once per format and axis."""
  inputs = {"f32": awkward(jnp.float32), "finite": finite_wide(),
            "bf16": awkward(jnp.bfloat16, 1)}
  for role, fmt, axis, sr in cases(name):
    rng = KEY if sr else None
    for what, x in inputs.items():
      if what == "bf16" and "x" not in role:  # bf16 inputs: once per format (activations)
        continue
      rand = stochastic.random_bits(stochastic.seed_of(KEY), x.shape) if sr else None
      want_codes, want_scales, want_ts, want_f32 = _oracle(x, fmt, axis, rand)
      want_bf16 = reference.from_f32_bits(jax.lax.bitcast_convert_type(want_f32, jnp.uint32),
                                          jnp.bfloat16)
      for mode in MODES:
        where = f"{name} {role} {fmt} axis {axis} SR {sr} {what} ({mode})"
        with kernels(mode):
          a = mxjax.quantize(x, fmt, axis=axis, rng=rng)
          assert a.format == fmt and a.shape == x.shape and a.dtype == x.dtype
          codes, scales, ts = oracle_layout.to_oracle(a.data, a.scales, a.tensor_scale, fmt,
                                                      x.shape, axis)
          np.testing.assert_array_equal(codes, want_codes, err_msg=f"{where}: codes")
          np.testing.assert_array_equal(scales, want_scales, err_msg=f"{where}: scales")
          assert (ts is None) == (want_ts is None) == (not fmt.tensor_scale), where
          if ts is not None:
            assert int(ts) == int(want_ts), f"{where}: tensor scale"
          assert_bits_equal(mxjax.dequantize(a), want_f32, f"{where}: dequantize f32")
          assert_bits_equal(a.dequantize(jnp.bfloat16), want_bf16, f"{where}: dequantize bf16")
          # fake_quantize: the dequantized values in x's dtype (the tensor scale applied)
          want_fake = want_f32 if x.dtype == jnp.float32 else want_bf16
          assert_bits_equal(mxjax.fake_quantize(x, fmt, axis=axis, rng=rng), want_fake,
                            f"{where}: fake_quantize")
    # the special blocks did what the rules say (so the data exercised them)
    deq = np.asarray(mxjax.dequantize(mxjax.quantize(inputs["f32"], fmt, axis=axis, rng=rng)))
    assert np.isnan(deq[3, 5]) and np.isnan(deq[4, 200]) and np.isnan(deq[5, 299])
    if not fmt.two_d and axis % 2 == 1:  # rowwise: the zero and -0 rows stay so
      assert (deq[0] == 0).all() and (deq[1] == 0).all() and np.signbit(deq[1]).all()


@every_format
def test_quantize_2x_equals_two_oracle_quantizations(name):
  """Rowwise and columnwise from the high-precision input in one call (1-D blocks); a 2-D
  tile format is refused with the reason (one tiling serves both orientations)."""
  x = finite_wide(2)
  for role, fmt in role_formats(RECIPES[name]).items():
    if fmt.two_d:
      with pytest.raises(ValueError, match="2-D tiles, whose one quantization serves both "
                                           "orientations; use mxjax.quantize"):
        mxjax.quantize_2x(x, fmt)
      continue
    for mode in MODES:
      with kernels(mode):
        rows, cols = mxjax.quantize_2x(x, fmt)
        for a, axis in ((rows, -1), (cols, 0)):
          where = f"{name} {role} axis {axis} ({mode})"
          want = _oracle(x, fmt, axis, None)
          got = oracle_layout.to_oracle(a.data, a.scales, a.tensor_scale, fmt, x.shape, axis)
          for g, w, what in zip(got, want, ("codes", "scales", "tensor scale")):
            if w is not None:
              np.testing.assert_array_equal(g, w, err_msg=f"{where}: {what}")
          assert_bits_equal(a.dequantize(), want[3], f"{where}: dequantize")


@every_format
def test_storage_is_packed_at_the_formats_size(name):
  """Codes packed (FP4: two per byte), one scale per block in the scale format's bytes,
  so an MXArray's bytes are the format's bytes per element (plus 4 B of tensor scale)."""
  x = finite_wide(3, (40, 128))
  for role, fmt in role_formats(RECIPES[name]).items():
    a = mxjax.quantize(x, fmt, axis=-1)
    bits = fmt.element_format.bits
    rows, cols = fmt.block
    n_blocks = -(-40 // rows) * -(-128 // cols)
    want = 40 * 128 * bits // 8 + n_blocks * fmt.scale.bytes + 4 * fmt.tensor_scale
    assert a.nbytes == want, (name, role, fmt, a.nbytes, want)
