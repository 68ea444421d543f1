"""MX ops under jit with NamedSharding on 8 CPU devices (XLA_FLAGS set in conftest.py)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import mxjax
from sharding_helpers import assert_grads_close

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")

COLLECTIVE = re.compile(r"all-gather|all-to-all|collective-permute|all-reduce")


@pytest.fixture(scope="module")
def mesh():
  # Auto axes: the partitioner (Shardy) propagates shardings, as Flax's helpers expect.
  return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def bits(a):
  return np.asarray(jax.lax.bitcast_convert_type(a, jnp.uint8))


def same_sharding(a, mesh, spec):
  return a.sharding.is_equivalent_to(NamedSharding(mesh, spec), a.ndim)


def hlo(f, *args):
  return f.lower(*args).compile().as_text()


SPECS = [P("data", None), P(None, "model"), P("data", "model"), P(None, ("data", "model")),
         P(("model", "data"), None)]


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m3", "e2m1"])
def test_sharded_quantize_is_shard_local_and_bit_identical(mesh, spec, fmt):
  x = jax.random.normal(jax.random.key(0), (256, 512), jnp.bfloat16) * 3
  xs = jax.device_put(x, NamedSharding(mesh, spec))
  expected = mxjax.quantize(x, fmt)
  f = jax.jit(lambda x: mxjax.quantize(x, fmt))
  got = f(xs)
  np.testing.assert_array_equal(bits(got.data), bits(expected.data))
  np.testing.assert_array_equal(bits(got.scales), bits(expected.scales))
  assert same_sharding(got.data, mesh, spec) and same_sharding(got.scales, mesh, spec)
  assert not COLLECTIVE.search(hlo(f, xs))
  # quantize_2x: both quantizations shard-local too (each shard holds whole blocks).
  g = jax.jit(lambda x: mxjax.quantize_2x(x, fmt))
  rows, cols = g(xs)
  exp_rows, exp_cols = mxjax.quantize_2x(x, fmt)
  for a, b in ((rows, exp_rows), (cols, exp_cols)):
    np.testing.assert_array_equal(bits(a.data), bits(b.data))
    np.testing.assert_array_equal(bits(a.scales), bits(b.scales))
  assert not COLLECTIVE.search(hlo(g, xs))
  # dequantize of the sharded MXArray stays sharded and local.
  d = jax.jit(lambda a: a.dequantize(jnp.bfloat16))
  out = d(got)
  np.testing.assert_array_equal(np.asarray(out, np.float32),
                                np.asarray(expected.dequantize(jnp.bfloat16), np.float32))
  assert same_sharding(out, mesh, spec)
  assert not COLLECTIVE.search(hlo(d, got))
  # fake_quantize along either axis: the input's sharding, shard-local, the same bits.
  for axis in (-1, 0):
    fq = jax.jit(lambda x, axis=axis: mxjax.fake_quantize(x, fmt, axis=axis))
    out = fq(xs)
    want = mxjax.quantize(x, fmt, axis=axis).dequantize(jnp.bfloat16)
    np.testing.assert_array_equal(bits(out), bits(want))
    assert same_sharding(out, mesh, spec)
    assert not COLLECTIVE.search(hlo(fq, xs))


def test_shards_that_cut_blocks_are_gathered_not_wrong(mesh):
  # 8 shards of 80 columns: 10 per shard cuts the 32-blocks; the answer must stay right.
  x = jax.random.normal(jax.random.key(1), (16, 80), jnp.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P(None, ("data", "model"))))
  got = jax.jit(lambda x: mxjax.quantize(x, "e4m3"))(xs)
  expected = mxjax.quantize(x, "e4m3")
  np.testing.assert_array_equal(bits(got.data), bits(expected.data))
  np.testing.assert_array_equal(bits(got.scales), bits(expected.scales))
  # A length that is not a multiple of the block at all.
  y = jax.random.normal(jax.random.key(2), (16, 100), jnp.float32)
  ys = jax.device_put(y, NamedSharding(mesh, P("data", "model")))
  got = jax.jit(lambda y: mxjax.quantize(y, "e2m1"))(ys)
  expected = mxjax.quantize(y, "e2m1")
  np.testing.assert_array_equal(bits(got.data), bits(expected.data))
  np.testing.assert_array_equal(bits(got.scales), bits(expected.scales))
  for v, vs in ((x, xs), (y, ys)):  # fake_quantize gathers such an axis the same way
    got = jax.jit(lambda v: mxjax.fake_quantize(v, "e2m1"))(vs)
    want = mxjax.quantize(v, "e2m1").dequantize(jnp.float32)
    np.testing.assert_array_equal(bits(got), bits(want))


def test_fewer_blocks_than_shards_are_gathered_not_an_error():
  # 2 blocks along axis 0 over 8 devices: Shardy would split the mesh axis into
  # sub-axes, which a PartitionSpec cannot say; the axis is gathered instead.
  mesh18 = jax.make_mesh((1, 8), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  x = jax.random.normal(jax.random.key(5), (64, 128), jnp.float32)
  xs = jax.device_put(x, NamedSharding(mesh18, P("model", None)))
  got = jax.jit(lambda x: mxjax.quantize(x, "e4m3", axis=0))(xs)
  expected = mxjax.quantize(x, "e4m3", axis=0)
  np.testing.assert_array_equal(bits(got.data), bits(expected.data))
  np.testing.assert_array_equal(bits(got.scales), bits(expected.scales))
  rows, cols = jax.jit(lambda x: mxjax.quantize_2x(x, "e4m3"))(xs)
  exp_rows, exp_cols = mxjax.quantize_2x(x, "e4m3")
  np.testing.assert_array_equal(bits(cols.data), bits(exp_cols.data))
  np.testing.assert_array_equal(bits(rows.scales), bits(exp_rows.scales))


def test_sharded_dot_general_matches_single_device(mesh):
  x = jax.random.normal(jax.random.key(3), (64, 256), jnp.float32)
  w = jax.random.normal(jax.random.key(4), (256, 128), jnp.float32)
  loss = lambda x, w: jnp.sum(mxjax.matmul(x, w) ** 2)
  expected = jax.value_and_grad(loss, (0, 1))(x, w)
  for xspec, wspec in [(P("data", None), P(None, None)),  # data parallel
                       (P("data", None), P(None, "model")),  # tensor parallel, column
                       (P("data", "model"), P("model", None))]:  # tensor parallel, row
    xs = jax.device_put(x, NamedSharding(mesh, xspec))
    ws = jax.device_put(w, NamedSharding(mesh, wspec))
    f = jax.jit(jax.value_and_grad(loss, (0, 1)))
    got = f(xs, ws)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    assert_grads_close(got[1][0], expected[1][0])
    assert_grads_close(got[1][1], expected[1][1])
