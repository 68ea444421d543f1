"""Kernels stored for inference hold one copy at their format's size (issue 35, part 1)."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from mxjax import MXArray
from mxjax.sweep import model as model_lib

RECIPES = {"mxfp8": (mxjax.MXFP8BlockScaling(), 8), "mxfp6": (mxjax.MXFP6BlockScaling(), 6),
           "mxfp4": (mxjax.MXFP4BlockScaling(), 4)}
CONFIG = model_lib.ModelConfig(d_model=64, layers=1, heads=2, max_len=16, mlp_ratio=2)


def _bits(x):
  return np.asarray(x).view(np.uint8 if x.dtype.itemsize == 1 else np.uint16)


def _live_bytes_since(before: set[int]) -> int:
  gc.collect()
  return sum(a.nbytes for a in jax.live_arrays() if id(a) not in before)


@pytest.fixture(scope="module")
def lm_and_hp():
  lm = model_lib.LanguageModel(CONFIG, dtype=jnp.float32)
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)
  return lm, tokens, jax.jit(lm.init)(jax.random.key(0), tokens)


def _check_stored(lm, tokens, hp, make_stored, recipe, bits):
  """`make_stored()`'s variables: kernels at params x (bits/8 + 1/32) bytes within 2%, by
  memory_report and by jax.live_arrays (nothing else is left alive: the f32 values are
  gone), one copy each along axis 0; logits equal to on-the-fly quantization's."""
  formula = bits / 8 + 1 / recipe.block_size
  n_kernel = model_lib.count_params(hp["params"])[1]
  before = {id(a) for a in jax.live_arrays()}
  stored = make_stored()
  live = _live_bytes_since(before)
  report = mxjax.memory_report(stored)
  assert report.quantized_f32_nbytes == 4 * n_kernel  # every kernel is stored quantized
  assert report.quantized_bytes_per_param == pytest.approx(formula, rel=0.02)
  assert len(report.copies) == len(model_lib.kernels(hp["params"]))
  assert all(kept == f"{recipe.roles().w} along axis 0 (1 copy)"
             for kept in report.copies.values())
  # nothing but the stored variables came alive (the f32 initial values are gone) ...
  fresh = {id(a): a.nbytes for a in jax.tree.leaves(stored) if id(a) not in before}
  assert live == sum(fresh.values())
  # ... and the live arrays of the kernels hold their format's bytes
  kernels = [x for x in jax.tree.leaves(stored, is_leaf=lambda x: isinstance(x, MXArray))
             if isinstance(x, MXArray)]
  kernel_ids = {id(a) for k in kernels for a in (k.data, k.scales)}
  kernel_live = sum(a.nbytes for a in jax.live_arrays() if id(a) in kernel_ids)
  assert kernel_live / n_kernel == pytest.approx(formula, rel=0.02)
  with mxjax.autocast(recipe=recipe):
    want = jax.jit(lm.apply)(hp, tokens)
    got = jax.jit(lm.apply)(stored, tokens)
  np.testing.assert_array_equal(_bits(got), _bits(want))
  return stored


def test_quantized_model_init_kernels_hold_their_format_bytes(lm_and_hp):
  """The sweep's transformer built under quantized_model_init (default: inference, one
  MXFP8 copy per kernel), against the same initial values quantized on the fly."""
  lm, tokens, hp = lm_and_hp
  recipe = mxjax.MXFP8BlockScaling()

  def make():
    with mxjax.quantized_model_init(recipe=recipe):
      return jax.jit(lm.init)(jax.random.key(0), tokens)

  stored = _check_stored(lm, tokens, hp, make, recipe, 8)
  assert set(mxjax.memory_report(stored).copies) == {
      "mx_kernels/" + "/".join(p) for p in model_lib.kernels(hp["params"])}


@pytest.mark.parametrize("name", list(RECIPES))
def test_quantize_params_kernels_hold_their_format_bytes(lm_and_hp, name):
  """The same model's params quantized after the fact (mxjax.quantize_params; the
  attention output contracts two dims: stored in 2-D form), MXFP8 / MXFP6 / MXFP4."""
  lm, tokens, hp = lm_and_hp
  recipe, bits = RECIPES[name]
  make = lambda: mxjax.quantize_params(  # noqa: E731
      hp, recipe, contract_ndim=lambda path: model_lib.contraction_ndim(path.split("/")))
  _check_stored(lm, tokens, hp, make, recipe, bits)


def test_nnx_linear_4096_holds_one_mxfp8_copy():
  """The measurement of the issue: nnx.Linear(4096, 4096) is 1.03 B/param, not 2.06."""
  from flax import nnx  # noqa: PLC0415
  with mxjax.quantized_model_init(recipe=mxjax.MXFP8BlockScaling()):
    layer = jax.eval_shape(lambda: mxjax.nnx.Linear(512, 4096, use_bias=False,
                                                    rngs=nnx.Rngs(0)))
  report = mxjax.memory_report(layer)
  assert report.quantized_bytes_per_param == pytest.approx(1 + 1 / 32)
  assert list(report.copies.values()) == ["e4m3/e8m0/1x32 along axis 0 (1 copy)"]
  with mxjax.quantized_model_init(recipe=mxjax.MXFP8BlockScaling(), for_training=True):
    layer = jax.eval_shape(lambda: mxjax.nnx.Linear(512, 4096, use_bias=False,
                                                    rngs=nnx.Rngs(0)))
  report = mxjax.memory_report(layer)
  assert report.quantized_bytes_per_param == pytest.approx(2 * (1 + 1 / 32))
  assert list(report.copies.values()) == ["e4m3/e8m0/1x32 along axes 0, 1 (2 copies)"]
  assert "e4m3/e8m0/1x32 along axes 0, 1 (2 copies)" in report.table()


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
