"""Autocast off (or a None rule): an intercepted stock layer is the stock layer, bit for bit,
in bf16 and f16 models too, with `precision` and `preferred_element_type` set.

On XLA's CPU a bf16 x bf16 -> f32 product (`preferred_element_type=f32`) does not round
like the f32 product of the same values, so a path that casts a bf16 layer's operands
to f32 is told apart here.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

import mxjax

D, N = 256, 64
DTYPES = (jnp.bfloat16, jnp.float16)
HIGHEST, HIGH = lax.Precision.HIGHEST, lax.Precision.HIGH


def assert_same(got, want):
  """Two pytrees of arrays: equal leaf dtypes and bits."""
  got, want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(got) == len(want)
  for i, (a, b) in enumerate(zip(got, want)):
    assert a.dtype == b.dtype, (i, a.dtype, b.dtype)
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8),
                                  err_msg=str(i))


class Layers(nn.Module):
  """Stock linen GEMM layers, per dtype, on that dtype's input x [B, D]."""

  @nn.compact
  def __call__(self, xs):
    out = []
    for x in xs:
      dt = dict(dtype=x.dtype, param_dtype=x.dtype)
      out += [
          nn.Dense(N, precision=HIGHEST, **dt)(x),
          nn.DenseGeneral(N, precision=HIGH, **dt)(x),
          nn.Dense(N, dtype=x.dtype)(x),  # f32 params, computed in the dtype
          nn.Einsum((D, N), "bd,dn->bn", precision=HIGHEST,
                    preferred_element_type=jnp.float32, **dt)(x),
          nn.Einsum((D, N), "bd,dn->bn", preferred_element_type=x.dtype, **dt)(x),
      ]
    return out


def inputs():
  x = jax.random.normal(jax.random.key(0), (16, D), jnp.float32)
  return [x.astype(dtype) for dtype in DTYPES]


def test_linen_intercepted_layers_with_autocast_off_are_stock_bits():
  model, xs = Layers(), inputs()
  variables = jax.jit(model.init)(jax.random.key(1), xs)
  run = jax.jit(model.apply)
  want = run(variables, xs)
  with mxjax.linen.intercept():
    assert_same(run(variables, xs), want)
  with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()), mxjax.linen.intercept([(".*", None)]):
    with pytest.warns(UserWarning, match="quantized no product"):  # every layer kept, said
      assert_same(run(variables, xs), want)


class NLayers(nnx.Module):
  """Stock NNX GEMM layers, per dtype, on that dtype's input x [B, D]."""

  def __init__(self, rngs: nnx.Rngs):
    self.layers = nnx.List()
    for dtype in DTYPES:
      dt = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
      self.layers.append(nnx.List([
          nnx.Linear(D, N, precision=HIGHEST, preferred_element_type=jnp.float32, **dt),
          nnx.Linear(D, N, precision=HIGH, **dt),
          nnx.Linear(D, N, dtype=dtype, rngs=rngs),  # f32 params, computed in the dtype
          nnx.LinearGeneral(D, N, preferred_element_type=jnp.float32, **dt),
          nnx.Einsum("bd,dn->bn", (D, N), (N,), precision=HIGHEST,
                     preferred_element_type=jnp.float32, **dt),
          nnx.Einsum("bd,dn->bn", (D, N), (N,), preferred_element_type=dtype, **dt),
      ]))

  def __call__(self, xs):
    return [layer(x) for layers, x in zip(self.layers, xs) for layer in layers]


def test_nnx_quantized_layers_with_autocast_off_are_stock_bits():
  xs = inputs()
  run = nnx.jit(lambda m, xs: m(xs))
  want = run(NLayers(nnx.Rngs(1)), xs)
  model = mxjax.nnx.quantize(NLayers(nnx.Rngs(1)))
  assert_same(run(model, xs), want)
  mxjax.nnx.quantize(model, [(".*", None)])
  with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()):
    with pytest.warns(UserWarning, match="quantized no product"):  # every layer kept, said
      assert_same(run(model, xs), want)
