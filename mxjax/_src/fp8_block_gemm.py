"""FP8 GEMM with FP32 block scales on Hopper tensor cores: the CUDA FFI target
`mxjax_fp8_block_gemm` (ffi/cuda/gemm_fp8_block.cu, cuBLASLt's VEC128_32F and
BLK128x128_32F scale modes; compute capability 9.x and cuBLASLt >= 12.9 only).

    out[..., n] = sum_j a_scales[..., j] * b_scale(n, j) * sum_{k in block j} a[..., k] * b[n, k]

with the FP8 products summed in f32 per 128-wide K block and the blocks accumulated in f32.
The operands are `mxjax.reference.block_quantize`'s for `FP8_1X128` (a; b with
`b_block=1`) or `FP8_128X128` (b with `b_block=128`) along K, codes viewed as float8 and
scales as f32 decode multipliers. No autodiff rule: callers wire it into their VJP.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from mxjax._src import extension

TARGET = "mxjax_fp8_block_gemm"
BLOCK = 128
#: cuBLASLt's workspace (its advice for Hopper), passed as part of a scratch result.
WORKSPACE_BYTES = 32 << 20
_FP8 = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))
_OUT = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def _blocks(n: int) -> int:
  return -(-n // BLOCK)


def shape_error(m: int, n: int, k: int) -> str | None:
  """Why cuBLASLt's block-scaled FP8 GEMM refuses out[m, n] = a[m, k] . b[n, k]^T, or None."""
  if m % 8 or n % 8 or k % 16:
    return (f"cuBLASLt's FP8 block-scaled GEMM needs M % 8 == 0, N % 8 == 0 and K % 16 == 0 "
            f"(16-byte aligned FP8 rows, scale layouts of M, N multiples of 4, 16-byte rows "
            f"of out); got M={m}, N={n}, K={k}")
  return None


def scratch_bytes(m: int, n: int, k: int, b_block: int) -> int:
  """Bytes of the scratch result: both scales in cuBLASLt's layouts plus the workspace."""
  pad = lambda x: -(-x // 256) * 256  # noqa: E731
  rows = _blocks(n) if b_block == BLOCK else n
  l = _blocks(k)
  b_cols = -(-l // 4) * 4 if b_block == BLOCK else l
  return 256 + pad(4 * m * l) + pad(4 * rows * b_cols) + WORKSPACE_BYTES


def _f32_scales(s, name):
  s = jnp.asarray(s)
  if s.dtype == jnp.uint32:
    return jax.lax.bitcast_convert_type(s, jnp.float32)
  if s.dtype != jnp.float32:
    raise TypeError(f"{name} must be float32 decode scales (or their uint32 bits), got {s.dtype}")
  return s


def _check_device(x, name):
  """Concrete arrays on a non-CUDA device: say so before XLA fails to lower the call."""
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
    for d in x.devices():
      if d.platform != "gpu" or not str(getattr(d, "compute_capability", "")).startswith("9."):
        raise RuntimeError(f"{TARGET} runs on NVIDIA GPUs of compute capability 9.x "
                           f"(Hopper); {name} is on {d} (see fp8_block_gemm.available())")


def fp8_block_gemm(a_codes, a_scales, b_codes, b_scales, *, b_block: int,
                   out_dtype=jnp.bfloat16) -> jax.Array:
  """out = a . b^T from FP8 codes and FP32 block scales on the FP8 tensor cores.

  Args:
    a_codes: [..., K] float8_e4m3fn or float8_e5m2, quantized along K in 1x128 blocks.
    a_scales: [..., ceil(K/128)] float32 decode scales (or uint32 f32 bits);
      a_scales[m, j] covers a_codes[m, 128j : 128j + 128].
    b_codes: [N, K] float8 (not float8_e5m2 when a_codes is: cuBLASLt has no E5M2 x E5M2).
    b_scales: b_block=1: [N, ceil(K/128)], 1x128 blocks along K as a's; b_block=128:
      [ceil(N/128), ceil(K/128)], b_scales[t, j] covers b_codes[128t : 128t+128,
      128j : 128j+128]. float32 or uint32 bits.
    b_block: 1 or 128, the rows of b's blocks.
    out_dtype: bfloat16, float16 or float32.

  Returns:
    [..., N] of out_dtype (M, N multiples of 8, K of 16: `shape_error`). Runs only where
    `available()` holds (concrete non-GPU arrays raise RuntimeError).
  """
  a = jnp.asarray(a_codes)
  b = jnp.asarray(b_codes)
  if a.dtype not in _FP8 or b.dtype not in _FP8:
    raise TypeError(f"a_codes and b_codes must be float8_e4m3fn or float8_e5m2, got "
                    f"{a.dtype} and {b.dtype}")
  if a.dtype == b.dtype == jnp.float8_e5m2:
    raise TypeError("a_codes and b_codes are both float8_e5m2: cuBLASLt has no E5M2 x E5M2 "
                    "FP8 GEMM (make one of them float8_e4m3fn)")
  out_dtype = jnp.dtype(out_dtype)
  if out_dtype not in _OUT:
    raise TypeError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
  if b_block not in (1, BLOCK):
    raise ValueError(f"b_block must be 1 (1x128 blocks) or 128 (128x128 tiles), got {b_block!r}")
  if a.ndim < 2 or b.ndim != 2 or b.shape[1] != a.shape[-1]:
    raise ValueError(f"needs a_codes [..., K] (rank >= 2) and b_codes [N, K]; got "
                     f"{a.shape} and {b.shape}")
  *lead, k = a.shape
  n = b.shape[0]
  m = math.prod(lead)
  sa = _f32_scales(a_scales, "a_scales")
  sb = _f32_scales(b_scales, "b_scales")
  if sa.shape != (*lead, _blocks(k)):
    raise ValueError(f"a_scales must have shape {(*lead, _blocks(k))} ([..., ceil(K/128)]), "
                     f"got {sa.shape}")
  want_b = (_blocks(n) if b_block == BLOCK else n, _blocks(k))
  if sb.shape != want_b:
    layout = "[ceil(N/128), ceil(K/128)]" if b_block == BLOCK else "[N, ceil(K/128)]"
    raise ValueError(f"b_scales must have shape {want_b} ({layout} for b_block={b_block}), "
                     f"got {sb.shape}")
  if (err := shape_error(m, n, k)) is not None:
    raise ValueError(err)
  for x, name in ((a, "a_codes"), (b, "b_codes")):
    _check_device(x, name)
  extension.load()
  call = jax.ffi.ffi_call(
      TARGET,
      (jax.ShapeDtypeStruct((*lead, n), out_dtype),
       jax.ShapeDtypeStruct((scratch_bytes(m, n, k, b_block),), jnp.uint8)),
      vmap_method="sequential")
  out, _ = call(a, sa, b, sb, b_block_rows=int(b_block))
  return out


@functools.lru_cache(maxsize=None)
def _probe(device) -> bool:
  """Runs an 8x8x16 product on `device`: whether the target runs there and is right."""
  a = jax.device_put(jnp.full((8, 16), 2.0, jnp.float8_e4m3fn), device)
  b = jax.device_put(jnp.full((8, 16), 0.5, jnp.float8_e4m3fn), device)
  sa = jax.device_put(jnp.full((8, 1), 3.0, jnp.float32), device)
  sb = jax.device_put(jnp.full((8, 1), 0.25, jnp.float32), device)
  try:
    out = fp8_block_gemm(a, sa, b, sb, b_block=1, out_dtype=jnp.float32)
    return bool(jnp.all(out == 12.0))  # 16 * (2 * 3) * (0.5 * 0.25)
  except Exception:  # noqa: BLE001 (any refusal means "not available")
    return False


def available(device=None) -> bool:
  """Whether `fp8_block_gemm` runs on `device` (default: the first): a 9.x GPU, a CUDA
  build and cuBLASLt >= 12.9 (one tiny cached call checks)."""
  device = jax.devices()[0] if device is None else device
  if device.platform != "gpu" or not str(getattr(device, "compute_capability", "")).startswith("9."):
    return False
  try:
    if TARGET not in extension.targets("cuda"):
      return False
  except ImportError:
    return False
  return _probe(device)
