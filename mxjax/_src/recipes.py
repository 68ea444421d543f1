"""Quantization recipes: frozen, hashable dataclasses (static args, jit keys) saying how a
model's GEMMs are quantized. Block-scaled ones map to `Roles` (`recipe.roles()`): MX
(`MXFP8BlockScaling`, `MXFP6BlockScaling`, `MXFP4BlockScaling`, `MXBlockScaling`),
`NVFP4BlockScaling`, `Float8BlockScaling`; `DelayedScaling` and `Float8CurrentScaling` are
per-tensor FP8 (`mxjax._src.fp8`). Field names and defaults follow TransformerEngine.
"""

from __future__ import annotations

import dataclasses
import enum

from mxjax._src import formats
from mxjax._src.formats import BlockFormat, ScaleFormat
from mxjax._src.roles import Roles, mx_roles


class FormatPair(enum.Enum):
  """A forward / backward pair of element formats (TransformerEngine's `Format`, exported
  under that name too); HYBRID is E4M3 forward, E5M2 gradients."""

  E4M3 = ("e4m3", "e4m3")
  HYBRID = ("e4m3", "e5m2")
  E5M2 = ("e5m2", "e5m2")
  E3M2 = ("e3m2", "e3m2")
  E2M3 = ("e2m3", "e2m3")
  E2M1 = ("e2m1", "e2m1")

  @property
  def fwd(self) -> str:
    return self.value[0]

  @property
  def bwd(self) -> str:
    return self.value[1]


Format = FormatPair  # TransformerEngine's name


def _pair(value, field: str) -> FormatPair:
  if isinstance(value, FormatPair):
    return value
  if isinstance(value, str) and value.upper() in FormatPair.__members__:
    return FormatPair[value.upper()]
  raise ValueError(f"{field} must be one of {list(FormatPair.__members__)}, got {value!r}")


def _element(value, field: str, backward: bool = False) -> str:
  """An element format name from a name, an ElementFormat or a FormatPair (its backward
  name where `backward`, else a one-format pair only)."""
  if isinstance(value, str) and value.upper() in FormatPair.__members__:
    value = FormatPair[value.upper()]
  if isinstance(value, FormatPair) and (backward or value.fwd == value.bwd):
    return value.bwd
  try:
    return formats.element_format(value).name
  except (TypeError, ValueError):
    raise ValueError(f"{field} must be one of {sorted(formats.FORMATS)}, got {value!r}") from None


#: Fields that `str` shows only away from their defaults.
_SWITCHES = frozenset({"stochastic_rounding", "random_hadamard_transform", "hadamard_size",
                       "rht_seed", "enable_2d_quantization"})


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Base of all recipes: its roles and predicates that say which kind it is."""

  def roles(self) -> Roles | None:
    """The per-role formats of a block-scaled recipe's products; None for per-tensor FP8."""
    return None

  def mx(self) -> bool:
    """OCP MX block scaling (E8M0 scales) of any element width."""
    return isinstance(self, _MXRecipe)

  def mxfp8(self) -> bool:
    return self.mx() and formats.element_format(self.fwd_format).bits == 8

  def mxfp6(self) -> bool:
    return self.mx() and formats.element_format(self.fwd_format).bits == 6

  def mxfp4(self) -> bool:
    return self.mx() and formats.element_format(self.fwd_format).bits == 4

  def block_scaling(self) -> bool:
    """Any block-scaled recipe (MX, NVFP4, FP8 blocks)."""
    return self.roles() is not None

  def needs_rng(self) -> bool:
    """Whether the backward rounds stochastically (needs Flax's "mx" rng stream or `rng=`)."""
    roles = self.roles()
    return roles is not None and roles.stochastic_rounding

  def fp8(self) -> bool:
    """Per-tensor-scaled FP8 (delayed or current scaling)."""
    return isinstance(self, (DelayedScaling, Float8CurrentScaling))

  def delayed(self) -> bool:
    return isinstance(self, DelayedScaling)

  def float8_current_scaling(self) -> bool:
    return isinstance(self, Float8CurrentScaling)

  def stateful(self) -> bool:
    """Whether the recipe keeps arrays between steps (only DelayedScaling does)."""
    return self.delayed()

  def __str__(self) -> str:
    parts = [f"recipe_type={type(self).__name__}"]
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name in _SWITCHES and value == f.default:  # shown only when switched on
        continue
      name = "format" if f.name in ("fp8_format", "fp6_format") else f.name
      parts.append(f"{name}={value.name if isinstance(value, FormatPair) else value}")
    return ", ".join(parts)


class _FP8Pair:
  """`fwd_format` / `bwd_format` from TransformerEngine's `fp8_format` field."""

  @property
  def fwd_format(self) -> str:
    return self.fp8_format.fwd

  @property
  def bwd_format(self) -> str:
    return self.fp8_format.bwd


def _check_bool_switches(recipe, *names) -> None:
  for name in names:
    if not isinstance(getattr(recipe, name), bool):
      raise TypeError(f"{type(recipe).__name__}: {name} must be a bool, got "
                      f"{getattr(recipe, name)!r}")


def _check_fp8_format(recipe) -> None:
  fmt = _pair(recipe.fp8_format, "fp8_format")
  if fmt not in (FormatPair.E4M3, FormatPair.HYBRID):
    raise ValueError(f"{type(recipe).__name__} needs Format.E4M3 or Format.HYBRID, got {fmt}")
  object.__setattr__(recipe, "fp8_format", fmt)


def _check_attention(recipe) -> None:
  if recipe.fp8_dpa or recipe.fp8_mha:
    raise NotImplementedError(f"{type(recipe).__name__}: fp8_dpa / fp8_mha (FP8 attention) "
                              "are not supported by mxjax")


@dataclasses.dataclass(frozen=True)
class _MXRecipe(Recipe):
  """The MX recipes' checks and roles."""

  def _check_block(self):
    mode = formats.scale_mode(self.scale_mode)
    for name in (self.fwd_format, self.bwd_format):
      formats.check_block_size(self.block_size, formats.element_format(name))
    object.__setattr__(self, "scale_mode", mode.value)
    _check_bool_switches(self, "stochastic_rounding", "random_hadamard_transform")
    try:
      self.roles()
    except ValueError as err:
      raise ValueError(f"{type(self).__name__}: {err}") from None

  def roles(self) -> Roles:
    return mx_roles(self.fwd_format, self.bwd_format, self.block_size, self.scale_mode,
                    two_d_weight=getattr(self, "enable_2d_quantization", False),
                    stochastic_rounding=self.stochastic_rounding,
                    random_hadamard_transform=self.random_hadamard_transform,
                    hadamard_size=self.hadamard_size, rht_seed=self.rht_seed)


@dataclasses.dataclass(frozen=True)
class MXFP8BlockScaling(_FP8Pair, _MXRecipe):
  """MXFP8: E4M3 (or HYBRID: E4M3 forward, E5M2 gradients) in blocks of `block_size`.

  Attributes:
    margin: kept for TransformerEngine compatibility; MX scales ignore it.
    fp8_format: Format.E4M3 or Format.HYBRID (E5M2 forward is refused, as in TE).
    fp8_dpa, fp8_mha: FP8 attention; not supported (must be False).
    block_size: 16, 32 or 64 elements per E8M0 scale.
    scale_mode: "rceil" (default) or "floor".
    enable_2d_quantization: weights in block_size x block_size tiles (TE 2.19): one
      quantized weight serves the forward and the dgrad.
    stochastic_rounding: round the gradients stochastically (needs Flax's "mx" rng stream).
    random_hadamard_transform: a block random Hadamard transform (`hadamard_size`, signs
      from `rht_seed`, fixed per GEMM) along the tokens on both wgrad operands.
    hadamard_size: the transform's block (a power of two).
    rht_seed: the seed of the transform's signs.
  """

  margin: int = 0
  fp8_format: FormatPair = FormatPair.E4M3
  fp8_dpa: bool = False
  fp8_mha: bool = False
  block_size: int = formats.DEFAULT_BLOCK_SIZE
  scale_mode: str = "rceil"
  enable_2d_quantization: bool = False
  stochastic_rounding: bool = False
  random_hadamard_transform: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    if _pair(self.fp8_format, "fp8_format") is FormatPair.E5M2:
      raise ValueError("MXFP8BlockScaling does not support Format.E5M2: the forward pass "
                       "needs E4M3; use Format.E4M3 or Format.HYBRID (E5M2 gradients)")
    _check_fp8_format(self)
    _check_attention(self)
    self._check_block()


@dataclasses.dataclass(frozen=True)
class MXBlockScaling(_MXRecipe):
  """MX block scaling with any forward / backward pair of the five element formats (the
  other MX recipes with TransformerEngine's checks; this one runs E5M2 both ways too).

  Attributes:
    fwd_format: the forward GEMM operands' element format ("e4m3", "e5m2", "e3m2", "e2m3"
      or "e2m1", an ElementFormat or a one-format Format). Stored as the name.
    bwd_format: element format of the output gradient in the backward GEMMs (a name).
    block_size: 16, 32 or 64 elements per E8M0 scale (a multiple of 4 for FP6).
    scale_mode: "rceil" (default) or "floor".
    stochastic_rounding, random_hadamard_transform, hadamard_size, rht_seed: as in
      MXFP8BlockScaling.
  """

  fwd_format: str
  bwd_format: str
  block_size: int = formats.DEFAULT_BLOCK_SIZE
  scale_mode: str = "rceil"
  stochastic_rounding: bool = False
  random_hadamard_transform: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    object.__setattr__(self, "fwd_format", _element(self.fwd_format, "fwd_format"))
    object.__setattr__(self, "bwd_format", _element(self.bwd_format, "bwd_format"))
    self._check_block()


@dataclasses.dataclass(frozen=True)
class MXFP6BlockScaling(_MXRecipe):
  """MXFP6: E2M3 or E3M2 elements in blocks of `block_size`.

  Attributes:
    fp6_format: Format.E2M3 (default) or Format.E3M2.
    bwd_format: the gradients' element format (a Format or a name; None: the forward's).
    block_size, scale_mode: as in MXFP8BlockScaling.
    stochastic_rounding, random_hadamard_transform, hadamard_size, rht_seed: as in
      MXFP8BlockScaling.
  """

  fp6_format: FormatPair = FormatPair.E2M3
  bwd_format: str | None = None
  block_size: int = formats.DEFAULT_BLOCK_SIZE
  scale_mode: str = "rceil"
  stochastic_rounding: bool = False
  random_hadamard_transform: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    fmt = _pair(self.fp6_format, "fp6_format")
    if fmt not in (FormatPair.E2M3, FormatPair.E3M2):
      raise ValueError(f"MXFP6BlockScaling needs Format.E2M3 or Format.E3M2, got {fmt}")
    object.__setattr__(self, "fp6_format", fmt)
    bwd = fmt.bwd if self.bwd_format is None else _element(self.bwd_format, "bwd_format", True)
    object.__setattr__(self, "bwd_format", bwd)
    self._check_block()

  @property
  def fwd_format(self) -> str:
    return self.fp6_format.fwd


@dataclasses.dataclass(frozen=True)
class MXFP4BlockScaling(_MXRecipe):
  """MXFP4: E2M1 elements in blocks of `block_size`.

  Attributes:
    bwd_format: the gradients' element format (a name; None: E2M1).
    block_size, scale_mode: as in MXFP8BlockScaling.
    stochastic_rounding, random_hadamard_transform, hadamard_size, rht_seed: as in
      MXFP8BlockScaling.
  """

  bwd_format: str | None = None
  block_size: int = formats.DEFAULT_BLOCK_SIZE
  scale_mode: str = "rceil"
  stochastic_rounding: bool = False
  random_hadamard_transform: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    bwd = "e2m1" if self.bwd_format is None else _element(self.bwd_format, "bwd_format", True)
    object.__setattr__(self, "bwd_format", bwd)
    self._check_block()

  @property
  def fwd_format(self) -> str:
    return "e2m1"


@dataclasses.dataclass(frozen=True)
class NVFP4BlockScaling(Recipe):
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
  fp4_format: FormatPair = FormatPair.E2M1
  fp8_format: FormatPair = FormatPair.E4M3
  fp8_dpa: bool = False
  fp8_mha: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    fp4, fp8 = _pair(self.fp4_format, "fp4_format"), _pair(self.fp8_format, "fp8_format")
    if fp4 is not FormatPair.E2M1:
      raise ValueError(f"NVFP4BlockScaling needs fp4_format=Format.E2M1, got {fp4}")
    if fp8 is not FormatPair.E4M3:
      raise ValueError(f"NVFP4BlockScaling's block scales are E4M3: fp8_format must be "
                       f"Format.E4M3, got {fp8}")
    object.__setattr__(self, "fp4_format", fp4)
    object.__setattr__(self, "fp8_format", fp8)
    _check_attention(self)
    self.roles()  # checks hadamard_size

  @property
  def fwd_format(self) -> str:
    return "e2m1"

  @property
  def bwd_format(self) -> str:
    return "e2m1"

  def roles(self) -> Roles:
    x = formats.nvfp4()
    return Roles(x, formats.nvfp4(two_d=not self.disable_2d_quantization), x,
                 not self.disable_stochastic_rounding, not self.disable_rht,
                 self.hadamard_size, self.rht_seed)


@dataclasses.dataclass(frozen=True)
class Float8BlockScaling(_FP8Pair, Recipe):
  """DeepSeek-V3-style FP8 (TransformerEngine's recipe): E4M3 in 1x128 blocks for inputs
  and gradients and 128x128 tiles for weights, FP32 scales (powers of two by default).
  1.03 B/param for 1x128 blocks, 1.0002 for 128x128 tiles.

  Attributes:
    use_f32_scales: any FP32 scale instead of a power of two (TE's
      NVTE_FP8_BLOCK_SCALING_FP32_SCALES).
    fp8_format: Format.E4M3 or Format.HYBRID (E5M2 gradients).
    x_block_scaling_dim: 1 (1x128 blocks) or 2 (128x128 tiles) for the input.
    w_block_scaling_dim: the same for the weight.
    grad_block_scaling_dim: the same for the gradient (not 2 with a 2-D input).
    fp8_dpa, fp8_mha: FP8 attention; not supported (must be False).
  """

  use_f32_scales: bool = False
  fp8_format: FormatPair = FormatPair.E4M3
  x_block_scaling_dim: int = 1
  w_block_scaling_dim: int = 2
  grad_block_scaling_dim: int = 1
  fp8_dpa: bool = False
  fp8_mha: bool = False

  def __post_init__(self):
    _check_fp8_format(self)
    for name in ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim"):
      if getattr(self, name) not in (1, 2):
        raise ValueError(f"Float8BlockScaling: {name} must be 1 (1x128 blocks) or 2 "
                         f"(128x128 tiles), got {getattr(self, name)!r}")
    _check_attention(self)
    self.roles()  # 2-D x with 2-D grad is refused there

  def roles(self) -> Roles:
    def make(elem, dim):
      return formats.fp8_block(elem, two_d=dim == 2, pow2=not self.use_f32_scales)

    return Roles(make(self.fwd_format, self.x_block_scaling_dim),
                 make(self.fwd_format, self.w_block_scaling_dim),
                 make(self.bwd_format, self.grad_block_scaling_dim))


@dataclasses.dataclass(frozen=True)
class DelayedScaling(_FP8Pair, Recipe):
  """Per-tensor FP8 whose scale comes from a history of past amaxes (see mxjax.state).

  Each step quantizes with the state's scale, records the amax (newest first) and sets the
  next scale to `fp8_max / amax / 2**margin`, amax the history's max or newest entry; an
  empty history (the first step) scales from the tensor's own amax.

  Attributes:
    margin: extra headroom, in powers of two.
    fp8_format: Format.HYBRID (E4M3 forward, E5M2 gradients) or Format.E4M3.
    amax_history_len: entries in each tensor's amax history.
    amax_compute_algo: "max" or "most_recent".
    reduce_amax: take the amax over all devices (mesh axes) before recording it.
  """

  margin: int = 0
  fp8_format: FormatPair = FormatPair.HYBRID
  amax_history_len: int = 1024
  amax_compute_algo: str = "max"
  reduce_amax: bool = True

  def __post_init__(self):
    _check_fp8_format(self)
    if self.amax_compute_algo not in ("max", "most_recent"):
      raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got "
                       f"{self.amax_compute_algo!r}")
    if int(self.amax_history_len) < 1:
      raise ValueError(f"amax_history_len must be >= 1, got {self.amax_history_len}")


@dataclasses.dataclass(frozen=True)
class Float8CurrentScaling(_FP8Pair, Recipe):
  """Per-tensor FP8 whose scale comes from the tensor's own amax: `fp8_max / amax / 2**margin`.

  Attributes:
    fp8_format: Format.HYBRID (E4M3 forward, E5M2 gradients) or Format.E4M3.
    margin: extra headroom, in powers of two.
    reduce_amax: take the amax over all devices (mesh axes) and named `vmap` axes; False
      keeps each member of a named axis (an ensemble) its own.
  """

  fp8_format: FormatPair = FormatPair.HYBRID
  margin: int = 0
  reduce_amax: bool = True

  def __post_init__(self):
    _check_fp8_format(self)


def recipe_for_weight(fmt: BlockFormat) -> Recipe:
  """A recipe whose weights are stored in `fmt` (for messages about stored kernels)."""
  if fmt.scale is ScaleFormat.E4M3:
    return NVFP4BlockScaling(disable_2d_quantization=not fmt.two_d)
  if fmt.scale is not ScaleFormat.E8M0:
    return Float8BlockScaling(use_f32_scales=fmt.scale is ScaleFormat.FP32,
                              w_block_scaling_dim=2 if fmt.two_d else 1)
  b, mode, name = fmt.block_size, fmt.scale_mode, fmt.element
  if name == "e4m3":
    return MXFP8BlockScaling(block_size=b, scale_mode=mode, enable_2d_quantization=fmt.two_d)
  if name in ("e2m3", "e3m2"):
    return MXFP6BlockScaling(fp6_format=name, block_size=b, scale_mode=mode)
  if name == "e2m1":
    return MXFP4BlockScaling(block_size=b, scale_mode=mode)
  return MXBlockScaling(name, name, block_size=b, scale_mode=mode)  # no TE recipe runs E5M2
