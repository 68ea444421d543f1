"""Which implementation each op runs where: the kernel setting and `backend_info()`.

Every op is lowered per platform inside one jitted program: the FFI kernels on the
platforms this build has (and trusts) them for, the plain-XLA codec
(`mxjax._src.codec`, the same bits) everywhere else. `MXJAX_KERNELS` (or `set_kernels`)
chooses:

- "auto" (default): the CPU kernels when the extension is built; on CUDA GPUs of
  compute capability 9.0 and up, each CUDA kernel that has been verified on a GPU
  (`CUDA_VERIFIED`: byte-equal to the CPU kernels, memcheck clean); XLA elsewhere.
- "ffi": the FFI kernels wherever this build has them (CUDA included, verified or not);
  tracing for a default backend without kernels is an error naming the platform.
- "xla": the plain-XLA path everywhere.
"""

from __future__ import annotations

import os

import jax

from mxjax._src import extension
from mxjax._src.operand_dtype import cpu_operand_dtype

KERNEL_MODES = ("auto", "ffi", "xla")
#: MXJAX_SIMD caps the CPU kernels' instruction set (the widest the CPU has otherwise).
SIMD_LEVELS = ("scalar", "avx2", "avx512")

_H100_2026_11_27 = (
    "NVIDIA H100 80GB HBM3 (sm_90), driver 580.159.04, CUDA 13.0, jax 0.11.2, on "
    "2026-11-27 (commit 9d32038): ffi/cuda/tests/gpu_check.py byte-equal to the CPU "
    "kernels, compute-sanitizer memcheck 0 errors, tests/test_quantize_exact.py on the GPU "
    "483 passed (benchmarks/results/gpu-h100-2026-11-27.md)")
_H200_2026_11_27 = (
    "NVIDIA H200 (sm_90), driver 580.159.04, CUDA 13.0, jax 0.11.2, on 2026-11-27 (commit "
    "729841c): {what}, compute-sanitizer memcheck 0 errors "
    "(benchmarks/results/gpu-h200-2026-11-27.md)")
_MX_REWRITE = _H200_2026_11_27.format(
    what="the rewritten kernels and the variants now their defaults (FP8 codes by the "
    "hardware cvt, proven equal to the codec on every finite f32; 4 threads per FP8 row "
    "block; 8 x 4 columnwise dequantize tiles; quantize_2x as the rows and columns kernels) "
    "byte-equal to those verified on an H100 (" + _H100_2026_11_27 + ") on 16384^2 random "
    "inputs of every format (bench_kernels.cu)")
_BLOCK = _H200_2026_11_27.format(
    what="ffi/cuda/tests/gpu_check_block.py byte-equal to the CPU kernels (625 cases, every "
    "block format, stochastic rounding, special values)")

#: The CUDA targets verified on a GPU, with where and when; "auto" uses these (and no
#: other) on GPUs of compute capability 9.0 and up. A target is added only with the run's
#: output committed under benchmarks/results/.
CUDA_VERIFIED: dict[str, str] = {
    "mxjax_quantize": _MX_REWRITE,
    "mxjax_quantize_2x": _MX_REWRITE,
    "mxjax_dequantize": _MX_REWRITE,
    "mxjax_fake_quantize": _MX_REWRITE,
    "mxjax_block_quantize": _BLOCK,
    "mxjax_block_quantize_2x": _BLOCK,
    "mxjax_block_dequantize": _BLOCK,
    "mxjax_block_fake_quantize": _BLOCK,
    "mxjax_tensor_amax": _H200_2026_11_27.format(what="gpu_check_block.py: equal to numpy "
                                                      "(54 cases)"),
    "mxjax_fp8_block_gemm": _H200_2026_11_27.format(
        what="ffi/cuda/tests/gpu_check_fp8_gemm.py: within the error bound of the float64 "
        "product of the dequantized operands in 11 cases"),
}
#: The compute capability from which "auto" uses the verified CUDA kernels.
CUDA_MIN_CAPABILITY = (9, 0)

# The product path of mxjax.dot_general on every backend today: dequantized operands
# (bf16; on CPUs without bf16 dot instructions f32, mxjax._src.operand_dtype) into XLA's dot
# with f32 accumulation (exact while every dequantized element is at least 2**-126, the
# smallest normal number; see mxjax._src.product). The cuBLASLt block-scaled MXFP8 GEMM target
# (`mxjax_mx_gemm`, Blackwell only) is built with CUDA but not yet used by the dot: it has
# not run on a Blackwell GPU.
_DOT_PATH = "operands in {dtype} into XLA's dot, f32 accumulation"


def _check_mode(mode, source: str) -> str:
  if mode not in KERNEL_MODES:
    raise ValueError(f"{source} must be one of {KERNEL_MODES}; got {mode!r}")
  return mode


def _check_simd_cap() -> None:
  """The kernels read MXJAX_SIMD themselves and would run scalar code for a misspelled
  level; a misspelling is an error here instead."""
  cap = os.environ.get("MXJAX_SIMD", "")
  if cap and cap not in SIMD_LEVELS:
    raise ValueError(f"the MXJAX_SIMD environment variable must be one of {SIMD_LEVELS} (or "
                     f"unset: the widest level the CPU has); got {cap!r}")


_check_simd_cap()

# A jit-cache-sensitive value: a function traced under one setting is traced again under
# another, instead of running the path it was first traced with.
_KERNELS = jax.make_user_context(
    default_value=_check_mode(os.environ.get("MXJAX_KERNELS", "auto").lower(),
                              "the MXJAX_KERNELS environment variable"))


def set_kernels(mode: str) -> None:
  """Sets the kernel choice for this process: "auto", "ffi" or "xla" (as MXJAX_KERNELS).

  Jitted functions are traced again under the new setting.

  Args:
    mode: "auto" (FFI kernels where built and trusted, else the plain-XLA path), "ffi"
      (the FFI kernels; a platform this build has none for then raises a RuntimeError at
      lowering) or "xla" (the plain-XLA path everywhere: the same bits; what `jax.export`
      needs).

  Raises:
    ValueError: any other mode.
  """
  _KERNELS.set_global(_check_mode(mode, "mxjax.set_kernels' mode"))


def get_kernels() -> str:
  """The kernel choice in effect: "auto", "ffi" or "xla"."""
  return _KERNELS.value


def built_platforms() -> tuple[str, ...]:
  """The jax platforms ("cpu", "cuda") this build has FFI kernels for; () when the
  compiled extension cannot be imported."""
  try:
    build = extension.build_info()
  except ImportError:
    return ()
  return tuple(p for p, built in (("cpu", build["cpu"]), ("cuda", build["cuda"])) if built)


def _uses_ffi(platform: str, mode: str, built: tuple[str, ...]) -> bool:
  if platform not in built or mode == "xla":
    return False
  return mode == "ffi" or platform == "cpu" or (bool(CUDA_VERIFIED) and _capable_gpus())


def _capable_gpus() -> bool:
  """Whether every local CUDA GPU has compute capability `CUDA_MIN_CAPABILITY` or more."""
  try:
    gpus = jax.local_devices(backend="gpu")
  except RuntimeError:
    return False
  caps = [tuple(int(v) for v in str(getattr(d, "compute_capability", "0.0")).split("."))
          for d in gpus]
  return bool(caps) and all(c >= CUDA_MIN_CAPABILITY for c in caps)


def uses_kernel(platform: str, target: str) -> bool:
  """Whether ops lowered for `platform` call the FFI target `target` under the setting."""
  if platform not in ffi_platforms() or target not in extension.targets(platform):
    return False
  return platform != "cuda" or get_kernels() == "ffi" or target in CUDA_VERIFIED


def ffi_platforms() -> tuple[str, ...]:
  """The jax platforms whose lowering uses the FFI kernels under the current setting.

  Raises:
    RuntimeError: the setting is "ffi" and this build has no kernels for the platform of
      jax's default device.
  """
  mode, built = get_kernels(), built_platforms()
  if mode == "ffi":
    platform = _lowering_platform(jax.devices()[0])
    if platform not in built:
      raise RuntimeError(
          f"MXJAX_KERNELS=ffi, but this mxjax build has no FFI kernels for platform "
          f"{platform!r} (it has them for {list(built) or 'no platform'}); use 'auto' or 'xla'")
  return tuple(p for p in built if _uses_ffi(p, mode, built))


def _kernel_path(platform: str) -> str:
  mode, built = get_kernels(), built_platforms()
  if _uses_ffi(platform, mode, built):
    if platform == "cpu":
      return f"C++ FFI kernels on the XLA CPU thread pool ({extension.build_info()['simd']})"
    verified = ("" if mode == "ffi" else
                f"; verified on a GPU: {', '.join(sorted(CUDA_VERIFIED))} (where and how: "
                "mxjax._src.backend.CUDA_VERIFIED), the others run plain XLA")
    return f"CUDA FFI kernels on the XLA stream (MXJAX_KERNELS={mode}{verified})"
  if mode == "ffi":
    return f"none: MXJAX_KERNELS=ffi and this build has no FFI kernels for {platform!r}"
  why = ("MXJAX_KERNELS=xla" if mode == "xla" else
         f"the GPU's compute capability is under {CUDA_MIN_CAPABILITY}" if platform in built
         else f"this build has no FFI kernels for {platform!r}")
  return f"plain XLA ops (mxjax._src.codec; {why})"


def backend_info(device: jax.Device | None = None) -> dict:
  """Describes the build and the path of each op on `device` (default: jax's first).

  Returns:
    A dict::

      {"build": the extension's build_info() (cpu, cuda, simd level, ...), or {} when the
         extension is not built,
       "kernels": the setting ("auto" / "ffi" / "xla"),
       "device": str, "platform": "cpu" | "cuda" | "rocm" | "tpu" | ...,
       "compute_capability": str | None (GPUs),
       "ops": {op name: path on this device}}
  """
  try:
    build = extension.build_info()
  except ImportError:
    build = {}
  device = device or jax.devices()[0]
  platform = _lowering_platform(device)
  path = _kernel_path(platform)
  ops = {op: path for op in ("quantize", "quantize_2x", "dequantize", "fake_quantize")}
  dtype = cpu_operand_dtype().name if platform == "cpu" else "bfloat16"
  ops["dot_general"] = (f"quantize_2x + dequantize, or fake_quantize with no backward "
                        f"({path.split(' (')[0]}), then {_DOT_PATH.format(dtype=dtype)} "
                        "(f32 operands for FP32 non-power-of-two scales)")
  ops["formats"] = ("the MX kernels for E8M0 scales in 1-D blocks of 16 / 32 / 64, the "
                    "block-format kernels for every other format (NVFP4, FP8 blocks, 2-D "
                    "tiles, stochastic rounding); the RHT in XLA")
  return {"build": build, "kernels": get_kernels(), "device": str(device.device_kind),
          "platform": platform, "compute_capability": getattr(device, "compute_capability", None),
          "ops": ops}


def _lowering_platform(device: jax.Device) -> str:
  """jax's lowering platform name of a device: "gpu" devices are "cuda" or "rocm"."""
  if device.platform != "gpu":
    return device.platform
  return "rocm" if "rocm" in device.client.platform_version.lower() else "cuda"
