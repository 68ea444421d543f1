#!/bin/bash
# One run on a GPU machine (H100 / H200): build mxjax with CUDA (sm_90a), check every CUDA
# path against the CPU kernels and the oracle, memcheck them, and time quantize (against a
# device-to-device copy), the GEMMs (against a bf16 GEMM with bf16 gradients) and a
# training step. Run from the project root there: `bash benchmarks/gpu/device_check.sh`.
# Outputs go to $OUT (log.txt and the tables); each step has its own timeout.
#   SKIP_BUILD=1   reuse the installed build (a second call on a warm machine)
#   ONLY="a b"     run only the named sections (env build kernels mx block gemm memcheck
#                  quantize step matmul)
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
P=$(pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG=$OUT/log.txt
exec > >(tee -a "$LOG") 2>&1
T0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

if want env; then
  el "== env"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  nvcc --version | tail -1
  python3 -c "import jax, jaxlib, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
fi

if want kernels; then  # the standalone kernel benchmark builds beside the package
  el "== nvcc bench_kernels.cu (background)"
  ( nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iffi -Iffi/include \
      -isystem "$(python3 -c 'import jax; print(jax.ffi.include_dir())')" \
      ffi/cuda/tests/bench_kernels.cu -o /tmp/bench_kernels > "$OUT/bench_build.txt" 2>&1 \
    && echo ok >> "$OUT/bench_build.txt" ) &
fi

if want build && [ -z "${SKIP_BUILD:-}" ]; then
  el "== build (MXJAX_CUDA=ON, sm_90a)"
  MXJAX_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 CMAKE_ARGS="-DMXJAX_CUDA_ARCHITECTURES=90a" \
    timeout 300 python3 -m pip install --no-build-isolation --no-deps --no-index . > "$OUT/build.txt" 2>&1
  rc=$?; el "build rc=$rc"; tail -3 "$OUT/build.txt"
  [ $rc -eq 0 ] || { grep -iE "error|fatal" "$OUT/build.txt" | head -40; exit 1; }
fi
cd /tmp
python3 -c "import mxjax, json; print(json.dumps(mxjax.backend_info(), default=str)[:1500])"

if want mx; then
  el "== gpu_check.py (MX: CUDA == CPU, byte for byte)"
  MXJAX_KERNELS=ffi timeout 150 python3 "$P/ffi/cuda/tests/gpu_check.py" 2>&1 | tail -20
  el "gpu_check rc=${PIPESTATUS[0]}"
fi

if want block; then
  el "== gpu_check_block.py (block formats: CUDA == CPU)"
  MXJAX_KERNELS=ffi timeout 150 python3 "$P/ffi/cuda/tests/gpu_check_block.py" 2>&1 | tail -30
  el "gpu_check_block rc=${PIPESTATUS[0]}"
fi

if want gemm; then
  el "== gpu_check_fp8_gemm.py (cuBLASLt FP8 block GEMM against the oracle)"
  timeout 100 python3 "$P/ffi/cuda/tests/gpu_check_fp8_gemm.py" 2>&1 | tee "$OUT/fp8_gemm.txt" | tail -40
  el "gpu_check_fp8_gemm rc=${PIPESTATUS[0]}"
fi

if want memcheck; then
  el "== compute-sanitizer memcheck over every CUDA target"
  MXJAX_KERNELS=ffi timeout 120 compute-sanitizer --tool memcheck --print-limit 20 \
    python3 "$P/benchmarks/gpu/memcheck_calls.py" 2>&1 | tail -12
  el "memcheck rc=${PIPESTATUS[0]}"
fi

if want kernels; then
  wait
  el "== bench_kernels (standalone: each kernel variant against a D2D copy)"
  tail -2 "$OUT/bench_build.txt"
  [ -x /tmp/bench_kernels ] && timeout 120 /tmp/bench_kernels 2>&1 | tee "$OUT/bench_kernels.txt" | tail -60
  el "bench_kernels rc=${PIPESTATUS[0]}"
fi

if want quantize; then
  el "== quantize on the GPU: kernels against a device copy (MX, then the block formats)"
  MXJAX_KERNELS=ffi timeout 100 python3 "$P/benchmarks/quantize.py" --shape 16384,16384 \
    --formats e4m3,e2m1 --reps 15 2>&1 | tee "$OUT/quantize.txt" | tail -14
  timeout 150 python3 "$P/benchmarks/quantize.py" --block-formats --shape 16384,16384 --reps 9 \
    2>&1 | tee -a "$OUT/quantize.txt" | tail -36
  el "quantize rc=${PIPESTATUS[0]}"
fi

if want step; then
  el "== training step of the LM at d_model 1024 (formats against bf16), every kernel on"
  MXJAX_KERNELS=ffi timeout 200 python3 "$P/benchmarks/step.py" --big --reps 6 \
    --formats mxfp8_e4m3,fp8_block,nvfp4 2>&1 | tee "$OUT/step.txt" | tail -16
  el "step rc=${PIPESTATUS[0]}"
fi

if want matmul; then
  el "== matmul: MX, FP8 blocks (cuBLASLt), NVFP4 against bf16 with bf16 gradients"
  MXJAX_KERNELS=ffi timeout 120 python3 "$P/benchmarks/matmul.py" --size 8192 --no-f32 \
    --recipes fp8_block,nvfp4 --reps 9 2>&1 | tee -a "$OUT/matmul.txt" | tail -22
  el "matmul rc=${PIPESTATUS[0]}"
fi
el "== done"
