"""`mxjax.coverage`'s arithmetic against counts written out by hand (2 * M * K * N per
product, times a scan's length): the FLOPs of each product, MX, kept by a rule, kept for a
short contraction, and left alone outside interception (`lax.dot_general` and
`lax.ragged_dot`), and `mx_share` = MX FLOPs / all dot FLOPs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import mxjax

MX = mxjax.MXFP8BlockScaling()
B, D, F, V = 8, 64, 32, 48        # the einsum [B, D] x [D, F], the head [B, F] x [F, V]
KS, NS = 16, 8                    # a product contracting 16 < one block
L, BS = 3, 4                      # a scan of 3 steps of [4, D] x [D, F]
M, K, N, G = 12, 64, 16, 3        # ragged_dot [M, K] x [G, K, N]
BM, BK, BN = 8, 32, 24            # a bare product outside interception

# Written out: 2 * M * K * N per call.
EINSUM = 2 * 8 * 64 * 32          # 32768, MX
SCAN_STEP = 2 * 4 * 64 * 32       # 16384 per step, MX, 3 steps
HEAD = 2 * 8 * 32 * 48            # 24576, kept by the rule
SHORT = 2 * 8 * 16 * 8            # 2048, kept: contraction shorter than one block
RAGGED = 2 * 12 * 64 * 16         # 24576: each of the M rows meets one [K, N] group
BARE = 2 * 8 * 32 * 24            # 12288, not intercepted


def arrays():
  """The arguments as shapes (`coverage` traces; nothing runs)."""
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
  return dict(w=f32(D, F), head=f32(F, V), short=f32(KS, NS), x=f32(B, D), xs=f32(L, BS, D),
              lhs=f32(M, K), experts=f32(G, K, N), bare=(f32(BM, BK), f32(BK, BN)))


SIZES = jax.ShapeDtypeStruct((G,), jnp.int32)


def model(w, head, short, x, xs):
  with jax.named_scope("mlp"):
    y = jnp.einsum("bd,df->bf", x, w)
  with jax.named_scope("head"):
    z = y @ head
  s = x[:, :KS] @ short
  _, ys = lax.scan(lambda c, xi: (c, xi @ w), 0, xs)
  return z, s, ys


def program(a, sizes):
  """The model through `mxjax.quantized` (rule: `head` kept), then a bare `ragged_dot`
  and a bare `dot_general` that nothing intercepts."""
  out = mxjax.quantized(model, rules=[("head", None)])(a["w"], a["head"], a["short"],
                                                       a["x"], a["xs"])
  return out, lax.ragged_dot(a["lhs"], a["experts"], sizes), lax.dot(*a["bare"])


def test_flops_and_mx_share_match_a_count_by_hand():
  with mxjax.autocast(recipe=MX):
    report = mxjax.coverage(program, arrays(), SIZES)
  rows = {(p.path, p.op): p for p in report.products}
  assert len(rows) == len(report.products) == 6, report.table()
  want = {  # (path, op): (FLOPs per call, calls, MX, reason prefix)
      ("mlp/einsum_0", "einsum"): (EINSUM, 1, True, None),
      ("head/dot_general_0", "dot_general"): (HEAD, 1, False, "rule 'head'"),
      ("dot_general_0", "dot_general"): (SHORT, 1, False,
                                         "contraction 16 shorter than one block (32)"),
      ("dot_general_1", "dot_general"): (SCAN_STEP, L, True, None),
  }
  for key, (flops, calls, mx, reason) in want.items():
    p = rows.pop(key)
    assert (p.flops, p.calls, p.mx) == (flops, calls, mx), (key, p)
    assert p.reason == reason, (key, p.reason)
  # What nothing intercepted: counted in full, with the reason.
  left = sorted(rows.values(), key=lambda p: p.op)
  assert [(p.op, p.flops, p.mx) for p in left] == [("dot_general", BARE, False),
                                                     ("ragged_dot", RAGGED, False)]
  assert all(p.reason.startswith("not intercepted") for p in left)
  mx_flops = EINSUM + L * SCAN_STEP                         # 81920
  total = mx_flops + HEAD + SHORT + RAGGED + BARE            # 145408
  assert report.mx_flops == mx_flops and report.total_flops == total
  assert report.mx_share == pytest.approx(81920 / 145408, rel=1e-12)
  assert f"{100 * 81920 / 145408:.1f}%" in report.table()


def test_a_bare_ragged_dot_counts_2mkn_flops_and_is_not_intercepted():
  a = arrays()
  with mxjax.autocast(recipe=MX):
    report = mxjax.coverage(lambda l, r, s: lax.ragged_dot(l, r, s), a["lhs"], a["experts"],
                            SIZES)
  (p,) = report.products
  assert (p.op, p.lhs_shape, p.rhs_shape, p.flops) == ("ragged_dot", (M, K), (G, K, N), RAGGED)
  assert not p.mx and p.reason.startswith("not intercepted")
  assert report.total_flops == RAGGED and report.mx_share == 0.0


def test_moe_share_counts_the_experts_on_both_sides():
  """An MoE layer's experts through `mxjax.quantized` (MX) next to the same experts
  outside it (kept): half the FLOPs are MX."""
  a = arrays()

  def experts(lhs, w, sizes):
    return lax.ragged_dot(lhs, w, sizes)

  def both(lhs, w, sizes):
    return mxjax.quantized(experts)(lhs, w, sizes), experts(lhs, w, sizes)

  with mxjax.autocast(recipe=MX):
    report = mxjax.coverage(both, a["lhs"], a["experts"], SIZES)
  assert [(p.op, p.flops, p.mx) for p in report.products] == [("ragged_dot", RAGGED, True),
                                                                ("ragged_dot", RAGGED, False)]
  assert report.mx_share == 0.5
