"""Every format: `mxjax.ragged_dot(..., recipe=)` (mixture-of-experts) forward and both
gradients against an oracle built here from `mxjax.reference`, group by group, with group
boundaries off every block grid, an empty group and rows past the last group; and a bare
`lax.ragged_dot` in a model, intercepted, reported in coverage with the recipe.

The oracle (f64 sums of the oracle's values; the library sums in f32):

  forward   out[m]  = q(x, K)[m] . q(w[g], K)                      (2-D w: tiles per expert)
  dgrad     dx[m]   = q(dy, N; SR bits of dy's index, stream 0)[m] . q(w[g], N)^T
  wgrad     dw[g]   = q(R x_g, M)^T . q(R dy_g, M; SR)

each over the values without the FP32 tensor scale (one per operand: NVFP4), times the
inverse tensor scales. The wgrad quantizes each group on its own along M: its blocks
start at its first row (`reference.block_quantize` of the group's rows). With an RHT
(R: the library's block Hadamard transform, 16 rows with the product's signs) a group's
rows are padded with zeros to a whole transform and transformed, and the transformed
operands are what the oracle quantizes (R cancels in exact arithmetic; the transform
itself is checked here against an f64 one). SR draws the bits of group g's rows where the
product lays them out: group g starting at row sum_{h<g} ceil(n_h / a) * a of the bits'
index space, a = the longest block or transform (`mxjax._src.ragged`'s layout).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from format_cases import RECIPES, assert_bits_equal, every_format, oracle_values, random_data
from mxjax import reference
from mxjax._src import hadamard, stochastic

M, K, N = 150, 256, 128
SIZES = np.array([37, 0, 70, 20], np.int32)  # 127 rows in groups, 23 past the last one
KEY = jax.random.key(9)
NAME = "moe/up"


def _groups():
  ends = np.cumsum(SIZES)
  return [(int(e - n), int(e)) for n, e in zip(SIZES, ends)]


def _data():
  lhs = random_data((M, K), seed=0)
  rhs = random_data((len(SIZES), K, N), seed=1, scale=0.05, spread=1)
  dy = random_data((M, N), seed=2, spread=2)
  return lhs, rhs, dy


def _values(a, fmt, axis, rand=None, ts=None) -> np.ndarray:
  """The oracle's dequantized values (f64) along `axis`, the tensor scale applied."""
  v, inv = oracle_values(a, fmt, axis, rand, ts)
  return np.asarray(v, np.float64) * float(inv)


def _rht(a, roles):
  """A group's rows padded with zeros to a whole transform and transformed along them."""
  signs = hadamard.rht_signs(roles.rht_seed, NAME, roles.hadamard_size)
  return hadamard.rht(a, 0, signs)


def _oracle(recipe, lhs, rhs, dy, key):
  roles = recipe.roles()
  seed = stochastic.seed_of(key)
  sr = roles.stochastic_rounding
  bits = lambda i, shape: (stochastic.random_bits(stochastic.stream(seed, i), shape)  # noqa: E731
                           if sr else None)
  x_k = _values(lhs, roles.x, 1)
  w_k = _values(rhs, roles.w, 1)
  dy_n = _values(dy, roles.grad, 1, bits(0, dy.shape))
  w_n = _values(rhs, roles.w, 2)
  out, dx = np.zeros((M, N)), np.zeros((M, K))
  for g, (a, b) in enumerate(_groups()):
    out[a:b] = x_k[a:b] @ w_k[g]
    dx[a:b] = dy_n[a:b] @ w_n[g].T
  # wgrad: each group on its own along M (transformed first with an RHT)
  parts_x = [lhs[a:b] for a, b in _groups()]
  parts_dy = [dy[a:b] for a, b in _groups()]
  if roles.random_hadamard_transform:
    parts_x = [_rht(p, roles) for p in parts_x]
    parts_dy = [_rht(p, roles) for p in parts_dy]
  # one tensor scale per operand (NVFP4), over all its rows
  tail_x, tail_dy = lhs[SIZES.sum():], dy[SIZES.sum():]
  if roles.random_hadamard_transform:
    tail_x, tail_dy = _rht(tail_x, roles), _rht(tail_dy, roles)
  ts_x = reference.tensor_scale(jnp.concatenate(parts_x + [tail_x]), roles.x) \
      if roles.x.tensor_scale else None
  ts_dy = reference.tensor_scale(jnp.concatenate(parts_dy + [tail_dy]), roles.grad) \
      if roles.grad.tensor_scale else None
  align = max(roles.x.block_size, roles.grad.block_size,
              roles.hadamard_size if roles.random_hadamard_transform else 1)
  dw, start = np.zeros(rhs.shape), 0
  for g, (px, pdy) in enumerate(zip(parts_x, parts_dy)):
    if len(px):
      rand = None if not sr else bits(1, (start + len(pdy), N))[start:]
      dw[g] = _values(px, roles.x, 0, ts=ts_x).T @ _values(pdy, roles.grad, 0, rand, ts_dy)
    start += -(-int(SIZES[g]) // align) * align
  return out, dx, dw


def _close(got, want, what):
  got = np.asarray(got, np.float64)
  scale = np.abs(want).max(initial=1e-30)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


def test_the_transform_is_an_orthogonal_hadamard():
  """The oracle's R: runs of 16 rows times H diag(signs) / 4 (f64 here), zero padded."""
  a = random_data((37, 8), seed=5)
  signs = hadamard.rht_signs(0, NAME, 16)
  h = np.array([[1.0]])
  while h.shape[0] < 16:
    h = np.block([[h, h], [h, -h]])
  mat = h * signs[None, :] / 4.0
  padded = np.concatenate([np.asarray(a, np.float64), np.zeros((11, 8))])
  want = np.concatenate([mat @ padded[i:i + 16] for i in range(0, 48, 16)])
  np.testing.assert_allclose(np.asarray(hadamard.rht(a, 0, signs)), want, rtol=1e-6,
                             atol=1e-6)
  np.testing.assert_allclose(mat @ mat.T, np.eye(16), atol=1e-12)


@every_format
def test_ragged_dot_forward_and_gradients_equal_the_oracle(name):
  recipe = RECIPES[name]
  lhs, rhs, dy = _data()
  sizes = jnp.asarray(SIZES)

  @jax.jit
  def run(lhs, rhs, dy, key):
    out, vjp = jax.vjp(lambda a, b: mxjax.ragged_dot(a, b, sizes, recipe=recipe, rng=key,
                                                     name=NAME), lhs, rhs)
    return (out, *vjp(dy))

  got = run(lhs, rhs, dy, KEY)
  want = _oracle(recipe, lhs, rhs, dy, KEY)
  for g, w, what in zip(got, want, ("forward", "dx", "dw")):
    _close(g, w, f"{name}: {what}")
  out, dx, dw = (np.asarray(a) for a in got)
  assert not out[SIZES.sum():].any() and not dx[SIZES.sum():].any()  # rows past the groups
  assert not dw[1].any()  # the empty group
  plain = np.asarray(jax.lax.ragged_dot(lhs, rhs, sizes))
  assert not np.array_equal(out, plain)  # quantized
  if recipe.needs_rng():  # SR: another key, another weight gradient
    assert not np.array_equal(np.asarray(run(lhs, rhs, dy, jax.random.key(10))[2]), dw)


@every_format
def test_intercepted_ragged_dot_is_reported_and_equals_mxjax_ragged_dot(name):
  """A bare `lax.ragged_dot` in a model function: coverage names it with the recipe, and
  its value and gradients are `mxjax.ragged_dot`'s under the key and name interception
  gives it (`mx_rng` folded with the product's number; its path "ragged_dot_0")."""
  recipe = RECIPES[name]
  lhs, rhs, _ = _data()
  sizes = jnp.asarray(SIZES)
  moe = lambda a, b: jnp.sum(jnp.tanh(jax.lax.ragged_dot(a, b, sizes)))  # noqa: E731
  quantized = mxjax.quantized(moe)
  with mxjax.autocast(recipe=recipe):
    report = mxjax.coverage(quantized, lhs, rhs)
    got = jax.jit(jax.value_and_grad(lambda a, b: quantized(a, b, mx_rng=KEY),
                                     argnums=(0, 1)))(lhs, rhs)
  [product] = report.products
  assert (product.op, product.path, product.mx) == ("ragged_dot", "ragged_dot_0", True)
  assert product.recipe.startswith(type(recipe).__name__), product.recipe
  assert report.mx_share == 1.0
  direct = lambda a, b: jnp.sum(jnp.tanh(mxjax.ragged_dot(  # noqa: E731
      a, b, sizes, recipe=recipe, rng=jax.random.fold_in(KEY, 1),
      name="ragged_dot_0")))
  want = jax.jit(jax.value_and_grad(direct, argnums=(0, 1)))(lhs, rhs)
  for g, w, what in zip(jax.tree.leaves(got), jax.tree.leaves(want), ("loss", "dx", "dw")):
    assert_bits_equal(g, w, f"{name}: {what}")


def test_two_d_activation_formats_are_refused():
  """The one cell that cannot work: 2-D tiles for the rows would cross the groups."""
  recipe = mxjax.Float8BlockScaling(x_block_scaling_dim=2)
  lhs, rhs, _ = _data()
  with pytest.raises(ValueError, match="2-D tiles for the input or the gradient would cross "
                                       "the groups' row boundaries"):
    mxjax.ragged_dot(lhs, rhs, jnp.asarray(SIZES), recipe=recipe)
