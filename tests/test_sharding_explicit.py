"""MX ops and matmul on Explicit meshes (sharding in types, `jax.set_mesh`) and on Auto
meshes, on 8 CPU devices: output shardings, bits, gradients and collectives against the
same program in high precision; per-device sizes below, at and above one block."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import mxjax
from sharding_helpers import (assert_collectives_within, assert_grads_close, bits, bytes_per_kind,
                              compiled_collectives, spec_of)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (CPU) devices")

KINDS = ("explicit", "auto")


def make_mesh(kind, shape=(2, 4)):
  """kind: "explicit" (jax.make_mesh's default axis type), "auto", or "mixed" ('data'
  Explicit, 'model' Auto)."""
  if kind == "explicit":
    mesh = jax.make_mesh(shape, ("data", "model"))
    assert set(mesh.axis_types) == {AxisType.Explicit}
    return mesh
  types = {"auto": (AxisType.Auto,) * 2, "mixed": (AxisType.Explicit, AxisType.Auto)}[kind]
  return jax.make_mesh(shape, ("data", "model"), axis_types=types)


def put(x, mesh, spec):
  return jax.device_put(x, NamedSharding(mesh, spec))


def padded(spec, ndim):
  return tuple(spec) + (None,) * (ndim - len(spec))


OP_SPECS = [P("data", None), P(None, "model"), P("data", "model"), P(None, ("data", "model"))]


@pytest.mark.parametrize("spec", OP_SPECS, ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_explicit_quantize_ops_carry_the_input_sharding_in_their_types(spec, fmt):
  mesh = make_mesh("explicit")
  x = jax.random.normal(jax.random.key(0), (256, 512), jnp.bfloat16) * 3
  want_rows, want_cols = mxjax.quantize_2x(x, fmt)
  with jax.set_mesh(mesh):
    xs = put(x, mesh, spec)
    ops = {"quantize": lambda x: mxjax.quantize(x, fmt),
           "quantize_2x": lambda x: mxjax.quantize_2x(x, fmt),
           "roundtrip": lambda x: mxjax.quantize(x, fmt).dequantize(jnp.bfloat16),
           "fake_quantize": lambda x: mxjax.fake_quantize(x, fmt, axis=0)}
    for name, f in ops.items():
      typed = jax.eval_shape(jax.jit(f), xs)  # the sharding is in the result types
      got = jax.jit(f)(xs)
      for t, a in zip(jax.tree.leaves(typed), jax.tree.leaves(got)):
        assert spec_of(t) == padded(spec, 2), (name, t)
        assert spec_of(a) == padded(spec, 2), (name, a.sharding)
      assert compiled_collectives(f, xs) == [], name
    rows, cols = jax.jit(ops["quantize_2x"])(xs)
    roundtrip = jax.jit(ops["roundtrip"])(xs)
    fake = jax.jit(ops["fake_quantize"])(xs)
  for a, b in ((rows, want_rows), (cols, want_cols)):
    np.testing.assert_array_equal(bits(a.data), bits(b.data))
    np.testing.assert_array_equal(bits(a.scales), bits(b.scales))
  np.testing.assert_array_equal(bits(roundtrip), bits(want_rows.dequantize(jnp.bfloat16)))
  np.testing.assert_array_equal(bits(fake), bits(want_cols.dequantize(jnp.bfloat16)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows_per_device", [1, 16, 32, 64])
def test_quantize_any_rows_per_device(kind, rows_per_device):
  # Quantized along the sharded rows: below a block per device the rows are gathered
  # (correct, not an error); from one block up each device quantizes its own blocks.
  mesh = make_mesh(kind, (8, 1))
  x = jax.random.normal(jax.random.key(1), (8 * rows_per_device, 64), jnp.float32)
  want_cols = mxjax.quantize(x, "e4m3", axis=0)
  want_rows, want_cols2 = mxjax.quantize_2x(x, "e4m3")
  with jax.set_mesh(mesh):
    xs = put(x, mesh, P("data", None))
    columnwise = lambda x: mxjax.quantize(x, "e4m3", axis=0)  # noqa: E731
    cols = jax.jit(columnwise)(xs)
    rows, cols2 = jax.jit(mxjax.quantize_2x)(xs)
    gathers = compiled_collectives(columnwise, xs)  # the program above, not compiled again
  for a, b in ((cols, want_cols), (rows, want_rows), (cols2, want_cols2)):
    np.testing.assert_array_equal(bits(a.data), bits(b.data))
    np.testing.assert_array_equal(bits(a.scales), bits(b.scales))
  whole_blocks = rows_per_device % 32 == 0
  assert (gathers == []) == whole_blocks, gathers
  # Quantized along the unsharded axis the rows stay sharded at every size.
  assert spec_of(rows.data)[0] == "data" and spec_of(rows.scales)[0] == "data"
  if kind == "explicit":
    assert spec_of(cols.data)[0] == ("data" if whole_blocks else None)


# ---------------------------------------------------------------------------------------
# matmul: forward and gradients, as the high-precision program shards them.

# (x spec, w spec, out_sharding) per layout; the output sharding is what jnp.dot gives.
MODES = {
    "dp": (P("data", None), P(None, None), None),
    "tp-col": (P("data", None), P(None, "model"), None),
    "tp-row": (P("data", "model"), P("model", None), P("data", None)),
    "fsdp": (P("data", None), P("data", None), None),
}


def loss_fn(dot, out_sharding):
  def loss(x, w):
    y = dot(x, w, out_sharding=out_sharding).astype(jnp.float32)
    return jnp.sum(jnp.square(y) * jnp.arange(y.shape[-1]))
  return loss


def hp_dot(x, w, out_sharding=None):
  return jnp.dot(x, w, out_sharding=out_sharding, preferred_element_type=jnp.float32)


@pytest.mark.parametrize("kind", (*KINDS, "mixed"))
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("rows_per_device", [1, 32, 96])
def test_matmul_forward_and_grad_shard_as_the_high_precision_program(kind, mode,
                                                                     rows_per_device):
  mesh = make_mesh(kind)
  xspec, wspec, out_spec = MODES[mode]
  x = jax.random.normal(jax.random.key(2), (2 * rows_per_device, 256), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(3), (256, 128), jnp.bfloat16)
  out_spec = out_spec if kind != "auto" else None  # Auto: the partitioner decides
  loss = loss_fn(mxjax.matmul, out_spec)
  want_y = mxjax.matmul(x, w)
  want_loss, want_grads = jax.value_and_grad(loss_fn(mxjax.matmul, None), (0, 1))(x, w)
  with jax.set_mesh(mesh):
    xs, ws = put(x, mesh, xspec), put(w, mesh, wspec)
    y = jax.jit(lambda x, w: mxjax.matmul(x, w, out_sharding=out_spec))(xs, ws)
    hp_y = jax.jit(lambda x, w: hp_dot(x, w, out_spec))(xs, ws)
    step, hp_step = (jax.value_and_grad(f, (0, 1)) for f in (loss, loss_fn(hp_dot, out_spec)))
    got_loss, grads = jax.jit(step)(xs, ws)
    _, hp_grads = jax.jit(hp_step)(xs, ws)
    ops = compiled_collectives(step, xs, ws)  # the same functions: no second compile
    hp_ops = compiled_collectives(hp_step, xs, ws)
  np.testing.assert_array_equal(bits(y), bits(want_y))  # each output element: one device
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  for g, want, primal, hp_g in zip(grads, want_grads, (xs, ws), hp_grads):
    # Explicit: a cotangent has its primal's type; Auto (and the Auto axis of a mixed
    # mesh): the layout the partitioner gives the high-precision gradient.
    assert spec_of(g) == spec_of(hp_g), (g.sharding, hp_g.sharding)
    if kind != "auto":
      assert spec_of(jax.typeof(g)) == spec_of(jax.typeof(primal)), (jax.typeof(g), primal)
    if mode == "dp" and primal is xs:  # each row's gradient is one device's
      np.testing.assert_array_equal(bits(g), bits(want))
    assert_grads_close(g, want)  # the same products, summed in another order
  if kind != "auto":
    assert spec_of(y) == spec_of(hp_y), (y.sharding, hp_y.sharding)
  # Below a block per device, the rows that the weight gradient quantizes (x [M, K] and
  # the output gradient [M, N], in f32) may be gathered whole, once each.
  m, k = x.shape
  row_gathers = 0 if rows_per_device % 32 == 0 else 4 * m * (k + w.shape[1])
  assert_collectives_within(ops, hp_ops, row_gathers=row_gathers)
  if mode == "fsdp" and kind != "auto":
    # The weight's contraction is split over 'data', as the batch is: the high-precision
    # program moves its slice for each product that reads it (forward and dgrad), mxjax
    # once, in high precision, before both quantizations (`sharding.unshared_contraction`).
    permuted = bytes_per_kind(ops)["collective-permute"] + bytes_per_kind(ops)["all-to-all"]
    hp_permuted = (bytes_per_kind(hp_ops)["collective-permute"]
                   + bytes_per_kind(hp_ops)["all-to-all"])
    assert permuted < hp_permuted, (sorted(ops), sorted(hp_ops))


# ---------------------------------------------------------------------------------------
# The sharding helpers, against what jax itself does.


def test_need_replication_factors_follow_shardys_numbering():
  # Shardy numbers factors by first appearance and needs special factors sorted by it.
  rule = "d0 n0 (k1 b1) -> d0 s0 (k1 b1), d0 c0 (k1 b1), d0 n0 (k1 p1), d0 n0 k1"
  assert mxjax._src.sharding.in_rule_order(["p1", "s0", "b1", "n0", "c0"], rule) == (
      "n0", "b1", "s0", "c0", "p1")


@pytest.mark.parametrize("spec", [P(), P("data"), P(None, "model"), P("data", "model"),
                                  P(("model", "data"), None), P(None, None, ("data", "model"))],
                         ids=str)
def test_spec_over_mesh_decodes_any_mesh_sharding(spec):
  mesh = make_mesh("auto")
  decoded = mxjax._src.sharding.spec_over_mesh(NamedSharding(mesh, spec), mesh, 3)
  assert NamedSharding(mesh, P(*decoded)).is_equivalent_to(NamedSharding(mesh, spec), 3)
  # The partitioner's own form (an HloSharding-backed jax.sharding.Sharding) decodes too.
  x = put(jnp.zeros((8, 8, 8)), mesh, spec)
  compiled = jax.jit(lambda x: x * 2).lower(x).compile()
  decoded = mxjax._src.sharding.spec_over_mesh(compiled.input_shardings[0][0], mesh, 3)
  assert NamedSharding(mesh, P(*decoded)).is_equivalent_to(NamedSharding(mesh, spec), 3)


# (rhs [K, N] entries, lhs [M, K] entries, K) -> the rhs entries to move to first, or None.
UNSHARED_CONTRACTIONS = [
    ((("data", None), ("data", None), 256), ("model", None)),  # FSDP: K to the free axis
    ((("data", None), ("data", None), 64), (None, None)),  # 'model' cuts blocks: gathered
    ((("data", "model"), ("data", None), 256), (None, "model")),  # no free axis: gathered
    ((("model", None), ("data", "model"), 256), None),  # TP-row: the contractions agree
    ((("data", None), (None, None), 256), None),  # the lhs is replicated: no conflict
    ((("data", None), ("data", "model"), 256), ("model", None)),  # to the lhs's K axis
]


@pytest.mark.parametrize("case,want", UNSHARED_CONTRACTIONS, ids=str)
def test_unshared_contraction_moves_k_off_the_axis_the_other_operand_uses(case, want):
  (rhs, lhs, k), mesh = case, make_mesh("explicit")
  got = mxjax._src.sharding.unshared_contraction(rhs, lhs, 0, 1, k, 32, mesh)
  assert got == (None if want is None else tuple(want))
  if got is None:
    return
  # K now shares no axis with the lhs's M (each device holds the lhs's K slice it
  # multiplies), and its shards hold whole blocks.
  assert got[0] is None or got[0] != lhs[0]
  assert k // mxjax._src.sharding.shard_count(mesh, got[0]) % 32 == 0


@pytest.mark.parametrize("sizes,spec", [
    ((8, 16, 256), ("data", None, None)),  # batch sharded, several rows per shard
    ((2, 16, 256), ("data", "model", None)),  # one batch index per shard: both merge
    ((8, 16, 256), ("data", "model", None)),  # several per shard: 'model' is gathered
    ((1, 64, 256), (None, "data", None)),
])
def test_merge_then_split_dims_is_the_reshape_jax_does(sizes, spec):
  mesh = make_mesh("explicit")
  kept, merged = mxjax._src.sharding.merge_dims(spec[:2], sizes[:2], mesh)
  x = np.arange(np.prod(sizes), dtype=np.float32).reshape(sizes)
  with jax.set_mesh(mesh):
    xs = put(x, mesh, P(*kept, spec[2]))
    merge = lambda x: jnp.reshape(x, (sizes[0] * sizes[1], sizes[2]),  # noqa: E731
                                  out_sharding=P(merged, None))
    flat = jax.jit(merge)(xs)
    ops = compiled_collectives(merge, xs)  # no data moves: each device keeps its rows
  assert ops == [], ops
  np.testing.assert_array_equal(flat, x.reshape(-1, sizes[2]))
  if spec == ("data", "model", None) and sizes[0] == 8:
    assert kept == ["data", None] and merged == "data"
  assert mxjax._src.sharding.split_dim(merged, sizes[:2], mesh) == list(kept)


def test_einsum_and_dense_general_on_an_explicit_mesh():
  mesh = make_mesh("explicit")
  q = jax.random.normal(jax.random.key(5), (4, 64, 8, 32), jnp.bfloat16)
  k = jax.random.normal(jax.random.key(6), (4, 64, 8, 32), jnp.bfloat16)
  scores = lambda q, k: mxjax.einsum("bqhd,bkhd->bhqk", q, k)  # noqa: E731
  loss = lambda q, k: jnp.sum(scores(q, k).astype(jnp.float32) ** 2)  # noqa: E731
  want, want_grads = scores(q, k), jax.grad(loss, (0, 1))(q, k)
  layer = mxjax.DenseGeneral(96, axis=(-2, -1))
  x = jax.random.normal(jax.random.key(7), (8, 4, 64))
  params = layer.init(jax.random.key(0), x)
  with mxjax.autocast(recipe=mxjax.MXFP8BlockScaling()):
    want_y = layer.apply(params, x)
    with jax.set_mesh(mesh):
      spec = P("data", None, "model", None)  # batch and heads sharded
      qs, ks = put(q, mesh, spec), put(k, mesh, spec)
      got = jax.jit(scores)(qs, ks)
      hp = jax.jit(lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, k))(qs, ks)
      grad = jax.grad(loss, (0, 1))
      grads = jax.jit(grad)(qs, ks)
      ops = compiled_collectives(grad, qs, ks)
      y = jax.jit(layer.apply)(params, put(x, mesh, P("data", None, None)))
  assert spec_of(got) == spec_of(hp) == ("data", "model", None, None)
  np.testing.assert_array_equal(bits(got), bits(want))
  for g, w in zip(grads, want_grads):
    assert spec_of(g) == padded(spec, 4)
    np.testing.assert_array_equal(bits(g), bits(w))  # each (b, h) slice on one device
  assert ops == [], ops  # batch and heads are independent: nothing to communicate
  assert spec_of(y) == ("data", None)
  np.testing.assert_allclose(y, want_y, rtol=1e-6, atol=1e-6)


def test_vmap_over_a_sharded_batch_on_an_explicit_mesh():
  mesh = make_mesh("explicit")
  x = jax.random.normal(jax.random.key(8), (4, 64, 256))
  w = jax.random.normal(jax.random.key(9), (256, 128))
  want = jax.vmap(mxjax.quantize)(x)
  want_y = jax.vmap(lambda x: mxjax.matmul(x, w))(x)
  with jax.set_mesh(mesh):
    xs = put(x, mesh, P("data", None, "model"))
    ws = put(w, mesh, P("model", None))
    batched = jax.vmap(mxjax.quantize)
    got = jax.jit(batched)(xs)
    y = jax.jit(jax.vmap(lambda x: mxjax.matmul(x, ws, out_sharding=P(None, None))))(xs)
    ops = compiled_collectives(batched, xs)
  assert spec_of(got.data) == spec_of(got.scales) == ("data", None, "model")
  np.testing.assert_array_equal(bits(got.data), bits(want.data))
  np.testing.assert_array_equal(bits(got.scales), bits(want.scales))
  assert ops == []
  assert spec_of(y) == ("data", None, None)
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-4)


def test_out_sharding_errors_name_what_was_wrong():
  x, w = jnp.ones((64, 256)), jnp.ones((256, 128))
  with pytest.raises(TypeError, match="out_sharding must be a NamedSharding or a PartitionSpec"):
    mxjax.matmul(x, w, out_sharding=("data", None))
  with pytest.raises(ValueError, match="needs a mesh set with jax.set_mesh"):
    mxjax.matmul(x, w, out_sharding=P("data", None))
  layer = mxjax.DenseGeneral((4, 32))
  params = layer.init(jax.random.key(0), x)
  with jax.set_mesh(make_mesh("explicit")):
    with pytest.raises(ValueError, match="shards a feature dim"):
      layer.apply(params, x, out_sharding=P(None, "model", None))


def test_einsum_out_sharding_when_the_contraction_is_sharded():
  """As with jnp.einsum, a sharded contraction on an Explicit mesh needs out_sharding; the
  result has it (given in the einsum's own output order, not the product's)."""
  mesh = make_mesh("explicit")
  a = jax.random.normal(jax.random.key(10), (64, 256))  # [m, k]
  b = jax.random.normal(jax.random.key(11), (256, 32))  # [k, n]
  want = mxjax.einsum("mk,kn->nm", a, b)
  with jax.set_mesh(mesh):
    a_s, b_s = put(a, mesh, P("data", "model")), put(b, mesh, P("model", None))
    got = jax.jit(lambda a, b: mxjax.einsum("mk,kn->nm", a, b,
                                            out_sharding=P(None, "data")))(a_s, b_s)
    hp = jax.jit(lambda a, b: jnp.einsum("mk,kn->nm", a, b,
                                         out_sharding=P(None, "data")))(a_s, b_s)
  assert spec_of(got) == spec_of(hp) == (None, "data")
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
  with pytest.raises(TypeError, match="out_sharding must be a NamedSharding"):
    mxjax.einsum("mk,kn->nm", a, b, out_sharding="data")


def test_stock_flax_layers_through_mxjax_on_an_explicit_mesh():
  """linen interception and nnx.quantize on stock layers: the output keeps the high-
  precision layer's sharding (data parallel), and a sharded contraction takes the
  layer's out_sharding (NNX), with the values of one device."""
  import flax.linen as nn  # noqa: PLC0415
  from flax import nnx  # noqa: PLC0415
  mesh = make_mesh("explicit")
  recipe = mxjax.MXFP8BlockScaling()
  x = jax.random.normal(jax.random.key(12), (16, 256))
  dense = nn.Dense(64)
  params = dense.init(jax.random.key(0), x)
  linear = mxjax.nnx.quantize(nnx.Linear(256, 64, rngs=nnx.Rngs(0)))
  with mxjax.autocast(recipe=recipe):
    with mxjax.linen.intercept():
      want = dense.apply(params, x)
    want_nnx = linear(x)
    with jax.set_mesh(mesh):
      xs = put(x, mesh, P("data", None))
      with mxjax.linen.intercept():
        got = jax.jit(dense.apply)(params, xs)
      hp = jax.jit(dense.apply)(params, xs)
      xk = put(x, mesh, P(None, "model"))  # the contraction sharded
      linear.kernel.set_value(put(linear.kernel.get_value(), mesh, P("model", None)))
      got_nnx = nnx.jit(lambda m, x: m(x, out_sharding=P("data", None)))(linear, xk)
  assert spec_of(got) == spec_of(hp) == ("data", None)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert not bool(jnp.all(got == hp))  # it is the MX product
  assert spec_of(got_nnx) == ("data", None)
  np.testing.assert_allclose(got_nnx, want_nnx, rtol=1e-5, atol=1e-4)


def test_ops_on_explicit_arrays_outside_set_mesh():
  """Arrays placed on an Explicit mesh carry it in their types: the ops run outside
  `jax.set_mesh` as jnp does there, with the same bits and shardings as inside it."""
  mesh = make_mesh("explicit")
  x = put(jax.random.normal(jax.random.key(1), (64, 96), jnp.float32), mesh, P("data", None))
  w = jax.random.normal(jax.random.key(2), (96, 32), jnp.float32)
  ops = {
      "quantize": lambda: mxjax.quantize(x).dequantize(),
      "fake_quantize": lambda: mxjax.fake_quantize(x),
      "matmul": lambda: mxjax.matmul(x, w),
      "jit": lambda: jax.jit(lambda a: mxjax.quantize(a, "e2m1").dequantize())(x),
  }
  for name, op in ops.items():
    outside = op()
    with jax.set_mesh(mesh):
      inside = op()
    assert spec_of(outside) == spec_of(inside) == ("data", None), name
    np.testing.assert_array_equal(bits(outside), bits(inside), err_msg=name)


@pytest.mark.parametrize("recipe", [mxjax.NVFP4BlockScaling(disable_rht=True),
                                    mxjax.MXFP8BlockScaling(enable_2d_quantization=True)],
                         ids=["nvfp4", "mxfp8_2d"])
def test_two_d_weight_tiles_keep_the_result_type_of_lax_dot_general(recipe):
  """2-D weight tiles are quantized gathered; the product's result still has the type
  `lax.dot_general` gives it on an Explicit mesh (N sharded over 'model'), and its VJP
  takes a cotangent of that type."""
  mesh = make_mesh("explicit")
  rng = np.random.default_rng(0)
  x, w = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((64, 64), (64, 128)))
  dims = (((1,), (0,)), ((), ()))
  with jax.set_mesh(mesh):
    xs, ws = put(x, mesh, P("data", None)), put(w, mesh, P(None, "model"))
    want = jax.typeof(jax.lax.dot_general(xs, ws, dims)).sharding.spec
    f = lambda x, w: mxjax.dot_general(x, w, dims, recipe=recipe,  # noqa: E731
                                       rng=jax.random.key(1))
    y, vjp = jax.vjp(f, xs, ws)
    dx, dw = vjp(jnp.ones_like(y))
  assert tuple(jax.typeof(y).sharding.spec) == tuple(want) == ("data", "model")
  assert (jax.typeof(dx).sharding.spec, jax.typeof(dw).sharding.spec) == (
      jax.typeof(xs).sharding.spec, jax.typeof(ws).sharding.spec)
