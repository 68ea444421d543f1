"""mxjax.recipes: fields, validation, predicates, hashing, str."""

import dataclasses

import jax
import pytest

from mxjax.recipes import (DelayedScaling, Float8CurrentScaling, Format, MXFP4BlockScaling,
                           MXFP6BlockScaling, MXFP8BlockScaling, Recipe,
                           recipe_for_quantized_weight)

ALL = [MXFP8BlockScaling(), MXFP8BlockScaling(fp8_format=Format.HYBRID), MXFP6BlockScaling(),
       MXFP6BlockScaling(fp6_format=Format.E3M2), MXFP4BlockScaling(), DelayedScaling(),
       Float8CurrentScaling()]


def test_mxfp8_formats():
  assert (MXFP8BlockScaling().fwd_format, MXFP8BlockScaling().bwd_format) == ("e4m3", "e4m3")
  hybrid = MXFP8BlockScaling(fp8_format=Format.HYBRID)
  assert (hybrid.fwd_format, hybrid.bwd_format) == ("e4m3", "e5m2")
  assert (hybrid.block_size, hybrid.scale_mode, hybrid.margin) == (32, "rceil", 0)


def test_mxfp8_refuses_e5m2_and_attention():
  with pytest.raises(ValueError, match="E5M2"):
    MXFP8BlockScaling(fp8_format=Format.E5M2)
  with pytest.raises(NotImplementedError, match="fp8_dpa"):
    MXFP8BlockScaling(fp8_dpa=True)
  with pytest.raises(NotImplementedError, match="fp8_mha"):
    MXFP8BlockScaling(fp8_mha=True)


def test_mx_recipes_validate_block_size_and_scale_mode():
  with pytest.raises(ValueError, match="block_size"):
    MXFP8BlockScaling(block_size=48)
  with pytest.raises(ValueError, match="scale mode"):
    MXFP4BlockScaling(scale_mode="ceil")
  assert MXFP8BlockScaling(scale_mode="FLOOR").scale_mode == "floor"


def test_mxfp6_and_mxfp4_backward_formats():
  assert (MXFP6BlockScaling().fwd_format, MXFP6BlockScaling().bwd_format) == ("e2m3", "e2m3")
  e3m2 = MXFP6BlockScaling(fp6_format="e3m2", bwd_format=Format.E5M2)
  assert (e3m2.fwd_format, e3m2.bwd_format) == ("e3m2", "e5m2")
  assert MXFP6BlockScaling() == MXFP6BlockScaling(bwd_format="e2m3")  # None = same as fwd
  assert (MXFP4BlockScaling().fwd_format, MXFP4BlockScaling().bwd_format) == ("e2m1", "e2m1")
  assert MXFP4BlockScaling(bwd_format=Format.HYBRID).bwd_format == "e5m2"
  with pytest.raises(ValueError, match="E2M3 or Format.E3M2"):
    MXFP6BlockScaling(fp6_format=Format.E4M3)
  with pytest.raises(ValueError, match="multiple of 4"):
    MXFP6BlockScaling(block_size=18)


def test_per_tensor_recipes_validate():
  with pytest.raises(ValueError, match="amax_compute_algo"):
    DelayedScaling(amax_compute_algo="mean")
  with pytest.raises(ValueError, match="amax_history_len"):
    DelayedScaling(amax_history_len=0)
  with pytest.raises(ValueError, match="E4M3 or Format.HYBRID"):
    Float8CurrentScaling(fp8_format=Format.E2M1)
  d = DelayedScaling()
  assert (d.fwd_format, d.bwd_format, d.amax_history_len, d.reduce_amax) == (
      "e4m3", "e5m2", 1024, True)


PREDICATES = ("mxfp8", "mx", "fp8", "delayed", "block_scaling", "float8_current_scaling")
EXPECTED = {
    "MXFP8BlockScaling": {"mxfp8", "mx", "block_scaling"},
    "MXFP6BlockScaling": {"mx", "block_scaling"},
    "MXFP4BlockScaling": {"mx", "block_scaling"},
    "DelayedScaling": {"fp8", "delayed"},
    "Float8CurrentScaling": {"fp8", "float8_current_scaling"},
}


@pytest.mark.parametrize("recipe", ALL, ids=lambda r: type(r).__name__)
def test_predicates(recipe):
  assert isinstance(recipe, Recipe)
  true = {p for p in PREDICATES if getattr(recipe, p)()}
  assert true == EXPECTED[type(recipe).__name__]
  assert recipe.stateful() == recipe.delayed()


@pytest.mark.parametrize("recipe", ALL, ids=lambda r: type(r).__name__)
def test_frozen_hashable_and_usable_as_static_arg(recipe):
  assert hash(recipe) == hash(dataclasses.replace(recipe))
  with pytest.raises(dataclasses.FrozenInstanceError):
    recipe.block_size = 16
  traces = []
  f = jax.jit(lambda x, r: (traces.append(r), x)[1], static_argnums=1)
  f(1.0, recipe)
  f(1.0, dataclasses.replace(recipe))  # equal recipe: cache hit
  assert traces == [recipe]


def test_str():
  assert str(MXFP8BlockScaling()).startswith("recipe_type=MXFP8BlockScaling, margin=0, format=E4M3")
  assert str(DelayedScaling()).startswith("recipe_type=DelayedScaling, margin=0, format=HYBRID")
  assert "format=E3M2" in str(MXFP6BlockScaling(fp6_format=Format.E3M2))
  assert str(MXFP4BlockScaling()).startswith("recipe_type=MXFP4BlockScaling")


def test_recipe_for_quantized_weight():
  assert recipe_for_quantized_weight("e4m3", 32, "rceil") == MXFP8BlockScaling()
  assert recipe_for_quantized_weight("e3m2", 16, "floor") == MXFP6BlockScaling(
      fp6_format=Format.E3M2, block_size=16, scale_mode="floor")
  assert recipe_for_quantized_weight("e2m1", 64, "rceil").mxfp4()
