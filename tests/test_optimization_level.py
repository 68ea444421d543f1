"""The suite compiles XLA's CPU programs at backend optimization level 0 with XLA's older
CPU emitters (conftest.py); the library's quantization gives the same bits with XLA's
defaults (level 3, the fusion emitters). Checked on the plain-XLA path and on the kernels'
path: quantize, quantize_2x, dequantize and fake_quantize of each format family on every
bf16 pattern and special blocks (stochastic rounding, the tensor scale, 2-D tiles). (XLA's
own f32 GEMMs and sums may round apart between the two, as they do between shardings:
tests compare those within tolerances.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from conftest import all_bf16_patterns, bits_of, special_blocks
from mxjax._src import backend

XLA_DEFAULTS = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}
FORMATS = (mxjax.mx("e4m3"), mxjax.mx("e3m2", scale_mode="floor"), mxjax.nvfp4(),
           mxjax.nvfp4(two_d=True), mxjax.fp8_block(pow2=False))


def _as_tested_and_by_default(fn, *args):
  """fn's jitted results as this process compiles and with XLA's defaults, as bits. The
  compiler options are part of the compile cache's key: two compiles."""
  return [[bits_of(a) for a in jax.tree.leaves(jax.jit(fn, **options)(*args))]
          for options in ({}, {"compiler_options": XLA_DEFAULTS})]


def _ops(x, key):
  out = []
  for fmt in FORMATS:
    axes = (-1,) if fmt.two_d else (-1, 0)
    for axis in axes:
      for rng in (None, key):
        a = mxjax.quantize(x, fmt, axis=axis, rng=rng)
        out += [a.data, a.scales, a.dequantize(jnp.bfloat16), a.dequantize(jnp.float32)]
      out.append(mxjax.fake_quantize(x, fmt, axis=axis, dtype=jnp.float32))
    if not fmt.two_d:
      out += [t for a in mxjax.quantize_2x(x, fmt) for t in (a.data, a.scales)]
  return out


@pytest.fixture(params=["xla", "auto"])
def kernels(request):
  before = backend.get_kernels()
  backend.set_kernels(request.param)
  yield request.param
  backend.set_kernels(before)


def test_the_ops_give_the_same_bits_as_tested_and_by_default(kernels):
  x = np.concatenate([all_bf16_patterns(), all_bf16_patterns("strided")]).reshape(512, 256)
  x = np.concatenate([x.astype(np.float32), special_blocks(np.float32, 256)[:64]])  # f32
  as_tested, by_default = _as_tested_and_by_default(_ops, jnp.asarray(x), jax.random.key(5))
  assert len(as_tested) == len(by_default) > 50
  for i, (a, b) in enumerate(zip(as_tested, by_default)):
    np.testing.assert_array_equal(a, b, err_msg=f"result {i}")
