"""The six block-scaled recipes every feature is tested in (issue 42's format matrix), and
what the per-format test modules (`tests/test_every_format_*.py`) share: the oracle's
values of a role, the role formats of a recipe, the keys and names a product runs with.

    @every_format
    def test_something(name):
      recipe = RECIPES[name]

The test ids are the case names ("mxfp8", "mxfp4", "mxfp4_sr_rht", "nvfp4", "fp8_block",
"mxfp8_2d"); `docs/formats.md` names the cases that show each feature.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxjax
from mxjax import reference

RECIPES = {
    "mxfp8": mxjax.MXFP8BlockScaling(),
    "mxfp4": mxjax.MXFP4BlockScaling(),
    "mxfp4_sr_rht": mxjax.MXFP4BlockScaling(stochastic_rounding=True,
                                            random_hadamard_transform=True),
    "nvfp4": mxjax.NVFP4BlockScaling(),  # TE's defaults: 16x16 weights, SR grads, RHT wgrad
    "fp8_block": mxjax.Float8BlockScaling(),  # 1x128 acts / grads, 128x128 weights
    "mxfp8_2d": mxjax.MXFP8BlockScaling(enable_2d_quantization=True),
}
IDS = tuple(RECIPES)

#: The weight format's bytes per param, written out from the formats' definitions
#: (element bits / 8 + scale bytes / elements per block), not taken from the library.
WEIGHT_BYTES_PER_PARAM = {
    "mxfp8": 1 + 1 / 32,          # E4M3, one E8M0 byte per 1x32
    "mxfp4": 0.5 + 1 / 32,        # E2M1, one E8M0 byte per 1x32
    "mxfp4_sr_rht": 0.5 + 1 / 32,
    "nvfp4": 0.5 + 1 / 256,       # E2M1, one E4M3 byte per 16x16 tile (+4 B per tensor)
    "fp8_block": 1 + 4 / 128 ** 2,  # E4M3, one FP32 scale per 128x128 tile
    "mxfp8_2d": 1 + 1 / 32 ** 2,  # E4M3, one E8M0 byte per 32x32 tile
}

#: The sweep's (and mxjax-eval's) name of each case.
SWEEP_NAMES = {"mxfp8": "mxfp8_e4m3", "mxfp4": "mxfp4_e2m1", "mxfp4_sr_rht": "mxfp4_sr_rht",
               "nvfp4": "nvfp4", "fp8_block": "fp8_block", "mxfp8_2d": "mxfp8_2d"}

#: Parametrizes a test over the six recipes by case name.
every_format = pytest.mark.parametrize("name", IDS)

DIMS = (((1,), (0,)), ((), ()))  # x [M, K] . w [K, N]


def role_formats(recipe) -> dict:
  """{"x": fmt, "w": fmt, "grad": fmt} of a recipe's roles."""
  roles = recipe.roles()
  return {"x": roles.x, "w": roles.w, "grad": roles.grad}


def oracle_values(x, fmt, axis: int, rand=None, tensor_scale_bits=None):
  """(values without the tensor scale, f32; 1 / tensor scale or 1.0) of the oracle's
  quantization of x along `axis` (2-D tiles: the last two axes)."""
  return _oracle_values(x, fmt, axis, rand, tensor_scale_bits)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _oracle_values(x, fmt, axis, rand, tensor_scale_bits):
  codes, scales, ts = reference.block_quantize(x, fmt, axis=axis, rand=rand,
                                               tensor_scale_bits=tensor_scale_bits)
  values = reference.block_dequantize(codes, scales, ts, fmt, axis=axis,
                                      apply_tensor_scale=False)
  inv = 1.0 if ts is None else 1.0 / jax.lax.bitcast_convert_type(ts, jnp.float32)
  return values, inv


def random_data(shape, seed: int = 0, scale: float = 1.0, dtype=jnp.float32, spread: int = 3):
  """Normal data whose rows have magnitudes over 2 * `spread` + 1 binades."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape[:-1] + (1,)))
  return jnp.asarray(x * scale, dtype)


def bits(a) -> np.ndarray:
  """The bit pattern of a float array (unsigned ints of its width)."""
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_bits_equal(got, want, what: str = ""):
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype,
                                                              got.shape, want.shape)
  diff = bits(got) != bits(want)
  assert not diff.any(), f"{what}: {diff.sum()} of {diff.size} elements differ"
