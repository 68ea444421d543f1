"""What each operand of a product `x[M, K] . w[K, N]` (input x, weight w, output gradient
g) is quantized to: `Roles` (block scales, from `Recipe.roles()`) or `TensorRoles` (one
scale per tensor), run by `mxjax._src.product`."""

from __future__ import annotations

import dataclasses
from typing import Any

from mxjax._src import formats
from mxjax._src.formats import BlockFormat


@dataclasses.dataclass(frozen=True)
class Roles:
  """The formats and rounding of a product's operands.

  Attributes:
    x: the input's format; 1-D blocks run along each product's contraction (K forward, M
      for the wgrad).
    w: the weight's format (K forward, N for the dgrad).
    grad: the output gradient's format (N for the dgrad, M for the wgrad).
    stochastic_rounding: round the gradient stochastically (the product needs a key).
    random_hadamard_transform: a block random Hadamard transform along M on both wgrad
      operands (it cancels in the product and spreads outliers).
    hadamard_size: the transform's block (a power of two).
    rht_seed: the seed of the transform's random signs (mixed with the product's name).
  """

  x: BlockFormat
  w: BlockFormat
  grad: BlockFormat
  stochastic_rounding: bool = False
  random_hadamard_transform: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    for name in ("x", "w", "grad"):
      if not isinstance(getattr(self, name), BlockFormat):
        raise TypeError(f"Roles.{name} must be a BlockFormat, got {getattr(self, name)!r}")
    n = int(self.hadamard_size)
    if self.random_hadamard_transform and (n < 2 or n & (n - 1) or n > 256):
      raise ValueError(f"hadamard_size must be a power of two in [2, 256], got "
                       f"{self.hadamard_size}")
    if self.x.two_d and self.grad.two_d:
      raise ValueError("2-D blocks for both the input and the gradient: their wgrad "
                       "product would be 2-D by 2-D, which block-scaled GEMMs do not run "
                       "(as in TransformerEngine); make one of them 1-D")

  @property
  def plain_mx(self) -> bool:
    """Every role on the MX kernels' fast path, nearest rounding and no transform."""
    return (all(f.mx_kernels for f in (self.x, self.w, self.grad))
            and not self.stochastic_rounding and not self.random_hadamard_transform)

  def describe(self) -> str:
    """A short name for reports: "MX e4m3/e5m2, block 32" for plain MX."""
    if self.plain_mx and self.x == self.w and self.x.scale_mode == self.grad.scale_mode:
      return f"MX {self.x.element}/{self.grad.element}, block {self.x.block_size}"
    parts = [f"x {self.x}", f"w {self.w}", f"grad {self.grad}"]
    if self.stochastic_rounding:
      parts.append("SR")
    if self.random_hadamard_transform:
      parts.append(f"RHT {self.hadamard_size}")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class TensorRoles:
  """Per-tensor FP8 roles: x and w in `recipe.fwd_format`, grad in `recipe.bwd_format`,
  each scaled by one f32 scale per tensor (`mxjax.state.step_scale`).

  Attributes:
    recipe: a DelayedScaling (scales from its state) or Float8CurrentScaling recipe.
  """

  recipe: Any

  def describe(self) -> str:
    return str(self.recipe)


def mx_roles(fwd_format: str = "e4m3", bwd_format: str = "e5m2",
             block_size: int = formats.DEFAULT_BLOCK_SIZE, scale_mode: str = "rceil", *,
             two_d_weight: bool = False, stochastic_rounding: bool = False,
             random_hadamard_transform: bool = False, hadamard_size: int = 16,
             rht_seed: int = 0) -> Roles:
  """MX roles: E8M0 scales in 1-D blocks of `block_size` (and 2-D weight tiles
  `block_size` x `block_size` with `two_d_weight`)."""
  x = formats.mx(fwd_format, block_size, scale_mode)
  return Roles(x, formats.mx(fwd_format, block_size, scale_mode, two_d=two_d_weight),
               formats.mx(bwd_format, block_size, scale_mode), stochastic_rounding,
               random_hadamard_transform, hadamard_size, rht_seed)
