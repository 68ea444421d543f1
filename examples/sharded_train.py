"""Trains a 2-layer `mxjax.Dense` MLP under `jax.jit` on a (data, model) mesh of CPU
devices, data or tensor parallel, and prints each param's sharding and the loss per step.

    python examples/sharded_train.py [--mesh 2x4] [--mode dp|tp-col|tp-row]
        [--recipe mxfp8|delayed|none] [--steps 20] [--axis-types explicit|auto]

Modes (the batch is always split over 'data'):
  dp      weights replicated.
  tp-col  Megatron style: fc1's kernel split on its features over 'model', fc2's on its
          contraction (one all-reduce of fc2's partial sums per forward).
  tp-row  both kernels split on their contraction.
dp and tp-col take the param shardings from the modules' logical `kernel_axes` through
Flax's logical axis rules; tp-row gives them directly. Explicit axes (jax.make_mesh's
default) put the shardings in the types; tp-col's fc2 then names its output sharding, as
`jnp.dot` asks where the contraction is sharded. The task: regress y = tanh(x W) for a
random teacher W. The script sets XLA_FLAGS to make the mesh's CPU devices.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import time


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mesh", default="2x4", help="data x model devices, e.g. 2x4")
  parser.add_argument("--mode", choices=("dp", "tp-col", "tp-row"), default="tp-col")
  parser.add_argument("--recipe", choices=("mxfp8", "delayed", "none"), default="mxfp8")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--axis-types", choices=("explicit", "auto"), default="explicit")
  args = parser.parse_args(argv)
  if not re.fullmatch(r"\d+x\d+", args.mesh):
    parser.error(f"--mesh must look like 2x4, got {args.mesh!r}")
  args.mesh_shape = tuple(int(v) for v in args.mesh.split("x"))
  return args


def main(argv=None):
  args = parse_args(argv)
  # The CPU devices must be asked for before jax is first imported.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform"
                             f"_device_count={math.prod(args.mesh_shape)}").strip()
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import mxjax
  from mxjax import state as state_lib

  dim, hidden = 128, 256
  recipe = {"mxfp8": mxjax.MXFP8BlockScaling(), "none": None,
            "delayed": mxjax.DelayedScaling(amax_history_len=16)}[args.recipe]
  rules = {"dp": (("embed", None), ("mlp", None)),
           "tp-col": (("embed", None), ("mlp", "model"))}
  tp_row = {"fc1": {"kernel": P("model", None), "bias": P()},
            "fc2": {"kernel": P("model", None), "bias": P()}}

  explicit = args.axis_types == "explicit"
  kind = AxisType.Explicit if explicit else AxisType.Auto
  mesh = jax.make_mesh(args.mesh_shape, ("data", "model"), axis_types=(kind,) * 2)
  fc2_out = (NamedSharding(mesh, P("data", None)) if explicit and args.mode == "tp-col"
             else None)
  constrain = jax.sharding.reshard if explicit else jax.lax.with_sharding_constraint

  class MLP(nn.Module):
    """x [B, dim] -> [B, dim]: fc1, GELU, fc2, in bf16."""

    @nn.compact
    def __call__(self, x):
      h = mxjax.Dense(hidden, dtype=jnp.bfloat16, kernel_axes=("embed", "mlp"),
                      bias_axes=("mlp",), name="fc1")(x)
      return mxjax.Dense(dim, dtype=jnp.bfloat16, kernel_axes=("mlp", "embed"),
                         bias_axes=("embed",), name="fc2")(nn.gelu(h), out_sharding=fc2_out)

  batch_sharding = NamedSharding(mesh, P("data", None))
  replicated = NamedSharding(mesh, P())
  teacher = jax.random.normal(jax.random.key(42), (dim, dim)) / math.sqrt(dim)
  model, tx = MLP(), optax.adam(1e-3)

  with mxjax.autocast(enabled=recipe is not None, recipe=recipe):
    boxed = model.init(jax.random.key(0), jnp.zeros((args.batch, dim)))
  if args.mode in rules:
    specs = nn.get_partition_spec(boxed)["params"]
    shardings = nn.logical_to_mesh_sharding(specs, mesh, rules[args.mode])
  else:
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), tp_row)
  variables = nn.unbox(boxed)
  params = jax.device_put(variables["params"], shardings)
  mx_state = jax.device_put(variables.get("mx_state", {}), replicated)
  opt_state = tx.init(params)

  def loss_fn(params, mx_state, x, y):
    out, mutated = model.apply({"params": params, "mx_state": mx_state}, x,
                               mutable=["mx_state"])
    return jnp.mean(jnp.square(out.astype(jnp.float32) - y)), mutated["mx_state"]

  @jax.jit
  def step(params, mx_state, opt_state, key):
    x = jax.random.normal(key, (args.batch, dim))
    x = constrain(x, batch_sharding)
    y = jnp.tanh(x @ teacher)
    (loss, mutated), (g_params, g_state) = jax.value_and_grad(
        loss_fn, argnums=(0, 1), has_aux=True)(params, mx_state, x, y)
    updates, opt_state = tx.update(g_params, opt_state, params)
    params = constrain(optax.apply_updates(params, updates), shardings)
    return params, state_lib.next_state(g_state, mutated), opt_state, loss

  print(f"mesh {dict(mesh.shape)} ({args.axis_types}), mode {args.mode}, recipe {recipe}")
  with mxjax.autocast(enabled=recipe is not None, recipe=recipe), jax.set_mesh(mesh):
    key = jax.random.key(1)
    hlo = step.lower(params, mx_state, opt_state, key).compile().as_text()
    ops = re.findall(r"\s(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                     r"(?:-start)?\(", hlo)
    print("collectives in one step:",
          ", ".join(f"{op} x{ops.count(op)}" for op in sorted(set(ops))) or "none")
    start = time.perf_counter()
    for i in range(args.steps):
      params, mx_state, opt_state, loss = step(params, mx_state, opt_state,
                                               jax.random.fold_in(key, i))
      print(f"step {i:3d}  loss {float(loss):.5f}")
    print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s")

  print("param shardings:")
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name = "/".join(str(k.key) for k in path)
    print(f"  {name:12s} {str(leaf.shape):12s} {leaf.sharding.spec}")
  if recipe is not None and recipe.delayed():
    scale = mx_state["fc1"]["recipe_state"].tensors["input"].scale
    values = {float(s.data) for s in scale.addressable_shards}
    print(f"fc1 input scale on the {len(scale.addressable_shards)} devices: {sorted(values)}")


if __name__ == "__main__":
  main()
