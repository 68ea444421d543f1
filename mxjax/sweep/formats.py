"""The formats a sweep compares: names (every spelling), how the GEMMs run, and what the
weights cost to store. Kinds: baseline (bf16), block_scaled (a block-scaled recipe),
per_tensor (per-tensor FP8), weight_only (INT8 weights, bf16 GEMMs).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable


from mxjax._src.quantize import fake_quantize
from mxjax._src.recipes import (DelayedScaling, Float8BlockScaling, Float8CurrentScaling, Format,
                                MXBlockScaling, MXFP4BlockScaling, MXFP6BlockScaling,
                                MXFP8BlockScaling, NVFP4BlockScaling, Recipe)
from mxjax.sweep import baselines

BASELINE = "bf16"


@dataclasses.dataclass(frozen=True)
class SweepRow:
  """One row kind of the sweep.

  Attributes:
    name: the canonical name, shown in the table, e.g. "mxfp8_e4m3".
    kind: "baseline", "block_scaled", "per_tensor" or "weight_only".
    weight_format: the element format of the weights ("int8"; None: bf16).
    make_recipe: `(block_size, scale_mode) -> Recipe`, or None (bf16 GEMMs).
    label: a short description.
    aliases, given: other names that select it, and the one the user typed (`parse`).
  """

  name: str
  kind: str
  weight_format: str | None
  make_recipe: Callable[[int, str], Recipe] | None
  label: str
  aliases: tuple[str, ...] = ()
  given: str | None = None

  @property
  def is_baseline(self) -> bool:
    return self.kind == "baseline"

  def recipe(self, block_size: int = 32, scale_mode: str = "rceil") -> Recipe | None:
    """The recipe the GEMMs run under; None for bf16 GEMMs (baseline, weight-only)."""
    return None if self.make_recipe is None else self.make_recipe(block_size, scale_mode)

  def weight_quantizer(self, block_size: int = 32, scale_mode: str = "rceil"):
    """`w [K, N] -> quantize-dequantize of w` (straight-through gradient) as this row
    stores weights; None for the baseline."""
    if self.kind == "block_scaled":
      return functools.partial(fake_quantize, format=self.recipe(block_size, scale_mode).roles().w,
                               axis=0)
    if self.kind == "per_tensor":
      return functools.partial(baselines.fp8_per_tensor, fmt=self.weight_format)
    if self.kind == "weight_only":
      return baselines.int8_per_channel
    return None

  def bytes_per_param(self, block_size: int = 32) -> float:
    """Storage of one weight, block scales included (per-tensor FP8, INT8: 1; bf16: 2)."""
    if self.weight_format is None:
      return 2.0
    if self.kind == "block_scaled":
      return self.recipe(block_size).roles().w.bytes_per_element()
    return 1.0


def _mx(width: str, element: str, label: str, make_recipe) -> SweepRow:
  """An MX row, named `mx{width}_{element}`, also `{width}_{element}` and `{element}`."""
  return SweepRow(f"mx{width}_{element}", "block_scaled", element, make_recipe, label,
                  (f"{width}_{element}", element))


FORMATS: dict[str, SweepRow] = {f.name: f for f in (
    SweepRow(BASELINE, "baseline", None, None, "bf16 (no quantization)", ("bfloat16",)),
    _mx("fp8", "e4m3", "MXFP8 E4M3 fwd+bwd",
        lambda b, s: MXFP8BlockScaling(fp8_format=Format.E4M3, block_size=b, scale_mode=s)),
    _mx("fp8", "e5m2", "MXFP8 E5M2 fwd+bwd",
        lambda b, s: MXBlockScaling("e5m2", "e5m2", block_size=b, scale_mode=s)),
    SweepRow("mxfp8_hybrid", "block_scaled", "e4m3",
             lambda b, s: MXFP8BlockScaling(fp8_format=Format.HYBRID, block_size=b, scale_mode=s),
             "MXFP8 E4M3 fwd, E5M2 grads", ("hybrid",)),
    _mx("fp6", "e3m2", "MXFP6 E3M2 fwd+bwd",
        lambda b, s: MXFP6BlockScaling(fp6_format=Format.E3M2, block_size=b, scale_mode=s)),
    _mx("fp6", "e2m3", "MXFP6 E2M3 fwd+bwd",
        lambda b, s: MXFP6BlockScaling(fp6_format=Format.E2M3, block_size=b, scale_mode=s)),
    _mx("fp4", "e2m1", "MXFP4 E2M1 fwd+bwd",
        lambda b, s: MXFP4BlockScaling(block_size=b, scale_mode=s)),
    SweepRow("nvfp4", "block_scaled", "e2m1", lambda b, s: NVFP4BlockScaling(),
             "NVFP4 (TE): E2M1, E4M3 scales per 16, FP32 tensor scale, 16x16 weights, "
             "SR grads, RHT wgrad", ("nvfp4_e2m1",)),
    SweepRow("nvfp4_no_sr", "block_scaled", "e2m1",
             lambda b, s: NVFP4BlockScaling(disable_stochastic_rounding=True),
             "NVFP4, gradients rounded to nearest (ablation)"),
    SweepRow("nvfp4_no_rht", "block_scaled", "e2m1",
             lambda b, s: NVFP4BlockScaling(disable_rht=True), "NVFP4 without the RHT (ablation)"),
    SweepRow("nvfp4_1d", "block_scaled", "e2m1",
             lambda b, s: NVFP4BlockScaling(disable_2d_quantization=True),
             "NVFP4, 1x16 weight blocks (ablation)"),
    SweepRow("fp8_block", "block_scaled", "e4m3", lambda b, s: Float8BlockScaling(),
             "FP8 blocks (DeepSeek-V3 / TE): E4M3, 1x128 acts+grads, 128x128 weights, "
             "pow2 FP32 scales", ("float8_block", "fp8_blockwise")),
    SweepRow("mxfp4_sr_rht", "block_scaled", "e2m1",
             lambda b, s: MXFP4BlockScaling(block_size=b, scale_mode=s, stochastic_rounding=True,
                                            random_hadamard_transform=True),
             "MXFP4 + stochastic rounding (grads) + RHT (wgrad)", ("fp4_sr_rht",)),
    SweepRow("mxfp4_sr", "block_scaled", "e2m1",
             lambda b, s: MXFP4BlockScaling(block_size=b, scale_mode=s, stochastic_rounding=True),
             "MXFP4 + stochastic rounding (grads)", ("fp4_sr",)),
    SweepRow("mxfp4_rht", "block_scaled", "e2m1",
             lambda b, s: MXFP4BlockScaling(block_size=b, scale_mode=s,
                                            random_hadamard_transform=True),
             "MXFP4 + RHT (wgrad)", ("fp4_rht",)),
    SweepRow("mxfp8_2d", "block_scaled", "e4m3",
             lambda b, s: MXFP8BlockScaling(block_size=b, scale_mode=s,
                                            enable_2d_quantization=True),
             "MXFP8 E4M3, 32x32 weight tiles", ("fp8_2d",)),
    SweepRow("fp8_delayed", "per_tensor", "e4m3", lambda b, s: DelayedScaling(),
             "per-tensor FP8, delayed scaling (E4M3 fwd, E5M2 grads)", ("delayed",)),
    SweepRow("fp8_current", "per_tensor", "e4m3", lambda b, s: Float8CurrentScaling(),
             "per-tensor FP8, current scaling (E4M3 fwd, E5M2 grads)", ("current",)),
    SweepRow("int8_weight", "weight_only", "int8", None,
             "INT8 weights (per output channel), bf16 GEMMs", ("int8",)),
)}

#: The demo's rows: bf16 and the five MX presets of MX evaluation harnesses.
DEFAULT = ("bf16", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1")

_BY_NAME: dict[str, str] = {n: f.name for f in FORMATS.values() for n in (f.name, *f.aliases)}


def canonical(name: str) -> str | None:
  """The canonical name of any accepted spelling (any case, '-' for '_'), else None."""
  return _BY_NAME.get(name.strip().lower().replace("-", "_"))


def parse(names: str) -> list[SweepRow]:
  """A comma list of format names (any accepted spelling) -> formats, baseline first
  (added if missing), each once, with `given` the first spelling the user typed.

  Raises:
    ValueError: for an unknown name.
  """
  wanted = [n.strip() for n in names.split(",") if n.strip()]
  unknown = [n for n in wanted if canonical(n) is None]
  if unknown:
    raise ValueError(f"unknown format(s) {', '.join(map(repr, unknown))}; choose from "
                     f"{', '.join(FORMATS)} (also fp8_e4m3, e4m3, ... spellings)")
  given: dict[str, str] = {}
  for n in wanted:
    given.setdefault(canonical(n), n)
  given.setdefault(BASELINE, BASELINE)
  ordered = [BASELINE] + [n for n in given if n != BASELINE]
  return [dataclasses.replace(FORMATS[n], given=given[n]) for n in ordered]
