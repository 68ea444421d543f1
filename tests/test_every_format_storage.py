"""Every format: weights stored once in the recipe's weight format, by
`mxjax.quantized_model_init` (linen and NNX) and by `mxjax.quantize_params` (mxjax's and
stock Flax layers): `memory_report(...).quantized_bytes_per_param` within 2% of the
format's bytes per param (written out in `format_cases`, and as
`recipe.roles().w.bytes_per_element()` says), one copy per kernel, and the model applied
from the stored kernels equals the model applied from its high-precision kernels under
the same recipe (inference: the same quantized values), bit for bit.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import nnx

import mxjax
from format_cases import (RECIPES, WEIGHT_BYTES_PER_PARAM, assert_bits_equal, every_format,
                          random_data)

X = random_data((64, 256), seed=0)
N_KERNEL = 256 * 512 * 2


class Net(nn.Module):
  dense: type = mxjax.Dense

  @nn.compact
  def __call__(self, x):
    return self.dense(256, name="down")(jax.nn.gelu(self.dense(512, name="up")(x)))


def _check_report(report, name, n_kernels=2):
  recipe = RECIPES[name]
  formula = recipe.roles().w.bytes_per_element()
  assert formula == pytest.approx(WEIGHT_BYTES_PER_PARAM[name], rel=1e-12)
  assert report.quantized_f32_nbytes == 4 * N_KERNEL  # every kernel stored quantized
  assert report.quantized_bytes_per_param == pytest.approx(formula, rel=0.02), str(report)
  assert len(report.copies) == n_kernels
  assert all(kept.endswith("(1 copy)") for kept in report.copies.values()), report.copies
  tiles = recipe.roles().w.two_d
  assert all(("in 2-D tiles" in kept) == tiles for kept in report.copies.values())


@every_format
def test_quantized_model_init_linen(name):
  recipe = RECIPES[name]
  model = Net()
  with mxjax.quantized_model_init(recipe=recipe):
    stored = jax.jit(model.init)(jax.random.key(0), X)
  hp = jax.jit(model.init)(jax.random.key(0), X)  # the same initial values
  assert "kernel" not in stored["params"]["up"]
  kernel = stored["mx_kernels"]["up"]["kernel"]
  assert isinstance(kernel, mxjax.MXArray) and kernel.format == recipe.roles().w
  _check_report(mxjax.memory_report(stored), name)
  with mxjax.autocast(recipe=recipe):
    got = jax.jit(model.apply)(stored, X)
    want = jax.jit(model.apply)(hp, X)
  assert_bits_equal(got, want, f"linen {name}")


@every_format
def test_quantized_model_init_nnx(name):
  recipe = RECIPES[name]

  class Mlp(nnx.Module):
    def __init__(self, rngs):
      self.up = mxjax.nnx.Linear(256, 512, rngs=rngs)
      self.down = mxjax.nnx.Linear(512, 256, rngs=rngs)

    def __call__(self, x):
      return self.down(jax.nn.gelu(self.up(x)))

  with mxjax.quantized_model_init(recipe=recipe):
    stored = Mlp(nnx.Rngs(0))
  hp = Mlp(nnx.Rngs(0))
  assert isinstance(nnx.as_pure(stored.up.kernel), mxjax.MXArray)
  _check_report(mxjax.memory_report(stored), name)
  assert len(jax.tree.leaves(nnx.state(stored, nnx.Param))) == 2  # the biases: kernels frozen
  with mxjax.autocast(recipe=recipe):
    got = nnx.jit(lambda m, x: m(x))(stored, X)
    want = nnx.jit(lambda m, x: m(x))(hp, X)
  assert_bits_equal(got, want, f"nnx {name}")


@every_format
@pytest.mark.parametrize("layers", ["mxjax", "stock"])
def test_quantize_params(name, layers):
  """A trained high-precision checkpoint stored quantized; mxjax's Dense reads it, and a
  stock `nn.Dense` model reads it under `mxjax.linen.intercept` (its params tree is
  unchanged, kernels replaced by MXArrays)."""
  recipe = RECIPES[name]
  model = Net(mxjax.Dense if layers == "mxjax" else nn.Dense)
  hp = model.init(jax.random.key(1), X)
  stored = jax.jit(lambda v: mxjax.quantize_params(v, recipe))(hp)
  _check_report(mxjax.memory_report(stored), name)
  assert mxjax.memory_report(stored).nbytes < 0.3 * mxjax.memory_report(hp).nbytes
  apply = jax.jit(model.apply)
  with mxjax.autocast(recipe=recipe), mxjax.linen.intercept():
    got, want = apply(stored, X), apply(hp, X)
  assert_bits_equal(got, want, f"{layers} {name}")
  assert not np.array_equal(np.asarray(got), np.asarray(model.apply(hp, X)))  # quantized
