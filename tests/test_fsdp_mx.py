"""FSDP of weights stored once as MX: the step gathers their codes and scales (8 CPU
devices, Explicit mesh axes)."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import mxjax

_GATHER = re.compile(r"=\s*(\([^=]*?\)|\S+)\s+all-gather(?:-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([\d,]*)\]")
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "u16": 2, "s32": 4, "u8": 1, "f8e4m3fn": 1,
          "f8e5m2": 1, "f8e8m0fnu": 1, "pred": 1}


def all_gather_bytes(hlo: str) -> int:
  total = 0
  for m in _GATHER.finditer(re.sub(r"/\*.*?\*/", "", hlo)):
    for dtype, dims in _ARRAY.findall(m.group(1)):
      total += int(np.prod([int(d) for d in dims.split(",") if d])) * _BYTES[dtype]
  return total


class Net(nn.Module):

  @nn.compact
  def __call__(self, x):
    return mxjax.Dense(256, name="down")(jax.nn.gelu(mxjax.Dense(512, name="up")(x)))


def _gather_bf16(a):
  """FSDP of a bf16 weight: gathered before use (as its bits: XLA's CPU would otherwise
  widen it to f32 for the collective, which a GPU does not); as it is on one device."""
  if jax.sharding.get_abstract_mesh().empty:
    return a
  bits = jax.sharding.reshard(lax.bitcast_convert_type(a, jnp.uint16), P())
  return lax.bitcast_convert_type(bits, jnp.bfloat16)


def _step(model, params, x, gather_bf16: bool):
  """Loss, output and gradients (bias of `up`, x) with the kernels frozen."""
  if gather_bf16:
    params = jax.tree.map(lambda a: _gather_bf16(a) if a.ndim == 2 else a, params)

  def loss(bias, x):
    y = model.apply({"params": {**params, "up": {**params["up"], "bias": bias}}}, x)
    return jnp.mean(y ** 2), y

  (value, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
      params["up"]["bias"], x)
  return value, y, grads


def test_fsdp_step_gathers_mx_codes_not_bf16():
  model, recipe = Net(), mxjax.MXFP8BlockScaling()
  x = jax.random.normal(jax.random.key(1), (64, 256))
  hp = model.init(jax.random.key(0), x)["params"]
  weights = {"bf16": jax.tree.map(lambda a: a.astype(jnp.bfloat16), hp),
             "mx": mxjax.quantize_params(hp, recipe)}
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  fsdp = lambda a: jax.device_put(  # noqa: E731  kernels (codes and scales) split on K
      a, NamedSharding(mesh, P("data", None) if a.ndim == 2 else P()))
  gathered = {}
  for name, params in weights.items():
    enabled = name == "mx"
    step = jax.jit(lambda p, x, g=not enabled: _step(model, p, x, g))
    with mxjax.autocast(enabled=enabled, recipe=recipe):
      want = step(params, x)  # one device
      with jax.set_mesh(mesh):
        sharded = jax.tree.map(fsdp, params)
        assert mxjax.memory_report(sharded).nbytes == mxjax.memory_report(params).nbytes
        xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
        gathered[name] = all_gather_bytes(step.lower(sharded, xs).compile().as_text())
        got = step(sharded, xs)
    # sums over the batch (the loss, the bias gradient) add the shards in another order;
    # the bf16 reference's gradient, rounded to bf16 from f32 GEMMs tiled differently on a
    # shard, may come out one bf16 ulp apart (at most 2^-7 of the value)
    tol = {"rtol": 1e-5, "atol": 1e-9} if enabled else {"rtol": 2.0 ** -7, "atol": 1e-9}
    for a, b in ((got[0], want[0]), (got[2][0], want[2][0])):
      np.testing.assert_allclose(a, b, **tol)
    for a, b in ((got[1], want[1]), (got[2][1], want[2][1])):  # the output, x's gradient
      if enabled:  # MX: products of exact values, equal to one device's bit for bit
        np.testing.assert_array_equal(a, b)
      else:  # the reference's f32 GEMM tiles differently on a shard
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  n_kernel = 256 * 512 * 2
  assert gathered["bf16"] >= 2 * n_kernel  # each kernel once, 2 B/param
  assert gathered["mx"] == pytest.approx(n_kernel * (1 + 1 / 32), rel=0.02)
  assert gathered["mx"] <= 0.55 * gathered["bf16"]
