#!/bin/bash
# One run on a GPU machine (H100 / H200): build mxjax with CUDA (sm_90a), check every CUDA
# path against the CPU kernels and the oracle, memcheck them, and time quantize (against a
# device-to-device copy), the GEMMs (against a bf16 GEMM with bf16 gradients) and a
# training step. Run from the project root there: `bash benchmarks/gpu/device_check.sh`.
# Outputs go to $OUT (log.txt and the tables); each step has its own timeout.
#   SKIP_BUILD=1   reuse the installed build (a second call on a warm machine)
#   ONLY="a b"     run only the named sections (env build checks kernels quantize gemm
#                  step matmul)
# The checks run side by side (the GPU has room; their time is XLA compiling on the host
# cores): gpu_check.py in 8 shards, gpu_check_block.py, the FP8 GEMM's oracle check,
# memcheck and tests/test_quantize_exact.py. The timings then run one at a time.
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
  git -C "$P" log -1 --format='commit %h %s' 2>/dev/null
fi

if want kernels; then  # the standalone kernel benchmark builds beside the package
  el "== nvcc bench_kernels.cu (background)"
  ( nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DMXJAX_CUDA_KERNELS_ONLY \
      -Iffi -Iffi/include ffi/cuda/tests/bench_kernels.cu -o /tmp/bench_kernels \
      > /tmp/bench_build.txt 2>&1 && echo "bench_kernels built" >> /tmp/bench_build.txt ) &
fi

if want build && [ -z "${SKIP_BUILD:-}" ]; then
  el "== build (MXJAX_CUDA=ON, sm_90a)"
  MXJAX_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 CMAKE_ARGS="-DMXJAX_CUDA_ARCHITECTURES=90a" \
    timeout 300 python3 -m pip install --no-build-isolation --no-deps --no-index . > /tmp/build.txt 2>&1
  rc=$?; el "build rc=$rc"; tail -2 /tmp/build.txt
  [ $rc -eq 0 ] || { grep -iE "error|fatal" /tmp/build.txt | head -40; exit 1; }
fi
cd /tmp
python3 -c "import mxjax, json; i = mxjax.backend_info(); print(i['build'], i.get('device'))"

if want checks; then
  el "== checks side by side: gpu_check.py x 8 shards, gpu_check_block.py, fp8 GEMM oracle, memcheck, test_quantize_exact.py"
  rm -rf /tmp/t /tmp/chk && mkdir -p /tmp/chk && cp -r "$P/tests" /tmp/t
  pids=()
  for i in 0 1 2 3 4 5 6 7; do
    ( MXJAX_KERNELS=ffi timeout 240 python3 "$P/ffi/cuda/tests/gpu_check.py" --shard $i/8 \
        > /tmp/chk/mx_$i.txt 2>&1; echo "rc=$?" >> /tmp/chk/mx_$i.txt ) & pids+=($!)
  done
  ( MXJAX_KERNELS=ffi timeout 240 python3 "$P/ffi/cuda/tests/gpu_check_block.py" --no-timing \
      > /tmp/chk/block.txt 2>&1; echo "rc=$?" >> /tmp/chk/block.txt ) & pids+=($!)
  ( timeout 240 python3 "$P/ffi/cuda/tests/gpu_check_fp8_gemm.py" --no-timing \
      > /tmp/chk/gemm.txt 2>&1; echo "rc=$?" >> /tmp/chk/gemm.txt ) & pids+=($!)
  ( MXJAX_KERNELS=ffi timeout 240 compute-sanitizer --tool memcheck --print-limit 20 \
      python3 "$P/benchmarks/gpu/memcheck_calls.py" > /tmp/chk/memcheck.txt 2>&1
    echo "rc=$?" >> /tmp/chk/memcheck.txt ) & pids+=($!)
  ( MXJAX_KERNELS=ffi timeout 240 python3 -m pytest -q -p no:cacheprovider -n 3 -o addopts="" \
      t/test_quantize_exact.py > /tmp/chk/exact.txt 2>&1; echo "rc=$?" >> /tmp/chk/exact.txt ) & pids+=($!)
  wait "${pids[@]}"
  for f in /tmp/chk/*.txt; do echo "=== $f"; cat "$f"; done > "$OUT/checks.txt"
  for i in 0 1 2 3 4 5 6 7; do echo "-- gpu_check.py shard $i/8"; grep -v Warning /tmp/chk/mx_$i.txt | tail -5; done
  echo "-- gpu_check_block.py"; tail -6 /tmp/chk/block.txt
  echo "-- gpu_check_fp8_gemm.py"; tail -22 /tmp/chk/gemm.txt
  echo "-- memcheck"; tail -4 /tmp/chk/memcheck.txt
  echo "-- test_quantize_exact.py (MXJAX_KERNELS=ffi, GPU default device)"; tail -4 /tmp/chk/exact.txt
  el "checks done"
fi

if want gemm; then
  el "== FP8 block GEMM (cuBLASLt) against a bf16 dot, 8192^3 and 16384x8192x8192"
  timeout 60 python3 "$P/ffi/cuda/tests/gpu_check_fp8_gemm.py" --timing-only 2>&1 \
    | tee "$OUT/fp8_gemm.txt" | tail -9
  el "gemm rc=${PIPESTATUS[0]}"
fi

if want step; then
  el "== training step of the LM at d_model 1024 (formats against bf16), kernels by kind"
  MXJAX_KERNELS=ffi timeout 150 python3 "$P/benchmarks/step.py" --big --reps 6 --profile 6 \
    --formats mxfp8_e4m3,fp8_block,nvfp4 2>&1 | tee "$OUT/step.txt" | tail -40
  el "step rc=${PIPESTATUS[0]}"
fi

if want kernels; then
  el "== bench_kernels (standalone: each kernel variant against a D2D copy)"
  wait; tail -1 /tmp/bench_build.txt
  [ -x /tmp/bench_kernels ] && timeout 90 /tmp/bench_kernels 16384 16384 10 2>&1 | tee "$OUT/bench_kernels.txt" | tail -4
  el "bench_kernels rc=${PIPESTATUS[0]}"
fi

if want quantize; then
  el "== quantize on the GPU: kernels against a device copy (MX, then the block formats)"
  MXJAX_KERNELS=ffi timeout 60 python3 "$P/benchmarks/quantize.py" --shape 16384,16384 \
    --formats e4m3,e2m1 --reps 15 2>&1 | tee "$OUT/quantize.txt" | tail -14
  MXJAX_KERNELS=ffi timeout 90 python3 "$P/ffi/cuda/tests/gpu_check_block.py" --timing-only \
    2>&1 | tee -a "$OUT/quantize.txt" | tail -18
  el "quantize rc=${PIPESTATUS[0]}"
fi

if want matmul; then
  el "== matmul: MX, FP8 blocks (cuBLASLt), NVFP4 against bf16 with bf16 gradients"
  MXJAX_KERNELS=ffi timeout 120 python3 "$P/benchmarks/matmul.py" --size 8192 --no-f32 \
    --recipes fp8_block,nvfp4 --reps 9 2>&1 | tee -a "$OUT/matmul.txt" | tail -22
  el "matmul rc=${PIPESTATUS[0]}"
fi
el "== done"
