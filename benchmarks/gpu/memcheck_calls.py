"""One call of every CUDA path on small odd shapes, for compute-sanitizer memcheck:

  MXJAX_KERNELS=ffi compute-sanitizer --tool memcheck python3 benchmarks/gpu/memcheck_calls.py

quantize / quantize_2x / dequantize / fake_quantize of MX (FP8, FP6, FP4) and of the block
formats (NVFP4 1x16 and 16x16 with the tensor amax, FP8 1x128 and 128x128, stochastic
rounding), and the FP8-block GEMM where this GPU has it. Prints what ran.
"""

import jax
import jax.numpy as jnp
import numpy as np

import mxjax
from mxjax._src import fp8_block_gemm

GPU = jax.devices("gpu")[0]
rng = np.random.default_rng(0)
ran = []
for dtype in (jnp.bfloat16, jnp.float32):
  for shape in ((7, 100), (130, 33), (3, 33, 48), (6, 128)):
    x = jax.device_put(jnp.asarray(rng.standard_normal(shape), dtype), GPU)
    for fmt in ("e4m3", "e3m2", "e2m1"):
      for axis in (-1, 0):
        a = mxjax.quantize(x, fmt, axis=axis)
        jax.block_until_ready((a.dequantize(dtype), mxjax.fake_quantize(x, fmt, axis=axis)))
      jax.block_until_ready(mxjax.quantize_2x(x, fmt))
    for bf in (mxjax.nvfp4(), mxjax.nvfp4(two_d=True), mxjax.fp8_block(),
               mxjax.fp8_block(two_d=True), mxjax.mx("e2m1", two_d=True)):
      a = mxjax.quantize(x, bf, axis=-1, rng=jax.random.key(1))
      jax.block_until_ready((a.dequantize(dtype), mxjax.fake_quantize(x, bf)))
      if not bf.two_d:
        jax.block_until_ready(mxjax.quantize_2x(x, bf))
    ran.append(f"{jnp.dtype(dtype).name}{shape}")
if fp8_block_gemm.available(GPU):
  a = mxjax.quantize(jax.device_put(jnp.asarray(rng.standard_normal((64, 400)), jnp.bfloat16), GPU),
                     mxjax.fp8_block())
  for two_d in (False, True):
    b = mxjax.quantize(jax.device_put(jnp.asarray(rng.standard_normal((136, 400)), jnp.bfloat16),
                                      GPU), mxjax.fp8_block(two_d=two_d))
    jax.block_until_ready(fp8_block_gemm.fp8_block_gemm(
        a.data, a.scales, b.data, b.scales, b_block=128 if two_d else 1))
  ran.append("fp8_block_gemm")
print("memcheck calls ran:", ", ".join(ran))
