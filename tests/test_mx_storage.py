"""Kernels stored for inference hold one copy at their format's size (issue 35, part 1)."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from mxjax import memory
from mxjax.sweep import model as model_lib

RECIPES = {"mxfp8": (mxjax.MXFP8BlockScaling(), 8), "mxfp6": (mxjax.MXFP6BlockScaling(), 6),
           "mxfp4": (mxjax.MXFP4BlockScaling(), 4)}
CONFIG = model_lib.ModelConfig(d_model=64, layers=1, heads=2, max_len=16, mlp_ratio=2)


def _bits(x):
  return np.asarray(x).view(np.uint8 if x.dtype.itemsize == 1 else np.uint16)


def _live_bytes_since(before: set[int]) -> int:
  gc.collect()
  return sum(a.nbytes for a in jax.live_arrays() if id(a) not in before)


@pytest.mark.parametrize("name", list(RECIPES))
def test_inference_kernels_hold_their_format_bytes_and_run_as_on_the_fly(name):
  """The sweep's transformer built under quantized_model_init (default: inference, one
  copy): its kernels hold params x (bits/8 + 1/32) bytes, as memory_report counts them
  and as jax.live_arrays holds them, within 2%; the logits equal those of the
  high-precision model with the same initial values quantized on the fly."""
  recipe, bits = RECIPES[name]
  formula = bits / 8 + 1 / recipe.block_size
  lm = model_lib.LanguageModel(CONFIG, dtype=jnp.float32)
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)
  hp = lm.init(jax.random.key(0), tokens)
  n_kernel = model_lib.count_params(hp["params"])[1]
  other_bytes = sum(x.nbytes for x in jax.tree.leaves(hp["params"])) - 4 * n_kernel

  before = {id(a) for a in jax.live_arrays()}
  with mxjax.quantized_model_init(recipe=recipe):
    stored = lm.init(jax.random.key(0), tokens)
  live = _live_bytes_since(before)
  report = mxjax.memory_report(stored)
  assert report.quantized_f32_nbytes == 4 * n_kernel  # every kernel is stored quantized
  assert report.quantized_bytes_per_param == pytest.approx(formula, rel=0.02)
  assert set(report.copies) == {"mx_kernels/" + "/".join(p)
                                for p in model_lib.kernels(hp["params"])}
  assert all(kept == f"{recipe.fwd_format} along axis 0 (1 copy)"
             for kept in report.copies.values())
  # live arrays: the stored variables and nothing else (the f32 initial values are gone)
  assert live == report.nbytes
  assert (live - other_bytes) / n_kernel == pytest.approx(formula, rel=0.02)

  with mxjax.autocast(recipe=recipe):
    want = jax.jit(lm.apply)(hp, tokens)
    got = jax.jit(lm.apply)(stored, tokens)
  np.testing.assert_array_equal(_bits(got), _bits(want))


def test_nnx_linear_4096_holds_one_mxfp8_copy():
  """The measurement of the issue: nnx.Linear(4096, 4096) is 1.03 B/param, not 2.06."""
  from flax import nnx  # noqa: PLC0415
  with mxjax.quantized_model_init(recipe=mxjax.MXFP8BlockScaling()):
    layer = jax.eval_shape(lambda: mxjax.nnx.Linear(512, 4096, use_bias=False,
                                                    rngs=nnx.Rngs(0)))
  report = mxjax.memory_report(layer)
  assert report.quantized_bytes_per_param == pytest.approx(1 + 1 / 32)
  assert list(report.copies.values()) == ["e4m3 along axis 0 (1 copy)"]
  with mxjax.quantized_model_init(recipe=mxjax.MXFP8BlockScaling(), for_training=True):
    layer = jax.eval_shape(lambda: mxjax.nnx.Linear(512, 4096, use_bias=False,
                                                    rngs=nnx.Rngs(0)))
  report = mxjax.memory_report(layer)
  assert report.quantized_bytes_per_param == pytest.approx(2 * (1 + 1 / 32))
  assert list(report.copies.values()) == ["e4m3 along axes 0, 1 (2 copies)"]
  assert "e4m3 along axes 0, 1 (2 copies)" in report.table()


def test_one_copy_training_dgrad_error_against_the_stored_pair():
  """Training with frozen kernels: one stored copy (for_training=True, columnwise=False)
  takes the dgrad from that copy's values; the pair takes it from a second copy quantized
  along the output features. Against the f32 dgrad of the same initial kernel, the one-
  copy dgrad is about as close as the pair's (measured: see issue35-docs)."""
  recipe = mxjax.MXFP8BlockScaling()
  model = mxjax.Dense(256, use_bias=False)
  x = jax.random.normal(jax.random.key(1), (64, 512))
  g = jax.random.normal(jax.random.key(2), (64, 256))
  hp = model.init(jax.random.key(0), x)
  exact = g @ hp["params"]["kernel"].T

  def dgrad(variables):
    with mxjax.autocast(recipe=recipe):
      return jax.vjp(lambda x: model.apply(variables, x), x)[1](g)[0]

  errors = {}
  for columnwise in (True, False):
    with mxjax.quantized_model_init(recipe=recipe, for_training=True, columnwise=columnwise):
      stored = model.init(jax.random.key(0), x)
    d = dgrad(stored)
    errors[columnwise] = float(jnp.linalg.norm(d - exact) / jnp.linalg.norm(exact))
  # both: the e5m2 quantization of g dominates (~4%); the kernel's copy adds little
  assert 0.01 < errors[True] < 0.06 and 0.01 < errors[False] < 0.06
  assert errors[False] < 1.1 * errors[True]
