"""A whole training step of the sweep's LM, MX recipes against bf16, in the same run; the
fixed cost of one FFI kernel call; and of one eager (un-jitted) mxjax op.

  python benchmarks/step.py                    # the sweep's default LM (d_model 128, ...)
  python benchmarks/step.py --d-model 256 --layers 4 --seq-len 256 --batch-size 32
  python benchmarks/step.py --formats mxfp8_e4m3,mxfp8_hybrid,mxfp4_e2m1,fp8_delayed
  python benchmarks/step.py --dtype float32    # an f32 model (Flax's default), against f32
  python benchmarks/step.py --big              # d_model 1024, 4 layers, seq 512 (a GPU's size)
  python benchmarks/step.py --big --profile 3   # and each step's 3 longest device kernels

The step is the sweep's (`mxjax.sweep.train.Runner.step`: loss, grads, AdamW update and a
stateful recipe's next state) jitted under each row's treatment, as the sweep runs it; the
steps are timed in turn within each repetition (median), so a noisy neighbour slows all of
them alike. Goal (issue 13): MXFP8 / bf16 <= 1.15. With
`--dtype float32` the model computes in f32 and the baseline ("bf16", the sweep's name for
no recipe) is the same f32 model without MX.

The FFI cost: one jitted program with `--calls` independent quantize calls on tiny inputs
against the same program with one call; the difference per extra call is what a kernel
call costs beyond its work (custom-call dispatch, attribute decoding, the thread pool).
The eager cost: `mxjax.quantize` and `dequantize` called outside `jit` on the same tiny
input, against an eager jnp op.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import interleaved_medians  # noqa: E402

from mxjax._src import extension  # noqa: E402
from mxjax._src.operand_dtype import cpu_operand_dtype  # noqa: E402
from mxjax._src.quantize import quantize  # noqa: E402
from mxjax.sweep import formats as sweep_formats  # noqa: E402
from mxjax.sweep import model as model_lib  # noqa: E402
from mxjax.sweep import train as train_lib  # noqa: E402


def step_fns(lm, config: train_lib.TrainConfig, names, seq_len: int):
  """{format name: step(params, opt_state, batch)}: the sweep's jitted step (its `Runner`)
  called under the row's treatment. A stateful recipe's step starts from its initial
  state each time (the state's values do not change the work)."""
  fns = {}
  for name in names:
    row = sweep_formats.FORMATS[name]
    treatment = train_lib.Treatment.for_gemms(row)
    runner = train_lib.Runner(lm, config, treatment, seq_len)
    recipe = row.recipe()
    key = jax.random.key(0) if recipe is not None and recipe.needs_rng() else None

    def run(params, opt_state, batch, runner=runner, key=key):  # SR recipes: a step's key
      with runner.treatment.context():
        return runner.step(params, runner.state0, opt_state, batch, key)

    fns[name] = run
  return fns, runner.tx


def kernel_kind(name: str) -> str:
  """A device kernel's kind, from its name: GEMM, mxjax (this library's kernels), XLA
  fusion, copy, other."""
  low = name.lower()
  if any(w in low for w in ("gemm", "nvjet", "xmma", "cutlass", "matmul", "dot")):
    return "GEMM"
  if any(w in low for w in ("mxjax", "quantize", "amax", "swizzle")):
    return "mxjax"
  if any(w in low for w in ("fusion", "loop_", "input_", "reduce", "transpose", "triton")):
    return "XLA fusion"
  if "memcpy" in low or "memset" in low or "copy" in low:
    return "copy"
  return "other"


def print_kernel_profile(name, fn, args, top: int) -> None:
  """Traces one call of `fn(*args)` (compiled already) and prints the device's kernel time
  by kind and the `top` longest kernels (jax.profiler.ProfileData of the trace)."""
  import collections
  import glob
  import tempfile
  with tempfile.TemporaryDirectory() as tmp:
    try:
      with jax.profiler.trace(tmp):
        jax.block_until_ready(fn(*args))
    except Exception as err:  # noqa: BLE001 (a profiler this machine lacks: no profile)
      print(f"  {name}: no trace ({type(err).__name__}: {str(err)[:120]})")
      return
    files = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
    if not files:
      print(f"  {name}: the trace wrote no xplane.pb")
      return
    data = jax.profiler.ProfileData.from_file(files[0])
  by_kernel = collections.Counter()
  for plane in data.planes:
    if not plane.name.startswith("/device:GPU"):
      continue
    for line in plane.lines:
      if line.name.startswith("Stream"):  # kernels and copies as the GPU ran them
        for event in line.events:
          by_kernel[event.name] += event.duration_ns
  if not by_kernel:
    print(f"  {name}: no GPU kernels in the trace")
    return
  by_kind = collections.Counter()
  for kernel, ns in by_kernel.items():
    by_kind[kernel_kind(kernel)] += ns
  print(f"  {name:14s} kernels {sum(by_kind.values()) / 1e6:7.2f} ms: " + ", ".join(
      f"{kind} {ns / 1e6:.2f}" for kind, ns in by_kind.most_common()))
  for kernel, ns in by_kernel.most_common(top):
    print(f"  {'':14s}   {ns / 1e6:6.2f} ms  {kernel[:110]}")


def ffi_call_cost(calls: int, shape=(16, 128), reps: int = 9) -> tuple[float, float]:
  """(seconds per extra quantize call, seconds per extra XLA elementwise op) on `shape`."""
  xs = jax.random.normal(jax.random.key(1), (calls, *shape), jnp.float32).astype(jnp.bfloat16)

  def many_quantize(xs, n):
    return [quantize(xs[i], "e4m3").data for i in range(n)]

  def many_xla(xs, n):  # optimization barriers keep XLA from fusing the n ops into one
    return [jax.lax.optimization_barrier(xs[i] * 2) for i in range(n)]

  fns = {(kind, n): jax.jit(lambda xs, f=f, n=n: f(xs, n))
         for kind, f in (("ffi", many_quantize), ("xla", many_xla)) for n in (1, calls)}
  t = interleaved_medians(fns, xs, reps=reps)
  per = lambda kind: (t[(kind, calls)] - t[(kind, 1)]) / (calls - 1)  # noqa: E731
  return per("ffi"), per("xla")


def eager_call_cost(shape=(16, 128), reps: int = 51) -> dict:
  """Seconds per eager call on `shape`: {"quantize", "dequantize", "jnp multiply"}."""
  x = jax.random.normal(jax.random.key(2), shape, jnp.float32).astype(jnp.bfloat16)
  q = quantize(x, "e4m3")
  fns = {"quantize": lambda x: quantize(x, "e4m3").data, "dequantize": lambda x: q.dequantize(),
         "jnp multiply": lambda x: x * 2}
  return interleaved_medians(fns, x, reps=reps)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  defaults = model_lib.ModelConfig()
  p.add_argument("--formats", default="mxfp8_e4m3,mxfp8_hybrid",
                 help="sweep format names compared with bf16")
  p.add_argument("--d-model", type=int, default=defaults.d_model)
  p.add_argument("--layers", type=int, default=defaults.layers)
  p.add_argument("--heads", type=int, default=defaults.heads)
  p.add_argument("--seq-len", type=int, default=64)
  p.add_argument("--batch-size", type=int, default=16)
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                 help="the LM's computation dtype (the baseline's too)")
  p.add_argument("--big", action="store_true",
                 help="d_model 1024, 4 layers, 8 heads, seq 512, batch 16 (overrides those)")
  p.add_argument("--reps", type=int, default=15)
  p.add_argument("--calls", type=int, default=64, help="quantize calls for the FFI cost")
  p.add_argument("--profile", type=int, default=0, metavar="N",
                 help="GPU: trace one step of each row, print its kernel time by kind and its "
                      "N longest kernels")
  args = p.parse_args(argv)
  if args.big:
    args.d_model, args.layers, args.heads, args.seq_len, args.batch_size = 1024, 4, 8, 512, 16
  config = model_lib.ModelConfig(d_model=args.d_model, layers=args.layers, heads=args.heads,
                                 max_len=args.seq_len)
  lm = model_lib.LanguageModel(config, dtype=jnp.dtype(args.dtype))
  params = train_lib.init_params(lm, 0, args.seq_len)
  names = [sweep_formats.BASELINE, *(f.name for f in sweep_formats.parse(args.formats))]
  fns, tx = step_fns(lm, train_lib.TrainConfig(), names, args.seq_len)
  batch = jnp.asarray(np.random.default_rng(0).integers(
      0, config.vocab, (args.batch_size, args.seq_len + 1)), jnp.int32)
  opt_state = tx.init(params)
  device = jax.devices()[0]
  print(f"device: {device.device_kind} ({device.platform}), {os.cpu_count()} cores, "
        f"simd={extension.build_info()['simd']}, MX product operands: "
        f"{cpu_operand_dtype().name if device.platform == 'cpu' else 'bfloat16'}")
  print(f"LM: d_model {config.d_model}, {config.layers} layers, {config.heads} heads, "
        f"batch {args.batch_size} x seq {args.seq_len}, {args.dtype}; AdamW step (sweep "
        f"defaults)")
  for name, fn in fns.items():  # compile (and a first run) apart from the timed steps
    t0 = time.perf_counter()
    jax.block_until_ready(fn(params, opt_state, batch))
    print(f"  {name:14s} compile + first step {time.perf_counter() - t0:6.1f} s")
  t = interleaved_medians(fns, params, opt_state, batch, reps=args.reps)
  base = t[sweep_formats.BASELINE]
  for name, sec in t.items():
    print(f"  {name:14s} {sec * 1e3:8.2f} ms  ratio to {args.dtype} {sec / base:.3f}")
  if args.profile:
    for name, fn in fns.items():
      print_kernel_profile(name, fn, (params, opt_state, batch), args.profile)
  ffi, xla = ffi_call_cost(args.calls)
  print(f"fixed cost per call on a [16, 128] bf16 input: FFI quantize {ffi * 1e6:.1f} us, "
        f"XLA elementwise op {xla * 1e6:.1f} us ({args.calls} calls in one program)")
  eager = eager_call_cost()
  print("eager call on a [16, 128] bf16 input: " +
        ", ".join(f"{name} {sec * 1e6:.1f} us" for name, sec in eager.items()))


if __name__ == "__main__":
  main()
