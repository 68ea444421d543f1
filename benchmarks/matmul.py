"""Block-scaled matmul against the bf16 and the f32 matmuls, measured in the same run.

  python benchmarks/matmul.py                  # CPU: 2048^3, forward and forward+backward
  python benchmarks/matmul.py --size 1024      # smaller
  python benchmarks/matmul.py --dense 16384,8192,8192   # a Dense layer: tokens, in, out
  python benchmarks/matmul.py --recipes fp8_block,nvfp4  # more rows (sweep format names)

The MX forward includes quantizing both operands; forward+backward includes the
gradient quantizations. The baselines are `jnp.dot` of the bf16 operands (a bf16 result,
f32 accumulation inside the GEMM; its gradients are bf16 dots, as a bf16 training step
computes them) and `jnp.dot` of f32 operands: XLA's CPU GEMM is faster in bf16 only on
CPUs with bf16 dot instructions, and the product dequantizes to whichever dtype is faster
(mxjax._src.operand_dtype). `--recipes` adds a row per block-scaled recipe (its roles'
formats; on Hopper, FP8 blocks run cuBLASLt's FP8 GEMM). The functions run in turn in each repetition; each
ratio is printed from the medians and as the median of the repetitions' own ratios (a
neighbour's load then slows both sides alike). On a GPU it also times `jax.nn.scaled_dot_general`
with the mxfp8 config where this jax has it. Goal (issue 13, CPU): MX <= 1.1x the faster
high-precision matmul, forward and forward+backward.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(__file__))
import mxjax  # noqa: E402
from mxjax._src.operand_dtype import cpu_operand_dtype  # noqa: E402
from mxjax.sweep import formats as sweep_formats  # noqa: E402
from timing import interleaved_times  # noqa: E402


def bf16_matmul(x, w):
  return jnp.dot(x, w)  # bf16 out (f32 accumulation inside the GEMM), bf16 gradients


def f32_matmul(x, w):
  return jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32)).astype(jnp.bfloat16)


def mx_matmul(fwd_format, bwd_format):
  return lambda x, w: mxjax.matmul(x, w, fwd_format=fwd_format, bwd_format=bwd_format)


def recipe_matmul(name: str):
  """The product of a sweep format's recipe (a fixed key for stochastic rounding)."""
  recipe = sweep_formats.FORMATS[sweep_formats.canonical(name)].recipe()
  key = jax.random.key(0)
  return lambda x, w: mxjax.matmul(x, w, recipe=recipe, rng=key, name="bench")


def loss_of(matmul):
  return lambda x, w: jnp.sum(matmul(x, w).astype(jnp.float32))


def scaled_dot_general_matmul():
  """jax.nn.scaled_dot_general with its mxfp8 config, or None where jax lacks it."""
  sdg = getattr(jax.nn, "scaled_dot_general", None)
  if sdg is None:
    return None
  cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
  dims = (((1,), (0,)), ((), ()))
  return lambda x, w: sdg(x, w, dims, preferred_element_type=jnp.bfloat16, configs=[cfg] * 3)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--size", type=int, default=2048, help="M = K = N")
  p.add_argument("--dense", default=None, help="tokens,in,out (overrides --size)")
  p.add_argument("--fwd-format", default="e4m3")
  p.add_argument("--bwd-format", default="e5m2")
  p.add_argument("--recipes", default="", help="comma list of sweep format names to add")
  p.add_argument("--no-f32", action="store_true", help="leave the f32 baseline out (GPUs)")
  p.add_argument("--reps", type=int, default=7)
  args = p.parse_args(argv)
  m, k, n = ((int(v) for v in args.dense.split(",")) if args.dense else (args.size,) * 3)
  kx, kw = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (m, k), jnp.bfloat16)
  w = jax.random.normal(kw, (k, n), jnp.bfloat16)
  device = jax.devices()[0]
  print(f"device: {device.device_kind} ({device.platform}), jax {jax.__version__}")
  print(f"shape: [{m}, {k}] x [{k}, {n}] bf16; MX {args.fwd_format} forward, "
        f"{args.bwd_format} gradients, 32-blocks, RCEIL")
  mx = mx_matmul(args.fwd_format, args.bwd_format)
  fns = {}
  rows = [("bf16", bf16_matmul), ("MX", mx)] + ([] if args.no_f32 else [("f32", f32_matmul)])
  rows += [(name, recipe_matmul(name)) for name in args.recipes.split(",") if name]
  for name, fn in rows:
    fns[f"{name} fwd"] = jax.jit(fn)
    fns[f"{name} fwd+bwd"] = jax.jit(jax.grad(loss_of(fn), (0, 1)))
  sdg = scaled_dot_general_matmul() if device.platform == "gpu" else None
  if sdg is not None:
    fns["scaled_dot_general fwd"] = jax.jit(sdg)
    fns["scaled_dot_general fwd+bwd"] = jax.jit(jax.grad(loss_of(sdg), (0, 1)))
  times = interleaved_times(fns, x, w, reps=args.reps)
  t = {name: statistics.median(v) for name, v in times.items()}
  flops = 2 * m * k * n
  for name, sec in t.items():
    mult = 3 if "bwd" in name else 1
    print(f"  {name:28s} {sec * 1e3:9.2f} ms  {mult * flops / sec / 1e12:7.3f} TFLOP/s")
  if device.platform == "cpu":
    print(f"MX product operands: {cpu_operand_dtype().name}")
  for way in ("fwd", "fwd+bwd"):
    for name, _ in rows[1:]:
      paired = statistics.median(a / b for a, b in zip(times[f"{name} {way}"],
                                                         times[f"bf16 {way}"]))
      print(f"ratio {name} / bf16, {way:8s} {t[f'{name} {way}'] / t[f'bf16 {way}']:.3f} "
            f"(median of the repetitions' ratios {paired:.3f})")
  if args.no_f32:
    return
  for way in ("fwd", "fwd+bwd"):
    best = min(("bf16", "f32"), key=lambda name: t[f"{name} {way}"])
    paired = statistics.median(a / b for a, b in zip(times[f"MX {way}"], times[f"{best} {way}"]))
    print(f"ratio MX / bf16, {way:8s} {t[f'MX {way}'] / t[f'bf16 {way}']:.3f};  MX / f32 "
          f"{t[f'MX {way}'] / t[f'f32 {way}']:.3f};  MX / faster ({best}) "
          f"{t[f'MX {way}'] / t[f'{best} {way}']:.3f} (median of the repetitions' ratios "
          f"{paired:.3f})  (goal <= 1.1 CPU)")
  if sdg is not None:
    print(f"ratio MX / scaled_dot_general, fwd+bwd: "
          f"{t['MX fwd+bwd'] / t['scaled_dot_general fwd+bwd']:.3f}")


if __name__ == "__main__":
  main()
