"""MX element formats and scale modes (OCP MX v1.0): pure data, no JAX ops.

Every layer names formats by these objects (or their string names); the integer
`ffi_id` and `ScaleMode.ffi_id` are the values passed to the C++/CUDA kernels.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import jax.numpy as jnp
import numpy as np

#: Block sizes the kernels support (elements sharing one E8M0 scale).
BLOCK_SIZES = (16, 32, 64)
DEFAULT_BLOCK_SIZE = 32

#: Exponent bias of the E8M0 scale: byte = e + 127; byte 0xFF is NaN.
E8M0_BIAS = 127
E8M0_NAN = 0xFF
SCALE_EXP_MIN = -127
SCALE_EXP_MAX = 127


class ScaleMode(str, enum.Enum):
  """How the shared exponent is chosen from a block's amax.

  FLOOR is the OCP rule `floor(log2(amax)) - emax` (the largest element may
  saturate); RCEIL (NVIDIA / TE / cuBLAS, the default) rounds up so that no
  element ever saturates.
  """

  RCEIL = "rceil"
  FLOOR = "floor"

  @property
  def ffi_id(self) -> int:
    return 0 if self is ScaleMode.RCEIL else 1


@dataclasses.dataclass(frozen=True)
class ElementFormat:
  """One MX element format.

  Attributes:
    name: "e4m3", "e5m2", "e3m2", "e2m3" or "e2m1".
    exp_bits, man_bits: widths of the exponent and mantissa fields (plus a sign bit).
    bias: exponent bias; the smallest normal exponent is `1 - bias`.
    emax: exponent of the largest power of two the format holds.
    max: largest finite magnitude.
    has_inf, has_nan: whether special codes exist (never produced by quantize).
    ffi_id: the id the kernels use for this format.
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
    """Storage entries along the quantized axis holding `n` logical elements.

    Packing runs along the quantized axis: group g holds elements
    `g*codes_per_group ...`; the last group is zero-padded.
    """
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

  Returns:
    The `ElementFormat` (bits, emax, max, storage dtype, packing).

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
  """Validates a block size for `fmt` and returns it."""
  if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool):
    raise TypeError(f"block_size must be an int, got {block_size!r}")
  if fmt.packed and block_size % fmt.codes_per_group:
    raise ValueError(
        f"block_size {block_size} is not a multiple of {fmt.codes_per_group}, which packed "
        f"format {fmt.name} needs")
  if block_size not in BLOCK_SIZES:
    raise ValueError(f"block_size {block_size} is not supported; expected one of {BLOCK_SIZES}")
  return int(block_size)
