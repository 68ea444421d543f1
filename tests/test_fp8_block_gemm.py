"""mxjax.fp8_block_gemm without a GPU: the wrapper's contract (shapes, dtypes, refusals
with the rule named), `available()` off a Hopper GPU, and the cuBLASLt scale layouts of
ffi/cuda/fp8_block_scales.h run on the host (needs nvcc). The GEMM itself is checked on a
Hopper GPU by ffi/cuda/tests/gpu_check_fp8_gemm.py."""

import pathlib
import shutil
import subprocess

import jax
import jax.numpy as jnp
import pytest

from mxjax._src import extension
from mxjax._src import fp8_block_gemm as fbg

ROOT = pathlib.Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def operands(m=16, n=24, k=256, b_block=1, a_dtype=E4M3, b_dtype=E4M3, lead=None):
  lead = (m,) if lead is None else lead
  a = jnp.ones((*lead, k), a_dtype)
  b = jnp.ones((n, k), b_dtype)
  sa = jnp.ones((*lead, -(-k // 128)), jnp.float32)
  sb = jnp.ones((-(-n // 128) if b_block == 128 else n, -(-k // 128)), jnp.float32)
  return a, sa, b, sb


def test_not_available_off_a_hopper_gpu():
  assert not fbg.available()
  assert not fbg.available(jax.devices("cpu")[0])


def test_target_is_built_with_cuda():
  if not extension.build_info()["cuda"]:
    pytest.skip("extension built without CUDA")
  assert fbg.TARGET in extension._extension().cuda_registrations()
  assert fbg.TARGET not in extension._extension().registrations()  # no CPU twin


@pytest.mark.parametrize("a_dtype, b_dtype, match", [
    (jnp.uint8, E4M3, "must be float8_e4m3fn or float8_e5m2, got uint8"),
    (E4M3, jnp.bfloat16, "must be float8_e4m3fn or float8_e5m2, got float8_e4m3fn and bfloat16"),
    (E5M2, E5M2, "both float8_e5m2: cuBLASLt has no E5M2 x E5M2"),
])
def test_operand_dtypes_are_checked(a_dtype, b_dtype, match):
  a, sa, b, sb = operands()
  with pytest.raises(TypeError, match=match):
    fbg.fp8_block_gemm(a.astype(a_dtype) if a_dtype != jnp.uint8 else
                       jax.lax.bitcast_convert_type(a, jnp.uint8), sa,
                       b.astype(b_dtype), sb, b_block=1)


def test_out_dtype_and_scale_dtype_are_checked():
  a, sa, b, sb = operands()
  with pytest.raises(TypeError, match="out_dtype must be bfloat16, float16 or float32, got int8"):
    fbg.fp8_block_gemm(a, sa, b, sb, b_block=1, out_dtype=jnp.int8)
  with pytest.raises(TypeError, match="a_scales must be float32 decode scales"):
    fbg.fp8_block_gemm(a, sa.astype(jnp.bfloat16), b, sb, b_block=1)
  with pytest.raises(TypeError, match="b_scales must be float32 decode scales"):
    fbg.fp8_block_gemm(a, sa, b, sb.astype(jnp.uint8), b_block=1)


def test_b_block_is_1_or_128():
  a, sa, b, sb = operands()
  with pytest.raises(ValueError, match=r"b_block must be 1 \(1x128 blocks\) or 128"):
    fbg.fp8_block_gemm(a, sa, b, sb, b_block=32)


def test_operand_shapes_are_checked():
  a, sa, b, sb = operands(m=16, n=24, k=256)
  with pytest.raises(ValueError, match=r"needs a_codes \[..., K\] \(rank >= 2\)"):
    fbg.fp8_block_gemm(a[0], sa[0], b, sb, b_block=1)
  with pytest.raises(ValueError, match=r"needs a_codes \[..., K\] .* and b_codes \[N, K\]"):
    fbg.fp8_block_gemm(a, sa, b[:, :128], sb, b_block=1)
  with pytest.raises(ValueError, match=r"a_scales must have shape \(16, 2\)"):
    fbg.fp8_block_gemm(a, sa[:, :1], b, sb, b_block=1)
  # 1x128 scales of b where 128x128 tiles are declared, and the other way round.
  with pytest.raises(ValueError, match=r"b_scales must have shape \(1, 2\) "
                                       r"\(\[ceil\(N/128\), ceil\(K/128\)\] for b_block=128\)"):
    fbg.fp8_block_gemm(a, sa, b, sb, b_block=128)
  _, _, _, sb2 = operands(m=16, n=24, k=256, b_block=128)
  with pytest.raises(ValueError, match=r"b_scales must have shape \(24, 2\) "
                                       r"\(\[N, ceil\(K/128\)\] for b_block=1\)"):
    fbg.fp8_block_gemm(a, sa, b, sb2, b_block=1)


@pytest.mark.parametrize("m, n, k", [(12, 16, 128), (16, 20, 128), (16, 16, 200), (16, 16, 8)])
def test_shapes_cublaslt_refuses_name_the_rule(m, n, k):
  a, sa, b, sb = operands(m, n, k)
  msg = fbg.shape_error(m, n, k)
  assert msg is not None and f"got M={m}, N={n}, K={k}" in msg
  with pytest.raises(ValueError, match=r"needs M % 8 == 0, N % 8 == 0 and K % 16 == 0"):
    fbg.fp8_block_gemm(a, sa, b, sb, b_block=1)


def test_accepted_shapes():
  for m, n, k in [(8, 8, 16), (16, 24, 400), (4096, 4096, 8192)]:
    assert fbg.shape_error(m, n, k) is None
  # M counts every leading dim of a: [2, 4, K] has M = 8.
  a, sa, b, sb = operands(n=8, k=32, lead=(2, 4))
  with pytest.raises(RuntimeError, match="compute capability 9.x"):
    fbg.fp8_block_gemm(a, sa, b, sb, b_block=1)


@pytest.mark.parametrize("b_block", [1, 128])
def test_valid_call_on_cpu_says_where_it_runs(b_block):
  a, sa, b, sb = operands(m=16, n=136, k=400, b_block=b_block, b_dtype=E5M2)
  bits = jax.lax.bitcast_convert_type(sb, jnp.uint32)  # f32 bits are accepted as scales
  with pytest.raises(RuntimeError, match=r"runs on NVIDIA GPUs of compute capability 9.x "
                                         r"\(Hopper\); a_codes is on"):
    fbg.fp8_block_gemm(a, sa, b, bits, b_block=b_block, out_dtype=jnp.float32)


def test_under_jit_on_cpu_xla_cannot_lower_it():
  if not extension.build_info()["cuda"]:
    pytest.skip("extension built without CUDA (the target is not registered at all)")
  a, sa, b, sb = operands()
  with pytest.raises(Exception, match=fbg.TARGET):
    jax.jit(lambda *x: fbg.fp8_block_gemm(*x, b_block=1))(a, sa, b, sb)


def test_scratch_holds_the_relaid_scales_and_the_workspace():
  # 1x128: a's [M, L] and b's [N, L] transposed; 128x128: b's tiles [ceil(N/128), L4].
  assert fbg.scratch_bytes(256, 512, 1024, 1) == 256 + 256 * 8 * 4 + 512 * 8 * 4 + (32 << 20)
  assert fbg.scratch_bytes(8, 8, 16, 128) == 256 + 256 + 256 + (32 << 20)
  assert fbg.scratch_bytes(256, 300, 640, 128) == 256 + 256 * 5 * 4 + 256 + (32 << 20)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_scale_relayout_matches_cublaslt_layouts_on_the_host(tmp_path):
  exe = tmp_path / "fp8_scale_layout_check"
  subprocess.run([NVCC, "-std=c++17", "-O2", f"-I{ROOT / 'ffi'}", f"-I{ROOT / 'ffi/include'}",
                  str(ROOT / "ffi/cuda/tests/fp8_scale_layout_check.cu"), "-o", str(exe)],
                 check=True, capture_output=True, text=True)
  run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
  assert "all passed" in run.stdout
