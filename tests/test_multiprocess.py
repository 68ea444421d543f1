"""Two processes on 127.0.0.1 (JAX's multi-process runtime, gloo CPU collectives) train
DP and FSDP MX Dense steps on one global 4-device mesh; both see the losses, gradients
and params of the same steps run in one process on one device."""

import functools
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import child_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "multiprocess_train.py"
TIMEOUT_S = 90  # for all processes together; they are killed past it


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(args, out, log):
  env = {k: v for k, v in child_env().items() if k != "XLA_FLAGS"}  # the script sets it
  return subprocess.Popen([sys.executable, str(SCRIPT), *args, "--out", str(out)], env=env,
                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_all(commands, tmp_path):
  """Runs (args, out) commands at once; kills them all past TIMEOUT_S. -> logs."""
  logs = [open(tmp_path / f"log{i}.txt", "w+") for i in range(len(commands))]
  procs = [launch(args, out, log) for (args, out), log in zip(commands, logs)]
  deadline = time.monotonic() + TIMEOUT_S
  try:
    for p in procs:
      p.wait(timeout=max(1.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    pass
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  texts = []
  for log in logs:
    log.seek(0)
    texts.append(log.read())
    log.close()
  for p, text in zip(procs, texts):
    assert p.returncode == 0, f"exit {p.returncode} (killed past {TIMEOUT_S} s?):\n{text[-3000:]}"
  return texts


@functools.lru_cache(maxsize=None)
def first_step_losses() -> tuple[float, float]:
  """(MXFP8, high-precision) loss of the script's first step on one device: its model
  (2 `mxjax.Dense`, GELU between), params, batch and loss, here."""
  import flax.linen as nn  # noqa: PLC0415 (jax after conftest's XLA_FLAGS)
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  import mxjax  # noqa: PLC0415
  from mx_products import count_mx_products  # noqa: PLC0415
  dim, hidden, batch = 128, 256, 256  # the script's DIM, HIDDEN, BATCH

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      return mxjax.Dense(dim, name="fc2")(nn.gelu(mxjax.Dense(hidden, name="fc1")(x)))

  teacher = np.random.default_rng(42).normal(size=(dim, dim)) / np.sqrt(dim)
  x = np.random.default_rng(0).normal(size=(batch, dim)).astype(np.float32)
  y = np.tanh(x @ teacher).astype(np.float32)
  params = MLP().init(jax.random.key(0), np.zeros((batch, dim), np.float32))
  loss = jax.jit(lambda p: jnp.mean(jnp.square(MLP().apply(p, x) - y)))
  hp = float(loss(params))
  with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()):
    assert count_mx_products(loss, params) == 2
    return float(loss(params)), hp


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])
def test_two_processes_train_as_one_device(tmp_path, axis_types):
  port = free_port()
  outs = [tmp_path / f"process{i}.npz" for i in range(2)] + [tmp_path / "one_device.npz"]
  common = ["--axis-types", axis_types, "--steps", "2"]
  logs = run_all([
      (common + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                 "--process-id", str(i), "--local-devices", "2"], outs[i]) for i in range(2)
  ] + [(common + ["--num-processes", "1", "--local-devices", "1"], outs[2])], tmp_path)
  assert "dp: 2 processes, 4 devices" in logs[0] and "fsdp: 2 processes, 4 devices" in logs[0]
  assert "fc1 kernel P('data'" in logs[0]  # FSDP's kernels are split over 'data'
  first, second, one = (np.load(out) for out in outs)
  assert sorted(first.files) == sorted(one.files)
  assert {name.split("/")[0] for name in first.files} == {"dp", "fsdp"}
  # MX ran: the first step's loss is the MXFP8 loss of the same step computed here (its
  # two MX products counted), not the high-precision one.
  mx_loss, hp_loss = first_step_losses()
  for name in ("dp/loss", "fsdp/loss"):
    np.testing.assert_allclose(first[name][0], mx_loss, rtol=1e-6, err_msg=name)
    assert abs(first[name][0] - hp_loss) > 1e-4 * hp_loss, (name, first[name][0], hp_loss)
  for name in first.files:
    np.testing.assert_array_equal(first[name], second[name], err_msg=name)  # one program
    want = one[name]
    if name.endswith("loss"):
      np.testing.assert_allclose(first[name], want, rtol=1e-6, err_msg=name)
    else:  # f32 sums over 4 devices vs 1: reduction order only
      np.testing.assert_allclose(first[name], want, rtol=1e-5,
                                 atol=1e-6 * float(np.abs(want).max()), err_msg=name)
