"""Runs every mxjax op on fixed inputs and saves the bytes of every result.

    MXJAX_KERNELS=xla python tests/op_surface.py OUT.npz

For tests/test_platforms.py, which runs it in processes under different kernel settings
and compares the files byte for byte. Covers every format x scale mode x orientation
(rowwise, columnwise, quantize_2x's pair), every block size, dequantize to every dtype
and fake_quantize, on all bf16 bit patterns, ragged f32 and rank-3 f16 data. Also saves
`custom_calls`: how many mxjax custom calls the compiled HLO of the whole surface has.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (DTYPES, FORMAT_NAMES, SCALE_MODES, all_bf16_patterns,  # noqa: E402
                      special_blocks)
import mxjax  # noqa: E402
from mxjax import formats  # noqa: E402


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


def surface(x, fmt: str, mode: str) -> dict:
  """name -> result array of every op on `x` for one format and scale mode."""
  out = {}
  for block_size in formats.BLOCK_SIZES:
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


def main(path: str):
  results, custom_calls = {}, 0
  for name, x in inputs().items():
    x = jnp.asarray(x)
    for fmt in FORMAT_NAMES:
      for mode in SCALE_MODES:
        fn = jax.jit(lambda v, fmt=fmt, mode=mode: surface(v, fmt, mode))
        hlo = fn.lower(x).compile().as_text()
        custom_calls += sum(hlo.count(f'custom_call_target="{t}"') for t in
                            ("mxjax_quantize", "mxjax_quantize_2x", "mxjax_dequantize",
                             "mxjax_fake_quantize"))
        for key, value in fn(x).items():
          results[f"{name}.{fmt}.{mode}.{key}"] = np.asarray(value).view(np.uint8)
  np.savez(path, custom_calls=np.int64(custom_calls), **results)


if __name__ == "__main__":
  main(sys.argv[1])
