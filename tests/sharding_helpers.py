"""Helpers shared by the sharding tests: collectives in compiled HLO, bit comparisons."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

_COLLECTIVE = re.compile(r"=\s*(\([^=]*?\)|\S+)\s+(all-gather|all-reduce|reduce-scatter|all-to-all|"
                         r"collective-permute|collective-broadcast)(?:-start)?\(")
_ARRAY = re.compile(r"\b[a-z]+\d*\[([\d,]*)\]")


def collectives(hlo_text: str) -> list[tuple[str, tuple[int, ...]]]:
  """[(op kind, shape)] of every array a collective produces; size-1 dims dropped (the
  MX product runs on [1, M, K] views)."""
  out = []
  hlo_text = re.sub(r"/\*.*?\*/", "", hlo_text)  # tuples past 5 entries carry /*index=5*/
  for m in _COLLECTIVE.finditer(hlo_text):
    for dims in _ARRAY.findall(m.group(1)):
      shape = tuple(int(d) for d in dims.split(",") if d and int(d) != 1)
      out.append((m.group(2), shape))
  return out


def compiled_collectives(f, *args) -> list[tuple[str, tuple[int, ...]]]:
  """The collectives of `jax.jit(f)` compiled for `args`."""
  return collectives(jax.jit(f).lower(*args).compile().as_text())


def bits(a) -> np.ndarray:
  return np.asarray(jax.lax.bitcast_convert_type(a, jnp.uint8))


def spec_of(a) -> tuple:
  """The PartitionSpec entries of an array (its type's when it is abstract), one per dim."""
  spec = tuple(a.sharding.spec)
  return spec + (None,) * (a.ndim - len(spec))
