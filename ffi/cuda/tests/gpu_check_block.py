"""GPU check of the block formats' CUDA handlers, for a machine with an NVIDIA GPU, a CUDA
jaxlib and mxjax built with MXJAX_CUDA=ON:

  python ffi/cuda/tests/gpu_check_block.py            # correctness, then timings
  python ffi/cuda/tests/gpu_check_block.py --no-timing
  python ffi/cuda/tests/gpu_check_block.py --timing-only [--shape 16384,16384]

1. mxjax_block_quantize / _fake_quantize / _dequantize / _quantize_2x on "CUDA" equal the
   CPU handlers byte for byte through jax.ffi.ffi_call on both devices (the CPU kernels
   are checked against mxjax.reference by tests/test_block_kernels.py): every element
   format x scale kind (E8M0 RCEIL / FLOOR, E4M3 with a tensor scale, FP32, FP32 pow2),
   1-D blocks along the last and a strided axis, 2-D tiles, odd and generic blocks, the
   three input dtypes, stochastic rounding, odd shapes with Inf / NaN / -0, and every bf16
   pattern. Codes are packed along the quantized axis; where the CPU handlers still write
   one code per byte, their codes are packed here (numpy) before the comparison.
2. mxjax_tensor_amax on "CUDA" equals numpy's max of the finite |x| (f32 bits).
3. Timings (medians): each kernel's bytes read + written per second, against an XLA
   elementwise copy (read + write every input byte) and a device-to-device copy.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from mxjax._src import extension

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "benchmarks"))
from timing import median_seconds  # noqa: E402  (benchmarks/timing.py)

CPU, GPU = jax.devices("cpu")[0], jax.devices("gpu")[0]
FORMATS = {"e4m3": (0, 8), "e5m2": (1, 8), "e3m2": (2, 6), "e2m3": (3, 6), "e2m1": (4, 4)}
ELEM_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "e3m2": 28.0, "e2m3": 7.5, "e2m1": 6.0}
GROUP = {8: (1, 1), 6: (4, 3), 4: (2, 1)}  # bits: (codes, bytes) per packing group
# (scale kind, scale mode): E8M0 RCEIL, E8M0 FLOOR, E4M3 (+ tensor scale), FP32, FP32 pow2.
KINDS = ((0, 0), (0, 1), (1, 0), (2, 0), (3, 0))
DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
failures = []


def fail(what):
  failures.append(what)
  print("FAIL", what, flush=True)


def same(got, want, what):
  got, want = np.asarray(got), np.asarray(want)
  g, w = got.view(np.uint8).ravel(), want.view(np.uint8).ravel()
  if got.shape != want.shape or not np.array_equal(g, w):
    bad = np.flatnonzero(g != w) if g.size == w.size else [-1]
    fail(f"{what}: shapes {got.shape} / {want.shape}, {len(bad)} bytes differ, first at {bad[0]}")


# ---------------------------------------------------------------------------------------
# Layouts

def storage(n, bits):
  g, b = GROUP[bits]
  return -(-n // g) * b


def packed_axis(ndim, block, axis):
  return ndim - 1 if block[0] > 1 else axis % ndim


def packed_shape(shape, block, axis, bits):
  s = list(shape)
  a = packed_axis(len(shape), block, axis)
  s[a] = storage(s[a], bits)
  return tuple(s)


def scales_type(shape, block, axis, kind):
  if block[0] > 1:
    s = (*shape[:-2], -(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
  else:
    s = tuple(-(-n // block[1]) if i == axis % len(shape) else n for i, n in enumerate(shape))
  return jax.ShapeDtypeStruct(s, jnp.uint32 if kind >= 2 else jnp.uint8)


def pack(codes, axis, bits):
  """Codes one per byte -> packed along `axis` (code i at bit i * bits, little endian)."""
  g, gb = GROUP[bits]
  c = np.moveaxis(np.asarray(codes), axis, -1).astype(np.uint64)
  n = c.shape[-1]
  c = np.pad(c, [(0, 0)] * (c.ndim - 1) + [(0, -n % g)]).reshape(*c.shape[:-1], -1, g)
  word = functools.reduce(np.bitwise_or, [c[..., i] << np.uint64(bits * i) for i in range(g)])
  out = np.stack([(word >> np.uint64(8 * k)) & np.uint64(0xFF) for k in range(gb)], -1)
  return np.moveaxis(out.astype(np.uint8).reshape(*c.shape[:-2], -1), -1, axis)


def attrs(fmt, kind, mode, block, axis):
  return dict(format=np.int32(FORMATS[fmt][0]), scale=np.int32(kind), scale_mode=np.int32(mode),
              block_rows=np.int64(block[0]), block_cols=np.int64(block[1]),
              axis=np.int64(axis))


# ---------------------------------------------------------------------------------------
# The handlers, one jitted program per case and device

@functools.lru_cache(maxsize=None)
def quantize_program(shape, dtype, fmt, kind, mode, block, axis, sr, packed):
  """(x, rand, ts) -> codes, scales, fake_quantize, dequantize (without / with the tensor
  scale); `packed`: whether this device's handlers write packed codes."""
  bits = FORMATS[fmt][1]
  a = attrs(fmt, kind, mode, block, axis)
  codes_shape = packed_shape(shape, block, axis, bits) if packed else shape
  out = (jax.ShapeDtypeStruct(codes_shape, jnp.uint8), scales_type(shape, block, axis, kind))
  f32 = jax.ShapeDtypeStruct(shape, jnp.float32)

  def run(x, rand, ts):
    codes, scales = jax.ffi.ffi_call("mxjax_block_quantize", out)(x, rand, ts, **a,
                                                                   stochastic_rounding=sr)
    fake = jax.ffi.ffi_call("mxjax_block_fake_quantize", f32)(x, rand, ts, **a,
                                                              stochastic_rounding=sr)
    deq = [jax.ffi.ffi_call("mxjax_block_dequantize", f32)(codes, scales, ts, **a,
                                                           apply_tensor_scale=apply)
           for apply in (False, True)]
    return codes, scales, fake, *deq

  return jax.jit(run)


@functools.lru_cache(maxsize=None)
def quantize_2x_program(shape, dtype, fmt, kind, mode, b, packed):
  bits = FORMATS[fmt][1]
  nd = len(shape)
  a = attrs(fmt, kind, mode, (1, b), nd - 1)
  rows = packed_shape(shape, (1, b), nd - 1, bits) if packed else shape
  cols = packed_shape(shape, (1, b), nd - 2, bits) if packed else shape
  out = (jax.ShapeDtypeStruct(rows, jnp.uint8), scales_type(shape, (1, b), nd - 1, kind),
         jax.ShapeDtypeStruct(cols, jnp.uint8), scales_type(shape, (1, b), nd - 2, kind))
  return jax.jit(lambda x, ts: jax.ffi.ffi_call("mxjax_block_quantize_2x", out)(x, ts, **a))


def cpu_writes_packed() -> bool:
  """Whether the CPU block handlers write packed codes (else one code per byte)."""
  x = np.zeros((4, 32), np.float32)
  try:
    prog = quantize_program(x.shape, x.dtype, "e2m1", 0, 0, (1, 16), 1, False, True)
    jax.block_until_ready(prog(jax.device_put(x, CPU), jax.device_put(np.zeros(1, np.uint32), CPU),
                               jax.device_put(np.zeros(1, np.uint32), CPU)))
    return True
  except Exception:  # noqa: BLE001  (the unpacked handler refuses the packed shape)
    return False


# ---------------------------------------------------------------------------------------
# Inputs

def inputs(shape, dtype, block_elems, seed):
  """Normal values times 2^[-30, 30] (2^[-140, 120] in a few runs), with -0 and about one
  Inf / NaN per 10 blocks."""
  rng = np.random.default_rng(seed)
  n = int(np.prod(shape))
  x = rng.standard_normal(n).astype(np.float32) * np.exp2(rng.integers(-30, 30, n)).astype(
      np.float32)
  wide = rng.integers(0, n, max(1, n // 50))
  x[wide] = rng.standard_normal(wide.size).astype(np.float32) * np.exp2(
      rng.integers(-140, 120, wide.size)).astype(np.float32)
  x[rng.integers(0, n, max(1, n // 20))] = -0.0
  specials = max(1, n // (10 * block_elems))
  x[rng.integers(0, n, specials)] = np.inf
  x[rng.integers(0, n, specials)] = -np.inf
  x[rng.integers(0, n, specials)] = np.nan
  with np.errstate(over="ignore"):  # (f16 overflows to Inf)
    return np.asarray(jnp.asarray(x.reshape(shape), dtype))


def tensor_scale_bits(x, fmt):
  """elem_max * 448 / amax over the finite |x|, as f32 bits (1.0 for amax 0)."""
  f = np.abs(np.asarray(x, np.float32))
  f = f[np.isfinite(f)]
  amax = np.float32(f.max()) if f.size else np.float32(0)
  s = np.float32(ELEM_MAX[fmt] * 448.0) / amax if amax else np.float32(1)
  return np.array([np.minimum(s, np.finfo(np.float32).max)], np.float32).view(np.uint32)


# ---------------------------------------------------------------------------------------
# Checks

def check_case(x, fmt, kind, mode, block, axis, sr, ts, cpu_packed, tag):
  bits = FORMATS[fmt][1]
  rand = np.random.default_rng(x.size).integers(0, 2**32, x.shape if sr else (1,),
                                                dtype=np.uint32)
  ts = np.asarray(ts, np.uint32)
  key = (x.shape, x.dtype, fmt, kind, mode, block, axis, sr)
  on = lambda dev, packed: quantize_program(*key, packed)(  # noqa: E731
      *(jax.device_put(a, dev) for a in (x, rand, ts)))
  want = [np.asarray(a) for a in on(CPU, cpu_packed)]
  got = [np.asarray(a) for a in on(GPU, True)]
  if not cpu_packed:
    want[0] = pack(want[0], packed_axis(x.ndim, block, axis), bits)
  for g, w, name in zip(got, want, ("codes", "scales", "fake_quantize", "dequantize",
                                    "dequantize (tensor scale)")):
    same(g, w, f"{tag} {name}")


def check_quantize(cpu_packed):
  layouts = [  # (shape, block, axis)
      ((7, 100), (1, 16), 1), ((7, 100), (1, 16), 0), ((130, 9), (1, 32), 0),
      ((3, 33, 5), (1, 32), 1), ((4, 64, 256), (1, 128), 2), ((1,), (1, 16), 0),
      ((2, 130, 260), (128, 128), 0), ((40, 50), (16, 16), 0), ((70, 100), (32, 32), 0),
      ((2, 48, 64), (16, 16), 0), ((600, 3), (1, 256), 0), ((50, 6), (1, 12), 0),
      ((20, 30), (8, 8), 0), ((3, 1000), (1, 2048), 1), ((16, 1024), (1, 16), 1),
      ((256, 40), (1, 128), 0),
  ]
  count = 0
  for li, (shape, block, axis) in enumerate(layouts):
    for fi, (fmt, (kind, mode)) in enumerate(itertools.product(FORMATS, KINDS)):
      i = li + fi
      dtype, sr = DTYPES[i % 3], bool(i % 2)
      x = inputs(shape, dtype, block[0] * block[1], i)
      ts = tensor_scale_bits(x, fmt) if kind == 1 else np.zeros(1, np.uint32)
      tag = f"{fmt} scale={kind} mode={mode} block={block} {np.dtype(dtype).name} {shape} " \
            f"axis={axis} sr={sr}"
      try:
        check_case(x, fmt, kind, mode, block, axis, sr, ts, cpu_packed, tag)
      except Exception as err:  # noqa: BLE001  (FP4 / FP6 blocks that split a packing group)
        if FORMATS[fmt][1] < 8 and block[1] % GROUP[FORMATS[fmt][1]][0] and "packing" in str(err):
          continue
        fail(f"{tag}: {err}")
      count += 1
  every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
  every = every.reshape(2048, 32)
  for (block, axis), fmt, (kind, mode) in itertools.product(
      (((1, 16), 1), ((1, 32), 0), ((16, 16), 0), ((32, 32), 0)), FORMATS, KINDS):
    ts = tensor_scale_bits(every, fmt) if kind == 1 else np.zeros(1, np.uint32)
    check_case(every, fmt, kind, mode, block, axis, False, ts, cpu_packed,
               f"every bf16 {fmt} scale={kind} mode={mode} block={block} axis={axis}")
    count += 1
  print(f"quantize / fake_quantize / dequantize: {count} cases checked", flush=True)


def check_quantize_2x(cpu_packed):
  count = 0
  for (shape, b), fmt, (kind, mode) in itertools.product(
      (((2, 33, 70), 16), ((130, 260), 128), ((40, 96), 32), ((300, 520), 256), ((20, 30), 8)),
      FORMATS, KINDS):
    dtype = DTYPES[count % 3]
    x = inputs(shape, dtype, b, count)
    ts = tensor_scale_bits(x, fmt) if kind == 1 else np.zeros(1, np.uint32)
    want = [np.asarray(a) for a in quantize_2x_program(shape, dtype, fmt, kind, mode, b,
                                                       cpu_packed)(
        jax.device_put(x, CPU), jax.device_put(ts, CPU))]
    got = [np.asarray(a) for a in quantize_2x_program(shape, dtype, fmt, kind, mode, b, True)(
        jax.device_put(x, GPU), jax.device_put(ts, GPU))]
    if not cpu_packed:
      bits = FORMATS[fmt][1]
      want[0], want[2] = pack(want[0], len(shape) - 1, bits), pack(want[2], len(shape) - 2, bits)
    tag = f"quantize_2x {fmt} scale={kind} mode={mode} b={b} {np.dtype(dtype).name} {shape}"
    for g, w, name in zip(got, want, ("row codes", "row scales", "col codes", "col scales")):
      same(g, w, f"{tag} {name}")
    count += 1
  print(f"quantize_2x: {count} cases checked", flush=True)


def check_tensor_amax():
  call = jax.jit(jax.ffi.ffi_call("mxjax_tensor_amax", jax.ShapeDtypeStruct((1,), jnp.uint32)))
  count = 0
  for shape, dtype in itertools.product(((0,), (1,), (7,), (1000,), (3, 1001), (4097, 4099)),
                                        DTYPES):
    x = inputs(shape, dtype, 1000, count) if np.prod(shape) else np.zeros(shape, dtype)
    for variant in ("as is", "zeros", "all nan"):
      y = x.copy()
      if variant == "zeros":
        y = np.where(np.signbit(y), -0.0, 0.0).astype(dtype)
      elif variant == "all nan":
        y = np.full(shape, np.nan, dtype)
      f = np.abs(np.asarray(y, np.float32)).ravel()
      f = f[np.isfinite(f)]
      want = f.view(np.uint32).max() if f.size else 0
      got = int(np.asarray(call(jax.device_put(y, GPU)))[0])
      if got != want:
        fail(f"tensor_amax {shape} {np.dtype(dtype).name} {variant}: got {got:#x} want {want:#x}")
      count += 1
  print(f"mxjax_tensor_amax: {count} cases checked", flush=True)


# ---------------------------------------------------------------------------------------
# Timings

def timings(shape):
  x = jax.device_put(jax.random.normal(jax.random.key(0), shape, jnp.bfloat16), GPU)
  n = x.size
  zero = jax.device_put(np.zeros(1, np.uint32), GPU)
  no_rand = jax.device_put(np.zeros(1, np.uint32), GPU)
  flip = jax.jit(lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16) ^ jnp.uint16(0x8000))
  copy = jax.jit(lambda x: jnp.copy(x))
  base = {"XLA elementwise copy": (lambda: flip(x), 4 * n),
          "device copy (jnp.copy)": (lambda: copy(x), 4 * n)}
  amax = jax.jit(jax.ffi.ffi_call("mxjax_tensor_amax", jax.ShapeDtypeStruct((1,), jnp.uint32)))
  ts = amax(x)  # any f32 bits serve as the tensor scale for timing

  def q(fmt, kind, block, axis=-1):
    bits = FORMATS[fmt][1]
    out = (jax.ShapeDtypeStruct(packed_shape(shape, block, axis % 2, bits), jnp.uint8),
           scales_type(shape, block, axis % 2, kind))
    call = jax.jit(lambda x, ts: jax.ffi.ffi_call("mxjax_block_quantize", out)(
        x, no_rand, ts, **attrs(fmt, kind, 0, block, axis % 2), stochastic_rounding=False))
    scale_bytes = (4 if kind >= 2 else 1) * n / (block[0] * block[1])
    return (lambda: call(x, ts)), 2 * n + n * bits / 8 + scale_bytes

  def q2x(fmt, kind, b):
    bits = FORMATS[fmt][1]
    prog = quantize_2x_program(shape, jnp.bfloat16, fmt, kind, 0, b, True)
    return (lambda: prog(x, ts)), 2 * n + 2 * (n * bits / 8 + (4 if kind >= 2 else 1) * n / b)

  def deq(fmt, kind, block):
    bits = FORMATS[fmt][1]
    codes, scales = q(fmt, kind, block)[0]()
    call = jax.jit(lambda c, s, t: jax.ffi.ffi_call(
        "mxjax_block_dequantize", jax.ShapeDtypeStruct(shape, jnp.float32))(
            c, s, t, **attrs(fmt, kind, 0, block, 1), apply_tensor_scale=kind == 1))
    return (lambda: call(codes, scales, ts)), n * bits / 8 + scales.nbytes + 4 * n

  def fake(fmt, kind, block):
    call = jax.jit(lambda x: jax.ffi.ffi_call(
        "mxjax_block_fake_quantize", jax.ShapeDtypeStruct(shape, jnp.float32))(
            x, no_rand, zero, **attrs(fmt, kind, 0, block, 1), stochastic_rounding=False))
    return (lambda: call(x)), 2 * n + 4 * n

  ops = {
      "NVFP4 1x16 rowwise (e2m1, e4m3 scales, tensor scale given)": q("e2m1", 1, (1, 16)),
      "NVFP4 1x16 columnwise (axis -2)": q("e2m1", 1, (1, 16), axis=0),
      "NVFP4 16x16": q("e2m1", 1, (16, 16)),
      "FP8 1x128 rowwise (e4m3, fp32 pow2 scales)": q("e4m3", 3, (1, 128)),
      "FP8 1x128 columnwise (axis -2)": q("e4m3", 3, (1, 128), axis=0),
      "FP8 128x128 (e4m3, fp32 pow2 scales)": q("e4m3", 3, (128, 128)),
      "MXFP8 1x32 rowwise (e4m3, e8m0)": q("e4m3", 0, (1, 32)),
      "quantize_2x NVFP4 1x16": q2x("e2m1", 1, 16),
      "quantize_2x FP8 1x128": q2x("e4m3", 3, 128),
      "tensor amax (bf16)": ((lambda: amax(x)), 2 * n),
      "dequantize NVFP4 1x16 -> f32": deq("e2m1", 1, (1, 16)),
      "fake_quantize NVFP4 1x16 -> f32": fake("e2m1", 1, (1, 16)),
  }
  print(f"\nTimings on {GPU.device_kind}, bf16 input {shape} (median of 15; GB/s = bytes read + "
        "written / s)", flush=True)
  ref = {}
  for name, (fn, nbytes) in base.items():
    t = median_seconds(fn, reps=15, warmup=3)
    ref[name] = nbytes / t
    print(f"  {name:58} {t * 1e3:8.3f} ms {nbytes / t / 1e9:8.0f} GB/s", flush=True)
  best = max(ref.values())
  for name, (fn, nbytes) in ops.items():
    t = median_seconds(fn, reps=15, warmup=3)
    print(f"  {name:58} {t * 1e3:8.3f} ms {nbytes / t / 1e9:8.0f} GB/s  "
          f"{nbytes / t / best:5.2f} of the faster copy", flush=True)


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--no-timing", action="store_true")
  parser.add_argument("--timing-only", action="store_true")
  parser.add_argument("--shape", default="16384,16384")
  args = parser.parse_args()
  extension.load()
  if not args.timing_only:
    packed = cpu_writes_packed()
    print(f"CPU block handlers write {'packed' if packed else 'one code per byte (packed here)'}",
          flush=True)
    check_tensor_amax()
    check_quantize(packed)
    check_quantize_2x(packed)
    print("block formats: CUDA == CPU" if not failures else f"{len(failures)} FAILURES",
          flush=True)
  if not args.no_timing:
    timings(tuple(int(s) for s in args.shape.split(",")))
  sys.exit(1 if failures else 0)
