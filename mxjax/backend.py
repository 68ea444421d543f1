"""`backend_info()`: which kernels were built and which path each op takes here."""

from __future__ import annotations

import jax

from mxjax import _ffi

# The product path of mxjax.dot_general on every backend today: exactly dequantized f32
# operands into XLA's dot with f32 accumulation. The cuBLASLt block-scaled MXFP8 GEMM
# target (`mxjax_mx_gemm`, Blackwell only) is built with CUDA but not yet used by the dot:
# it has not run on a Blackwell GPU.
_DOT_PATH = "dequantize to f32 (exact) + XLA dot, f32 accumulation"


def backend_info(device: jax.Device | None = None) -> dict:
  """Describes the build and the path of each op on `device` (default: jax's first).

  Returns:
    {"build": the extension's build_info() (cpu, cuda, simd level, ...),
     "device": str, "platform": "cpu" | "gpu" | ...,
     "compute_capability": str | None (GPUs),
     "ops": {op name: path on this device}}
  """
  build = _ffi.build_info()
  device = device or jax.devices()[0]
  platform = device.platform
  capability = getattr(device, "compute_capability", None)
  if platform == "cpu":
    kernels = f"C++ FFI kernels on the XLA CPU thread pool ({build['simd']})"
  elif platform == "gpu" and build["cuda"]:
    kernels = "CUDA FFI kernels on the XLA stream"
  else:
    kernels = f"not available: this build has no kernels for platform {platform!r}"
  ops = {op: kernels for op in ("quantize", "quantize_2x", "dequantize", "fake_quantize")}
  ops["dot_general"] = f"quantize_2x ({kernels.split(' (')[0]}) + {_DOT_PATH}"
  return {"build": build, "device": str(device.device_kind), "platform": platform,
          "compute_capability": capability, "ops": ops}
