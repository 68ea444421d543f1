"""Which implementation each op runs where: the kernel setting and `backend_info()`.

Every op is lowered per platform inside one jitted program: the FFI kernels on the
platforms this build has (and trusts) them for, the plain-XLA path (`mxjax.xla_codec`,
the same bits) everywhere else. `MXJAX_KERNELS` (or `set_kernels`) chooses:

- "auto" (default): FFI kernels on "cpu" when the extension is built; XLA on every other
  platform. The CUDA kernels stay off in auto until `ffi/cuda/tests/gpu_check.py` has
  passed on a GPU (`CUDA_KERNELS_VERIFIED`).
- "ffi": the FFI kernels wherever this build has them (CUDA included); tracing for a
  default backend without kernels is an error naming the platform.
- "xla": the plain-XLA path everywhere.
"""

from __future__ import annotations

import os

import jax

from mxjax import _ffi
from mxjax._operand_dtype import cpu_operand_dtype

KERNEL_MODES = ("auto", "ffi", "xla")
#: MXJAX_SIMD caps the CPU kernels' instruction set (the widest the CPU has otherwise).
SIMD_LEVELS = ("scalar", "avx2", "avx512")

#: Set once `ffi/cuda/tests/gpu_check.py` has passed on a GPU and its output is committed
#: under benchmarks/results/. Until then "auto" runs the XLA path on GPUs.
CUDA_KERNELS_VERIFIED = False

# The product path of mxjax.dot_general on every backend today: dequantized operands
# (bf16; on CPUs without bf16 dot instructions f32, mxjax._operand_dtype) into XLA's dot
# with f32 accumulation (exact while every dequantized element is at least 2**-126, the
# smallest normal number; see mxjax.dot). The cuBLASLt block-scaled MXFP8 GEMM target
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
    build = _ffi.build_info()
  except ImportError:
    return ()
  return tuple(p for p, built in (("cpu", build["cpu"]), ("cuda", build["cuda"])) if built)


def _uses_ffi(platform: str, mode: str, built: tuple[str, ...]) -> bool:
  if platform not in built or mode == "xla":
    return False
  return mode == "ffi" or platform == "cpu" or CUDA_KERNELS_VERIFIED


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
      return f"C++ FFI kernels on the XLA CPU thread pool ({_ffi.build_info()['simd']})"
    verified = "" if CUDA_KERNELS_VERIFIED else ", not yet verified on a GPU"
    return f"CUDA FFI kernels on the XLA stream (MXJAX_KERNELS={mode}{verified})"
  if mode == "ffi":
    return f"none: MXJAX_KERNELS=ffi and this build has no FFI kernels for {platform!r}"
  why = ("MXJAX_KERNELS=xla" if mode == "xla" else
         "the CUDA kernels are not yet verified on a GPU" if platform in built else
         f"this build has no FFI kernels for {platform!r}")
  return f"plain XLA ops (mxjax.xla_codec; {why})"


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
    build = _ffi.build_info()
  except ImportError:
    build = {}
  device = device or jax.devices()[0]
  platform = _lowering_platform(device)
  path = _kernel_path(platform)
  ops = {op: path for op in ("quantize", "quantize_2x", "dequantize", "fake_quantize")}
  dtype = cpu_operand_dtype().name if platform == "cpu" else "bfloat16"
  ops["dot_general"] = (f"quantize_2x + dequantize, or fake_quantize with no backward "
                        f"({path.split(' (')[0]}), then {_DOT_PATH.format(dtype=dtype)}")
  cpu_kernels = platform == "cpu" and path.startswith("C++ FFI kernels")
  block_path = (f"C++ FFI kernels ({_ffi.build_info()['simd']})" if cpu_kernels
                else "plain XLA (mxjax.block_codec)")
  ops["block_scaled"] = (f"{block_path} for NVFP4, FP8 blocks, 2-D MX tiles and stochastic "
                         "rounding (mxjax.block_ops), the RHT in XLA, f32 products")
  return {"build": build, "kernels": get_kernels(), "device": str(device.device_kind),
          "platform": platform, "compute_capability": getattr(device, "compute_capability", None),
          "ops": ops}


def _lowering_platform(device: jax.Device) -> str:
  """jax's lowering platform name of a device: "gpu" devices are "cuda" or "rocm"."""
  if device.platform != "gpu":
    return device.platform
  return "rocm" if "rocm" in device.client.platform_version.lower() else "cuda"
