"""The formats a sweep compares: a name, its recipe, and what its weights cost to store."""

from __future__ import annotations

import dataclasses
from typing import Callable

from mxjax import formats as mx_formats
from mxjax.recipes import (Format, MXFP4BlockScaling, MXFP6BlockScaling, MXFP8BlockScaling,
                           Recipe)

BASELINE = "bf16"


@dataclasses.dataclass(frozen=True)
class SweepFormat:
  """One column of the sweep.

  Attributes:
    name: the CLI name, e.g. "mxfp8_e4m3".
    weight_format: the element format weights are stored in (None: bf16, unquantized).
    make_recipe: `(block_size, scale_mode) -> Recipe`, or None for the baseline.
    label: a short description for the table and plot.
  """

  name: str
  weight_format: str | None
  make_recipe: Callable[[int, str], Recipe] | None
  label: str

  @property
  def is_baseline(self) -> bool:
    return self.make_recipe is None

  def recipe(self, block_size: int = 32, scale_mode: str = "rceil") -> Recipe | None:
    """The recipe the GEMMs run under; None for the baseline (plain bf16)."""
    return None if self.make_recipe is None else self.make_recipe(block_size, scale_mode)

  def bytes_per_param(self, block_size: int = 32) -> float:
    """Storage of one weight in MX form: element bits / 8 plus one E8M0 byte per block."""
    if self.weight_format is None:
      return 2.0
    return mx_formats.element_format(self.weight_format).bits / 8 + 1 / block_size


FORMATS: dict[str, SweepFormat] = {f.name: f for f in (
    SweepFormat(BASELINE, None, None, "bf16 (no quantization)"),
    SweepFormat("mxfp8_e4m3", "e4m3",
                lambda b, s: MXFP8BlockScaling(fp8_format=Format.E4M3, block_size=b,
                                               scale_mode=s), "MXFP8 E4M3 fwd+bwd"),
    SweepFormat("mxfp8_hybrid", "e4m3",
                lambda b, s: MXFP8BlockScaling(fp8_format=Format.HYBRID, block_size=b,
                                               scale_mode=s), "MXFP8 E4M3 fwd, E5M2 grads"),
    SweepFormat("mxfp6_e3m2", "e3m2",
                lambda b, s: MXFP6BlockScaling(fp6_format=Format.E3M2, block_size=b,
                                               scale_mode=s), "MXFP6 E3M2 fwd+bwd"),
    SweepFormat("mxfp6_e2m3", "e2m3",
                lambda b, s: MXFP6BlockScaling(fp6_format=Format.E2M3, block_size=b,
                                               scale_mode=s), "MXFP6 E2M3 fwd+bwd"),
    SweepFormat("mxfp4_e2m1", "e2m1",
                lambda b, s: MXFP4BlockScaling(block_size=b, scale_mode=s),
                "MXFP4 E2M1 fwd+bwd"),
)}


def parse(names: str) -> list[SweepFormat]:
  """A comma list of format names -> formats, baseline first (added if missing).

  Raises:
    ValueError: for an unknown name.
  """
  wanted = [n.strip().lower() for n in names.split(",") if n.strip()]
  unknown = [n for n in wanted if n not in FORMATS]
  if unknown:
    raise ValueError(f"unknown format(s) {unknown}; choose from {', '.join(FORMATS)}")
  if BASELINE not in wanted:
    wanted.insert(0, BASELINE)
  ordered = [BASELINE] + [n for n in dict.fromkeys(wanted) if n != BASELINE]
  return [FORMATS[n] for n in ordered]
