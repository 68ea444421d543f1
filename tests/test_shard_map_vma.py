"""mxjax's custom VJPs inside `jax.shard_map` with `check_vma=True` (the default), on 8 CPU
devices: an operand replicated over a manual axis that the other operand varies over gets
its gradient summed over that axis and stays replicated, as with `lax.dot_general`. Each
gradient equals, bit for bit, the same shard_map with `check_vma=False` and an explicit
`jax.lax.psum`; forward values are unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import mxjax
from mxjax import state as state_lib
from mxjax._src import fp8, sharding
from sharding_helpers import assert_grads_close

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")

KINDS = ("auto", "explicit")
DIMS = (((1,), (0,)), ((), ()))
OPS = {
    "matmul": lambda x, w: mxjax.matmul(x, w),
    "dot_general": lambda x, w: mxjax.dot_general(x, w, DIMS),
    "einsum": lambda x, w: mxjax.einsum("bk,kn->bn", x, w),
}
# 32 rows per device along 'data': whole 32-blocks for the wgrad's quantization along M.
X = jax.random.normal(jax.random.key(0), (256, 64))
W = jax.random.normal(jax.random.key(1), (64, 128))


def make_mesh(kind, shape=(8,), names=("data",)):
  axis_type = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}[kind]
  return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names))


def run(mesh, f, in_specs, out_specs, *args, check_vma=True):
  """jit(shard_map(f)) on args placed as in_specs, under jax.set_mesh(mesh)."""
  with jax.set_mesh(mesh):
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, in_specs)]
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=check_vma))(*args)


def loss(op):
  return lambda w, x: jnp.sum(op(x, w) ** 2)


def rel(a, b):
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def stock_grad(argnums):
  return jax.grad(lambda w, x: jnp.sum(jnp.dot(x, w, precision="highest") ** 2),
                  argnums=argnums)(W, X)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("kind", KINDS)
def test_replicated_weight_grad_is_psummed(kind, op):
  """Data parallel: x split on 'data', w replicated; dw is the psum of the local dws."""
  mesh, f = make_mesh(kind), loss(OPS[op])
  specs = (P(), P("data"))
  got = run(mesh, jax.grad(f), specs, P(), W, X)
  want = run(mesh, lambda w, x: jax.lax.psum(jax.grad(f)(w, x), "data"), specs, P(), W, X,
             check_vma=False)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert rel(got, stock_grad(0)) < 0.1
  # and the same as the stock dot in the same shard_map, to MXFP8's accuracy
  stock = run(mesh, jax.grad(loss(lambda x, w: jnp.dot(x, w, precision="highest"))), specs,
              P(), W, X)
  assert rel(got, stock) < 0.1


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("kind", KINDS)
def test_forward_unchanged(kind, op):
  """The forward value (without and with a backward) equals check_vma=False's."""
  mesh, f = make_mesh(kind), OPS[op]
  specs = (P(), P("data"))
  fwd = lambda w, x: f(x, w)  # noqa: E731
  for fn in (fwd, lambda w, x: jax.vjp(fwd, w, x)[0]):
    got = run(mesh, fn, specs, P("data"), W, X)
    want = run(mesh, fn, specs, P("data"), W, X, check_vma=False)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("kind", KINDS)
def test_replicated_input_grad_is_psummed(kind):
  """Tensor parallel: x replicated, w split on its features; dx is the psum of the local
  dxs."""
  mesh, f = make_mesh(kind), loss(OPS["matmul"])
  specs = (P(None, "data"), P())
  dx = jax.grad(f, argnums=1)
  got = run(mesh, dx, specs, P(), W, X)
  want = run(mesh, lambda w, x: jax.lax.psum(dx(w, x), "data"), specs, P(), W, X,
             check_vma=False)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert rel(got, stock_grad(1)) < 0.1


@pytest.mark.parametrize("kind", KINDS)
def test_each_operand_replicated_over_the_others_axis(kind):
  """2x4 mesh: x split on 'data', w on its features over 'model'; dx is summed over
  'model', dw over 'data'."""
  mesh = make_mesh(kind, (2, 4), ("data", "model"))
  f = loss(OPS["matmul"])
  specs, grads = (P(None, "model"), P("data")), jax.grad(f, argnums=(0, 1))
  summed = lambda w, x: (lambda g: (jax.lax.psum(g[0], "data"),  # noqa: E731
                                    jax.lax.psum(g[1], "model")))(grads(w, x))
  got = run(mesh, grads, specs, specs, W, X)
  want = run(mesh, summed, specs, specs, W, X, check_vma=False)
  for g, w, stock in zip(got, want, stock_grad((0, 1))):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert rel(g, stock) < 0.1


@pytest.mark.parametrize("kind", KINDS)
def test_both_operands_varying(kind):
  """Both operands split on the batch: the local gradients, no sum, as check_vma=False."""
  mesh = make_mesh(kind)
  x = jax.random.normal(jax.random.key(2), (16, 32, 64))
  w = jax.random.normal(jax.random.key(3), (16, 64, 128))
  grads = jax.grad(loss(OPS["matmul"]), argnums=(0, 1))
  specs = (P("data"), P("data"))
  got = run(mesh, grads, specs, specs, w, x)
  want = run(mesh, grads, specs, specs, w, x, check_vma=False)
  stock = jax.grad(lambda w, x: jnp.sum(jnp.matmul(x, w, precision="highest") ** 2),
                   argnums=(0, 1))(w, x)
  for g, v, s in zip(got, want, stock):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(v))
    assert rel(g, s) < 0.1


@pytest.mark.parametrize("kind", KINDS)
def test_replicated_mxarray_weight(kind):
  """A weight quantized ahead of time (an MXArray pytree), replicated: dx as with
  check_vma=False."""
  mesh = make_mesh(kind)
  q = mxjax.quantize(W, "e4m3", axis=0)
  dx = jax.grad(lambda q, x: jnp.sum(mxjax.matmul(x, q) ** 2), argnums=1)
  specs = (P(), P("data"))
  got = run(mesh, dx, specs, P("data"), q, X)
  want = run(mesh, dx, specs, P("data"), q, X, check_vma=False)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("recipe", [mxjax.Float8CurrentScaling(), mxjax.DelayedScaling()],
                         ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_replicated_weight_grad(kind, recipe):
  """Per-tensor FP8 (mxjax._src.fp8.dot_general): dw summed over 'data'. Its backward sums
  before its scaling, check_vma=False's after: equal up to f32 rounding."""
  mesh = make_mesh(kind)
  tensors = state_lib.init(recipe).tensors if recipe.delayed() else None
  dw = jax.grad(lambda w, x: jnp.sum(fp8.dot_general(x, w, DIMS, recipe, tensors)[0] ** 2))
  specs = (P(), P("data"))
  got = run(mesh, dw, specs, P(), W, X)
  want = run(mesh, lambda w, x: jax.lax.psum(dw(w, x), "data"), specs, P(), W, X,
             check_vma=False)
  assert_grads_close(got, want)  # the same products, summed before or after the scaling
  assert rel(got, stock_grad(0)) < 0.1


def test_vary_alike_is_a_no_op_where_nothing_varies():
  """Outside shard_map and under check_vma=False the operands come back as they are;
  under check_vma both vary over the union of their axes."""
  a, b = sharding.vary_alike(X, W)
  assert a is X and b is W
  mesh = make_mesh("auto")

  def check(w, x):
    a, b = sharding.vary_alike(x, w)
    if sharding.varying_axes(x):  # check_vma=True
      assert sharding.varying_axes(a) == sharding.varying_axes(b) == {"data"}
    else:
      assert a is x and b is w
    return x

  for check_vma in (True, False):
    run(mesh, check, (P(), P("data")), P("data"), W, X, check_vma=check_vma)
