"""Rules with recipes on stock Flax layers: each layer runs the format its rule names.

`mxjax.linen.intercept(rules)` on nn.Dense / nn.DenseGeneral / nn.Einsum and
`mxjax.nnx.quantize(model, rules)` on nnx.Linear / nnx.LinearGeneral / nnx.Einsum, under
an MXFP8 autocast. Every layer reads the same input; the format each one used is read off
its output: it equals, to f32 rounding, the product of the input and kernel quantized
along the contraction by the oracle (`mxjax.reference`) in exactly one of MXFP8 (E4M3),
MXFP4 (E2M1) or no format (high precision), and those three differ by percents.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mxjax
from mxjax import reference

D, N = 64, 32  # the contraction holds two 32-blocks
MXFP8, MXFP4 = mxjax.MXFP8BlockScaling(), mxjax.MXFP4BlockScaling()
PATHS = ("attn/dense", "attn/general", "mlp/dense", "mlp/general", "head")
FORMATS = ("high", "e4m3", "e2m1")

# (rules, the format of each path in PATHS); the autocast recipe is MXFP8.
CASES = {
    "mlp_mxfp4": ([(r"mlp", MXFP4)], ("e4m3", "e4m3", "e2m1", "e2m1", "e4m3")),
    # first match wins: the MLP stays high precision, the catch-all takes the rest
    "none_first": ([(r"mlp", None), (r".*", MXFP4)], ("e2m1", "e2m1", "high", "high", "e2m1")),
    # first match wins: a recipe before a None rule that matches the same layer
    "recipe_first": ([(r"head", MXFP4), (r"head|attn/dense", None)],
                     ("high", "e4m3", "e4m3", "e4m3", "e2m1")),
}


def quantized_values(a, fmt: str, axis: int) -> np.ndarray:
  """`a` quantized along `axis` and decoded by the oracle (f64)."""
  data, scales = reference.quantize(a, fmt, axis=axis)
  return np.asarray(reference.dequantize(data, scales, fmt, axis=axis, shape=a.shape),
                    np.float64)


def format_of(y, x, kernel, bias) -> str:
  """Which of FORMATS `y` = x [B, D] . kernel [D, N] + bias was computed in: the one oracle
  within f32 rounding (1e-5 relative); the others must be 1e-3 or more away."""
  errors = {}
  for fmt in FORMATS:
    xq, kq = ((np.asarray(x, np.float64), np.asarray(kernel, np.float64)) if fmt == "high"
              else (quantized_values(x, fmt, 1), quantized_values(kernel, fmt, 0)))
    want = xq @ kq + np.asarray(bias, np.float64)
    errors[fmt] = float(np.linalg.norm(np.asarray(y, np.float64) - want) / np.linalg.norm(want))
  close = [fmt for fmt, err in errors.items() if err < 1e-5]
  assert len(close) == 1 and all(err > 1e-3 for fmt, err in errors.items()
                                 if fmt not in close), errors
  return close[0]


def inputs():
  return jax.random.normal(jax.random.key(7), (8, D), jnp.float32)


class Pair(nn.Module):
  @nn.compact
  def __call__(self, x):
    return {"dense": nn.Dense(N, name="dense")(x),
            "general": nn.DenseGeneral(N, name="general")(x)}


class Fan(nn.Module):
  """Every stock GEMM layer kind on the same input x [B, D] -> {path parts: [B, N]}."""

  @nn.compact
  def __call__(self, x):
    return {"attn": Pair(name="attn")(x), "mlp": Pair(name="mlp")(x),
            "head": nn.Einsum((D, N), "bd,dn->bn", name="head")(x)}


def _flat(tree) -> dict:
  return {"/".join(str(getattr(k, "key", k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.fixture(scope="module")
def linen_fan():
  x = inputs()
  return x, Fan().init(jax.random.key(0), x)


@pytest.mark.parametrize("case", sorted(CASES))
def test_linen_rules_give_each_stock_layer_its_format(linen_fan, case):
  x, variables = linen_fan
  rules, want = CASES[case]
  with mxjax.autocast(recipe=MXFP8), mxjax.linen.intercept(rules):
    out = _flat(jax.jit(Fan().apply)(variables, x))
  params = variables["params"]
  got = []
  for path in PATHS:
    layer = params
    for part in path.split("/"):
      layer = layer[part]
    got.append(format_of(out[path], x, layer["kernel"], layer["bias"]))
  assert tuple(got) == want, dict(zip(PATHS, got))


class NPair(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.dense = nnx.Linear(D, N, rngs=rngs)
    self.general = nnx.LinearGeneral(D, N, rngs=rngs)

  def __call__(self, x):
    return {"dense": self.dense(x), "general": self.general(x)}


class NFan(nnx.Module):
  """The NNX form of `Fan`: the same graph paths."""

  def __init__(self, rngs: nnx.Rngs):
    self.attn = NPair(rngs)
    self.mlp = NPair(rngs)
    self.head = nnx.Einsum("bd,dn->bn", (D, N), (N,), rngs=rngs)

  def __call__(self, x):
    return {"attn": self.attn(x), "mlp": self.mlp(x), "head": self.head(x)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_nnx_rules_give_each_stock_layer_its_format(case):
  x = inputs()
  rules, want = CASES[case]
  model = mxjax.nnx.quantize(NFan(nnx.Rngs(0)), rules)
  with mxjax.autocast(recipe=MXFP8):
    out = _flat(nnx.jit(lambda m, x: m(x))(model, x))
  layers = {"/".join(map(str, path)): node for path, node in nnx.iter_graph(model)}
  got = [format_of(out[path], x, layers[path].kernel[...], layers[path].bias[...])
         for path in PATHS]
  assert tuple(got) == want, dict(zip(PATHS, got))
