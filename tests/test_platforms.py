"""Every path gives the same bits: the plain-XLA path against the FFI kernels (separate
processes, MXJAX_KERNELS=xla / auto). The CPU kernel level: MXJAX_SIMD caps it per process,
mxjax._src.extension.set_simd switches it in process (test_quantize_exact.py runs at every level)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from conftest import child_env
from mxjax._src import extension, backend

TESTS = os.path.dirname(os.path.abspath(__file__))
SIMD_LEVELS = backend.SIMD_LEVELS
MXJAX_TARGETS = ("mxjax_quantize", "mxjax_quantize_2x", "mxjax_dequantize", "mxjax_fake_quantize")


def _run_together(runs, timeout: int) -> list[subprocess.CompletedProcess]:
  """Runs each `(args, env)` of `runs` as `python args...` (in tests/, importing this
  process's mxjax, with env's extra variables), all at once, and checks that every one
  succeeded."""
  children = [(subprocess.Popen([sys.executable, *args], cwd=TESTS, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=child_env(**env)),
               args, env) for args, env in runs]
  done = []
  try:
    for child, args, env in children:
      stdout, stderr = child.communicate(timeout=timeout)
      assert child.returncode == 0, f"{args} with {env} failed:\n{stdout[-3000:]}\n" \
                                    f"{stderr[-3000:]}"
      done.append(subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr))
  finally:
    for child, _, _ in children:
      child.kill()
      child.wait()
  return done


needs_cpu_kernels = pytest.mark.skipif("cpu" not in backend.built_platforms(),
                                       reason="this build has no CPU FFI kernels")


@needs_cpu_kernels
def test_xla_path_equals_ffi_kernels_in_separate_processes(tmp_path):
  files = {kernels: tmp_path / f"{kernels}.npz" for kernels in ("xla", "auto")}
  _run_together([([os.path.join(TESTS, "op_surface.py"), str(path)], {"MXJAX_KERNELS": kernels})
                 for kernels, path in files.items()], 900)
  xla, ffi = np.load(files["xla"]), np.load(files["auto"])
  assert int(xla["custom_calls"]) == 0  # the XLA path compiles to no mxjax custom call
  assert int(ffi["custom_calls"]) > 0  # and the other process really ran the kernels
  keys = sorted(set(xla.files) - {"custom_calls"})
  assert keys == sorted(set(ffi.files) - {"custom_calls"}) and len(keys) > 700
  differ = [k for k in keys if xla[k].shape != ffi[k].shape or not np.array_equal(xla[k], ffi[k])]
  assert not differ, f"{len(differ)} results differ, e.g. {differ[:5]}"


@needs_cpu_kernels
def test_simd_cap_picks_the_level_of_a_process():
  """MXJAX_SIMD caps the levels a process runs, from its start. (test_quantize_exact.py runs
  its whole suite at every level this process runs, switched in process.)"""
  levels = extension.runnable_simd()
  assert levels[0] == "scalar" and set(levels) <= set(SIMD_LEVELS)
  assert extension.build_info()["simd"] == levels[-1]  # the widest, uncapped
  code = "from mxjax._src import extension; print(extension.build_info()['simd'], *extension.runnable_simd())"
  procs = _run_together([(["-c", code], {"MXJAX_SIMD": level}) for level in levels], 300)
  for i, (level, proc) in enumerate(zip(levels, procs)):
    assert proc.stdout.split() == [level, *levels[:i + 1]], (level, proc.stdout)


@needs_cpu_kernels
def test_set_simd_switches_the_level_in_process():
  before = extension.build_info()["simd"]
  x = jnp.linspace(-3, 3, 64 * 96, dtype=jnp.float32).reshape(64, 96).astype(jnp.bfloat16)
  want = [np.asarray(t) for t in jax.tree.leaves(mxjax.quantize_2x(x, "e3m2"))]
  try:
    for level in extension.runnable_simd():
      extension.set_simd(level)
      assert extension.build_info()["simd"] == level
      assert level in mxjax.backend_info()["ops"]["quantize"]
      got = jax.tree.leaves(mxjax.quantize_2x(x, "e3m2"))
      assert len(got) == len(want) == 4
      for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)
    with pytest.raises(ValueError, match=r"'avx-512' is not one this build and CPU run"):
      extension.set_simd("avx-512")
  finally:
    extension.set_simd(before)
  proc = subprocess.run([sys.executable, "-c", "from mxjax._src import extension; extension.set_simd('avx2')"],
                        cwd=TESTS, capture_output=True, text=True, timeout=120,
                        env=child_env(MXJAX_SIMD="scalar"))
  assert proc.returncode != 0 and "'avx2' is not one" in proc.stderr
  assert "MXJAX_SIMD='scalar' caps" in proc.stderr


# ---------------------------------------------------------------------------------------
# The setting, in process


def _custom_calls(fn, *args) -> int:
  text = jax.jit(fn).lower(*args).compile().as_text()
  return sum(text.count(f'"{t}"') for t in MXJAX_TARGETS)


@pytest.fixture
def restore_kernels():
  before = backend.get_kernels()
  yield
  backend.set_kernels(before)


@needs_cpu_kernels
def test_set_kernels_retraces_jitted_functions(restore_kernels):
  x = jnp.linspace(-3, 3, 256, dtype=jnp.float32).reshape(8, 32)
  traces = []

  def fn(v):
    traces.append(backend.get_kernels())
    return mxjax.quantize(v, "e2m1").dequantize()

  backend.set_kernels("auto")
  jitted = jax.jit(fn)
  want = jitted(x)
  backend.set_kernels("xla")
  assert backend.get_kernels() == "xla"
  np.testing.assert_array_equal(jitted(x), want)
  assert traces == ["auto", "xla"]  # traced again under the new setting
  assert _custom_calls(fn, x) == 0
  assert mxjax.backend_info()["ops"]["dequantize"].startswith("plain XLA ops")
  backend.set_kernels("auto")
  assert _custom_calls(fn, x) == 2
  assert "C++ FFI kernels" in mxjax.backend_info()["ops"]["quantize"]


@needs_cpu_kernels
def test_export_under_xla_kernels(restore_kernels):
  """jax.export refuses the FFI custom calls (no compatibility guarantee); under
  set_kernels("xla") (the README's way) the exported product runs with the FFI's bits."""
  x = jax.random.normal(jax.random.key(0), (64, 96), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (96, 32), jnp.float32)
  backend.set_kernels("auto")
  want = jax.jit(lambda x, w: mxjax.matmul(x, w))(x, w)
  with pytest.raises(ValueError, match="custom calls"):
    jax.export.export(jax.jit(lambda x, w: mxjax.matmul(x, w)))(x, w)
  backend.set_kernels("xla")
  exported = jax.export.export(jax.jit(lambda x, w: mxjax.matmul(x, w)))(x, w)
  np.testing.assert_array_equal(exported.call(x, w), want)


def test_exported_train_step_on_mxjax_pytrees_serializes(restore_kernels):
  """A jitted step whose arguments and results hold mxjax's pytrees (a DelayedScaling
  RecipeState, quantized kernels as MXArrays) survives Exported.serialize / deserialize:
  the same bits as jit, the same output structure."""
  from mxjax import linen as mxl
  from mxjax._src.recipes import DelayedScaling, MXFP8BlockScaling
  backend.set_kernels("xla")
  x = jax.random.normal(jax.random.key(0), (4, 64))
  recipe = DelayedScaling(amax_history_len=4)
  model = mxl.Dense(32)
  with mxjax.autocast(recipe=recipe):
    variables = model.init(jax.random.key(1), x)

  def step(variables, x):
    with mxjax.autocast(recipe=recipe):
      return model.apply(variables, x, mutable=["mx_state"])

  with mxjax.quantized_model_init(recipe=MXFP8BlockScaling()):
    frozen = model.init(jax.random.key(1), x)
  for fn, args in ((step, (variables, x)), (model.apply, (frozen, x))):
    exported = jax.export.deserialize(jax.export.export(jax.jit(fn))(*args).serialize())
    got, want = exported.call(*args), jax.jit(fn)(*args)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
      np.testing.assert_array_equal(a, b)


def test_bad_kernel_setting_is_an_error(restore_kernels):
  with pytest.raises(ValueError, match=r"set_kernels.*'auto', 'ffi', 'xla'.*'cuda'"):
    backend.set_kernels("cuda")
  proc = subprocess.run([sys.executable, "-c", "import mxjax"], cwd=TESTS, capture_output=True,
                        text=True, timeout=120, env=child_env(MXJAX_KERNELS="fast"))
  assert proc.returncode != 0 and "MXJAX_KERNELS" in proc.stderr and "'fast'" in proc.stderr


def test_misspelled_simd_cap_is_an_error():
  # The kernels alone would take an unknown MXJAX_SIMD value for "scalar".
  proc = subprocess.run([sys.executable, "-c", "import mxjax"], cwd=TESTS, capture_output=True,
                        text=True, timeout=120, env=child_env(MXJAX_SIMD="avx-512"))
  assert proc.returncode != 0 and "MXJAX_SIMD" in proc.stderr and "'avx-512'" in proc.stderr


def test_ffi_setting_without_kernels_names_the_platform(restore_kernels, monkeypatch):
  monkeypatch.setattr(backend, "built_platforms", lambda: ())
  backend.set_kernels("ffi")
  with pytest.raises(RuntimeError, match=r"MXJAX_KERNELS=ffi.*no FFI kernels for platform "
                                         r"'cpu'"):
    mxjax.quantize(jnp.ones((4, 32)), "e4m3")
  assert mxjax.backend_info()["ops"]["quantize"].startswith("none: MXJAX_KERNELS=ffi")
  backend.set_kernels("auto")  # auto falls back to XLA where no kernels exist
  np.testing.assert_array_equal(mxjax.fake_quantize(jnp.ones((4, 32)), "e4m3"), 1.0)
  assert "no FFI kernels for 'cpu'" in mxjax.backend_info()["ops"]["quantize"]


def test_auto_uses_the_verified_cuda_kernels_on_capable_gpus(monkeypatch):
  """auto uses a CUDA build's kernels on GPUs of compute capability 9.0 and up, and of
  those only the targets verified on a GPU (CUDA_VERIFIED); "ffi" uses every one."""
  monkeypatch.setattr(backend, "built_platforms", lambda: ("cpu", "cuda"))
  monkeypatch.setattr(backend, "get_kernels", lambda: "auto")
  cuda_targets = frozenset({"mxjax_quantize", "mxjax_fake_quantize"})
  monkeypatch.setattr(extension, "targets",
                      lambda p: cuda_targets if p == "cuda" else frozenset({"mxjax_quantize"}))
  monkeypatch.setattr(backend, "_capable_gpus", lambda: False)  # e.g. an sm_80 GPU
  assert backend.ffi_platforms() == ("cpu",)
  assert not backend.uses_kernel("cuda", "mxjax_quantize")
  monkeypatch.setattr(backend, "_capable_gpus", lambda: True)
  monkeypatch.setattr(backend, "CUDA_VERIFIED", {"mxjax_quantize": "an H100"})
  assert backend.ffi_platforms() == ("cpu", "cuda")
  assert backend.uses_kernel("cuda", "mxjax_quantize")
  assert not backend.uses_kernel("cuda", "mxjax_fake_quantize")  # built, not verified
  monkeypatch.setattr(backend, "get_kernels", lambda: "ffi")
  assert backend.uses_kernel("cuda", "mxjax_fake_quantize")
