"""Trains a 2-layer `mxjax.Dense` MLP (MXFP8) over several processes with JAX's own
multi-process runtime (`jax.distributed`): data parallel (DP) and fully sharded (FSDP)
on one global mesh over every process's devices.

One machine, two processes of 2 CPU devices each (a 4-device mesh), gloo collectives:

    python examples/multiprocess_train.py --coordinator 127.0.0.1:12355 \\
        --num-processes 2 --process-id 0 &
    python examples/multiprocess_train.py --coordinator 127.0.0.1:12355 \\
        --num-processes 2 --process-id 1

On a cluster, start the same script once per host with no flags: `jax.distributed.
initialize()` then reads the coordinator, the process count and this process's id from
SLURM, Kubernetes (GKE) or Cloud TPU settings by itself. mxjax adds nothing of its own:
the MX ops shard as any JAX op does. `--num-processes 1` runs without the runtime.

Modes (the batch is always split over 'data'; biases replicated):
  dp    kernels replicated: one gradient all-reduce.
  fsdp  kernels split over 'data' on their contracting dim; gathered for the product.
`--out FILE.npz` saves the losses, the first step's gradients and the final params (whole,
on every process) for comparison with another run.
"""

from __future__ import annotations

import argparse
import os

DIM, HIDDEN, BATCH = 128, 256, 256
MODES = ("dp", "fsdp")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--coordinator", default=None, help="host:port of process 0")
  parser.add_argument("--num-processes", type=int, default=None)
  parser.add_argument("--process-id", type=int, default=None)
  parser.add_argument("--local-devices", type=int, default=2,
                      help="CPU devices per process (CPU only)")
  parser.add_argument("--axis-types", choices=("explicit", "auto"), default="explicit")
  parser.add_argument("--modes", default="dp,fsdp", help=f"comma-separated of {MODES}")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--out", default=None, help="save results to this .npz")
  args = parser.parse_args(argv)
  args.modes = tuple(args.modes.split(","))
  if not set(args.modes) <= set(MODES):
    parser.error(f"--modes must name some of {MODES}, got {args.modes}")
  return args


def main(argv=None):
  args = parse_args(argv)
  # CPU devices per process; must be set before jax is first imported.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform"
                             f"_device_count={args.local_devices}").strip()
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if args.num_processes != 1:
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.num_processes, process_id=args.process_id)
  import flax.linen as nn
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax.experimental import multihost_utils
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import mxjax

  recipe = mxjax.MXFP8BlockScaling()
  kind = AxisType.Explicit if args.axis_types == "explicit" else AxisType.Auto
  mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(kind,))

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.gelu(mxjax.Dense(HIDDEN, name="fc1")(x))
      return mxjax.Dense(DIM, name="fc2")(h)

  model, tx = MLP(), optax.sgd(0.1)
  teacher = np.random.default_rng(42).normal(size=(DIM, DIM)) / np.sqrt(DIM)

  def batch(step):
    """The global batch of `step`, the same on every process."""
    x = np.random.default_rng(step).normal(size=(BATCH, DIM)).astype(np.float32)
    return x, np.tanh(x @ teacher).astype(np.float32)

  def global_array(value, spec):
    """A global array from a host value every process holds whole."""
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

  def loss_fn(params, x, y):
    return jnp.mean(jnp.square(model.apply({"params": params}, x) - y))

  @jax.jit
  def step(params, opt_state, x, y):
    with mxjax.autocast(recipe=recipe):
      loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, grads

  init_params = jax.device_get(
      model.init(jax.random.key(0), np.zeros((BATCH, DIM), np.float32))["params"])
  results = {}
  with jax.set_mesh(mesh):
    for mode in args.modes:
      kernel = P("data", None) if mode == "fsdp" else P()
      specs = {name: {"kernel": kernel, "bias": P()} for name in ("fc1", "fc2")}
      params = jax.tree.map(global_array, init_params, specs)
      opt_state = tx.init(params)
      losses = []
      for i in range(args.steps):
        x, y = (global_array(a, P("data", None)) for a in batch(i))
        params, opt_state, loss, grads = step(params, opt_state, x, y)
        losses.append(float(loss.addressable_data(0)))  # replicated: each process has it
        if i == 0:
          first_grads = multihost_utils.process_allgather(grads, tiled=True)
        if jax.process_index() == 0:
          print(f"{mode} step {i}  loss {losses[-1]:.6f}", flush=True)
      results[f"{mode}/loss"] = np.array(losses)
      final = multihost_utils.process_allgather(params, tiled=True)
      for prefix, tree in (("grad", first_grads), ("param", final)):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
          results[f"{mode}/{prefix}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
      if jax.process_index() == 0:
        kernel_sharding = params["fc1"]["kernel"].sharding
        print(f"{mode}: {jax.process_count()} processes, {jax.device_count()} devices, "
              f"fc1 kernel {kernel_sharding.spec}", flush=True)
  if args.out:
    np.savez(args.out, **results)


if __name__ == "__main__":
  main()
