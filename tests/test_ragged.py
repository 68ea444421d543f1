"""`mxjax.ragged_dot`: the MX grouped GEMM of mixture-of-experts layers, against the
oracle group by group (`mxjax.reference`), with group boundaries off the block grid, an
empty group and rows past the last group."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from mxjax import reference
from mxjax._src import ragged
from mx_products import count_mx_products

M, K, N = 150, 64, 48
SIZES = np.array([37, 0, 70, 20], np.int32)  # 127 rows in groups, 23 past the last one


def _data(dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  lhs = jnp.asarray(rng.standard_normal((M, K)) * np.exp(rng.normal(0, 2, (M, 1))), dtype)
  rhs = jnp.asarray(rng.standard_normal((len(SIZES), K, N)), dtype)
  return lhs, rhs


def _ref(x, fmt, axis):
  """reference quantize-dequantize along `axis` (f32)."""
  data, scales = reference.quantize(x, fmt, axis=axis)
  return np.asarray(reference.dequantize(data, scales, fmt, axis=axis, shape=x.shape),
                    np.float64)


def _groups():
  ends = np.cumsum(SIZES)
  return [(e - n, e) for n, e in zip(SIZES, ends)]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1"])
def test_group_blocks_end_at_each_group_boundary(fmt, simd_level):
  lhs, _ = _data()
  lhs = lhs.at[40:45].set(jnp.inf).at[100].set(0.0).at[130, 3].set(jnp.nan)
  got = ragged.group_fake_quantize(lhs, fmt, jnp.asarray(SIZES), block_size=32,
                                   scale_mode="rceil")
  want = reference.group_quantized(lhs, fmt, SIZES, block_size=32)
  np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                np.asarray(want).view(np.uint32))


def test_forward_is_the_product_of_the_oracles_operands_group_by_group():
  lhs, rhs = _data()
  y = np.asarray(jax.jit(mxjax.ragged_dot)(lhs, rhs, jnp.asarray(SIZES)), np.float64)
  lq = _ref(lhs, "e4m3", 1)
  for g, (a, b) in enumerate(_groups()):
    want = lq[a:b] @ _ref(rhs[g], "e4m3", 0)  # exact products, f64 sums
    np.testing.assert_allclose(y[a:b], want, rtol=1e-5,  # f32 sums of exact products
                               atol=1e-5 * np.abs(want).max(initial=0))
  assert not np.any(y[SIZES.sum():])  # rows past the last group: zeros
  plain = np.asarray(jax.lax.ragged_dot(lhs, rhs, jnp.asarray(SIZES)), np.float64)
  assert not np.array_equal(y, plain)


def test_gradients_match_the_oracle_group_by_group():
  lhs, rhs = _data()
  g = jnp.asarray(np.random.default_rng(1).standard_normal((M, N)), jnp.float32)
  _, vjp = jax.vjp(lambda a, b: mxjax.ragged_dot(a, b, jnp.asarray(SIZES)), lhs, rhs)
  dlhs, drhs = (np.asarray(x, np.float64) for x in jax.jit(vjp)(g))
  gq_n = _ref(g, "e5m2", 1)                                   # dgrad: along N
  gq_m = np.asarray(reference.group_quantized(g, "e5m2", SIZES), np.float64)   # wgrad: M
  lq_m = np.asarray(reference.group_quantized(lhs, "e4m3", SIZES), np.float64)
  for e, (a, b) in enumerate(_groups()):
    want = gq_n[a:b] @ _ref(rhs[e], "e4m3", 1).T
    np.testing.assert_allclose(dlhs[a:b], want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max(initial=0))
    want_w = lq_m[a:b].T @ gq_m[a:b]
    np.testing.assert_allclose(drhs[e], want_w, rtol=1e-5,
                               atol=1e-5 * np.abs(want_w).max(initial=1))
  assert not np.any(drhs[1]) and not np.any(dlhs[SIZES.sum():])  # the empty group; the tail


def test_intercepted_ragged_dot_with_experts_split_over_a_mesh_equals_one_device():
  lhs, rhs = _data()
  sizes = jnp.asarray(SIZES)
  loss = lambda a, b: jnp.sum(jax.lax.ragged_dot(a, b, sizes) ** 2)  # noqa: E731
  mesh = jax.make_mesh((4,), ("expert",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:4])  # (jax infers no Explicit ragged_dot)
  with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()):
    one = jax.value_and_grad(mxjax.quantized(loss), argnums=(0, 1))(lhs, rhs)
    report = mxjax.coverage(mxjax.quantized(loss), lhs, rhs)
    split = jax.device_put(rhs, jax.NamedSharding(mesh, jax.P("expert")))
    sharded = jax.jit(jax.value_and_grad(mxjax.quantized(loss), argnums=(0, 1)))(lhs, split)
  assert [(p.op, p.mx) for p in report.products] == [("ragged_dot", True)]
  assert split.sharding.spec[0] == "expert"
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(sharded)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("recipe", [mxjax.MXFP8BlockScaling(), mxjax.NVFP4BlockScaling()],
                         ids=["mxfp8", "nvfp4"])
def test_ragged_dot_is_the_one_block_scaled_product(recipe):
  """ragged_dot is a thin layer over mxjax's one product (its custom VJP and config, with
  grouped GEMMs), not a product of its own."""
  lhs, rhs = _data()
  fn = lambda lhs, rhs: ragged.ragged_dot(lhs, rhs, SIZES, recipe=recipe,  # noqa: E731
                                          rng=jax.random.key(0))
  assert count_mx_products(fn, lhs, rhs) == 1


def test_bad_operands_are_refused():
  lhs, rhs = _data()
  with pytest.raises(ValueError, match=r"lhs \[M, K\], rhs \[G, K, N\]"):
    mxjax.ragged_dot(lhs, rhs[0], jnp.asarray(SIZES))
  with pytest.raises(TypeError, match="group_sizes must be integers"):
    mxjax.ragged_dot(lhs, rhs, jnp.asarray(SIZES, jnp.float32))
