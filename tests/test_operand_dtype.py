"""The MX product's CPU operand dtype: chosen from the CPU's flags, overridable, and the
product equals the oracle's with either dtype."""

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
