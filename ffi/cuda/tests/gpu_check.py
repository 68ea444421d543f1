"""GPU check of the CUDA handlers, for a machine with an NVIDIA GPU and a CUDA jaxlib.

  python ffi/cuda/tests/gpu_check.py [--shard I/N]

--shard I/N runs the I-th of N interleaved slices of the quantize and fake_quantize cases
(the swizzle and GEMM checks in slice 0): N processes in parallel cover them all, N times
faster (the time is XLA compiling each case on both devices).

1. mxjax_quantize / _2x / _dequantize on "CUDA" equal the CPU handlers byte for byte (the
   CPU kernels are checked against the oracle by tests/test_quantize_exact.py), on every
   bf16 bit pattern and on random data of odd shapes, every format / mode / block / dtype;
   mxjax_fake_quantize on "CUDA" (called directly: mxjax.fake_quantize runs two kernels on
   GPUs until the lead switches it) equals the CPU's fused kernel, every input and output
   dtype, along the last axis and along a strided one.
2. mxjax_swizzle_scales equals the 128x4 layout written in numpy.
3. mxjax_mx_gemm (Blackwell only; elsewhere it must fail with "compute capability"):
   equals dequantize + f32 matmul up to accumulation order.
"""

import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from mxjax._src import extension, formats
from mxjax._src.quantize import dequantize, fake_quantize, quantize, quantize_2x

FORMATS = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
SHARD, SHARDS = 0, 1  # this process runs the cases whose index is SHARD modulo SHARDS
CPU, GPU = jax.devices("cpu")[0], jax.devices("gpu")[0]


def u8(a):
  return np.asarray(a).view(np.uint8)


def same(a, b, what):
  a, b = u8(a), u8(b)
  if not np.array_equal(a, b):
    bad = np.flatnonzero(a.ravel() != b.ravel())
    sys.exit(f"FAIL {what}: {bad.size} bytes differ, first at {bad[0]}")


def mine(cases):
  """This shard's cases, counted."""
  global checked
  for i, case in enumerate(cases):
    if i % SHARDS == SHARD:
      checked += 1
      yield case


checked = 0


def inputs(shape, dtype, seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape).astype(np.float32) * np.exp2(rng.integers(-30, 30, shape))
  x.ravel()[rng.integers(0, x.size, max(1, x.size // 50))] = np.inf
  x.ravel()[rng.integers(0, x.size, max(1, x.size // 50))] = np.nan
  x.ravel()[rng.integers(0, x.size, max(1, x.size // 20))] = -0.0
  return jnp.asarray(x, dtype)


def check_quantize():
  every_bf16 = jnp.asarray(np.arange(1 << 16, dtype=np.uint16).view(jnp.bfloat16).reshape(-1, 64))
  cases = [(every_bf16, -1), (every_bf16, 0)]
  for dtype, (shape, axis) in itertools.product(
      (jnp.bfloat16, jnp.float16, jnp.float32),
      (((7, 100), -1), ((130, 9), 0), ((3, 33, 5), 1), ((4, 64, 256), -1), ((1,), 0),
       ((64, 256), 0), ((2, 96, 48), 1), ((70, 128), 0))):
    cases.append((inputs(shape, dtype, len(cases)), axis))
  for (x, axis), fmt, mode, block in mine(itertools.product(
      cases, FORMATS, ("rceil", "floor"), (16, 32, 64))):
    kw = dict(axis=axis, block_size=block, scale_mode=mode)
    want = quantize(jax.device_put(x, CPU), fmt, **kw)
    got = quantize(jax.device_put(x, GPU), fmt, **kw)
    tag = f"quantize {fmt} {mode} B={block} {x.dtype} {x.shape} axis={axis}"
    same(got.scales, want.scales, tag + " scales")
    same(got.data, want.data, tag + " data")
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
      same(dequantize(jax.device_put(want, GPU), dtype), dequantize(want, dtype), tag + " deq")
    if x.ndim >= 2:
      got2 = quantize_2x(jax.device_put(x, GPU), fmt, block_size=block, scale_mode=mode)
      want2 = quantize_2x(jax.device_put(x, CPU), fmt, block_size=block, scale_mode=mode)
      for g, w, side in zip(got2, want2, ("row", "col")):
        same(g.scales, w.scales, f"{tag} 2x {side} scales")
        same(g.data, w.data, f"{tag} 2x {side} data")
  print(f"quantize / quantize_2x / dequantize: CUDA == CPU ({checked} cases)")


def cuda_fake_quantize(x, fmt, mode, block, axis, dtype):
  """mxjax_fake_quantize on the GPU, called directly (x on the GPU)."""
  extension.load()
  call = jax.ffi.ffi_call("mxjax_fake_quantize", jax.ShapeDtypeStruct(x.shape, dtype))
  return call(x, format=np.int32(formats.element_format(fmt).ffi_id),
              scale_mode=np.int32(formats.scale_mode(mode).ffi_id),
              block_size=np.int64(block), axis=np.int64(axis % x.ndim))


def check_fake_quantize():
  every_bf16 = jnp.asarray(np.arange(1 << 16, dtype=np.uint16).view(jnp.bfloat16).reshape(-1, 64))
  cases = [(every_bf16, -1), (every_bf16, 0), (every_bf16.reshape(64, -1), 0)]
  for dtype, (shape, axis) in itertools.product(
      (jnp.bfloat16, jnp.float16, jnp.float32),
      (((7, 100), -1), ((130, 9), 0), ((3, 33, 5), 1), ((4, 64, 256), -1), ((64, 256), 0),
       ((1,), 0), ((2, 96, 48), 1))):
    cases.append((inputs(shape, dtype, 1000 + len(cases)), axis))
  for (x, axis), fmt, mode, block, out in mine(itertools.product(
      cases, FORMATS, ("rceil", "floor"), (16, 32, 64), (jnp.bfloat16, jnp.float16, jnp.float32))):
    want = fake_quantize(jax.device_put(x, CPU), fmt, axis=axis, block_size=block,
                         scale_mode=mode, dtype=out)
    got = jax.jit(cuda_fake_quantize, static_argnums=(1, 2, 3, 4, 5))(
        jax.device_put(x, GPU), fmt, mode, block, axis, out)
    same(got, want, f"fake_quantize {fmt} {mode} B={block} {x.dtype}->{jnp.dtype(out).name} "
         f"{x.shape} axis={axis}")
  print(f"fake_quantize: CUDA == CPU ({checked} cases in all)")


def swizzle_reference(s):
  rows, cols = s.shape
  rp, cp = -(-rows // 128) * 128, -(-cols // 4) * 4
  padded = np.zeros((rp, cp), np.uint8)
  padded[:rows, :cols] = s
  return padded.reshape(rp // 128, 4, 32, cp // 4, 4).transpose(0, 3, 2, 1, 4).ravel()


def check_swizzle():
  extension.load()
  for rows, cols in ((1, 1), (128, 4), (300, 9), (1024, 224)):
    s = np.random.default_rng(rows).integers(0, 255, (rows, cols), dtype=np.uint8)
    out = jax.ShapeDtypeStruct((swizzle_reference(s).size,), jnp.uint8)
    got = jax.ffi.ffi_call("mxjax_swizzle_scales", out)(jax.device_put(s, GPU))
    same(got, swizzle_reference(s), f"swizzle {rows}x{cols}")
  print("mxjax_swizzle_scales: matches the 128x4 layout")


def check_gemm():
  extension.load()
  m, n, k = 256, 384, 512
  rng = np.random.default_rng(0)
  a = quantize(jax.device_put(rng.standard_normal((m, k), np.float32), GPU), "e4m3")
  b = quantize(jax.device_put(rng.standard_normal((n, k), np.float32), GPU), "e4m3")
  call = jax.ffi.ffi_call("mxjax_mx_gemm", jax.ShapeDtypeStruct((m, n), jnp.float32))
  try:
    got = np.asarray(call(a.data, a.scales, b.data, b.scales))
  except Exception as err:  # noqa: BLE001
    major = int(GPU.compute_capability.split(".")[0])
    if major < 10 and "compute capability" in str(err):
      print(f"mxjax_mx_gemm: refused on sm_{GPU.compute_capability} as it should")
      return
    raise
  want = np.asarray(dequantize(a, jnp.float32)) @ np.asarray(dequantize(b, jnp.float32)).T
  ok = np.isclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  if not ok.all():
    sys.exit(f"FAIL mx_gemm: {np.count_nonzero(~ok)} of {ok.size} outputs differ")
  print("mxjax_mx_gemm: matches dequantize + matmul")


if __name__ == "__main__":
  if "--shard" in sys.argv:
    SHARD, SHARDS = map(int, sys.argv[sys.argv.index("--shard") + 1].split("/"))
    assert 0 <= SHARD < SHARDS, "--shard I/N needs 0 <= I < N"
  if SHARD == 0:
    check_swizzle()
  check_quantize()
  check_fake_quantize()
  if SHARD == 0:
    check_gemm()
