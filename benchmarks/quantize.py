"""Benchmark: MX quantize kernels (XLA FFI) against the same quantization in jax.numpy.

For each format: rowwise quantize (along the last axis), columnwise (along the first) and
rowwise + columnwise (`quantize_2x`, one pass) of a bf16 matrix, against an XLA-compiled
jnp version. The jnp
baseline does float math (FP8 formats; not bit-exact at the edges, only a speed baseline)
or calls the integer oracle `mxjax.reference` (packed FP6 / FP4 formats).

  python benchmarks/quantize.py [--formats e4m3,e2m1] [--shape 8192,8192] [--reps 9]
  python benchmarks/quantize.py --warm-allocator   # see below
  python benchmarks/quantize.py --shape 16384,16384 # on a GPU (issue goal: >= 80% of copy)
  python benchmarks/quantize.py --xla-path          # the plain-XLA path vs the jnp baseline
  python benchmarks/quantize.py --dtype float32     # f32 inputs (f32 dequantize / fake_quantize)
  python benchmarks/quantize.py --block-formats     # NVFP4, FP8 blocks, 2-D MX: kernels vs XLA
  python benchmarks/quantize.py --block-formats nvfp4,fp8_1x128 --shape 4096,4096  # issue 42

The kernels are timed in turn with a copy in every repetition. Each ratio is printed two
ways: "B (median M)", B from each side's fastest run, M the median over the repetitions of
the ratio within each (a neighbour's load or the bandwidth's drift then moves both sides
alike). On CPU the copy is a memcpy on every core (benchmarks/roofline.py): rowwise and
columnwise quantize, quantize_2x and rowwise and columnwise dequantize print their traffic
(input + data + scales) per second as a fraction of the copy's (issue 13 goals: >= 0.8 for
FP8 / FP4, >= 0.6 for FP6; quantize_2x <= 1.2x the rowwise time). On GPUs the copy is an
elementwise op that reads and writes every byte once (flipping the sign bits as unsigned
integers; XLA's CPU elementwise ops run on one thread, no bandwidth reference). The 2x / row
line also prints the ratio of the bytes each moves: the time ratio of two kernels at the
same bandwidth (1.34 for FP8: a second output of 1 + 1/32 bytes per element on 3.03).
fake_quantize (rowwise, bf16 to bf16, one pass) prints its roofline fraction (4 bytes per
element) and its time over that of quantize + dequantize. `--dtype float32 | float16` times
the same ops on that input dtype (dequantize and fake_quantize to it), the bytes counted
with its size.

On CPU, XLA allocates every output afresh and the kernel faults in its pages: ~35 ms per
64 MiB on a 2-core machine, more than the quantization itself. `--warm-allocator`
restarts the benchmark with glibc told to keep freed memory (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_), so that repeated calls reuse warm pages, as a
training step's buffers do; both runs are honest, they measure different things.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roofline import parallel_copy, quantize_bytes  # noqa: E402
from timing import cpu_model, interleaved_medians, interleaved_times  # noqa: E402

import mxjax  # noqa: E402
from mxjax import reference  # noqa: E402
from mxjax._src import backend, extension, formats, ops as ops_lib  # noqa: E402
from mxjax._src.quantize import dequantize, fake_quantize, quantize, quantize_2x  # noqa: E402


def jnp_quantize(x, fmt: str, axis: int, block_size: int = 32):
  """RCEIL MX quantization along `axis` in float jnp: (data, E8M0 scales)."""
  f = formats.element_format(fmt)
  if f.packed:
    return reference.quantize(x, fmt, axis=axis, block_size=block_size)
  x = jnp.moveaxis(x, axis, -1).astype(jnp.float32)
  blk = x.reshape(*x.shape[:-1], -1, block_size)
  amax = jnp.max(jnp.abs(blk), axis=-1, keepdims=True)
  e = jnp.clip(jnp.ceil(jnp.log2(amax / f.max)), -127, 127)
  e = jnp.where(amax == 0, -127.0, e)
  v = jnp.clip(blk * jnp.exp2(-e), -f.max, f.max).astype(f.storage_dtype)
  scales = (e[..., 0] + 127).astype(jnp.uint8)
  data = jnp.moveaxis(v.reshape(x.shape), -1, axis)
  return data, jnp.moveaxis(scales, -1, axis)


WARM_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32),
                      "MALLOC_TRIM_THRESHOLD_": str(1 << 36), "MALLOC_TOP_PAD_": str(1 << 30)}


def bench(fmt: str, shape, reps: int, dtype=jnp.bfloat16) -> tuple[dict, int]:
  """Seconds per repetition ({name: [reps floats]}) of the kernels, a parallel copy (on CPU,
  the roofline; benchmarks/roofline.py) and the jnp baselines; and the bytes the copy moves. The kernels and the copy are
  interleaved with each other, so each repetition's times pair up; the jnp baselines only
  among themselves: they churn through GiBs of temporaries, and timed between them the
  kernels ran 1.5-2x slower than alone (8192^2 on a 2-core CPU)."""
  x = jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(dtype)
  q = jax.jit(lambda x: quantize(x, fmt))(x)
  q_col = jax.jit(lambda x: quantize(x, fmt, axis=-2))(x)
  row, both = jax.jit(lambda x: quantize(x, fmt)), jax.jit(lambda x: quantize_2x(x, fmt))
  col = jax.jit(lambda x: quantize(x, fmt, axis=-2))
  deq = jax.jit(lambda q: dequantize(q, dtype))
  fake = jax.jit(lambda x: fake_quantize(x, fmt))
  if jax.devices()[0].platform == "cpu":
    copy, copy_bytes = parallel_copy()
  else:  # an elementwise op that reads and writes every input byte once
    bits = jnp.dtype(f"uint{8 * x.dtype.itemsize}")
    sign = bits.type(1 << (8 * bits.itemsize - 1))
    flip = jax.jit(lambda x: jax.lax.bitcast_convert_type(x, bits) ^ sign)
    copy, copy_bytes = functools.partial(flip, x), 2 * x.nbytes
  kernels = {"copy": copy, "kernel_row": lambda: row(x), "kernel_col": lambda: col(x),
             "kernel_2x": lambda: both(x), "deq": lambda: deq(q), "deq_col": lambda: deq(q_col),
             "fake": lambda: fake(x)}
  baselines = {
      "jnp_row": jax.jit(functools.partial(jnp_quantize, fmt=fmt, axis=-1)),
      "jnp_col": jax.jit(functools.partial(jnp_quantize, fmt=fmt, axis=-2)),
      "jnp_2x": jax.jit(lambda x: (jnp_quantize(x, fmt, -1), jnp_quantize(x, fmt, -2))),
  }
  times = {**interleaved_times(kernels, reps=reps), **interleaved_times(baselines, x, reps=reps)}
  return times, copy_bytes


def ratio(top: list, bottom: list, scale: float = 1.0) -> str:
  """`scale * top / bottom` of two interleaved lists of seconds, as 'B (median M)': B from
  each side's fastest run, M the median over the repetitions of the ratio within each."""
  best = scale * min(top) / min(bottom)
  pairs = statistics.median(scale * a / b for a, b in zip(top, bottom))
  return f"{best:.2f} (median {pairs:.2f})"


def cpu_roofline(fmt: str, shape, t: dict, copy_bytes: int, itemsize: int = 2) -> None:
  """Prints rowwise and columnwise quantize, quantize_2x, rowwise and columnwise dequantize
  (to the input's dtype, of `itemsize` bytes) and fake_quantize as fractions of the CPU
  roofline: the bytes each moves per second over the parallel copy's (see `ratio`)."""
  n, bits = int(np.prod(shape)), formats.element_format(fmt).bits
  moved = {name: quantize_bytes(n, shape[axis], bits, in_bytes=itemsize, outputs=outputs)
           for name, axis, outputs in (("kernel_row", -1, 1), ("kernel_col", -2, 1),
                                       ("kernel_2x", -1, 2), ("deq", -1, 1),
                                       ("deq_col", -2, 1))}
  moved["fake"] = 2 * itemsize * n  # x in, x's dtype out
  fraction = {name: ratio(t["copy"], t[name], b / copy_bytes) for name, b in moved.items()}
  print(f"{fmt:7} roofline (copy {copy_bytes / min(t['copy']) / 1e9:.1f} GB/s, "
        f"{moved['kernel_row'] / n:.2f} B/elem): rowwise {fraction['kernel_row']}, "
        f"columnwise {fraction['kernel_col']}, 2x {fraction['kernel_2x']}, dequantize {min(t['deq']) * 1e3:.2f} ms = {fraction['deq']}, "
        f"columnwise dequantize {fraction['deq_col']}")
  two_passes = [a + b for a, b in zip(t["kernel_row"], t["deq"])]
  print(f"{fmt:7} fake_quantize {min(t['fake']) * 1e3:.2f} ms = {fraction['fake']} of the "
        f"roofline; its time / (quantize + dequantize) {ratio(t['fake'], two_passes)}")


def compiled_under(mode: str, fn, *args):
  """`fn(*args)` jitted and compiled with mxjax's kernel choice `mode` ("ffi" or "xla": the
  plain-XLA path), as a function of no arguments (the arrays are arguments of the program:
  closed over, XLA would fold the op into a constant at compile time)."""
  before = backend.get_kernels()
  backend.set_kernels(mode)
  try:
    run = jax.jit(fn).lower(*args).compile()
  finally:
    backend.set_kernels(before)
  return functools.partial(run, *args)


def bench_xla_path(fmts, shape, reps: int):
  """Prints the plain-XLA path's time (`mxjax._src.codec`, what runs where no FFI kernels
  are used) against the jnp baseline above, rowwise and rowwise + columnwise, timed in the
  same run; the issue's goal is a ratio (jnp / XLA path) of at least 1 on CPU."""
  x = jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(jnp.bfloat16)
  n = int(np.prod(shape))
  print(f"\nplain-XLA path vs jnp baseline: bf16 {shape}, block 32, rceil")
  print(f"{'format':7} {'op':6} {'xla ms':>9} {'Gelem/s':>8} {'jnp ms':>9} {'jnp/xla':>8}")
  for fmt in fmts:
    t = interleaved_medians({
        "xla_row": compiled_under("xla", lambda x: quantize(x, fmt), x),
        "xla_2x": compiled_under("xla", lambda x: (quantize(x, fmt), quantize(x, fmt, axis=0)),
                                 x),
        "jnp_row": functools.partial(jax.jit(functools.partial(jnp_quantize, fmt=fmt, axis=-1)),
                                     x),
        "jnp_2x": functools.partial(jax.jit(lambda x: (jnp_quantize(x, fmt, -1),
                                                       jnp_quantize(x, fmt, -2))), x),
    }, reps=reps)
    for op in ("row", "2x"):
      k, j = t[f"xla_{op}"], t[f"jnp_{op}"]
      print(f"{fmt:7} {op:6} {k * 1e3:9.2f} {n / k / 1e9:8.2f} {j * 1e3:9.2f} {j / k:7.2f}x")


BLOCK_FORMATS = {"mxfp4": mxjax.mx("e2m1"), "nvfp4": mxjax.nvfp4(),
                 "nvfp4_2d": mxjax.nvfp4(two_d=True), "fp8_1x128": mxjax.fp8_block(),
                 "fp8_128x128": mxjax.fp8_block(two_d=True),
                 "mxfp8_2d": mxjax.mx("e4m3", two_d=True)}


def bench_block_formats(shape, reps: int, names=tuple(BLOCK_FORMATS)):
  """Prints the block-scaled formats' kernels (the CPU kernels at the SIMD level in use, or
  the CUDA ones) against their plain-XLA path (the baseline, the same bits) on a bf16
  matrix: quantize along the last axis (2-D formats: in tiles), along the first (1-D
  formats), with stochastic rounding ("sr"), both at once ("2x": `quantize_2x`, one pass;
  the XLA path quantizes twice), dequantize and fake_quantize (the GEMM's operand, bf16
  out). Each prints its time and the bytes it moves per second as a fraction of the
  copy's: the bf16 input, the packed codes, the scales, bf16 outputs. NVFP4's quantize and
  fake_quantize include the tensor scale's amax (its own pass over x: "amax", the
  mxjax_tensor_amax kernel against the XLA reduction it replaces). "sr" makes its random
  bits as it rounds (the kernels; the XLA path hashes them first).
  """
  x = jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(jnp.bfloat16)
  n = int(np.prod(shape))
  key = jax.random.key(1)
  if jax.devices()[0].platform == "cpu":
    copy, copy_bytes = parallel_copy()
  else:
    copy = compiled_under("xla", lambda x: -x, x)
    copy_bytes = 2 * x.nbytes
  device = jax.devices()[0]
  where = cpu_model() if device.platform == "cpu" else device.device_kind
  print(f"\nblock-scaled formats: bf16 {shape}, simd={extension.build_info()['simd']}, "
        f"{where}; roofline = bytes moved per second / the copy's")
  print(f"{'format':28} {'op':6} {'ms':>8} {'Gelem/s':>8} {'roofline':>18} {'XLA path ms':>12} "
        f"{'speedup':>8}")

  def print_row(label, op, t, moved):
    """One op's line: its best time, rate, roofline fraction (`moved` bytes) and the
    XLA path's time (`t["xla_" + op]`) with the speedup over it."""
    frac = ratio(t["copy"], t[op], moved / copy_bytes)
    base = min(t[f"xla_{op}"])
    print(f"{label:28} {op:6} {min(t[op]) * 1e3:8.2f} {n / min(t[op]) / 1e9:8.2f} "
          f"{frac:>18} {base * 1e3:12.2f} {base / min(t[op]):7.2f}x", flush=True)

  for bf in (BLOCK_FORMATS[name] for name in names):
    a = jax.jit(lambda x, bf=bf: quantize(x, bf))(x)
    code_bytes = a.data.size
    scale_bytes = a.scales.size * a.scales.dtype.itemsize
    ops = {"row": (lambda x, a, bf=bf: quantize(x, bf), 2 * n + code_bytes + scale_bytes),
           "sr": (lambda x, a, bf=bf: quantize(x, bf, rng=key), 2 * n + code_bytes + scale_bytes),
           "deq": (lambda x, a: dequantize(a, jnp.bfloat16), 2 * n + code_bytes + scale_bytes),
           "fake": (lambda x, a, bf=bf: fake_quantize(x, bf), 4 * n)}
    if not bf.two_d:
      ops["col"] = (lambda x, a, bf=bf: quantize(x, bf, axis=0), 2 * n + code_bytes + scale_bytes)
      ops["2x"] = (lambda x, a, bf=bf: quantize_2x(x, bf), 2 * n + 2 * (code_bytes + scale_bytes))
    if bf.tensor_scale:
      ops["amax"] = (lambda x, a: ops_lib.tensor_amax(x), 2 * n)
    fns = {"copy": copy}
    for op, (f, _) in ops.items():
      fns[op] = compiled_under("ffi", f, x, a)
      fns[f"xla_{op}"] = compiled_under("xla", f, x, a)
    t = interleaved_times(fns, reps=reps)
    for op, (_, moved) in ops.items():
      print_row(str(bf), op, t, moved)
    if bf.tensor_scale:  # every code depends on x's amax: x is read twice (the amax, then
      # the codes) wherever it outgrows the last-level cache, which caps "row" at
      # moved / (moved + 2n); this line counts both reads, the op's physical floor
      moved = ops["row"][1] + 2 * n
      frac = ratio(t["copy"], t["row"], moved / copy_bytes)
      print(f"{str(bf):28} {'row':6} {'':17} {frac:>18}  counting the amax's read of x "
            f"(the line above is capped at {ops['row'][1] / moved:.2f})", flush=True)
    best_copy = min(t["copy"])
    print(f"{str(bf):28} copy   {best_copy * 1e3:8.2f}  ({copy_bytes / best_copy / 1e9:.1f} GB/s "
          "read + written)", flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--formats", default="e4m3", help="comma-separated element formats")
  parser.add_argument("--shape", default="8192,8192", help="input shape, e.g. 8192,8192")
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"),
                      help="the input's dtype (and dequantize's / fake_quantize's output's)")
  parser.add_argument("--reps", type=int, default=9, help="timed repetitions (median)")
  parser.add_argument("--warm-allocator", action="store_true",
                      help="rerun with glibc keeping freed memory (CPU page-fault effect)")
  parser.add_argument("--block-formats", nargs="?", const=",".join(BLOCK_FORMATS),
                      metavar="NAMES", help="only time the block-scaled formats' kernels and "
                      f"plain-XLA path (comma-separated, of {', '.join(BLOCK_FORMATS)}; all)")
  parser.add_argument("--xla-path", action="store_true",
                      help="only time the plain-XLA path against the jnp baseline")
  args = parser.parse_args(argv)
  if args.warm_allocator and any(os.environ.get(k) != v for k, v in WARM_ALLOCATOR_ENV.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **WARM_ALLOCATOR_ENV})
  shape = tuple(int(s) for s in args.shape.split(","))
  if args.xla_path:
    bench_xla_path(args.formats.split(","), shape, args.reps)
    return
  if args.block_formats:
    bench_block_formats(shape, args.reps, args.block_formats.split(","))
    return
  n = int(np.prod(shape))
  info = extension.build_info()
  device = jax.devices()[0]
  dtype = jnp.dtype(args.dtype)
  print(f"mxjax quantize benchmark: {dtype.name} {shape}, block 32, rceil; simd={info['simd']}, "
        f"{device.device_kind} ({device.platform}), {os.cpu_count()} cores, warm allocator: "
        f"{all(os.environ.get(k) == v for k, v in WARM_ALLOCATOR_ENV.items())}")
  print(f"{'format':7} {'op':6} {'kernel ms':>10} {'Gelem/s':>8} {'jnp ms':>9} {'Gelem/s':>8} "
        f"{'speedup':>8}")
  for fmt in args.formats.split(","):
    times, copy_bytes = bench(fmt, shape, args.reps, dtype)
    t = {name: statistics.median(v) for name, v in times.items()}
    for op in ("row", "col", "2x"):
      k, j = t[f"kernel_{op}"], t[f"jnp_{op}"]
      print(f"{fmt:7} {op:6} {k * 1e3:10.2f} {n / k / 1e9:8.2f} {j * 1e3:9.2f} {n / j / 1e9:8.2f} "
            f"{j / k:7.2f}x")
    bits = formats.element_format(fmt).bits
    moved = functools.partial(quantize_bytes, n, shape[-1], bits, in_bytes=dtype.itemsize)
    floor = moved(outputs=2) / moved()
    print(f"{fmt:7} (rowwise+columnwise time) / (rowwise time) = "
          f"{ratio(times['kernel_2x'], times['kernel_row'])}  "
          f"(bytes moved: {floor:.2f}; jnp: {t['jnp_2x'] / t['jnp_row']:.2f})")
    if device.platform == "cpu":  # XLA's CPU elementwise ops are no bandwidth reference
      cpu_roofline(fmt, shape, times, copy_bytes, dtype.itemsize)
      continue
    f = formats.element_format(fmt)
    row_bytes = n * dtype.itemsize + f.storage_length(shape[-1]) * n // shape[-1] + n // 32
    copy_bw = copy_bytes / t["copy"]
    print(f"{fmt:7} rowwise traffic {row_bytes / t['kernel_row'] / 1e9:.1f} GB/s = "
          f"{row_bytes / t['kernel_row'] / copy_bw:.0%} of the elementwise copy's "
          f"{copy_bw / 1e9:.1f} GB/s")

if __name__ == "__main__":
  main()
