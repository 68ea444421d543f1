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


# The programs run the kernel bodies on the host only, so their device code (every kernel
# the included .cu files launch) is never run: it is emitted as PTX for one virtual
# architecture at cicc -O0, with no ptxas (the library's build compiles it for real). That
# and a lower host optimization where the run stays short take these two tests from about
# 430 s to about 130 s of a 2-core machine's suite run.
def _check(tmp_path, source: str, host_opt: str, timeout: int):
  exe = tmp_path / source
  build = subprocess.run(
      [NVCC, "-std=c++17", host_opt, "-gencode=arch=compute_75,code=compute_75", "-Xcicc",
       "-O0", f"-I{ROOT / 'ffi'}", f"-I{ROOT / 'ffi/include'}", "-isystem",
       jax.ffi.include_dir(), str(ROOT / f"ffi/cuda/tests/{source}.cu"), "-o", str(exe)],
      capture_output=True, text=True)
  assert build.returncode == 0, build.stderr[-4000:]
  run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout)
  assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
  assert "all passed" in run.stdout
  assert "FAIL" not in run.stdout


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_cuda_kernel_bodies_equal_cpu_kernels_on_the_host(tmp_path):
  _check(tmp_path, "host_check", "-O0", 300)  # runs in ~5 s unoptimized


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_cuda_block_kernel_bodies_equal_cpu_block_kernels_on_the_host(tmp_path):
  _check(tmp_path, "block_host_check", "-O1", 600)  # ~30 s at -O0, ~8 s at -O1
