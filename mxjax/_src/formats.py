"""Block-scaled formats, pure data: element format x scale format x block shape x an
optional FP32 tensor scale (`BlockFormat`): OCP MX (`mx`), NVFP4 (`nvfp4`), DeepSeek FP8
blocks (`fp8_block`); `mxjax.reference` states the rules. A block `(1, b)` runs along one
axis; `(b, b)` is a square tile over the last two axes (one quantized weight serves the
forward and the dgrad). The kernels' ids (`ffi_id`) are written out, never enum order.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import jax.numpy as jnp
import numpy as np

#: Block sizes of the MX kernels' fast path (1-D E8M0 blocks).
BLOCK_SIZES = (16, 32, 64)
DEFAULT_BLOCK_SIZE = 32

#: Exponent bias of the E8M0 scale: byte = e + 127; byte 0xFF is NaN.
E8M0_BIAS = 127
E8M0_NAN = 0xFF
SCALE_EXP_MIN = -127
SCALE_EXP_MAX = 127


class ScaleMode(str, enum.Enum):
  """How an E8M0 scale's exponent is chosen from a block's amax: FLOOR (OCP,
  `floor(log2(amax)) - emax`, may saturate) or RCEIL (TE / cuBLAS, the default: no element
  saturates)."""

  RCEIL = "rceil"
  FLOOR = "floor"

  @property
  def ffi_id(self) -> int:
    return {ScaleMode.RCEIL: 0, ScaleMode.FLOOR: 1}[self]


@dataclasses.dataclass(frozen=True)
class ElementFormat:
  """The format of a block's elements (OCP MX v1.0).

  Attributes:
    name: "e4m3", "e5m2", "e3m2", "e2m3" or "e2m1".
    exp_bits: width of the exponent field.
    man_bits: width of the mantissa field (plus a sign bit).
    bias: exponent bias; the smallest normal exponent is `1 - bias`.
    emax: exponent of the largest power of two the format holds.
    max: largest finite magnitude.
    has_inf: whether Inf codes exist (never produced by quantize).
    has_nan: whether NaN codes exist (never produced by quantize).
    ffi_id: the id the kernels use for this element format.
  """

  name: str
  exp_bits: int
  man_bits: int
  bias: int
  emax: int
  max: float
  has_inf: bool
  has_nan: bool
  ffi_id: int

  @property
  def bits(self) -> int:
    return 1 + self.exp_bits + self.man_bits

  @property
  def emin(self) -> int:
    """Exponent of the smallest normal value."""
    return 1 - self.bias

  @property
  def packed(self) -> bool:
    """FP6 and FP4 codes are packed into uint8 storage; FP8 uses jnp float8 dtypes."""
    return self.bits < 8

  @property
  def codes_per_group(self) -> int:
    """Codes packed together: 4 six-bit codes in 3 bytes, 2 four-bit codes in 1 byte."""
    return {8: 1, 6: 4, 4: 2}[self.bits]

  @property
  def bytes_per_group(self) -> int:
    return self.codes_per_group * self.bits // 8

  @property
  def storage_dtype(self) -> np.dtype:
    if self.name == "e4m3":
      return jnp.dtype(jnp.float8_e4m3fn)
    if self.name == "e5m2":
      return jnp.dtype(jnp.float8_e5m2)
    return jnp.dtype(jnp.uint8)

  def storage_length(self, n: int) -> int:
    """Storage entries holding `n` elements along the packed axis (last group padded)."""
    return math.ceil(n / self.codes_per_group) * self.bytes_per_group

  @property
  def max_code(self) -> int:
    """Code (without sign) of the largest finite magnitude."""
    if self.name == "e4m3":  # S.1111.111 is NaN, so max is S.1111.110
      return (1 << (self.bits - 1)) - 2
    if self.has_inf:  # IEEE-like: the top exponent holds Inf / NaN
      return ((1 << self.exp_bits) - 2) << self.man_bits | ((1 << self.man_bits) - 1)
    return (1 << (self.bits - 1)) - 1

  def __str__(self) -> str:
    return self.name


E4M3 = ElementFormat("e4m3", 4, 3, 7, 8, 448.0, False, True, 0)
E5M2 = ElementFormat("e5m2", 5, 2, 15, 15, 57344.0, True, True, 1)
E3M2 = ElementFormat("e3m2", 3, 2, 3, 4, 28.0, False, False, 2)
E2M3 = ElementFormat("e2m3", 2, 3, 1, 2, 7.5, False, False, 3)
E2M1 = ElementFormat("e2m1", 2, 1, 1, 2, 6.0, False, False, 4)

FORMATS: dict[str, ElementFormat] = {f.name: f for f in (E4M3, E5M2, E3M2, E2M3, E2M1)}

#: Input dtypes the quantize kernels accept (and dequantize produces).
HIGH_PRECISION_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def element_format(fmt: str | ElementFormat) -> ElementFormat:
  """Looks up an element format by name ("e4m3", "mxfp8_e4m3", "E4M3" ...).

  Args:
    fmt: a name whose last "_" part is "e4m3", "e5m2", "e3m2", "e2m3" or "e2m1" (any
      case), or an `ElementFormat` (returned as it is).

  Raises:
    TypeError: `fmt` is neither a str nor an ElementFormat.
    ValueError: an unknown name.
  """
  if isinstance(fmt, ElementFormat):
    return fmt
  if not isinstance(fmt, str):
    raise TypeError(f"MX element format must be a string or ElementFormat, got {fmt!r}")
  key = fmt.lower().split("_")[-1]
  if key not in FORMATS:
    raise ValueError(f"Unknown MX element format {fmt!r}; expected one of {sorted(FORMATS)}")
  return FORMATS[key]


def scale_mode(mode: str | ScaleMode) -> ScaleMode:
  """Parses "rceil" / "floor" (any case) into a ScaleMode."""
  if isinstance(mode, ScaleMode):
    return mode
  try:
    return ScaleMode(str(mode).lower())
  except ValueError:
    raise ValueError(
        f"Unknown scale mode {mode!r}; expected one of {[m.value for m in ScaleMode]}") from None


def check_block_size(block_size: int, fmt: ElementFormat) -> int:
  """Validates an MX block size (16, 32 or 64; whole packing groups) and returns it."""
  if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool):
    raise TypeError(f"block_size must be an int, got {block_size!r}")
  if fmt.packed and block_size % fmt.codes_per_group:
    raise ValueError(
        f"block_size {block_size} is not a multiple of {fmt.codes_per_group}, which packed "
        f"format {fmt.name} needs")
  if block_size not in BLOCK_SIZES:
    raise ValueError(f"block_size {block_size} is not supported; expected one of {BLOCK_SIZES}")
  return int(block_size)


class ScaleFormat(str, enum.Enum):
  """The format of a block's scale.

  E8M0: a power of two, byte e + 127 (OCP MX); its exponent follows the `scale_mode`.

  E4M3: an unsigned E4M3 byte (NVFP4), `amax_block / elem_max * tensor_scale`, RNE,
  saturated to 448; byte 0x7F (NaN) marks a block that held NaN / Inf.

  FP32: an f32 decode scale `1 / m` with `m = elem_max / amax_block` (TE's
  Float8BlockScaling with FP32 scales).

  FP32_POW2: the same with `m` rounded down to a power of two (no element saturates;
  the decode scale is exact).
  """

  E8M0 = "e8m0"
  E4M3 = "e4m3"
  FP32 = "fp32"
  FP32_POW2 = "fp32_pow2"

  @property
  def bytes(self) -> int:
    return 1 if self in (ScaleFormat.E8M0, ScaleFormat.E4M3) else 4

  @property
  def dtype(self) -> np.dtype:
    """The dtype scales are held in (their values are the decode scales)."""
    return jnp.dtype({ScaleFormat.E8M0: jnp.float8_e8m0fnu, ScaleFormat.E4M3: jnp.float8_e4m3fn,
                      ScaleFormat.FP32: jnp.float32, ScaleFormat.FP32_POW2: jnp.float32}[self])

  @property
  def ffi_id(self) -> int:
    """The id of ffi/include/mxjax/block_codec.h's ScaleKind."""
    return {ScaleFormat.E8M0: 0, ScaleFormat.E4M3: 1, ScaleFormat.FP32: 2,
            ScaleFormat.FP32_POW2: 3}[self]


@dataclasses.dataclass(frozen=True)
class BlockFormat:
  """A block-scaled format: what every quantizer, array and product of mxjax takes.

  Attributes:
    element: element format name ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1").
    scale: ScaleFormat (or its value).
    block: (rows, cols); (1, b) is a 1-D block of b elements along the quantized axis,
      (b, b) a square tile over the last two axes.
    tensor_scale: whether an FP32 scale per tensor comes first (E4M3 scales only):
      `S = elem_max * 448 / amax_tensor` (1 where amax is 0), as TE's NVFP4.
    scale_mode: the E8M0 exponent rule, "rceil" or "floor" (ignored by other scales).
  """

  element: str
  scale: ScaleFormat = ScaleFormat.E8M0
  block: tuple[int, int] = (1, DEFAULT_BLOCK_SIZE)
  tensor_scale: bool = False
  scale_mode: str = "rceil"

  def __post_init__(self):
    object.__setattr__(self, "element", element_format(self.element).name)
    try:
      object.__setattr__(self, "scale", ScaleFormat(getattr(self.scale, "value", self.scale)))
    except ValueError:
      raise ValueError(f"unknown scale format {self.scale!r}; expected one of "
                       f"{[s.value for s in ScaleFormat]}") from None
    block = tuple(int(b) for b in self.block)
    if len(block) != 2 or min(block) < 1:
      raise ValueError(f"block must be (rows, cols) of positive ints, got {self.block!r}")
    if block[0] not in (1, block[1]):
      raise ValueError(f"block {block}: 2-D blocks must be square (b, b) (one quantized "
                       "copy then serves both orientations); 1-D blocks are (1, b)")
    elem = element_format(self.element)
    if block[1] % elem.codes_per_group:
      raise ValueError(f"block {block}: {elem.name} packs {elem.codes_per_group} codes "
                       f"together, so a block's length must be a multiple of it")
    object.__setattr__(self, "block", block)
    object.__setattr__(self, "scale_mode", scale_mode(self.scale_mode).value)
    if self.tensor_scale and self.scale is not ScaleFormat.E4M3:
      raise ValueError(f"a per-tensor scale goes with E4M3 block scales (NVFP4); "
                       f"{self.scale.value} scales carry the tensor's range themselves")
    if self.scale is ScaleFormat.E4M3 and elem.bits == 8:
      raise ValueError("E4M3 block scales are for sub-byte elements (NVFP4); FP8 "
                       "elements take E8M0 or FP32 scales")

  @property
  def element_format(self) -> ElementFormat:
    return element_format(self.element)

  @property
  def two_d(self) -> bool:
    return self.block[0] > 1

  @property
  def block_size(self) -> int:
    """Elements per block along a row (the block's length along the packed axis)."""
    return self.block[1]

  @property
  def block_elements(self) -> int:
    return self.block[0] * self.block[1]

  @property
  def mx_kernels(self) -> bool:
    """Whether the MX kernels (the fast path) run it: E8M0 in 1-D blocks of 16, 32, 64."""
    return self.scale is ScaleFormat.E8M0 and not self.two_d and self.block[1] in BLOCK_SIZES

  def bytes_per_element(self) -> float:
    """Storage per element, element and block scale (not the tensor scale)."""
    return self.element_format.bits / 8 + self.scale.bytes / self.block_elements

  def with_block(self, block) -> "BlockFormat":
    return dataclasses.replace(self, block=tuple(block))

  def __str__(self) -> str:
    ts = "+fp32 tensor scale" if self.tensor_scale else ""
    return f"{self.element}/{self.scale.value}/{self.block[0]}x{self.block[1]}{ts}"


def mx(element: str = "e4m3", block_size: int = DEFAULT_BLOCK_SIZE,
       scale_mode: str = "rceil", *, two_d: bool = False) -> BlockFormat:
  """OCP MX: E8M0 scales in 1-D blocks of `block_size` (or `block_size` square tiles)."""
  b = int(block_size)
  return BlockFormat(element, ScaleFormat.E8M0, (b, b) if two_d else (1, b),
                     scale_mode=scale_mode)


def nvfp4(*, two_d: bool = False) -> BlockFormat:
  """NVFP4: E2M1 elements, an unsigned E4M3 scale per 1x16 block (16x16 tile with
  `two_d`) and an FP32 scale per tensor: 0.5625 B/element (0.504 in tiles)."""
  return BlockFormat("e2m1", ScaleFormat.E4M3, (16, 16) if two_d else (1, 16),
                     tensor_scale=True)


def fp8_block(element: str = "e4m3", *, two_d: bool = False, pow2: bool = True) -> BlockFormat:
  """DeepSeek-V3 FP8 blocks: FP32 scales (powers of two with `pow2`) per 1x128 block
  (128x128 tile with `two_d`): 1.03 B/element (1.0002 in tiles)."""
  return BlockFormat(element, ScaleFormat.FP32_POW2 if pow2 else ScaleFormat.FP32,
                     (128, 128) if two_d else (1, 128))


def as_block_format(format, block_size: int | None = None, mode=None) -> BlockFormat:
  """A BlockFormat from the public ops' arguments: a BlockFormat as it is (then no
  `block_size` / `mode`), or an MX element name with an MX block size and scale mode."""
  if isinstance(format, BlockFormat):
    if block_size is not None or mode is not None:
      raise ValueError(f"a BlockFormat ({format}) carries its own block and scale mode; "
                       "pass block_size / scale_mode only with an element format name")
    return format
  fmt = element_format(format)
  b = check_block_size(DEFAULT_BLOCK_SIZE if block_size is None else block_size, fmt)
  return mx(fmt.name, b, scale_mode("rceil" if mode is None else mode))


#: NVFP4 in 1x16 blocks / 16x16 weight tiles.
NVFP4 = nvfp4()
NVFP4_2D = nvfp4(two_d=True)
#: DeepSeek-V3 FP8: 1x128 (activations, gradients), 128x128 tiles (weights).
FP8_1X128 = fp8_block()
FP8_128X128 = fp8_block(two_d=True)
#: MXFP8 with 32x32 weight tiles (TE's enable_2d_quantization).
MXFP8_2D = mx("e4m3", two_d=True)
