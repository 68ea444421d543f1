"""Runs every mxjax op on fixed inputs and saves the bytes of every result.

    MXJAX_KERNELS=xla python tests/op_surface.py OUT.npz

For tests/test_platforms.py, which runs it in processes under different kernel settings
and compares the files byte for byte. Covers every format x scale mode x orientation
(rowwise, columnwise, quantize_2x's pair), dequantize to every dtype and fake_quantize,
on all bf16 bit patterns, ragged f32 and rank-3 f16 data, in blocks of 32. (The plain-XLA
process spends its time compiling, a second a program; the other block sizes are each
path's against the oracle: test_xla_codec.py, test_quantize_exact.py.)
The block-scaled formats (NVFP4, FP8 blocks, 2-D MX) run their ops too, stochastic
rounding included. Also saves `custom_calls`: how many mxjax custom calls the compiled HLO
of the whole surface has.
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (DTYPES, FORMAT_NAMES, SCALE_MODES, all_bf16_patterns,  # noqa: E402
                      special_blocks)
import mxjax  # noqa: E402

# The block-scaled formats beside MX's element x mode x block grid: NVFP4 (1-D and 16x16
# with the tensor scale), FP8 1x128 / 128x128 (power-of-two and FP32 scales), 2-D MX.
BLOCK_FORMATS = {"nvfp4": mxjax.nvfp4(), "nvfp4_2d": mxjax.nvfp4(two_d=True),
                 "fp8_block": mxjax.fp8_block(), "fp8_block_fp32": mxjax.fp8_block(pow2=False),
                 "fp8_2d": mxjax.fp8_block(two_d=True), "mxfp4_2d": mxjax.mx("e2m1", two_d=True)}
TARGETS = ("mxjax_quantize", "mxjax_quantize_2x", "mxjax_dequantize", "mxjax_fake_quantize",
           "mxjax_block_quantize", "mxjax_block_quantize_2x", "mxjax_block_dequantize",
           "mxjax_block_fake_quantize", "mxjax_tensor_amax")


def inputs() -> dict:
  """name -> input array: every bf16 pattern, ragged f32 with specials, rank-3 f16 with
  random bit patterns."""
  bf16 = np.concatenate([all_bf16_patterns(), all_bf16_patterns("strided")])
  bf16 = bf16.reshape(256, 512)
  rng = np.random.default_rng(3)
  f32 = (rng.standard_normal((37, 75)) * np.exp2(rng.integers(-140, 120, (37, 1))))
  f32 = np.concatenate([f32.astype(np.float32),
                        special_blocks(np.float32, 75)[:40]]).astype(np.float32)
  f32[5, 7], f32[60, 70] = np.nan, -np.inf
  f16 = rng.standard_normal((3, 40, 33)) * np.exp2(rng.integers(-26, 14, (3, 40, 1)))
  f16 = np.where(rng.random(f16.shape) < 0.1, rng.integers(0, 1 << 16, f16.shape).astype(
      np.uint16).view(np.float16), f16.astype(np.float16))
  return {"bf16": bf16, "f32": f32, "f16": f16}


def surface(x, fmt: str, mode: str, block_sizes) -> dict:
  """name -> result array of every op on `x` for one format and scale mode."""
  out = {}
  for block_size in block_sizes:
    for axis, orientation in ((-1, "row"), (0, "col")):
      a = mxjax.quantize(x, fmt, axis=axis, block_size=block_size, scale_mode=mode)
      out[f"{orientation}{block_size}.data"], out[f"{orientation}{block_size}.scales"] = (
          a.data, a.scales)
      for dtype in DTYPES:
        out[f"{orientation}{block_size}.deq_{np.dtype(dtype).name}"] = a.dequantize(dtype)
    rows, cols = mxjax.quantize_2x(x, fmt, block_size=block_size, scale_mode=mode)
    for name, a in (("2x_row", rows), ("2x_col", cols)):
      out[f"{name}{block_size}.data"], out[f"{name}{block_size}.scales"] = a.data, a.scales
    out[f"fake{block_size}"] = mxjax.fake_quantize(x, fmt, block_size=block_size,
                                                  scale_mode=mode)
  return out


def block_surface(x, fmt) -> dict:
  """name -> result array of every op on `x` for one block-scaled format: quantize (1-D
  blocks along both axes; 2-D tiles), with stochastic rounding, dequantize to every dtype,
  quantize_2x (1-D) and fake_quantize."""
  out = {}
  axes = ((-1, "row"),) if fmt.two_d else ((-1, "row"), (0, "col"))
  for axis, orientation in axes:
    for sr, key in (("", None), ("_sr", jax.random.key(7))):
      a = mxjax.quantize(x, fmt, axis=axis, rng=key)
      out[f"{orientation}{sr}.data"], out[f"{orientation}{sr}.scales"] = a.data, a.scales
      if a.tensor_scale is not None:
        out[f"{orientation}{sr}.tensor_scale"] = a.tensor_scale
    for dtype in DTYPES:
      out[f"{orientation}.deq_{np.dtype(dtype).name}"] = a.dequantize(dtype)
    out[f"{orientation}.fake"] = mxjax.fake_quantize(x, fmt, axis=axis)
  if not fmt.two_d:
    for name, a in zip(("2x_row", "2x_col"), mxjax.quantize_2x(x, fmt)):
      out[f"{name}.data"], out[f"{name}.scales"] = a.data, a.scales
  return out


def main(path: str):
  results, custom_calls = {}, 0
  for name, x in inputs().items():
    x = jnp.asarray(x)
    cases = {f"{fmt}.{mode}": functools.partial(surface, fmt=fmt, mode=mode, block_sizes=(32,))
             for fmt in FORMAT_NAMES for mode in SCALE_MODES}
    cases.update({f: functools.partial(block_surface, fmt=bf) for f, bf in BLOCK_FORMATS.items()})
    for case, run in cases.items():
      fn = jax.jit(run)
      hlo = fn.lower(x).compile().as_text()
      custom_calls += sum(hlo.count(f'custom_call_target="{t}"') for t in TARGETS)
      for key, value in fn(x).items():
        results[f"{name}.{case}.{key}"] = np.atleast_1d(np.asarray(value)).view(np.uint8)
  np.savez(path, custom_calls=np.int64(custom_calls), **results)


if __name__ == "__main__":
  main(sys.argv[1])
