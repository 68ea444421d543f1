"""One description of a block-scaled format: element format x scale format x block shape
x an optional FP32 per-tensor scale. Pure data, no JAX ops.

OCP MX is one case (E8M0 scales, 1x32 blocks); NVFP4 (E2M1, unsigned E4M3 scales, 1x16
or 16x16 blocks, an FP32 tensor scale) and DeepSeek-style FP8 blocks (E4M3, FP32 scales,
optionally powers of two, 1x128 or 128x128) are others. `mxjax.reference` holds the rules
(`block_quantize`), `mxjax.block_codec` the plain-XLA path, `mxjax.block_ops` the ops
that lower to the CPU kernels or to that path.

A block shape `(rows, cols)` acts on two axes of an operand: `(1, b)` is a 1-D block of b
elements along one axis (the contraction, for a GEMM operand); `(b, b)` a square tile, the
same whichever of its two axes a product contracts (so one quantized weight serves the
forward and the dgrad).
"""

from __future__ import annotations

import dataclasses
import enum

from mxjax._src import formats


class ScaleFormat(str, enum.Enum):
  """The format of the per-block scale.

  E8M0: a power of two, byte e + 127 (OCP MX); its exponent follows the `scale_mode`.
  E4M3: an unsigned E4M3 byte (NVFP4): `amax_block / elem_max * tensor_scale`, RNE,
    saturated to 448.
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
  def ffi_id(self) -> int:
    """The id of ffi/include/mxjax/block_codec.h's ScaleKind."""
    return list(ScaleFormat).index(self)


#: Block shapes in use (rows, cols); any positive shape works in the XLA path.
BLOCK_SHAPES = ((1, 32), (1, 16), (16, 16), (32, 32), (1, 128), (128, 128))


@dataclasses.dataclass(frozen=True)
class BlockFormat:
  """A block-scaled format.

  Attributes:
    element: element format name ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1").
    scale: ScaleFormat (or its value).
    block: (rows, cols); (1, b) is a 1-D block of b elements along the quantized axis.
    tensor_scale: whether an FP32 scale per tensor comes first (E4M3 scales only):
      `S = elem_max * 448 / amax_tensor` (1 where amax is 0), as TE's NVFP4.
    scale_mode: the E8M0 exponent rule, "rceil" or "floor" (ignored by other scales).
  """

  element: str
  scale: ScaleFormat = ScaleFormat.E8M0
  block: tuple[int, int] = (1, 32)
  tensor_scale: bool = False
  scale_mode: str = "rceil"

  def __post_init__(self):
    object.__setattr__(self, "element", formats.element_format(self.element).name)
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
    object.__setattr__(self, "block", block)
    object.__setattr__(self, "scale_mode", formats.scale_mode(self.scale_mode).value)
    if self.tensor_scale and self.scale is not ScaleFormat.E4M3:
      raise ValueError(f"a per-tensor scale goes with E4M3 block scales (NVFP4); "
                       f"{self.scale.value} scales carry the tensor's range themselves")
    elem = formats.element_format(self.element)
    if self.scale is ScaleFormat.E4M3 and elem.bits == 8:
      raise ValueError("E4M3 block scales are for sub-byte elements (NVFP4); FP8 "
                       "elements take E8M0 or FP32 scales")

  @property
  def element_format(self) -> formats.ElementFormat:
    return formats.element_format(self.element)

  @property
  def two_d(self) -> bool:
    return self.block[0] > 1

  @property
  def block_elements(self) -> int:
    return self.block[0] * self.block[1]

  def bytes_per_element(self) -> float:
    """Storage per element: element bits / 8 + the scale's bytes / elements per block
    (the tensor scale's 4 bytes per tensor left out)."""
    return self.element_format.bits / 8 + self.scale.bytes / self.block_elements

  def with_block(self, block) -> "BlockFormat":
    return dataclasses.replace(self, block=tuple(block))

  def __str__(self) -> str:
    ts = "+fp32 tensor scale" if self.tensor_scale else ""
    return f"{self.element}/{self.scale.value}/{self.block[0]}x{self.block[1]}{ts}"


def mx(element: str, block_size: int = 32, scale_mode: str = "rceil") -> BlockFormat:
  """OCP MX: E8M0 scales, 1-D blocks."""
  return BlockFormat(element, ScaleFormat.E8M0, (1, block_size), scale_mode=scale_mode)


#: NVFP4: E2M1, 1x16 blocks, E4M3 scales, FP32 tensor scale (0.5 + 1/16 = 0.5625 B/elem).
NVFP4 = BlockFormat("e2m1", ScaleFormat.E4M3, (1, 16), tensor_scale=True)
#: NVFP4 with 16x16 weight tiles (0.5 + 1/256 B/elem).
NVFP4_2D = BlockFormat("e2m1", ScaleFormat.E4M3, (16, 16), tensor_scale=True)
#: DeepSeek-V3 FP8: E4M3, 1x128 (activations, gradients; 1 + 4/128 = 1.03125 B/elem).
FP8_1X128 = BlockFormat("e4m3", ScaleFormat.FP32_POW2, (1, 128))
#: DeepSeek-V3 FP8 weights: E4M3, 128x128 tiles (1 + 4/16384 B/elem).
FP8_128X128 = BlockFormat("e4m3", ScaleFormat.FP32_POW2, (128, 128))
#: MXFP8 with 32x32 weight tiles (TE's enable_2d_quantization; 1 + 1/1024 B/elem).
MXFP8_2D = BlockFormat("e4m3", ScaleFormat.E8M0, (32, 32))
