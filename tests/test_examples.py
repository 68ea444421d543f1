"""Smoke tests of the example scripts: short runs in subprocesses (as a user runs them)."""

import math
import os
import re
import subprocess
import sys

import pytest
from conftest import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(script: str, *args: str, **env) -> str:
  env = {k: v for k, v in child_env(**env).items() if k != "XLA_FLAGS"}
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert proc.returncode == 0, (f"{script} {args} failed:\n{proc.stdout[-2000:]}\n"
                                f"{proc.stderr[-3000:]}")
  return proc.stdout


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4"])
def test_train_mlp_short_run(recipe):
  out = run_example("train_mlp.py", "--steps", "12", "--batch", "32", "--every", "4",
                    "--recipe", recipe)
  rows = [line.split() for line in out.splitlines() if re.fullmatch(r"\s*\d+(\s+\S+){2}", line)]
  assert [int(r[0]) for r in rows] == [0, 4, 8]
  losses = [[float(v) for v in r[1:]] for r in rows]
  assert all(math.isfinite(v) and 0 < v < 10 for r in losses for v in r)
  bf16, quantized = losses[0]
  assert abs(quantized - bf16) < 0.1 * bf16  # same init and data: close at step 0
  assert re.search(rf"mean of the last 10 steps: bf16 [\d.]+, {recipe} [\d.]+", out)


def sharded_losses(kernels: str) -> list[str]:
  out = run_example("sharded_train.py", "--steps", "3", "--mode", "tp-col",
                    MXJAX_KERNELS=kernels)
  assert "collectives in one step:" in out and "param shardings:" in out
  return re.findall(r"step +\d+ +loss ([\d.]+)", out)


def test_sharded_train_short_run_on_both_kernel_paths():
  """The sharding rules serve the FFI kernels and the XLA path alike: same losses."""
  ffi, xla = sharded_losses("auto"), sharded_losses("xla")
  assert len(ffi) == 3 and all(math.isfinite(float(v)) for v in ffi)
  assert ffi == xla


def test_dropin_flax_short_run():
  out = run_example("dropin_flax.py", "--steps", "3", "--every", "1", "--tier", "mlp_only")
  match = re.search(r"validation loss: bf16 ([\d.]+), mxfp8 ([\d.]+)", out)
  assert match, out[-2000:]
  bf16, mxfp8 = float(match[1]), float(match[2])
  assert 0 < bf16 < 20 and math.isfinite(mxfp8)
  assert abs(mxfp8 - bf16) < 0.05 * bf16  # the same stock model, MXFP8 MLPs only: close


def test_dropin_flax_own_einsum_model_is_covered():
  """A model written with its own einsum modules and a tied head: every product MX."""
  out = run_example("dropin_flax.py", "--model", "own", "--steps", "2", "--every", "1")
  assert re.search(r"^OwnBlock_0/q/einsum_0 +einsum", out, re.M), out[:3000]
  share = re.search(r"MX share of dot FLOPs: ([\d.]+)%", out)
  assert share and float(share[1]) >= 99.0, out[:3000]
  assert re.search(r"^dot_general_0 +dot_general +\[1, 64, 128\] x \[128, 256\]", out, re.M)
  match = re.search(r"validation loss: bf16 ([\d.]+), mxfp8 ([\d.]+)", out)
  assert match and float(match[2]) != float(match[1])
