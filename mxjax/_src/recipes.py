"""Quantization recipes: frozen, hashable dataclasses (usable as static args and jit keys).

A recipe says how the GEMMs of a model are quantized:

- `MXFP8BlockScaling`, `MXFP6BlockScaling`, `MXFP4BlockScaling`: MX block scaling (one
  E8M0 scale per `block_size` elements along the contraction), computed by
  `mxjax._src.dot.dot_general` with the recipe's `fwd_format` / `bwd_format`. Stateless.
  They keep TransformerEngine's checks (e.g. no E5M2 forward).
- `MXBlockScaling(fwd_format, bwd_format)`: the same GEMMs for any pair of the five MX
  element formats.
- `DelayedScaling`: per-tensor FP8 with the scale taken from an amax history (state).
- `Float8CurrentScaling`: per-tensor FP8 with the scale taken from the current amax.

Field names follow TransformerEngine where it has them (`margin`, `fp8_format`, ...).
"""

from __future__ import annotations

import dataclasses
import enum

from mxjax._src import formats


class Format(enum.Enum):
  """Element formats of a recipe: forward / backward element format names.

  HYBRID is E4M3 in the forward pass and E5M2 for gradients (TransformerEngine's name).
  """

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


def _format(value, field: str) -> Format:
  if isinstance(value, Format):
    return value
  if isinstance(value, str) and value.upper() in Format.__members__:
    return Format[value.upper()]
  raise ValueError(f"{field} must be one of {list(Format.__members__)}, got {value!r}")


#: Fields of the MX recipes that `str` shows only away from their defaults.
_SWITCHES = frozenset({"stochastic_rounding", "random_hadamard_transform", "hadamard_size",
                       "rht_seed", "enable_2d_quantization"})


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Base of all recipes: predicates that say which kind of recipe this is."""

  def mxfp8(self) -> bool:
    """MX block scaling with 8-bit forward elements (E4M3, or E5M2 in MXBlockScaling)."""
    return self._mx_bits() == 8

  def mxfp6(self) -> bool:
    return self._mx_bits() == 6

  def mxfp4(self) -> bool:
    return self._mx_bits() == 4

  def _mx_bits(self) -> int | None:
    return formats.element_format(self.fwd_format).bits if self.mx() else None

  def mx(self) -> bool:
    """MX block scaling of any element width (FP8, FP6, FP4)."""
    return isinstance(self, _MXRecipe)

  def block_scaling(self) -> bool:
    return self.mx()

  def block_roles(self):
    """The per-role block formats (`mxjax._src.block_recipes.BlockRoles`) when the GEMMs run
    `mxjax.block_dot` (NVFP4, FP8 blocks, MX with 2-D weights / SR / RHT); None when
    they run `mxjax.dot` (plain MX) or another path."""
    return None

  def needs_rng(self) -> bool:
    """Whether the GEMMs' backward draws random bits (stochastic rounding): the model
    then needs a key (Flax's "mx" rng stream, or `rng=`)."""
    return False

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
      parts.append(f"{name}={value.name if isinstance(value, Format) else value}")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class _MXRecipe(Recipe):
  """Common checks and properties of the MX block-scaling recipes."""

  def _check_block(self):
    formats.scale_mode(self.scale_mode)
    for name in (self.fwd_format, self.bwd_format):
      formats.check_block_size(self.block_size, formats.element_format(name))
    object.__setattr__(self, "scale_mode", formats.scale_mode(self.scale_mode).value)
    from mxjax._src import block_recipes  # noqa: PLC0415 (imports this module)
    block_recipes.check_switches(self)
    self.block_roles()

  def block_roles(self):
    """None for plain MX; the roles (`block_recipes.mx_roles`) when a switch is on."""
    two_d = getattr(self, "enable_2d_quantization", False)
    if not (two_d or self.stochastic_rounding or self.random_hadamard_transform):
      return None
    from mxjax import block_recipes  # noqa: PLC0415
    return block_recipes.mx_roles(self, two_d)

  def needs_rng(self) -> bool:
    return self.stochastic_rounding


class _FP8FormatRoles:
  """`fwd_format` / `bwd_format` of a recipe with TransformerEngine's `fp8_format` field
  (a `Format`: E4M3 both ways, or HYBRID: E4M3 forward, E5M2 gradients)."""

  @property
  def fwd_format(self) -> str:
    return self.fp8_format.fwd

  @property
  def bwd_format(self) -> str:
    return self.fp8_format.bwd


@dataclasses.dataclass(frozen=True)
class MXFP8BlockScaling(_FP8FormatRoles, _MXRecipe):
  """MXFP8: E4M3 (or HYBRID: E4M3 forward, E5M2 gradients) in blocks of `block_size`.

  Attributes:
    margin: kept for TransformerEngine compatibility; MX scales ignore it.
    fp8_format: Format.E4M3 or Format.HYBRID (E5M2 forward is refused, as in TE).
    fp8_dpa, fp8_mha: FP8 attention; not supported (must be False).
    block_size: 16, 32 or 64 elements per E8M0 scale.
    scale_mode: "rceil" (default) or "floor".
    enable_2d_quantization: weights in block_size x block_size E8M0 tiles (32x32 by
      default, TE 2.19): one quantized weight serves the forward and the dgrad.
    stochastic_rounding: round the gradients' elements stochastically (needs a key:
      Flax's "mx" rng stream); the GEMMs then run `mxjax.block_dot`.
    random_hadamard_transform: a block random Hadamard transform (`hadamard_size`, signs
      from `rht_seed`, fixed per GEMM) along the tokens on both wgrad operands.
  """

  margin: int = 0
  fp8_format: Format = Format.E4M3
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
    fmt = _format(self.fp8_format, "fp8_format")
    object.__setattr__(self, "fp8_format", fmt)
    if fmt is Format.E5M2:
      raise ValueError("MXFP8BlockScaling does not support Format.E5M2: the forward pass "
                       "needs E4M3; use Format.E4M3 or Format.HYBRID (E5M2 gradients)")
    if fmt not in (Format.E4M3, Format.HYBRID):
      raise ValueError(f"MXFP8BlockScaling needs Format.E4M3 or Format.HYBRID, got {fmt}")
    if self.fp8_dpa or self.fp8_mha:
      raise NotImplementedError("MXFP8BlockScaling: fp8_dpa / fp8_mha (FP8 attention) are "
                                "not supported by mxjax")
    self._check_block()


def _element_format_name(value, field: str) -> str:
  """The element format name ("e4m3", ...) of a name, an ElementFormat or a one-format
  Format member (not HYBRID, which names two)."""
  if isinstance(value, Format) and value.fwd == value.bwd:
    return value.fwd
  try:
    return formats.element_format(value).name
  except (TypeError, ValueError):
    raise ValueError(f"{field} must be one of {sorted(formats.FORMATS)}, got {value!r}") from None


@dataclasses.dataclass(frozen=True)
class MXBlockScaling(_MXRecipe):
  """MX block scaling with any forward / backward pair of the five element formats.

  The other MX recipes are this with TransformerEngine's checks; this one also runs,
  e.g., E5M2 forward and backward (as MX evaluation harnesses sweep it).

  Attributes:
    fwd_format: element format of both GEMM operands in the forward pass ("e4m3",
      "e5m2", "e3m2", "e2m3" or "e2m1"; an ElementFormat or a one-format Format works
      too). Stored as the name.
    bwd_format: element format of the output gradient in the backward GEMMs. Stored as
      the name.
    block_size: 16, 32 or 64 elements per E8M0 scale (a multiple of 4 for FP6).
    scale_mode: "rceil" (default) or "floor".
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
    object.__setattr__(self, "fwd_format", _element_format_name(self.fwd_format, "fwd_format"))
    object.__setattr__(self, "bwd_format", _element_format_name(self.bwd_format, "bwd_format"))
    self._check_block()


def _element_name(value, field: str) -> str:
  """An element format name from a Format (its backward name) or a format name."""
  if isinstance(value, Format):
    return value.bwd
  if isinstance(value, str) and value.upper() in Format.__members__:
    return Format[value.upper()].bwd
  raise ValueError(f"{field} must be a Format or an element format name, got {value!r}")


@dataclasses.dataclass(frozen=True)
class MXFP6BlockScaling(_MXRecipe):
  """MXFP6: E2M3 or E3M2 elements in blocks of `block_size`.

  Attributes:
    fp6_format: Format.E2M3 (default) or Format.E3M2.
    bwd_format: the gradients' element format (a Format or a name like "e5m2"); None means
      the forward format. Stored as the element format name.
    block_size, scale_mode: as in MXFP8BlockScaling.
  """

  fp6_format: Format = Format.E2M3
  bwd_format: str | None = None
  block_size: int = formats.DEFAULT_BLOCK_SIZE
  scale_mode: str = "rceil"
  stochastic_rounding: bool = False
  random_hadamard_transform: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    fmt = _format(self.fp6_format, "fp6_format")
    if fmt not in (Format.E2M3, Format.E3M2):
      raise ValueError(f"MXFP6BlockScaling needs Format.E2M3 or Format.E3M2, got {fmt}")
    object.__setattr__(self, "fp6_format", fmt)
    bwd = fmt.bwd if self.bwd_format is None else _element_name(self.bwd_format, "bwd_format")
    object.__setattr__(self, "bwd_format", bwd)
    self._check_block()

  @property
  def fwd_format(self) -> str:
    return self.fp6_format.fwd


@dataclasses.dataclass(frozen=True)
class MXFP4BlockScaling(_MXRecipe):
  """MXFP4: E2M1 elements in blocks of `block_size`.

  Attributes:
    bwd_format: the gradients' element format; None means E2M1. Stored as a name.
    block_size, scale_mode: as in MXFP8BlockScaling.
    stochastic_rounding: round the gradients' elements stochastically (needs a key:
      Flax's "mx" rng stream); the GEMMs then run `mxjax.block_dot`.
    random_hadamard_transform: a block random Hadamard transform (`hadamard_size`, signs
      from `rht_seed`, fixed per GEMM) along the tokens on both wgrad operands.
    hadamard_size, rht_seed: the transform's block (a power of two) and signs' seed.
  """

  bwd_format: str | None = None
  block_size: int = formats.DEFAULT_BLOCK_SIZE
  scale_mode: str = "rceil"
  stochastic_rounding: bool = False
  random_hadamard_transform: bool = False
  hadamard_size: int = 16
  rht_seed: int = 0

  def __post_init__(self):
    bwd = "e2m1" if self.bwd_format is None else _element_name(self.bwd_format, "bwd_format")
    object.__setattr__(self, "bwd_format", bwd)
    self._check_block()

  @property
  def fwd_format(self) -> str:
    return "e2m1"


def _check_per_tensor_format(recipe) -> None:
  fmt = _format(recipe.fp8_format, "fp8_format")
  if fmt not in (Format.E4M3, Format.HYBRID):
    raise ValueError(f"{type(recipe).__name__} needs Format.E4M3 or Format.HYBRID, got {fmt}")
  object.__setattr__(recipe, "fp8_format", fmt)


@dataclasses.dataclass(frozen=True)
class DelayedScaling(_FP8FormatRoles, Recipe):
  """Per-tensor FP8 whose scale comes from a history of past amaxes (see mxjax.state).

  Each step quantizes with the scale in the state, records the tensor's amax in the
  history (newest first) and sets the next scale to `fp8_max / amax / 2**margin`, amax
  being the history's max (`"max"`) or its newest entry (`"most_recent"`). A tensor
  whose history is still empty (the first step) is scaled from its own amax.

  Attributes:
    margin: extra headroom, in powers of two.
    fp8_format: Format.HYBRID (E4M3 forward, E5M2 gradients) or Format.E4M3.
    amax_history_len: entries in each tensor's amax history.
    amax_compute_algo: "max" or "most_recent".
    reduce_amax: take the amax over all devices (mesh axes) before recording it.
  """

  margin: int = 0
  fp8_format: Format = Format.HYBRID
  amax_history_len: int = 1024
  amax_compute_algo: str = "max"
  reduce_amax: bool = True

  def __post_init__(self):
    _check_per_tensor_format(self)
    if self.amax_compute_algo not in ("max", "most_recent"):
      raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got "
                       f"{self.amax_compute_algo!r}")
    if int(self.amax_history_len) < 1:
      raise ValueError(f"amax_history_len must be >= 1, got {self.amax_history_len}")


@dataclasses.dataclass(frozen=True)
class Float8CurrentScaling(_FP8FormatRoles, Recipe):
  """Per-tensor FP8 whose scale comes from the tensor's own amax: `fp8_max / amax / 2**margin`.

  Attributes:
    fp8_format: Format.HYBRID (E4M3 forward, E5M2 gradients) or Format.E4M3.
    margin: extra headroom, in powers of two.
    reduce_amax: take the amax over all devices (mesh axes) and named `vmap` axes; False
      keeps each member of a named axis (an ensemble) its own.
  """

  fp8_format: Format = Format.HYBRID
  margin: int = 0
  reduce_amax: bool = True

  def __post_init__(self):
    _check_per_tensor_format(self)


def recipe_for_quantized_weight(fmt: str, block_size: int, scale_mode: str) -> Recipe:
  """The MX recipe whose forward format, block and scale mode made a quantized weight."""
  if fmt == "e4m3":
    return MXFP8BlockScaling(block_size=block_size, scale_mode=scale_mode)
  if fmt in ("e2m3", "e3m2"):
    return MXFP6BlockScaling(fp6_format=fmt, block_size=block_size, scale_mode=scale_mode)
  if fmt == "e2m1":
    return MXFP4BlockScaling(block_size=block_size, scale_mode=scale_mode)
  if fmt == "e5m2":  # no TransformerEngine-style recipe runs an E5M2 forward
    return MXBlockScaling(fmt, fmt, block_size=block_size, scale_mode=scale_mode)
  raise ValueError(f"no MX recipe quantizes weights to {fmt}")
