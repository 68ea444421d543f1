"""Helpers shared by the sharding tests: collectives in compiled HLO, bit comparisons,
and the one gradient tolerance of the sharded-against-one-device comparisons."""

from __future__ import annotations

import re
from collections import Counter

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

_COLLECTIVE = re.compile(r"=\s*(\([^=]*?\)|\S+)\s+(all-gather|all-reduce|reduce-scatter|all-to-all|"
                         r"collective-permute|collective-broadcast)(?:-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2,
          "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}


def collectives(hlo_text: str) -> list[tuple[str, tuple[int, ...], str]]:
  """[(op kind, shape, HLO element type)] of every array a collective produces; size-1
  dims dropped (the MX product runs on [1, M, K] views)."""
  out = []
  hlo_text = re.sub(r"/\*.*?\*/", "", hlo_text)  # tuples past 5 entries carry /*index=5*/
  for m in _COLLECTIVE.finditer(hlo_text):
    for dtype, dims in _ARRAY.findall(m.group(1)):
      shape = tuple(int(d) for d in dims.split(",") if d and int(d) != 1)
      out.append((m.group(2), shape, dtype))
  return out


def compiled_collectives(f, *args) -> list[tuple[str, tuple[int, ...], str]]:
  """The collectives of `jax.jit(f)` compiled for `args`."""
  return collectives(jax.jit(f).lower(*args).compile().as_text())


def _itemsize(dtype: str) -> int:
  if dtype.startswith("f8"):
    return 1
  return _BYTES[dtype]


def moved(ops) -> Counter:
  """The multiset of (kind, element count, element type) of collectives: a shape up to a
  reshape or transpose (the MX product runs on [M, K] views of a [B, S, K] operand, and
  may compute a weight gradient transposed)."""
  return Counter((kind, int(np.prod(shape, dtype=np.int64)), dtype) for kind, shape, dtype in ops)


def bytes_per_kind(ops) -> Counter:
  """{kind: the bytes its collectives produce, summed}."""
  out = Counter()
  for kind, shape, dtype in ops:
    out[kind] += int(np.prod(shape, dtype=np.int64)) * _itemsize(dtype)
  return out


def assert_collectives_within(ops, hp_ops, *, exact: bool = False, row_gathers: int = 0):
  """The MX program's collectives against the same program's in high precision.

  row_gathers == 0 (whole blocks on every device): every collective of `ops` is one of
  `hp_ops` (kind, element count, element type; a sub-multiset, or the same multiset
  where `exact`), and so the bytes of each kind are at most the high-precision ones.
  row_gathers > 0 (a device holds less than one block along a quantized axis, which is
  gathered first): per kind the bytes are at most the high-precision bytes, plus, for
  all-gathers, `row_gathers` bytes (the operands whose rows are gathered).
  """
  got, want = moved(ops), moved(hp_ops)
  if not row_gathers:
    extra = got - want
    assert not extra, f"collectives the high-precision program lacks: {sorted(extra)}\n" \
                      f"MX: {sorted(ops)}\nhigh precision: {sorted(hp_ops)}"
    if exact:
      assert got == want, f"MX: {sorted(ops)}\nhigh precision: {sorted(hp_ops)}"
    return
  got_b, want_b = bytes_per_kind(ops), bytes_per_kind(hp_ops)
  for kind, n in got_b.items():
    allowed = want_b[kind] + (row_gathers if kind == "all-gather" else 0)
    assert n <= allowed, (kind, n, allowed, sorted(ops), sorted(hp_ops))


def bits(a) -> np.ndarray:
  return np.asarray(jax.lax.bitcast_convert_type(a, jnp.uint8))


def spec_of(a) -> tuple:
  """The PartitionSpec entries of an array (its type's when it is abstract), one per dim."""
  spec = tuple(a.sharding.spec)
  return spec + (None,) * (a.ndim - len(spec))


# The one tolerance of a gradient computed sharded against the same gradient on one
# device. Both sum the same f32 products (each device quantizes the blocks one device
# would), in another order: partial sums per shard, then a collective. Two orders of n
# f32 terms differ by a few units of 2^-24 times the sum of the terms' magnitudes, which
# for these gradients (no heavy cancellation) stays below 8 units of f32 epsilon of the
# largest entry; the result is then rounded once to the gradient's dtype, where that
# difference can straddle a rounding boundary: one unit in the last place (at most
# eps(dtype) * |value|). Measured (AMD EPYC Zen 4, XLA CPU): f32 gradients within 1.5 eps
# of the largest entry, bf16 ones within one ulp.
GRAD_ATOL_EPS = 8


def assert_grads_close(got, want, err_msg: str = ""):
  """|got - want| <= eps(dtype) * |want| + 8 * eps(f32) * max |want| elementwise, with
  eps the gradient dtype's machine epsilon (bf16 2^-7, f16 2^-10, f32 2^-23)."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype, (got.dtype, want.dtype, err_msg)
  eps = float(ml_dtypes.finfo(want.dtype).eps)
  want32, got32 = want.astype(np.float32), got.astype(np.float32)
  scale = float(np.abs(want32).max()) if want32.size else 0.0
  atol = GRAD_ATOL_EPS * float(np.finfo(np.float32).eps) * scale
  np.testing.assert_allclose(got32, want32, rtol=eps, atol=atol, err_msg=err_msg)
