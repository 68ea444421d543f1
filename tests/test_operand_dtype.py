"""The MX product's CPU operand dtype: chosen from the CPU's flags, overridable, and the
product equals the oracle's with either dtype."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mxjax
from mxjax._src import operand_dtype
from test_dot import assert_f32_close, oracle_fake

FLAGS_LINE = "flags\t\t: fpu sse2 avx2 fma {extra}\n"


@pytest.fixture
def fresh_choice(monkeypatch):
  """Clears the cached choice before and after the test (it is read at trace time)."""
  operand_dtype.cpu_operand_dtype.cache_clear()
  monkeypatch.delenv("MXJAX_CPU_OPERAND_DTYPE", raising=False)
  yield monkeypatch
  operand_dtype.cpu_operand_dtype.cache_clear()
  jax.clear_caches()


@pytest.mark.parametrize("extra, expected", [("", jnp.float32), ("avx512_bf16", jnp.bfloat16),
                                             ("amx_bf16 amx_tile", jnp.bfloat16)])
def test_choice_follows_the_cpu_flags(tmp_path, fresh_choice, extra, expected):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\n" + FLAGS_LINE.format(extra=extra))
  flags = operand_dtype.cpu_flags(str(cpuinfo))
  assert "avx2" in flags and "processor" not in flags
  fresh_choice.setattr(operand_dtype, "cpu_flags", lambda: flags)
  assert operand_dtype.cpu_operand_dtype() == expected


def test_no_cpuinfo_means_no_flags(tmp_path):
  assert operand_dtype.cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_bad_override_is_named(fresh_choice):
  fresh_choice.setenv("MXJAX_CPU_OPERAND_DTYPE", "float16")
  with pytest.raises(ValueError, match="MXJAX_CPU_OPERAND_DTYPE.*float16"):
    operand_dtype.cpu_operand_dtype()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_product_uses_the_chosen_dtype_and_equals_the_oracle(fresh_choice, dtype):
  fresh_choice.setenv("MXJAX_CPU_OPERAND_DTYPE", dtype)
  kl, kr = jax.random.split(jax.random.key(3))
  lhs = jax.random.normal(kl, (64, 96), jnp.float32)
  rhs = jax.random.normal(kr, (96, 48), jnp.float32)
  fn = jax.jit(lambda a, b: mxjax.matmul(a, b, fwd_format="e4m3"))
  hlo = fn.lower(lhs, rhs).compile().as_text()
  dot_operands = [line for line in hlo.splitlines() if " dot(" in line]
  assert dot_operands, hlo
  short = {"bfloat16": "bf16", "float32": "f32"}
  fusion = hlo.split(" dot(")[0].rsplit("%fused", 1)[-1]  # the computation holding the dot
  assert f"param_0: {short[dtype]}[" in fusion and f"param_1: {short[dtype]}[" in fusion
  ql, qr = oracle_fake(lhs, "e4m3", (1,)), oracle_fake(rhs, "e4m3", (0,))
  dims = (((1,), (0,)), ((), ()))
  expected = lax.dot_general(ql, qr, dims, precision=lax.Precision.HIGHEST)
  assert_f32_close(fn(lhs, rhs), expected, jnp.abs(ql), jnp.abs(qr), dims)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("x_batched", [False, True])
def test_vmapped_weights_gradients_equal_each_members(fresh_choice, dtype, x_batched):
  """An ensemble (weights vmapped, inputs shared or not): every product of the backward
  runs, eagerly and under jit, and each member's gradients are its own. With bf16 operands
  XLA's CPU rejected the vmapped backward's dots ("Unsupported element type for
  DotThunk::Execute: BF16 x BF16 = F32") until the product took canonical operands."""
  fresh_choice.setenv("MXJAX_CPU_OPERAND_DTYPE", dtype)
  kx, kw = jax.random.split(jax.random.key(5))
  x = jax.random.normal(kx, (3, 40, 64) if x_batched else (40, 64), jnp.float32)
  w = jax.random.normal(kw, (3, 64, 96), jnp.float32)
  loss = lambda x, w: jnp.sum(mxjax.matmul(x, w) ** 2)
  grad = jax.value_and_grad(loss, (0, 1))
  in_axes = (0 if x_batched else None, 0)
  for fn in (jax.vmap(grad, in_axes), jax.jit(jax.vmap(grad, in_axes))):
    vals, (gx, gw) = jax.block_until_ready(fn(x, w))
    for i in range(3):
      v, (ex, ew) = grad(x[i] if x_batched else x, w[i])
      np.testing.assert_allclose(vals[i], v, rtol=1e-6)
      np.testing.assert_allclose(gx[i], ex, rtol=1e-6, atol=1e-5)
      np.testing.assert_allclose(gw[i], ew, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "fp8_1x128"])
def test_an_mxarray_along_its_rows_transposes_as_its_codes(fmt):
  """`product._transposed` of an array quantized along its second to last axis (a batch
  dim, 40 rows: ragged blocks and packing groups) dequantizes to the transpose of its
  values: FP4 and FP6 codes are packed along that axis as rows pack theirs."""
  from mxjax._src import formats, ops, product
  bf = {"nvfp4": formats.NVFP4, "mxfp4": formats.mx("e2m1"), "mxfp6_e2m3": formats.mx("e2m3"),
        "mxfp8_e4m3": formats.mx("e4m3"), "fp8_1x128": formats.FP8_1X128}[fmt]
  x = jax.random.normal(jax.random.key(0), (2, 40, 24), jnp.float32)
  a = ops.as_mxarray(*ops.quantize_raw(x, bf, 1), bf, 1, x)
  t = product._transposed(a)
  assert t.shape == (2, 24, 40) and t.axis == 2
  want = jnp.swapaxes(ops.dequantize_raw(a, jnp.float32), 1, 2)
  np.testing.assert_array_equal(np.asarray(ops.dequantize_raw(t, jnp.float32)),
                                np.asarray(want))


def _dot_operand_types(hlo: str) -> list[str]:
  """The element type of each dot's operands in compiled HLO (inside fusions too), as
  "bf16" or "f32" where the two agree."""
  defined = dict(re.findall(r"(%[\w.-]+) = (\w+)\[", hlo))
  types = []
  for a, b in re.findall(r" dot\((%[\w.-]+), (%[\w.-]+)\)", hlo):
    types.append(defined[a] if defined[a] == defined[b] else f"{defined[a]} x {defined[b]}")
  return types


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "fp8_block"])
def test_every_gemm_of_a_training_product_takes_bf16_operands(fresh_choice, recipe):
  """With bf16 operands the forward, dgrad and wgrad GEMMs all take them: the wgrad's lhs
  (quantized along M) comes as its transposed codes, since XLA's CPU dot converts an lhs
  contracting its first dim to f32 (at twice the cost). The gradients equal those with
  f32 operands to f32 accumulation order."""
  r = {"mxfp8": mxjax.MXFP8BlockScaling(), "fp8_block": mxjax.Float8BlockScaling(),
       "nvfp4": mxjax.NVFP4BlockScaling(disable_stochastic_rounding=True)}[recipe]
  kx, kw, kg = jax.random.split(jax.random.key(7), 3)
  x = jax.random.normal(kx, (256, 128), jnp.bfloat16)
  w = jax.random.normal(kw, (128, 64), jnp.bfloat16)
  g = jax.random.normal(kg, (256, 64), jnp.bfloat16)

  def grads(x, w):
    f = mxjax.quantized(lambda x, w: x @ w)
    with mxjax.autocast(recipe=r):
      _, vjp = jax.vjp(f, x, w)
    return vjp(g)

  results = {}
  for dtype in ("float32", "bfloat16"):
    fresh_choice.setenv("MXJAX_CPU_OPERAND_DTYPE", dtype)
    operand_dtype.cpu_operand_dtype.cache_clear()
    jax.clear_caches()
    fn = jax.jit(grads)
    types = _dot_operand_types(fn.lower(x, w).compile().as_text())
    short = {"bfloat16": "bf16", "float32": "f32"}[dtype]
    assert len(types) == 2 and all(t == short for t in types), types  # dgrad, wgrad
    results[dtype] = fn(x, w)
  for got, want in zip(results["bfloat16"], results["float32"]):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2 ** -7 * np.abs(want).max())
