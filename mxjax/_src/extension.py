"""Loads the compiled extension `mxjax._mxjax_ffi` and registers its XLA FFI targets.

Targets for "cpu" and, when built with CUDA, "CUDA" (`targets(platform)` lists them);
registering one does not make the ops use it: `mxjax._src.backend` decides per platform.
"""

from __future__ import annotations

import functools
import os

import jax

_MISSING = (
    "mxjax's compiled extension mxjax._mxjax_ffi could not be imported ({err}). Build and "
    "install the package from the repository root with `pip install .` (needs a C++17 "
    "compiler, CMake and nanobind); for development `pip install --no-build-isolation -e .`.")


def _extension():
  try:
    from mxjax import _mxjax_ffi
  except ImportError as err:
    raise ImportError(_MISSING.format(err=err)) from err
  return _mxjax_ffi


@functools.lru_cache(maxsize=None)
def load() -> None:
  """Registers every FFI target of the extension with JAX, once per process."""
  ext = _extension()
  for name, capsule in ext.registrations().items():
    jax.ffi.register_ffi_target(name, capsule, platform="cpu", api_version=1)
  for name, capsule in ext.cuda_registrations().items():
    jax.ffi.register_ffi_target(name, capsule, platform="CUDA", api_version=1)


@functools.lru_cache(maxsize=None)
def targets(platform: str) -> frozenset[str]:
  """The FFI target names this build has for a jax platform ("cpu", "cuda"); none when
  the extension cannot be imported."""
  try:
    ext = _extension()
  except ImportError:
    return frozenset()
  found = {"cpu": ext.registrations, "cuda": ext.cuda_registrations}.get(platform)
  return frozenset(found()) if found else frozenset()


def build_info() -> dict:
  """What the extension was built with: {"cpu": bool, "cuda": bool, "simd": level in use
  ("avx512" / "avx2" / "scalar"), "simd_compiled": [levels], "sanitize": bool, "compiler": str}."""
  return dict(_extension().build_info())


def runnable_simd() -> tuple[str, ...]:
  """The CPU kernel levels this build and CPU run under the MXJAX_SIMD cap, narrowest first
  (a subset of ("scalar", "avx2", "avx512"))."""
  return tuple(_extension().runnable_simd())


def set_simd(level: str) -> None:
  """Makes `level` (one of runnable_simd()) the CPU kernel level of kernel calls from now
  on (wait for dispatched computations first). Raises ValueError for other levels."""
  if not _extension().set_simd(level):
    cap = os.environ.get("MXJAX_SIMD")
    raise ValueError(f"CPU kernel level {level!r} is not one this build and CPU run: "
                     f"{runnable_simd()}" + (f" (MXJAX_SIMD={cap!r} caps them)" if cap else ""))
