"""Shared test data and hypothesis strategies for the mxjax tests.

Data builders return numpy arrays (ml_dtypes for bf16) so tests can both feed them to JAX
and reason about them in float64 outside of XLA (whose CPU threads flush f32 subnormals).
"""

from __future__ import annotations

import functools
import os

# Eight CPU devices for the sharding tests; must be set before jax is first imported.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()

# The test processes compile XLA's CPU programs fast: at backend optimization level 0
# (LLVM's -O0) and with XLA's older CPU emitters (`--xla_cpu_use_fusion_emitters=false`).
# On test-sized inputs compiling is most of a test's time: level 0 took a fifth off three
# large test files' CPU time (460 s -> 365 s), the older emitters half of what was left
# in test_block_kernels (135 s -> 71 s). The library's quantization is elementwise IEEE
# and integer arithmetic (XLA's CPU code has no fast math in either), so its bits do not
# depend on these: test_optimization_level.py compares them with XLA's defaults. XLA's own
# f32 GEMMs and sums may round apart between the two, as between shardings; the tests
# compare those within tolerances. The children (child_env: examples, the sweep's CLI,
# test_platforms' op surface, the docs) run with XLA's defaults. A setting in XLA_FLAGS
# is kept; an XLA that no longer knows a flag (it would abort) is not given it.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _xla_knows(flag: str) -> bool:
  """Whether this jaxlib's XLA accepts `flag` (those of jaxlib 0.10 are known; another
  version is asked in a child process, as an unknown flag aborts)."""
  from importlib import metadata  # noqa: PLC0415
  if metadata.version("jaxlib").startswith("0.10."):
    return True
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"],
                         env={**os.environ, "XLA_FLAGS": flag}, capture_output=True)
  return probe.returncode == 0


for _flag in FAST_COMPILE_FLAGS:
  if _flag.split("=")[0] not in os.environ["XLA_FLAGS"] and _xla_knows(_flag):
    os.environ["XLA_FLAGS"] += " " + _flag

import hypothesis
import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

FORMAT_NAMES = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
SCALE_MODES = ("rceil", "floor")
DTYPES = (ml_dtypes.bfloat16, np.float16, np.float32)
DTYPE_IDS = ("bf16", "f16", "f32")

hypothesis.settings.register_profile(
    "ci", max_examples=20, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow,
                           hypothesis.HealthCheck.data_too_large])
hypothesis.settings.register_profile(
    "dev", max_examples=100, deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
  """Where pytest-xdist is loaded and the command line names no workers (`-n`, `--tx`):
  one worker per core, at most 4, a test file per worker (`--dist loadfile`), as if given
  `-n auto --maxprocesses 4 --dist loadfile`. Runs before xdist's own hook, which turns
  these options into workers; `-p no:xdist` leaves a plain single-process run."""
  if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
    return  # no xdist, or an xdist worker (its options come from the controller)
  option = config.option
  if option.numprocesses is None and not option.tx:
    option.numprocesses = "auto"
    option.maxprocesses = option.maxprocesses or 4
  if option.numprocesses != 0 and option.dist == "no" and not option.distload:
    option.dist = "loadfile"
    option.loadscopereorder = False  # files in pytest_collection_modifyitems' order


# The files that take longest (seconds of an idle 2-core run, `--durations`), handed out
# first so that no long file is left to run alone at the end (xdist's own order is by the
# number of tests: test_cuda_host_check.py's two tests went last and ran alone for minutes).
_LONGEST_FIRST = ("test_block_kernels.py", "test_quantize_exact.py", "test_platforms.py",
                  "test_interception.py", "test_cuda_host_check.py",
                  "test_sharding_explicit.py", "test_dropin_linen.py", "test_linen.py",
                  "test_state.py", "test_fake_quantize.py", "test_xla_codec.py",
                  "test_sweep.py")


def pytest_collection_modifyitems(items):
  """The files of _LONGEST_FIRST first, in its order; the others after, as collected."""
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def _kernel_levels() -> tuple[str | None, ...]:
  """The CPU kernel levels to run the exactness tests at: every one this build and CPU run
  where the ops use the CPU kernels; (None,) (the level does not matter) where they use
  plain XLA."""
  from mxjax._src import extension, backend  # noqa: PLC0415  (jax after XLA_FLAGS above)
  if "cpu" not in backend.built_platforms() or "cpu" not in backend.ffi_platforms():
    return (None,)
  return extension.runnable_simd()


@pytest.fixture(scope="module", params=_kernel_levels())
def simd_level(request):
  """Runs each test of a module that uses it at each level (mxjax._src.extension.set_simd), in this
  process: the programs compiled at the first level serve the others, whose runs differ in
  the kernels."""
  if request.param is None:
    yield None
    return
  from mxjax._src import extension  # noqa: PLC0415
  before = extension.build_info()["simd"]
  extension.set_simd(request.param)
  yield request.param
  extension.set_simd(before)


def bits_of(a) -> np.ndarray:
  """The bit patterns of a numpy / jax float array as unsigned ints of the same width."""
  a = np.asarray(a)
  return a.view(_UINT[a.dtype.itemsize])


def mxarrays(tree) -> list:
  """The MXArrays of a pytree, in leaf order."""
  import jax  # noqa: PLC0415 (jax after XLA_FLAGS, as everywhere in this file)
  from mxjax._src.mxarray import MXArray  # noqa: PLC0415
  leaves = jax.tree.leaves(tree, is_leaf=lambda a: isinstance(a, MXArray))
  return [a for a in leaves if isinstance(a, MXArray)]


def mxarray_bits(arrays) -> list[np.ndarray]:
  """The bit patterns of every MXArray's data and scales (NaN compares too)."""
  return [bits_of(x) for a in arrays for x in (a.data, a.scales)]


def assert_same_floats(got, want):
  """Bit-equal float arrays (same dtype and shape), except that any NaN matches any NaN."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype, (got.dtype, want.dtype)
  assert got.shape == want.shape, (got.shape, want.shape)
  nan_g, nan_w = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
  np.testing.assert_array_equal(nan_g, nan_w)
  np.testing.assert_array_equal(np.where(nan_g, 0, bits_of(got)), np.where(nan_w, 0, bits_of(want)))


def all_bf16_patterns(arrangement: str = "sequential") -> np.ndarray:
  """All 65,536 bf16 bit patterns as a [2048, 32] bfloat16 array.

  "sequential": row r holds patterns 32r .. 32r+31 (blocks of neighbouring values; 8 rows
  hold NaN / Inf). "strided": row r holds patterns r, r + 2048, ... (every block spans
  exponents, signs and specials; 128 rows hold NaN / Inf).
  """
  p = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
  if arrangement == "strided":
    p = p.reshape(32, 2048).T.copy()
  return p.reshape(2048, 32).view(ml_dtypes.bfloat16)


def all_f16_patterns(arrangement: str = "sequential") -> np.ndarray:
  """All 65,536 f16 bit patterns as a [2048, 32] float16 array (arranged as above)."""
  return all_bf16_patterns(arrangement).view(np.uint16).view(np.float16)


def f32_patterns(num_blocks: int = 2048, block_size: int = 32, seed: int = 0) -> np.ndarray:
  """[num_blocks, block_size] float32: uniformly random bit patterns (every exponent,
  subnormals, specials), random values within a few binades of each block's largest,
  and the special blocks below."""
  rng = np.random.default_rng(seed)
  n = num_blocks * block_size
  raw = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)
  scale = np.exp2(rng.integers(-149, 128, size=(num_blocks, 1))).astype(np.float64)
  near = (rng.uniform(-2, 2, size=(num_blocks, block_size)) * scale)
  near = np.where(np.abs(near) < np.finfo(np.float32).max, near, 0).astype(np.float32)
  # Mostly finite data: keep 1/8 of the raw rows (those hold specials often).
  out = np.where((np.arange(num_blocks) % 8 == 0)[:, None], raw.reshape(num_blocks, -1), near)
  return np.concatenate([out, special_blocks(np.float32, block_size)], axis=0)


def special_blocks(dtype, block_size: int = 32, seed: int = 1) -> np.ndarray:
  """[k, block_size] blocks of `dtype` aimed at the corners of the MX rules: zero and -0
  blocks, subnormal-only blocks, NaN / +-Inf blocks, amax at and around every power of two
  and at every format's max times powers of two (saturation, RCEIL/FLOOR boundary), and
  the dtype's max; the other elements are random fractions of the amax."""
  dtype = np.dtype(dtype)
  fi = ml_dtypes.finfo(dtype)
  rng = np.random.default_rng(seed)
  tiny_sub = float(fi.smallest_subnormal)
  rows = []

  def block(amax, fill="random", sign=1.0):
    if fill == "random":
      b = rng.uniform(-1, 1, size=block_size) * amax
    else:
      b = np.full(block_size, fill, np.float64)
    b[rng.integers(block_size)] = sign * amax
    return b

  rows.append(np.zeros(block_size))
  rows.append(np.full(block_size, -0.0))
  rows.append(np.where(np.arange(block_size) % 2, -0.0, 0.0))
  for k in (1, 3, 2 ** (fi.nmant - 1) + 1, 2 ** fi.nmant - 1):  # subnormal-only
    rows.append(block(k * tiny_sub, "random"))
    rows.append(block(k * tiny_sub, 0.0, -1.0))
  for special in (np.nan, np.inf, -np.inf):
    b = rng.uniform(-1, 1, size=block_size)
    b[rng.integers(block_size)] = special
    rows.append(b)
  maxes = (448.0, 57344.0, 28.0, 7.5, 6.0, 480.0, 464.0, 449.0)
  for k in range(fi.minexp - fi.nmant, fi.maxexp, 3):
    for m in (1.0, 1.0 - 2.0 ** -(fi.nmant + 1)) + tuple(mx / 2 ** np.floor(np.log2(mx)) for mx in maxes):
      a = m * 2.0 ** k
      for a2 in (a, a * (1 + 2.0 ** -fi.nmant), a * (1 - 2.0 ** -(fi.nmant + 1))):
        rows.append(block(a2, "random", rng.choice([-1.0, 1.0])))
  rows.append(block(float(fi.max), "random"))
  rows.append(block(float(fi.max), float(fi.max), -1.0))
  out = np.stack(rows)
  big = np.isfinite(out) & (np.abs(out) > float(fi.max))
  out = np.where(big, np.sign(out) * float(fi.max), out)
  return out.astype(dtype)


# ---------------------------------------------------------------------------------------
# Hypothesis strategies


@st.composite
def shapes_and_axes(draw, min_rank: int = 1, max_rank: int = 4, max_len: int = 80,
                    max_size: int = 4096):
  """(shape, axis) with rank in [min_rank, max_rank]; the quantized axis has any length
  in [1, max_len] (often not a multiple of any block); axis may be negative."""
  rank = draw(st.integers(min_rank, max_rank))
  axis = draw(st.integers(-rank, rank - 1))
  shape = [draw(st.integers(1, 5)) for _ in range(rank)]
  shape[axis] = draw(st.one_of(st.integers(1, max_len), st.sampled_from([16, 32, 64, 96])))
  while np.prod(shape) > max_size:
    i = int(np.argmax([s if j != axis % rank else 0 for j, s in enumerate(shape)]))
    shape[i] = max(1, shape[i] // 2)
  return tuple(shape), axis


@st.composite
def float_arrays(draw, shape, dtype, specials: bool = True):
  """A numpy array of `shape` and `dtype` (bf16 / f16 / f32): a per-row scale anywhere in
  the dtype's range times a few binades of spread, sprinkled with zeros, -0, subnormals,
  random bit patterns and (when `specials`) NaN / +-Inf."""
  dtype = np.dtype(dtype)
  fi = ml_dtypes.finfo(dtype)
  seed = draw(st.integers(0, 2 ** 32 - 1))
  rng = np.random.default_rng(seed)
  size = int(np.prod(shape))
  lo, hi = fi.minexp - fi.nmant, fi.maxexp - 1
  center = draw(st.one_of(st.integers(lo, hi), st.sampled_from([0, lo, hi, fi.minexp])))
  spread = draw(st.sampled_from([0, 1, 4, 12, 40]))
  expo = np.clip(center - rng.integers(0, spread + 1, size=size), lo, hi)
  v = rng.uniform(1, 2, size=size) * np.exp2(expo.astype(np.float64))
  v *= rng.choice([-1.0, 1.0], size=size)
  v = np.clip(v, -float(fi.max), float(fi.max)).astype(dtype)
  mix = draw(st.sampled_from(["none", "zeros", "bits", "all"]))
  u = rng.uniform(size=size)
  if mix in ("zeros", "all"):
    v = np.where(u < 0.1, dtype.type(0), np.where(u < 0.15, dtype.type(-0.0), v))
  if mix in ("bits", "all"):
    raw = rng.integers(0, 1 << (8 * dtype.itemsize), size=size, dtype=np.uint64)
    raw = raw.astype(_UINT[dtype.itemsize]).view(dtype)
    if not specials:
      raw = np.where(np.isfinite(raw), raw, dtype.type(0))
    v = np.where(rng.uniform(size=size) < 0.2, raw, v)
  if specials and draw(st.booleans()):
    k = draw(st.integers(1, 3))
    idx = rng.integers(0, size, size=k)
    v[idx] = rng.choice([np.nan, np.inf, -np.inf], size=k).astype(dtype)
  return v.reshape(shape)


def child_env(**extra) -> dict:
  """The environment of a child Python process that must import the mxjax this one runs:
  the installed package (as in CI), or the source tree with its in-place build. Its
  directory leads PYTHONPATH; run such children outside the repository root, where `-m`
  and `-c` would put the (unbuilt) source tree first."""
  import mxjax  # noqa: PLC0415 (after the XLA_FLAGS above)
  home = os.path.dirname(os.path.dirname(os.path.abspath(mxjax.__file__)))
  path = os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH")) if p)
  flags = " ".join(f for f in os.environ["XLA_FLAGS"].split()
                   if f not in FAST_COMPILE_FLAGS)  # XLA's defaults
  return {**os.environ, "PYTHONPATH": path, "XLA_FLAGS": flags, **extra}


def every_code_under_every_scale(fmt: str, block_size: int = 32):
  """Row r holds every code of `fmt` (repeated to at least 64 entries) under scale byte r,
  for all 256 bytes. -> (codes uint8[256, n], scales e8m0[256, n / block], packed data)."""
  import jax.numpy as jnp  # noqa: PLC0415 (after the XLA_FLAGS above)
  from mxjax import reference  # noqa: PLC0415
  from mxjax._src import formats
  bits = formats.element_format(fmt).bits
  codes = np.tile(np.arange(1 << bits, dtype=np.uint8), max(1, 64 >> bits))
  codes = jnp.asarray(np.broadcast_to(codes, (256, codes.size)))
  scale_bytes = np.repeat(np.arange(256, dtype=np.uint8)[:, None], codes.shape[1] // block_size,
                          1)
  scales = jnp.asarray(scale_bytes).view(jnp.float8_e8m0fnu)
  return codes, scales, reference.pack_codes(codes, fmt)


def exhaustive_rows(dtype_id: str) -> np.ndarray:
  """[rows, 64] of dtype_id ("bf16", "f16", "f32"): every bf16 (f16) bit pattern in two
  arrangements and the special blocks; "f32" adds random f32 bit patterns."""
  if dtype_id == "f16":
    parts = [all_f16_patterns(), all_f16_patterns("strided"), special_blocks(np.float16, 64)]
  else:
    parts = [all_bf16_patterns(), all_bf16_patterns("strided"),
             special_blocks(ml_dtypes.bfloat16, 64)]
    if dtype_id == "f32":
      parts = [p.astype(np.float32) for p in parts] + [f32_patterns(512, 64)]
  return np.concatenate([p.reshape(-1, 64) for p in parts])


@functools.lru_cache(maxsize=16)
def wide_mixed_blocks(rows: int, cols: int, seed: int = 0) -> np.ndarray:
  """bf16 [rows, cols] whose 32-blocks mix the kinds a vector path must get right: normal
  data at block exponents from 2^-140 to 2^120, runs of all the bf16 bit patterns (NaN,
  Inf, subnormals), zero and signed-zero blocks and subnormal-only blocks; `cols` need not
  be a multiple of 32. Rows this wide fill the kernels' 16-block SIMD groups. Read-only and
  made once per arguments: a 32 MiB one takes 2 s, and each format at each SIMD level asks
  for the same few."""
  rng = np.random.default_rng(seed)
  whole = cols - cols % 32
  blocks = (rng.standard_normal((rows * whole // 32, 32)) *
            np.exp2(rng.integers(-140, 120, size=(rows * whole // 32, 1)))).astype(np.float32)
  bits = blocks.astype(ml_dtypes.bfloat16).view(np.uint16)
  kind = rng.random(len(bits))
  patterns = rng.permutation(np.arange(65536, dtype=np.uint16))
  exhaustive = np.flatnonzero(kind < 0.2)[:2048]
  bits[exhaustive] = patterns[:32 * len(exhaustive)].reshape(-1, 32)
  bits[(kind >= 0.2) & (kind < 0.25)] = 0
  signed_zero = (kind >= 0.25) & (kind < 0.3)
  bits[signed_zero] = np.where(rng.random((signed_zero.sum(), 32)) < 0.5, 0x8000, 0)
  tiny = (kind >= 0.3) & (kind < 0.35)
  bits[tiny] = rng.integers(0, 0x80, (tiny.sum(), 32)) | (rng.integers(0, 2, (tiny.sum(), 32)) << 15)
  x = bits.reshape(rows, whole).view(ml_dtypes.bfloat16)
  x = np.concatenate([x, x[:, :cols % 32]], axis=1)
  x.flags.writeable = False
  return x
