"""Block-scaled recipes beyond plain MX: TransformerEngine's `NVFP4BlockScaling` and
`Float8BlockScaling`, and `BlockRoles`, the per-role formats every block-scaled recipe
(these, and MX recipes with 2-D weights, stochastic rounding or an RHT) hands the GEMM.

Field names and defaults follow TransformerEngine 2.x.
"""

from __future__ import annotations

import dataclasses

from mxjax._src import block_format as bfmt
from mxjax._src.block_format import BlockFormat, ScaleFormat
from mxjax._src.recipes import _FP8FormatRoles, Format, Recipe, _format


@dataclasses.dataclass(frozen=True)
class BlockRoles:
  """What each operand of a GEMM `x[M, K] . w[K, N]` is quantized to (`mxjax.block_dot`).

  Attributes:
    x, w, grad: BlockFormats of the input, the weight and the output gradient. A 1-D
      block `(1, b)` runs along the contraction of the product the operand enters
      (K forward, N for the dgrad, M for the wgrad); a 2-D tile is the same for every
      product (a 2-D weight quantized once serves forward and dgrad).
    stochastic_rounding: round the gradient's elements stochastically (both copies).
    random_hadamard_transform: a block RHT along M on both wgrad operands (x and grad).
    hadamard_size: the RHT's block (a power of two).
    rht_seed: the seed of the RHT's random signs (fixed per GEMM: mixed with its name).
  """

  x: BlockFormat
  w: BlockFormat
  grad: BlockFormat
  stochastic_rounding: bool = False
  random_hadamard_transform: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    n = int(self.hadamard_size)
    if self.random_hadamard_transform and (n < 2 or n & (n - 1) or n > 256):
      raise ValueError(f"hadamard_size must be a power of two in [2, 256], got "
                       f"{self.hadamard_size}")
    if self.x.two_d and self.grad.two_d:
      raise ValueError("2-D blocks for both the input and the gradient: their wgrad "
                       "product would be 2-D by 2-D, which block-scaled GEMMs do not run "
                       "(as in TransformerEngine); make one of them 1-D")


def check_switches(recipe) -> None:
  """Checks the stochastic-rounding / RHT switches of an MX recipe."""
  n = int(recipe.hadamard_size)
  if recipe.random_hadamard_transform and (n < 2 or n & (n - 1) or n > 256):
    raise ValueError(f"{type(recipe).__name__}: hadamard_size must be a power of two in "
                     f"[2, 256], got {recipe.hadamard_size}")
  for name in ("stochastic_rounding", "random_hadamard_transform"):
    if not isinstance(getattr(recipe, name), bool):
      raise TypeError(f"{type(recipe).__name__}: {name} must be a bool, got "
                      f"{getattr(recipe, name)!r}")


def mx_roles(recipe, two_d: bool = False) -> BlockRoles:
  """The roles of an MX recipe (E8M0, 1-D blocks of `block_size`; 2-D weight tiles
  `block_size` x `block_size` where `two_d`)."""
  b, mode = recipe.block_size, recipe.scale_mode
  w = bfmt.mx(recipe.fwd_format, b, mode)
  return BlockRoles(bfmt.mx(recipe.fwd_format, b, mode), w.with_block((b, b)) if two_d else w,
                    bfmt.mx(recipe.bwd_format, b, mode), recipe.stochastic_rounding,
                    recipe.random_hadamard_transform, recipe.hadamard_size, recipe.rht_seed)


class _BlockRecipe(Recipe):
  """Recipes whose GEMMs run `mxjax.block_dot` with `block_roles()`."""

  def block_scaling(self) -> bool:
    return True

  def needs_rng(self) -> bool:
    return self.block_roles().stochastic_rounding


@dataclasses.dataclass(frozen=True)
class NVFP4BlockScaling(_BlockRecipe):
  """NVFP4 (TransformerEngine's recipe): E2M1 elements, an unsigned E4M3 scale per 16
  elements and an FP32 scale per tensor (0.5625 B/param; 0.504 with 2-D weights).

  Attributes:
    disable_rht: no random Hadamard transform on the wgrad operands (input and grad,
      along the tokens). On by default, as in TE.
    disable_stochastic_rounding: round gradients to nearest (SR is on by default).
    disable_2d_quantization: weights in 1x16 blocks instead of 16x16 tiles.
    fp4_format: Format.E2M1 only.
    fp8_format: the block scales' format: Format.E4M3 only.
    fp8_dpa, fp8_mha: FP8 attention; not supported (must be False).
    hadamard_size: the RHT's block (16, as TE).
    rht_seed: seed of the RHT's random signs (fixed per GEMM).
  """

  disable_rht: bool = False
  disable_stochastic_rounding: bool = False
  disable_2d_quantization: bool = False
  fp4_format: Format = Format.E2M1
  fp8_format: Format = Format.E4M3
  fp8_dpa: bool = False
  fp8_mha: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    fp4, fp8 = _format(self.fp4_format, "fp4_format"), _format(self.fp8_format, "fp8_format")
    if fp4 is not Format.E2M1:
      raise ValueError(f"NVFP4BlockScaling needs fp4_format=Format.E2M1, got {fp4}")
    if fp8 is not Format.E4M3:
      raise ValueError(f"NVFP4BlockScaling's block scales are E4M3: fp8_format must be "
                       f"Format.E4M3, got {fp8}")
    object.__setattr__(self, "fp4_format", fp4)
    object.__setattr__(self, "fp8_format", fp8)
    if self.fp8_dpa or self.fp8_mha:
      raise NotImplementedError("NVFP4BlockScaling: fp8_dpa / fp8_mha (FP8 attention) are "
                                "not supported by mxjax")
    self.block_roles()  # checks hadamard_size

  @property
  def fwd_format(self) -> str:
    return "e2m1"

  @property
  def bwd_format(self) -> str:
    return "e2m1"

  def block_roles(self) -> BlockRoles:
    w = bfmt.NVFP4 if self.disable_2d_quantization else bfmt.NVFP4_2D
    return BlockRoles(bfmt.NVFP4, w, bfmt.NVFP4, not self.disable_stochastic_rounding,
                      not self.disable_rht, self.hadamard_size, self.rht_seed)


@dataclasses.dataclass(frozen=True)
class Float8BlockScaling(_FP8FormatRoles, _BlockRecipe):
  """DeepSeek-V3-style FP8 (TransformerEngine's recipe): E4M3 in 1x128 blocks for inputs
  and gradients and 128x128 tiles for weights, FP32 scales (powers of two by default).
  1.03 B/param for 1x128 blocks, 1.0002 for 128x128 tiles.

  Attributes:
    use_f32_scales: any FP32 scale instead of a power of two (TE's
      NVTE_FP8_BLOCK_SCALING_FP32_SCALES).
    fp8_format: Format.E4M3 or Format.HYBRID (E5M2 gradients).
    x_block_scaling_dim, w_block_scaling_dim, grad_block_scaling_dim: 1 (1x128 blocks)
      or 2 (128x128 tiles); the input and the gradient cannot both be 2.
    fp8_dpa, fp8_mha: FP8 attention; not supported (must be False).
  """

  use_f32_scales: bool = False
  fp8_format: Format = Format.E4M3
  x_block_scaling_dim: int = 1
  w_block_scaling_dim: int = 2
  grad_block_scaling_dim: int = 1
  fp8_dpa: bool = False
  fp8_mha: bool = False

  def __post_init__(self):
    fmt = _format(self.fp8_format, "fp8_format")
    if fmt not in (Format.E4M3, Format.HYBRID):
      raise ValueError(f"Float8BlockScaling needs Format.E4M3 or Format.HYBRID, got {fmt}")
    object.__setattr__(self, "fp8_format", fmt)
    for name in ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim"):
      if getattr(self, name) not in (1, 2):
        raise ValueError(f"Float8BlockScaling: {name} must be 1 (1x128 blocks) or 2 "
                         f"(128x128 tiles), got {getattr(self, name)!r}")
    if self.fp8_dpa or self.fp8_mha:
      raise NotImplementedError("Float8BlockScaling: fp8_dpa / fp8_mha (FP8 attention) are "
                                "not supported by mxjax")
    self.block_roles()  # 2-D x with 2-D grad is refused there

  def block_roles(self) -> BlockRoles:
    scale = ScaleFormat.FP32 if self.use_f32_scales else ScaleFormat.FP32_POW2

    def make(elem, dim):
      return BlockFormat(elem, scale, (128, 128) if dim == 2 else (1, 128))

    return BlockRoles(make(self.fwd_format, self.x_block_scaling_dim),
                      make(self.fwd_format, self.w_block_scaling_dim),
                      make(self.bwd_format, self.grad_block_scaling_dim))
