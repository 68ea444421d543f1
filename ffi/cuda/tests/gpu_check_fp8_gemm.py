"""GPU check of mxjax_fp8_block_gemm (FP8 x FP8 with FP32 1x128 / 128x128 block scales
through cuBLASLt) for a Hopper GPU (compute capability 9.x) and a CUDA jaxlib:

  python ffi/cuda/tests/gpu_check_fp8_gemm.py            # correctness, refusals, timing
  python ffi/cuda/tests/gpu_check_fp8_gemm.py --no-timing
  python ffi/cuda/tests/gpu_check_fp8_gemm.py --timing-only

Exit status 0 when every check passes (on a GPU that is not 9.x: when the target refuses
it with its "compute capability 9.x" message), 1 otherwise; a table at the end.

1. Correctness. Operands are quantized on the CPU with mxjax.quantize (bit-equal to
   mxjax.reference.block_quantize): a in 1x128 blocks, b in 1x128 blocks or 128x128 tiles,
   FP32_POW2 and FP32 scales, e4m3 / e5m2, with blocks of zeros, tiny (2^-50) and huge
   (2^70, in a) amax among random magnitudes 2^[-20, 20]. The oracle is the float64 product of
   reference.block_dequantize'd operands. Bound, per output element:
     |got - ref| <= 2^-9 * S + u_out * |ref| + floor,   S = sum_k |a[m, k] * b[n, k]|,
   u_out the output's unit roundoff (f32 2^-24, bf16 2^-8, f16 2^-11) and floor its
   smallest normal spacing. Why: the FP8 products are exact; cuBLASLt sums each 128-wide K
   block on the tensor cores, whose FP8 accumulation keeps about 14 significant bits on
   Hopper (DeepSeek-V3 report, 3.3.2; error up to a few 2^-14 of the block's sum of
   magnitudes), then promotes the block's partial sum to f32 (acc = fma(partial * s1, s2,
   acc): a few f32 roundings, 2^-24 each) and rounds once to the output type. A wrong scale
   layout or block mapping errs by factors of 2^k (the blocks' magnitudes differ by up to
   2^40): each case also shows that the bound rejects an oracle with a's scales shifted by
   one block. The outputs' memory is poisoned with NaN first; NaN never passes.
2. Refusals: the raw target (bypassing the wrapper's checks) refuses M % 8, K % 16,
   E5M2 x E5M2 and b_block_rows = 64 with the rule named, without crashing.
3. Timing: the GEMM (1x128 a, 128x128 and 1x128 b, bf16 out) at 8192^3 and
   16384 x 8192 x 8192 (M x N x K) against a bf16 x bf16 -> bf16 dot of the same shape,
   same run: median of rounds of back-to-back calls. Goal: >= 1.4x the bf16 speed at 8192^3.
"""

import argparse
import ctypes
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import mxjax
from mxjax import reference
from mxjax._src import extension
from mxjax._src import fp8_block_gemm as fbg
from mxjax._src.formats import BlockFormat

CPU = jax.devices("cpu")[0]
try:
  GPU = jax.devices("gpu")[0]
except RuntimeError:  # no GPU backend: main() says so
  GPU = None
F8 = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
U_OUT = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
FLOOR = {"float32": 2.0**-149, "bfloat16": 2.0**-133, "float16": 2.0**-24}
RTOL_S = 2.0**-9
_dequantize = jax.jit(reference.block_dequantize, static_argnames=("bf", "axis"))
ROWS = []  # the final table
FAILED = []


CASES = [  # check_case's arguments
    dict(name="square 1Dx1D", m=128, n=128, k=128),
    dict(name="square 1Dx2D bf16", m=256, n=384, k=512, b_block=128, out="bfloat16"),
    dict(name="tiny", m=8, n=8, k=16, specials=False),
    dict(name="K < 128", m=320, n=336, k=64, b_block=128),
    dict(name="K < 128 1D", m=320, n=336, k=64),
    dict(name="odd M,N,K (L=4)", m=200, n=264, k=400, b_block=128),
    dict(name="odd M,N,K (L=6, padded tiles)", m=200, n=264, k=656, b_block=128),
    dict(name="odd M,N,K 1D", m=200, n=264, k=656),
    dict(name="e5m2 a", m=256, n=256, k=1024, a_el="e5m2", b_block=128, out="bfloat16"),
    dict(name="e5m2 b", m=256, n=256, k=1024, b_el="e5m2", b_block=1),
    dict(name="FP32 (non-pow2) scales", m=264, n=136, k=1024, scale="fp32", b_block=128),
    dict(name="FP32 scales 1D", m=264, n=136, k=1024, scale="fp32"),
    dict(name="f16 out", m=256, n=256, k=512, b_block=128, out="float16"),
    dict(name="batched a [2, 64, K]", m=128, n=256, k=384, lead=(2, 64), b_block=128),
    dict(name="large", m=1024, n=1024, k=4096, b_block=128, out="bfloat16"),
    dict(name="large 1D f32", m=1024, n=512, k=4096),
]


def report(name, shape, status, detail=""):
  ROWS.append((name, shape, status, detail))
  print(f"{status:6s} {name} {shape} {detail}", flush=True)
  if status == "FAIL":
    FAILED.append(name)


def cublaslt_version():
  """cublasLtGetVersion() of the libcublasLt this process loaded (None if not loaded)."""
  try:
    with open("/proc/self/maps") as f:
      libs = sorted({line.split()[-1] for line in f if "libcublasLt.so" in line})
    return ctypes.CDLL(libs[0]).cublasLtGetVersion() if libs else None
  except (OSError, IndexError, AttributeError):
    return None


def block_data(rng, rows, k, row_block, span=20, zeros=True, tiny=True, huge=False):
  """[rows, k] f32: random normals scaled per block (row_block x 128) by 2^U[-span, span];
  about 1/16 of the blocks all zero, 1/16 at 2^-50 and (huge) 1/32 at 2^70 in magnitude."""
  rb, kb = -(-rows // row_block), -(-k // 128)
  e = rng.integers(-span, span + 1, (rb, kb)).astype(np.float64)
  flat = e.reshape(-1)
  pick = rng.permutation(flat.size)
  n16, n32 = max(1, flat.size // 16), max(1, flat.size // 32)
  if zeros:
    flat[pick[:n16]] = -np.inf
  if tiny:
    flat[pick[n16: 2 * n16]] = -50
  if huge:
    flat[pick[2 * n16: 2 * n16 + n32]] = 70
  scale = np.repeat(np.repeat(np.exp2(e), row_block, 0), 128, 1)[:rows, :k]
  return (rng.standard_normal((rows, k)) * scale).astype(np.float32)


def quantized(x, bf):
  """(float8 codes, f32 scales) on the GPU and the f64 dequantized oracle operand (CPU)."""
  with jax.default_device(CPU):
    xc = jax.device_put(jnp.asarray(x), CPU)
    a = mxjax.quantize(xc, bf, axis=-1)
    deq = _dequantize(*reference.block_quantize(xc, bf, axis=-1), bf, axis=-1)
  f8, sc = a.data, a.scales
  return (jax.device_put(f8, GPU), jax.device_put(sc, GPU), np.asarray(deq, np.float64),
          np.asarray(sc))


def poison(shape, dtype):
  """Fills and frees a NaN buffer of the output's size, which the next output likely reuses."""
  p = jax.device_put(jnp.full(shape, jnp.nan, dtype), GPU).block_until_ready()
  p.delete()


def within(got, ref, s, out):
  """(element passes, |got - ref| / bound); NaN fails."""
  bound = RTOL_S * s + U_OUT[out] * np.abs(ref) + FLOOR[out]
  ratio = np.abs(got - ref) / bound
  return ratio <= 1, ratio


def check_case(name, m, n, k, a_el="e4m3", b_el="e4m3", b_block=1, out="float32",
               scale="fp32_pow2", specials=True, lead=None, seed=0):
  shape = f"M={m} N={n} K={k}" + (f" a{list(lead)}" if lead else "")
  tag = f"{name}: a {a_el} 1x128, b {b_el} {'128x128' if b_block == 128 else '1x128'}, " \
        f"{scale} scales, out {out}"
  rng = np.random.default_rng(seed)
  # Huge blocks in a only (a huge x huge product would overflow f32); f16 out: small spans.
  span = 4 if out == "float16" else 20
  xa = block_data(rng, m, k, 1, span, specials, specials, specials and out != "float16")
  xb = block_data(rng, n, k, b_block, span, specials, specials)
  fa = BlockFormat(a_el, scale, (1, 128))
  fb = BlockFormat(b_el, scale, (b_block, 128))
  a, sa, da, sa_host = quantized(xa, fa)
  b, sb, db, _ = quantized(xb, fb)
  ref = da @ db.T
  s = np.abs(da) @ np.abs(db).T
  if lead:
    a = a.reshape(*lead, k)
    sa = sa.reshape(*lead, -1)
  poison((*(lead or (m,)), n), jnp.dtype(out))
  got = fbg.fp8_block_gemm(a, sa, b, sb, b_block=b_block, out_dtype=jnp.dtype(out))
  got = np.asarray(got.astype(jnp.float32), np.float64).reshape(m, n)
  ok, ratio = within(got, ref, s, out)
  nan = int(np.isnan(got).sum())
  # The bound must reject a's scales moved by one block (a layout bug's signature).
  kb = sa_host.shape[-1]
  if kb > 1:
    shifted = np.repeat(np.roll(sa_host, 1, axis=1).astype(np.float64), 128, 1)[:, :k]
    own = np.repeat(sa_host.astype(np.float64), 128, 1)[:, :k]
    with np.errstate(invalid="ignore", divide="ignore"):
      wrong_a = np.where(own != 0, da / np.where(own == 0, 1, own) * shifted, 0)
    rejects = not within(got, wrong_a @ db.T, s, out)[0].all()
  else:
    rejects = None
  detail = f"max err/bound {np.nanmax(ratio):.3g}, {int((~ok).sum())} of {ok.size} over"
  if out == "float32":  # the accumulation error itself (f32 rounding of out is negligible)
    e = np.abs(got - ref) / np.where(s > 0, s, 1)
    detail += f"; err/S max {np.nanmax(e):.1e}, median {np.nanmedian(e):.1e}"
  detail += f"; NaN {nan}; shifted-scale oracle rejected: {rejects}"
  if nan or not ok.all() or rejects is False:
    report(tag, shape, "FAIL", detail)
  else:
    report(tag, shape, "ok", detail)


def check_overflow_probe():
  """Informational: a block amax of 2^126 in a with tiny b (true output finite). cuBLASLt
  multiplies a block's partial sum by one scale before the other; with a's scale first the
  f32 intermediate overflows (TransformerEngine's reference: 1-D scale first for 2D x 1D)."""
  m = n = 128
  k = 256
  xa = np.ones((m, k), np.float32) * np.float32(2.0**126)
  xb = np.ones((n, k), np.float32) * np.float32(2.0**-40)
  for b_block in (1, 128):
    fa = BlockFormat("e4m3", "fp32_pow2", (1, 128))
    fb = BlockFormat("e4m3", "fp32_pow2", (b_block, 128))
    a, sa, da, _ = quantized(xa, fa)
    b, sb, db, _ = quantized(xb, fb)
    got = np.asarray(fbg.fp8_block_gemm(a, sa, b, sb, b_block=b_block, out_dtype=jnp.float32))
    ref = da @ db.T
    report(f"overflow probe (info): a amax 2^126, b 2^-40, b {b_block}-row blocks",
           f"M={m} N={n} K={k}", "info",
           f"oracle max {np.abs(ref).max():.3g}; got {int(np.isinf(got).sum())} Inf, "
           f"{int(np.isnan(got).sum())} NaN of {got.size}")


def raw_call(a, sa, b, sb, b_block_rows, out_dtype=jnp.float32):
  lead, n = a.shape[:-1], b.shape[0]
  call = jax.ffi.ffi_call(fbg.TARGET, (jax.ShapeDtypeStruct((*lead, n), out_dtype),
                                       jax.ShapeDtypeStruct((1 << 20,), jnp.uint8)))
  return call(a, sa, b, sb, b_block_rows=b_block_rows)[0].block_until_ready()


def check_refusals():
  def ops(m, n, k, ad=jnp.float8_e4m3fn, bd=jnp.float8_e4m3fn, brows=None):
    brows = n if brows is None else brows
    kb = -(-k // 128)
    return (jax.device_put(jnp.zeros((m, k), ad), GPU),
            jax.device_put(jnp.ones((m, kb), jnp.float32), GPU),
            jax.device_put(jnp.zeros((n, k), bd), GPU),
            jax.device_put(jnp.ones((brows, kb), jnp.float32), GPU))

  cases = [
      ("M % 8 (M=12)", ops(12, 16, 128), 1, "M % 8 == 0, N % 8 == 0 and K % 16 == 0"),
      ("K % 16 (K=200)", ops(16, 16, 200), 1, "M % 8 == 0, N % 8 == 0 and K % 16 == 0"),
      ("E5M2 x E5M2", ops(16, 16, 128, jnp.float8_e5m2, jnp.float8_e5m2), 1, "E5M2 x E5M2"),
      ("b_block_rows=64", ops(16, 16, 128), 64, "b_block_rows must be 1"),
      ("128x128 b_scales shape", ops(16, 16, 128), 128, "b_scales must be float32 [ceil(N/128)"),
  ]
  for name, args, brows, words in cases:
    try:
      raw_call(*args, brows)
      report(f"refusal: {name}", "", "FAIL", "ran instead of refusing")
    except Exception as err:  # noqa: BLE001
      text = str(err)
      status = "ok" if words in text else "FAIL"
      report(f"refusal: {name}", "", status, text.splitlines()[0][-160:] if status == "FAIL"
             else f"refused: ...{words}...")


def timed(fn, *args, reps=20, rounds=7):
  """Median seconds per call over `rounds` rounds of `reps` back-to-back calls."""
  fn(*args).block_until_ready()
  fn(*args).block_until_ready()
  per = []
  for _ in range(rounds):
    t = time.perf_counter()
    for _ in range(reps - 1):
      fn(*args)
    fn(*args).block_until_ready()
    per.append((time.perf_counter() - t) / reps)
  return float(np.median(per))


def random_fp8(key, shape, dtype):
  bits = jax.random.bits(key, shape, jnp.uint8)
  bits = jnp.where((bits & 0x7F) >= 0x7E, bits & 0x3F, bits)  # no NaN / near-max codes
  return jax.lax.bitcast_convert_type(bits, dtype)


def check_timing():
  results = {}
  for m, n, k in ((8192, 8192, 8192), (16384, 8192, 8192)):
    keys = jax.random.split(jax.random.key(0), 6)
    with jax.default_device(GPU):
      x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
      w = jax.random.normal(keys[1], (n, k), jnp.bfloat16)
      a = random_fp8(keys[2], (m, k), jnp.float8_e4m3fn)
      b = random_fp8(keys[3], (n, k), jnp.float8_e4m3fn)
      sa = jnp.exp2(jax.random.randint(keys[4], (m, k // 128), -8, 8).astype(jnp.float32))
      sb1 = jnp.exp2(jax.random.randint(keys[5], (n, k // 128), -8, 8).astype(jnp.float32))
      sb2 = sb1[: n // 128]
    dot = jax.jit(lambda x, w: jax.lax.dot_general(x, w, (((1,), (1,)), ((), ()))))
    g2 = jax.jit(lambda a, sa, b, sb: fbg.fp8_block_gemm(a, sa, b, sb, b_block=128))
    g1 = jax.jit(lambda a, sa, b, sb: fbg.fp8_block_gemm(a, sa, b, sb, b_block=1))
    flop = 2.0 * m * n * k
    t_bf16 = timed(dot, x, w)
    t_2d = timed(g2, a, sa, b, sb2)
    t_1d = timed(g1, a, sa, b, sb1)
    shape = f"M={m} N={n} K={k}"
    report("bf16 dot (bf16 out)", shape, "time", f"{t_bf16 * 1e3:.3f} ms, "
           f"{flop / t_bf16 / 1e12:.0f} TFLOP/s")
    for label, t in (("fp8 block GEMM 1x128 . 128x128", t_2d), ("fp8 block GEMM 1x128 . 1x128", t_1d)):
      ratio = t_bf16 / t
      status = "time"
      if (m, n, k) == (8192, 8192, 8192) and label.endswith("128x128"):
        status = "ok" if ratio >= 1.4 else "SLOW"
      report(label + " (bf16 out)", shape, status,
             f"{t * 1e3:.3f} ms, {flop / t / 1e12:.0f} TFLOP/s, {ratio:.2f}x bf16")
      results[(shape, label)] = ratio
  return results


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--no-timing", action="store_true")
  parser.add_argument("--timing-only", action="store_true")
  args = parser.parse_args()
  if GPU is None:
    print("FAIL: no GPU (jax.devices('gpu') is empty); run this on a Hopper GPU with a CUDA jaxlib")
    return 1
  extension.load()
  cc = GPU.compute_capability
  print(f"device: {GPU.device_kind}, compute capability {cc}, jax {jax.__version__}")
  if fbg.TARGET not in extension.targets("cuda"):
    sys.exit("FAIL: the extension has no mxjax_fp8_block_gemm (built without CUDA?)")
  if not cc.startswith("9."):
    try:
      raw_call(*(jax.device_put(x, GPU) for x in (
          jnp.zeros((8, 16), jnp.float8_e4m3fn), jnp.ones((8, 1), jnp.float32),
          jnp.zeros((8, 16), jnp.float8_e4m3fn), jnp.ones((8, 1), jnp.float32))), 1)
    except Exception as err:  # noqa: BLE001
      if "compute capability 9.x" in str(err):
        print(f"mxjax_fp8_block_gemm refused sm_{cc} as it should; available() = "
              f"{fbg.available(GPU)}")
        return 0
      print(f"FAIL: unexpected error on sm_{cc}: {err}")
      return 1
    print(f"FAIL: mxjax_fp8_block_gemm ran on sm_{cc}")
    return 1
  if not fbg.available(GPU):
    report("available() on a 9.x GPU", "", "FAIL", "False; the cases below show why")
  print(f"available(): {fbg.available(GPU)}; cuBLASLt version {cublaslt_version()}")

  for i, case in enumerate(() if args.timing_only else CASES):
    try:
      check_case(**case, seed=i)
    except Exception as err:  # noqa: BLE001
      report(case["name"], f"M={case['m']} N={case['n']} K={case['k']}", "FAIL",
             f"raised {type(err).__name__}: {str(err).splitlines()[0][:200]}")
  if not args.timing_only:
    check_overflow_probe()
    check_refusals()
  if not args.no_timing:
    check_timing()

  print("\n| check | shape | status | detail |\n|---|---|---|---|")
  for name, shape, status, detail in ROWS:
    print(f"| {name} | {shape} | {status} | {detail} |")
  print(f"\n{'FAILED: ' + ', '.join(FAILED) if FAILED else 'all checks passed'}")
  return 1 if FAILED else 0


if __name__ == "__main__":
  sys.exit(main())
