"""mxjax.quantize_params: post-training quantization of linen / NNX variables, through an
orbax round trip, run by mxjax's own modules with no change to the model's code."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import mxjax
from mxjax import MXArray
from mxjax.nnx.modules import QuantizedKernel

MX8, MX4 = mxjax.MXFP8BlockScaling(), mxjax.MXFP4BlockScaling()


def _bits(x):
  return np.asarray(x).view(np.uint8 if x.dtype.itemsize == 1 else np.uint16)


class Net(nn.Module):
  """Dense, a DenseGeneral to (4, 32) and one contracting both those dims back."""

  @nn.compact
  def __call__(self, x):
    h = jax.nn.gelu(mxjax.Dense(256, name="up")(x))
    h = mxjax.DenseGeneral((4, 32), name="split")(h)
    return mxjax.DenseGeneral(64, axis=(-2, -1), name="merge")(h)


def _contract_ndim(path: str) -> int:
  return 2 if "merge" in path else 1


def _roundtrip(tmp_path, name, tree, target):
  path = os.path.join(tmp_path, name)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, tree)
    checkpointer.wait_until_finished()
    restored = checkpointer.restore(path, target)
  size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
  return restored, size


def test_linen_ptq_orbax_roundtrip_runs_as_on_the_fly(tmp_path):
  """Trained f32 params -> quantize_params (MXFP4, the kernel picked by a rule kept in
  high precision) -> orbax -> restored into jax.eval_shape's target -> the unchanged model
  applies them; its output equals the f32 params' with the same quantization on the fly."""
  x = jax.random.normal(jax.random.key(1), (8, 64))
  model = Net()
  variables = jax.jit(model.init)(jax.random.key(0), x)
  rules = [(r"split", None)]
  convert = lambda v: mxjax.quantize_params(  # noqa: E731
      v, MX4, rules, contract_ndim=_contract_ndim)
  mx = convert(variables)
  params = mx["params"]
  assert isinstance(params["up"]["kernel"], MXArray) and params["up"]["kernel"].axis == 0
  assert params["merge"]["kernel"].shape == (128, 64)  # two contracted dims: 2-D form
  assert not isinstance(params["split"]["kernel"], MXArray)  # the rule's None
  assert params["up"]["bias"] is variables["params"]["up"]["bias"]  # the rest as it is
  assert (jax.tree.structure(jax.tree.map(lambda _: 0, mx, is_leaf=lambda a: isinstance(
      a, MXArray))) == jax.tree.structure(variables))
  restored, _ = _roundtrip(tmp_path, "linen", mx, jax.eval_shape(convert, variables))
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(mx), strict=True):
    np.testing.assert_array_equal(_bits(a), _bits(b))

  with mxjax.autocast(recipe=MX4):  # "split" quantized on the fly in both
    want = jax.jit(model.apply)(variables, x)
    got = jax.jit(model.apply)(restored, x)
  np.testing.assert_array_equal(_bits(got), _bits(want))
  # autocast off: the stored kernels are dequantized (their MX values, high precision)
  is_mx = lambda a: isinstance(a, MXArray)  # noqa: E731
  deq = jax.tree.map(lambda a: a.dequantize() if is_mx(a) else a, restored, is_leaf=is_mx)
  deq["params"]["merge"]["kernel"] = deq["params"]["merge"]["kernel"].reshape(4, 32, 64)
  np.testing.assert_array_equal(model.apply(restored, x), model.apply(deq, x))
  with mxjax.autocast(recipe=MX8), pytest.raises(ValueError, match="Recipe mismatch for"):
    model.apply(restored, x)


class NnxNet(nnx.Module):

  def __init__(self, rngs):
    self.up = mxjax.nnx.Linear(64, 256, rngs=rngs)
    self.down = mxjax.nnx.Linear(256, 64, rngs=rngs)

  def __call__(self, x):
    return self.down(jax.nn.gelu(self.up(x)))


def test_nnx_ptq_orbax_roundtrip_runs_as_on_the_fly(tmp_path):
  """nnx.state -> quantize_params (MXFP8) -> orbax (bytes on disk about 1.03 per
  kernel param) -> nnx.merge with the model's graphdef: frozen QuantizedKernel variables,
  the same output as the f32 model quantized on the fly."""
  x = jax.random.normal(jax.random.key(1), (8, 64))
  model = NnxNet(nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  mx = mxjax.quantize_params(state, MX8)
  assert isinstance(mx["up"]["kernel"], QuantizedKernel)
  assert isinstance(mx["up"]["kernel"].get_value(), MXArray)
  assert isinstance(mx["up"]["bias"], nnx.Param)
  target = jax.eval_shape(lambda s: mxjax.quantize_params(s, MX8), state)
  restored, _ = _roundtrip(tmp_path, "nnx", mx, target)
  quantized = nnx.merge(graphdef, restored)
  assert mxjax.memory_report(quantized).quantized_bytes_per_param == pytest.approx(1 + 1 / 32)
  with mxjax.autocast(recipe=MX8):
    want = nnx.jit(lambda m, x: m(x))(model, x)
    got = nnx.jit(lambda m, x: m(x))(quantized, x)
  np.testing.assert_array_equal(_bits(got), _bits(want))
  # frozen: a gradient over nnx.Param leaves the quantized kernels out
  with mxjax.autocast(recipe=MX8):
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(quantized)
  assert set(grads["up"]) == {"bias"}


def test_bytes_on_disk_are_the_format_bytes_per_param(tmp_path):
  """A [1024, 512] kernel on disk: about params x (bits/8 + 1/32) bytes, up to orbax's
  compression (0.83 B/param for MXFP8 of normal values) and its own files (a few KiB)."""
  w = {"params": {"proj": {"kernel": jax.random.normal(jax.random.key(0), (1024, 512))}}}
  n, sizes = 1024 * 512, {}
  for recipe, bits in ((MX8, 8), (mxjax.MXFP6BlockScaling(), 6), (MX4, 4)):
    mx = mxjax.quantize_params(w, recipe)
    _, size = _roundtrip(tmp_path, f"disk{bits}", mx, mx)
    sizes[bits] = size / n
  print(sizes)
  # orbax compresses (zstd): the codes of normal values do not use every bit pattern
  for bits, per_param in sizes.items():
    assert 0.7 * (bits / 8 + 1 / 32) < per_param < 1.05 * (bits / 8 + 1 / 32), sizes


def test_errors_name_the_path():
  params = {"params": {"dense": {"kernel": jnp.ones((64, 32))},
                       "odd": {"kernel": jnp.ones((64,))}}}
  with pytest.raises(ValueError, match="'params/odd/kernel' has shape \\(64,\\)"):
    mxjax.quantize_params(params)
  ok = {"params": {"dense": {"kernel": jnp.ones((64, 32))}}}
  with pytest.raises(ValueError, match="the rule 'attn' matches no leaf"):
    mxjax.quantize_params(ok, rules=[("attn", None)])
  mx4 = mxjax.quantize_params(ok, MX4)
  with pytest.raises(ValueError, match="recipe mismatch at 'params/dense/kernel'.*e2m1"):
    mxjax.quantize_params(mx4, MX8)
  assert mxjax.quantize_params(mx4, MX4)["params"]["dense"]["kernel"] is (
      mx4["params"]["dense"]["kernel"])
  with pytest.raises(ValueError, match="needs a block-scaled recipe"):
    mxjax.quantize_params(ok, mxjax.Float8CurrentScaling())
  with pytest.raises(TypeError, match="pass nnx.state"):
    mxjax.quantize_params(NnxNet(nnx.Rngs(0)))
