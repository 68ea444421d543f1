"""mxjax.einsum: exact against the oracle's dequantized operands, gradients against an
independent computation, jnp.einsum's shapes for every kind of subscripts, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mxjax
from test_dot import oracle_fake

HIGHEST = lax.Precision.HIGHEST

# (subscripts, a shape, b shape): batched, transposed operands / outputs, several
# contracted dims, ragged blocks.
CASES = [
    ("bqd,bkd->bqk", (3, 40, 64), (3, 24, 64)),  # batched, both contract their last dim
    ("ki,kj->ji", (96, 40), (96, 24)),  # transposed lhs and transposed output
    ("abcd,cdbe->ea", (6, 4, 8, 16), (8, 16, 4, 5)),  # three contracted dims, output ea
    ("xyhd,dn->xynh", (2, 5, 3, 50), (50, 7)),  # K = 50 (a ragged block)
    ("bthd,bshd->bhts", (2, 9, 3, 32), (2, 11, 3, 32)),  # attention scores
]


def _split(subscripts):
  """(a's, b's, output's indices, the contracted ones) of an explicit equation."""
  inputs, out_ix = subscripts.split("->")
  a_ix, b_ix = inputs.split(",")
  contract = [c for c in a_ix if c in b_ix and c not in out_ix]
  return a_ix, b_ix, out_ix, contract


def assert_close_to_exact(got, want, bound):
  """|got - want| within f32 accumulation-order error of `bound` = sum |a| |b|."""
  err = jnp.abs(got.astype(jnp.float32) - want)
  assert bool(jnp.all(err <= 1e-5 * bound + 1e-30)), float(jnp.max(err - 1e-5 * bound))


def _operands(a_shape, b_shape, seed=0):
  ka, kb, kg = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(ka, a_shape, jnp.float32),
          jax.random.normal(kb, b_shape, jnp.float32), kg)


@pytest.mark.parametrize("subscripts, a_shape, b_shape", CASES)
@pytest.mark.parametrize("fmt", ["e4m3", "e3m2"])
def test_forward_is_exact_product_of_oracle_dequantized_operands(subscripts, a_shape, b_shape,
                                                                  fmt):
  a, b, _ = _operands(a_shape, b_shape)
  a_ix, b_ix, _, contract = _split(subscripts)
  out = jax.jit(functools.partial(mxjax.einsum, subscripts, fwd_format=fmt))(a, b)
  qa = oracle_fake(a, fmt, [a_ix.index(c) for c in contract])
  qb = oracle_fake(b, fmt, [b_ix.index(c) for c in contract])
  want = jnp.einsum(subscripts, qa, qb, precision=HIGHEST)
  assert out.shape == want.shape and out.dtype == jnp.float32
  assert_close_to_exact(out, want, jnp.einsum(subscripts, jnp.abs(qa), jnp.abs(qb),
                                              precision=HIGHEST))
  assert not bool(jnp.all(out == jnp.einsum(subscripts, a, b, precision=HIGHEST)))


@pytest.mark.parametrize("subscripts, a_shape, b_shape", CASES)
def test_gradients_match_an_independent_computation(subscripts, a_shape, b_shape):
  """dgrad / wgrad: the output gradient (E5M2) and the saved operand (E4M3) quantized in
  blocks along what each backward product contracts, computed with jnp.einsum."""
  a, b, kg = _operands(a_shape, b_shape, seed=1)
  a_ix, b_ix, out_ix, contract = _split(subscripts)
  out, vjp = jax.vjp(functools.partial(mxjax.einsum, subscripts), a, b)
  g = jax.random.normal(kg, out.shape, jnp.float32)
  da, db = vjp(g)
  a_free = [c for c in a_ix if c not in b_ix]
  b_free = [c for c in b_ix if c not in a_ix]
  # dgrad contracts b's free dims; wgrad contracts a's free dims (flattened in order).
  g_n = oracle_fake(g, "e5m2", [out_ix.index(c) for c in b_free])
  b_n = oracle_fake(b, "e4m3", [b_ix.index(c) for c in b_free])
  g_m = oracle_fake(g, "e5m2", [out_ix.index(c) for c in a_free])
  a_m = oracle_fake(a, "e4m3", [a_ix.index(c) for c in a_free])
  da_eq, db_eq = f"{out_ix},{b_ix}->{a_ix}", f"{a_ix},{out_ix}->{b_ix}"
  assert_close_to_exact(da, jnp.einsum(da_eq, g_n, b_n, precision=HIGHEST),
                        jnp.einsum(da_eq, jnp.abs(g_n), jnp.abs(b_n), precision=HIGHEST))
  assert_close_to_exact(db, jnp.einsum(db_eq, a_m, g_m, precision=HIGHEST),
                        jnp.einsum(db_eq, jnp.abs(a_m), jnp.abs(g_m), precision=HIGHEST))
  # and they are gradients of the einsum, up to the quantization (~6% for E5M2 x E4M3)
  _, exact_vjp = jax.vjp(lambda a, b: jnp.einsum(subscripts, a, b, precision=HIGHEST), a, b)
  for got, want in zip((da, db), exact_vjp(g)):
    assert float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want)) < 0.08


@pytest.mark.parametrize("subscripts, a_shape, b_shape", [
    ("ij,jk", (8, 32), (32, 5)),  # implicit output
    ("i,j->ij", (5,), (6,)),  # outer product: nothing contracted
    ("ii,ij->j", (32, 32), (32, 3)),  # a diagonal of a
    ("ij,jk->k", (4, 32), (32, 3)),  # i summed away before the product
    ("bij,bjk->bik", (1, 3, 32), (4, 32, 2)),  # size-1 batch broadcast
    ("ij,jk->ik", (8, 1), (40, 5)),  # size-1 contracted dim broadcast
    ("...ij,...jk->...ik", (2, 3, 4, 32), (3, 32, 5)),  # ellipses of different ranks
])
def test_shapes_and_values_follow_jnp_einsum(subscripts, a_shape, b_shape):
  a, b, _ = _operands(a_shape, b_shape, seed=2)
  want = jnp.einsum(subscripts, a, b, precision=HIGHEST)
  got = mxjax.einsum(subscripts, a, b)
  assert got.shape == want.shape
  rel = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
  assert 0 < rel < 0.08, rel  # E4M3 on both operands: a few percent, never exact


def test_a_size_1_contracted_dim_is_the_broadcast_operand():
  """A contracted dim of size 1 against 40 (`jnp.einsum` broadcasts it): the product and
  gradients of the operand broadcast by hand, bit for bit."""
  a, b, _ = _operands((8, 1), (40, 5), seed=3)
  f = lambda a, b: mxjax.einsum("ij,jk->ik", a, b)  # noqa: E731
  by_hand = lambda a, b: f(jnp.broadcast_to(a, (8, 40)), b)  # noqa: E731
  for got, want in zip(jax.value_and_grad(lambda *o: jnp.sum(f(*o) ** 2), (0, 1))(a, b),
                       jax.value_and_grad(lambda *o: jnp.sum(by_hand(*o) ** 2), (0, 1))(a, b)):
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
      np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("subscripts, a_shape, b_shape", [
    ("ij,jk->ik", (8, 0), (0, 6)),  # nothing to contract: zeros
    ("i,i->", (0,), (0,)),
    ("ij,jk->ik", (0, 32), (32, 4)),  # an empty output
    ("bij,bjk->bik", (1, 2, 32), (0, 32, 3)),  # size 1 against size 0
])
def test_zero_size_dims_follow_jnp_einsum(subscripts, a_shape, b_shape):
  a, b = jnp.ones(a_shape), jnp.ones(b_shape)
  want = jnp.einsum(subscripts, a, b)
  got = mxjax.einsum(subscripts, a, b)
  assert got.shape == want.shape and bool(jnp.all(got == want))


def test_weak_types_give_jnp_output_dtypes():
  """A bf16 array with a weakly typed f32 one (`jnp.full(..., 0.5)`): bf16, as jnp's
  einsum and matmul give; a strongly typed f32 one: f32."""
  x = jnp.ones((4, 64), jnp.bfloat16)
  weak, strong = jnp.full((64, 16), 0.5), jnp.full((64, 16), 0.5, jnp.float32)
  for w in (weak, strong):
    assert mxjax.einsum("ik,kn->in", x, w).dtype == jnp.einsum("ik,kn->in", x, w).dtype
    assert mxjax.matmul(x, w).dtype == jnp.matmul(x, w).dtype
  assert mxjax.matmul(x, weak).dtype == jnp.bfloat16 != mxjax.matmul(x, strong).dtype


def test_weakly_typed_f64_operands_under_x64_take_jnps_promotion():
  """Under `jax_enable_x64` a Python scalar's array is a weak f64: jnp's products cast it to
  the other operand's dtype, and so do mxjax's (bit for bit the product with that dtype's
  array). Before, mxjax refused it as an f64 operand."""
  with jax.enable_x64(True):
    for dtype in (jnp.float32, jnp.bfloat16):
      x = jax.random.normal(jax.random.key(0), (4, 64)).astype(dtype)
      weak = jnp.full((64, 16), 0.3)
      assert weak.dtype == jnp.float64 and jax.typeof(weak).weak_type
      strong = weak.astype(dtype)
      dims = (((1,), (0,)), ((), ()))
      for op, want_dtype in ((lambda a, b: mxjax.matmul(a, b), jnp.matmul(x, weak).dtype),
                             (lambda a, b: mxjax.einsum("ik,kn->in", a, b),
                              jnp.einsum("ik,kn->in", x, weak).dtype),
                             (lambda a, b: mxjax.dot_general(a, b, dims), dtype)):
        got, want = op(x, weak), op(x, strong)
        assert got.dtype == want.dtype == want_dtype == dtype
        np.testing.assert_array_equal(got, want)
        assert op(weak.T, x.T).dtype == dtype  # either side
    with pytest.raises(TypeError, match="float64"):  # a strong f64 stays refused
      mxjax.matmul(x, jnp.ones((64, 16), jnp.float64))


def test_output_dtype_and_preferred_element_type():
  a = jnp.ones((4, 64), jnp.bfloat16)
  b = jnp.ones((64, 3), jnp.bfloat16)
  assert mxjax.einsum("ik,kn->in", a, b).dtype == jnp.bfloat16
  out = mxjax.einsum("ik,kn->in", a, b, preferred_element_type=jnp.float32)
  assert out.dtype == jnp.float32 and bool(jnp.all(out == 64.0))


@pytest.mark.parametrize("subscripts, message", [
    ("ij,jk,kl->il", "exactly two operands"),
    ("ij,jk->iq", "must be distinct and appear in an operand"),
    ("ijk,jk->ik", "gives operand a 3 indices, but it has rank 2"),
    ("i1,jk->ik", "bad subscripts"),
])
def test_bad_subscripts_are_clear_errors(subscripts, message):
  with pytest.raises(ValueError, match=message):
    mxjax.einsum(subscripts, np.ones((4, 32), np.float32), np.ones((32, 5), np.float32))


def test_mismatched_sizes_are_a_clear_error():
  with pytest.raises(ValueError, match="index 'j'.*sizes 32 and 16"):
    mxjax.einsum("ij,jk->ik", np.ones((4, 32), np.float32), np.ones((16, 5), np.float32))


@pytest.mark.parametrize("count", [1, 3])
def test_other_than_two_operands_is_a_clear_error(count):
  operands = [np.ones((32, 32), np.float32)] * count
  with pytest.raises(TypeError, match=f"exactly two operands, got {count}"):
    mxjax.einsum("ij,jk,kl->il" if count == 3 else "ij->ji", *operands)
