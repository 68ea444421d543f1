"""The CUDA kernels' per-thread code, run on the host and compared byte for byte with the
CPU kernels: ffi/cuda/tests/host_check.cu for the MX kernels (every format, dtype, block
size and scale mode, odd shapes with Inf / NaN / -0 / subnormals; and the 128x4 scale
swizzle), ffi/cuda/tests/block_host_check.cu for the block formats' kernels (every format,
scale kind, block, dtype, stochastic rounding, tensor scale; packed codes against the
CPU's packed codes; quantize_2x, dequantize, tensor amax). Needs nvcc, not a GPU; CI
has nvcc. The GPU itself is checked by ffi/cuda/tests/gpu_check.py and gpu_check_block.py."""

import pathlib
import shutil
import subprocess

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")


# The programs run the kernel bodies on the host only (the headers' __global__ kernels and
# launches compile only under nvcc's CUDA front end, MXJAX_CUDA_DEVICE), so nvcc compiles
# them as C++ (-x c++: the host compiler with the CUDA headers; no cudafe++, no cicc), with
# MXJAX_HD plain `inline` rather than forced inlining (far less code to generate), at a low
# host optimization where the run stays short. That takes these two tests from about 100 s
# to about 50 s of a 2-core machine (the library's build compiles the device code for real).
def _check(tmp_path, source: str, host_opt: str, timeout: int):
  exe = tmp_path / source
  build = subprocess.run(
      [NVCC, "-std=c++17", host_opt, "-x", "c++", "-DMXJAX_HD=inline", f"-I{ROOT / 'ffi'}",
       f"-I{ROOT / 'ffi/include'}", "-isystem", jax.ffi.include_dir(),
       str(ROOT / f"ffi/cuda/tests/{source}.cu"), "-o", str(exe)],
      capture_output=True, text=True)
  assert build.returncode == 0, build.stderr[-4000:]
  run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout)
  assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
  assert "all passed" in run.stdout
  assert "FAIL" not in run.stdout


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_cuda_kernel_bodies_equal_cpu_kernels_on_the_host(tmp_path):
  _check(tmp_path, "host_check", "-O0", 300)  # builds in ~12 s, runs in ~6 s


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_cuda_block_kernel_bodies_equal_cpu_block_kernels_on_the_host(tmp_path):
  _check(tmp_path, "block_host_check", "-O1", 600)  # ~24 s + 8 s (at -O0: 13 s + 45 s)
