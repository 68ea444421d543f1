"""jax.export of a serving function whose MX weights (quantize_params) are inputs, on the
plain-XLA path: serialized, reloaded and run; lowered for several platforms at once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from mxjax._src import backend
from mxjax.sweep import model as model_lib

TINY = model_lib.ModelConfig(d_model=32, layers=1, heads=2, max_len=16)


@pytest.fixture
def xla_kernels():
  before = backend.get_kernels()
  mxjax.set_kernels("xla")
  yield
  backend.set_kernels(before)


def test_export_serving_with_mx_weights_as_inputs(xla_kernels):
  """Next-token logits of the LM from MXFP4 weights: the exported program takes the
  MXArrays as arguments (other weights of the same shapes run without re-export), has no
  FFI call (it lowers for cpu and tpu at once), and reloaded it gives the jitted tokens."""
  lm = model_lib.LanguageModel(TINY)
  recipe = mxjax.MXFP4BlockScaling()
  convert = lambda p: mxjax.quantize_params(  # noqa: E731
      p, recipe, contract_ndim=lambda path: model_lib.contraction_ndim(path.split("/")))
  prompt = jnp.asarray(np.frombuffer(b"def f", np.uint8).astype(np.int32))[None]
  init = jax.jit(lm.init)
  weights = [convert(init(jax.random.key(seed), prompt)["params"]) for seed in (0, 1)]

  def serve(params, prompt):
    with mxjax.autocast(recipe=recipe):
      return lm.apply({"params": params}, prompt)[:, -1]

  exported = jax.export.export(jax.jit(serve), platforms=("cpu", "tpu"))(
      weights[0], prompt)
  assert "custom_call" not in exported.mlir_module()  # plain XLA: no FFI call
  assert any(isinstance(a, mxjax.MXArray) for a in jax.tree.leaves(
      exported.in_tree.unflatten(exported.in_avals),
      is_leaf=lambda a: isinstance(a, mxjax.MXArray)))
  reloaded = jax.export.deserialize(exported.serialize())
  for params in weights:
    np.testing.assert_array_equal(reloaded.call(params, prompt), jax.jit(serve)(params, prompt))
  assert not np.array_equal(reloaded.call(*weights[:1], prompt), reloaded.call(weights[1], prompt))
