"""Products inside a real `lax.while_loop` (a trip count only known at run time, as in a
decode loop or an iterative solver; not a `fori_loop` with static bounds, which traces
to a `scan`) are MX under `mxjax.quantized`, `mxjax.linen.intercept` and
`mxjax.nnx.quantize`: each step's product equals the MX oracle computed here from
`mxjax.reference`, differs from the high-precision one by the MX rounding, and
`mxjax.coverage` lists it as MX.

Each step multiplies one row block of `xs` (chosen by the step counter) with the weight
and adds it to the carry, so every step's product is the oracle's exactly, whatever the
previous steps summed."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

import mxjax
from mxjax import reference

MX = mxjax.MXFP8BlockScaling()  # e4m3 forward, blocks of 32 along the contraction
L, B, D, F = 4, 8, 64, 48
STEPS = 3  # the trip count, an argument: traced under jit


def data():
  rng = np.random.default_rng(0)
  xs = jnp.asarray(rng.standard_normal((L, B, D)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((D, F)) * 0.1, jnp.float32)
  return xs, w


def decode_loop(xs, w, n):
  """sum over steps i < n of xs[i % L] @ w, in a `lax.while_loop` of n steps."""
  def body(carry):
    i, acc = carry
    return i + 1, acc + lax.dynamic_index_in_dim(xs, i % L, keepdims=False) @ w

  zero = jnp.zeros((B, F), jnp.float32)
  return lax.while_loop(lambda carry: carry[0] < n, body, (jnp.int32(0), zero))[1]


def mx_oracle(xs, w, n: int):
  """The same loop with each product the oracle's: q(x, K) . q(w, K) in f32."""
  def q(a, axis):
    data, scales = reference.quantize(a, MX.fwd_format, axis=axis, block_size=MX.block_size,
                                      scale_mode=MX.scale_mode)
    return reference.dequantize(data, scales, MX.fwd_format, axis=axis,
                                block_size=MX.block_size, shape=a.shape)

  qw = q(w, 0)
  acc = jnp.zeros((B, F), jnp.float32)
  for i in range(n):
    acc = acc + jnp.dot(q(xs[i % L], 1), qw, precision=lax.Precision.HIGHEST)
  return acc


def check(got, hp, n, report, path):
  """`got` is the MX oracle's (to f32 accumulation order), not the high-precision `hp`;
  the report lists the loop's one product at `path` as MX."""
  want = mx_oracle(*data(), n)
  scale = float(jnp.abs(want).max())
  np.testing.assert_allclose(got, want, rtol=2 ** -20, atol=2 ** -20 * scale)
  assert float(jnp.abs(got - hp).max()) > 1e-3 * scale  # MX rounding, not high precision
  assert [(p.path, p.mx) for p in report.products] == [(path, True)], report.table()


@pytest.mark.parametrize("n", [STEPS, 6])
def test_quantized_function(n):
  xs, w = data()
  fn = jax.jit(mxjax.quantized(decode_loop))
  with mxjax.autocast(recipe=MX):
    got = fn(xs, w, n)
    report = mxjax.coverage(mxjax.quantized(decode_loop), xs, w, jnp.int32(n))
  check(got, jax.jit(decode_loop)(xs, w, n), n, report, "dot_general_0")


class Decoder(nn.Module):
  """A linen module whose own code loops over its param with `lax.while_loop`."""

  @nn.compact
  def __call__(self, xs, n):
    return decode_loop(xs, self.param("w", nn.initializers.zeros, (D, F)), n)


class Step(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x @ self.param("w", nn.initializers.zeros, (D, F))


class LiftedDecoder(nn.Module):
  """The same loop as a Flax lifted `nn.while_loop` calling a submodule in its body."""

  def setup(self):
    self.step = Step()

  def __call__(self, xs, n):
    if self.is_initializing():
      self.step(xs[0])

    def body(mdl, carry):
      i, acc = carry
      return i + 1, acc + mdl.step(lax.dynamic_index_in_dim(xs, i % L, keepdims=False))

    zero = jnp.zeros((B, F), jnp.float32)
    return nn.while_loop(lambda mdl, carry: carry[0] < n, body, self, (jnp.int32(0), zero))[1]


class Model(nn.Module):
  decoder: type

  @nn.compact
  def __call__(self, xs, n):
    return self.decoder(name="decoder")(xs, n)


# linen names a module's method other than `__call__` by its scope `module.method` (the
# lifted loop's body: `decoder.body`).
@pytest.mark.parametrize("decoder, path", [
    (Decoder, "decoder/dot_general_0"),
    (LiftedDecoder, "decoder/decoder.body/step/dot_general_0")])
def test_linen_intercept(decoder, path):
  xs, w = data()
  model = Model(decoder)
  variables = model.init(jax.random.key(0), xs, STEPS)
  variables = jax.tree.map(lambda _: w, variables)  # the one weight [D, F]
  apply = jax.jit(model.apply)
  hp = apply(variables, xs, STEPS)
  with mxjax.autocast(recipe=MX), mxjax.linen.intercept():
    got = apply(variables, xs, STEPS)
    report = mxjax.coverage(model.apply, variables, xs, jnp.int32(STEPS))
  check(got, hp, STEPS, report, path)


class NnxDecoder(nnx.Module):
  def __init__(self, w):
    self.w = nnx.Param(w)

  def __call__(self, xs, n):
    return decode_loop(xs, self.w[...], n)


class NnxModel(nnx.Module):
  def __init__(self, w):
    self.decoder = NnxDecoder(w)

  def __call__(self, xs, n):
    return self.decoder(xs, n)


def test_nnx_quantize():
  xs, w = data()
  model = NnxModel(w)
  run = nnx.jit(lambda model, xs, n: model(xs, n))
  hp = run(model, xs, STEPS)
  mxjax.nnx.quantize(model)
  graphdef, state = nnx.split(model)
  with mxjax.autocast(recipe=MX):
    got = run(model, xs, STEPS)
    report = mxjax.coverage(lambda s, xs, n: nnx.merge(graphdef, s)(xs, n), state, xs,
                            jnp.int32(STEPS))
  check(got, hp, STEPS, report, "decoder/dot_general_0")
