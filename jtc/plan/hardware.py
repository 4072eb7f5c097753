"""Chips, slices and their published roofline constants, and the topology's devices without the
hardware (the check of a program's memory against a device's is `jtc.rl.preflight`'s).

Every constant is per chip and cites the vendor page it comes from. Times computed from them are
estimates (a roofline: the slowest of compute, HBM and interconnect at their peak rates).
"""

import dataclasses
import os

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip peak dense bf16 FLOP/s, HBM capacity (bytes) and bandwidth (bytes/s), and the
  chip's interconnect bandwidth (bytes/s, ICI for a TPU, NVLink for a GPU)."""
  name: str
  platform: str  # 'tpu' or 'gpu'
  peak_flops: float
  hbm_bytes: float
  hbm_bandwidth: float
  link_bandwidth: float
  source: str


CHIPS = {
    # https://cloud.google.com/tpu/docs/v5e : 197 TFLOP/s bf16, 16 GiB HBM2 at 819 GB/s,
    # ICI 1,600 Gbps per chip.
    'v5e':
        Chip('v5e', 'tpu', 197e12, 16 * GIB, 819e9, 1600e9 / 8, 'cloud.google.com/tpu/docs/v5e'),
    # https://cloud.google.com/tpu/docs/v5p : 459 TFLOP/s bf16, 95 GiB HBM2e at 2,765 GB/s,
    # ICI 4,800 Gbps per chip.
    'v5p':
        Chip('v5p', 'tpu', 459e12, 95 * GIB, 2765e9, 4800e9 / 8, 'cloud.google.com/tpu/docs/v5p'),
    # https://cloud.google.com/tpu/docs/v6e : 918 TFLOP/s bf16, 32 GiB HBM at 1,640 GB/s,
    # ICI 3,584 Gbps per chip.
    'v6e':
        Chip('v6e', 'tpu', 918e12, 32 * GIB, 1640e9, 3584e9 / 8, 'cloud.google.com/tpu/docs/v6e'),
    # https://www.nvidia.com/en-us/data-center/h100/ (SXM): 989 TFLOP/s dense bf16 (1,979 with
    # sparsity), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s.
    'h100':
        Chip('h100', 'gpu', 989e12, 80e9, 3.35e12, 900e9, 'nvidia.com/en-us/data-center/h100'),
    # https://www.nvidia.com/en-us/data-center/h200/ (SXM): 989 TFLOP/s dense bf16, 141 GB HBM3e
    # at 4.8 TB/s, NVLink 900 GB/s.
    'h200':
        Chip('h200', 'gpu', 989e12, 141e9, 4.8e12, 900e9, 'nvidia.com/en-us/data-center/h200'),
    # https://www.nvidia.com/en-us/data-center/a100/ (80 GB SXM): 312 TFLOP/s bf16, 80 GB HBM2e
    # at 2,039 GB/s, NVLink 600 GB/s.
    'a100':
        Chip('a100', 'gpu', 312e12, 80e9, 2.039e12, 600e9, 'nvidia.com/en-us/data-center/a100'),
}

# Slice names (chips as Google counts them: v5e / v6e by chips, v5p by TensorCores, 2 per chip)
# -> the topology of their chips.
SLICES = {
    'v5e-4': 'v5e:2x2',
    'v5e-8': 'v5e:2x4',
    'v5e-16': 'v5e:4x4',
    'v5e-32': 'v5e:4x8',
    'v5e-64': 'v5e:8x8',
    'v5e-128': 'v5e:8x16',
    'v5e-256': 'v5e:16x16',
    'v5p-8': 'v5p:2x2x1',
    'v5p-16': 'v5p:2x2x2',
    'v5p-32': 'v5p:2x2x4',
    'v5p-64': 'v5p:2x4x4',
    'v5p-128': 'v5p:4x4x4',
    'v5p-256': 'v5p:4x4x8',
    'v5p-512': 'v5p:4x8x8',
    'v6e-4': 'v6e:2x2',
    'v6e-8': 'v6e:2x4',
    'v6e-16': 'v6e:4x4',
    'v6e-32': 'v6e:4x8',
    'v6e-64': 'v6e:8x8',
    'v6e-256': 'v6e:16x16',
}
TOPOLOGIES = tuple(sorted(set(SLICES.values())))


def topology_name(name: str) -> str:
  """'v5e-64' or 'v5e:8x8' -> 'v5e:8x8'; a ValueError listing the known ones otherwise."""
  name = SLICES.get(name, name)
  if name not in TOPOLOGIES:
    raise ValueError(f'unknown topology {name!r}; known: {", ".join(TOPOLOGIES)} or the slice '
                     f'names {", ".join(SLICES)}')
  return name


def chip_of(topology: str) -> Chip:
  return CHIPS[topology.split(':')[0]]


def quiet_libtpu_env():
  """Environment for libtpu on a machine without TPUs: without an accelerator type and worker
  list libtpu prints start-up errors before it serves a deviceless topology, and without
  ALLOW_MULTIPLE_LIBTPU_LOAD a second planner (or test worker) on the machine stops at libtpu's
  lockfile, which guards chips this machine does not have. Set only where no TPU chip is
  attached (a TPU VM's own settings are left alone)."""
  if os.path.exists('/dev/accel0') or os.path.exists('/dev/vfio/0'):
    return
  os.environ.setdefault('TPU_ACCELERATOR_TYPE', 'v5litepod-4')
  os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')


def topology_devices(topology: str, num_slices: int = 1):
  """The devices of ``num_slices`` slices of ``topology``, without the hardware (libtpu's
  deviceless topology); an error naming the `plan` extra when libtpu is missing."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  quiet_libtpu_env()
  try:
    import libtpu  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise ValueError('planning for a TPU needs libtpu: pip install -e ".[plan]"') from None
  kwargs = {'num_slices': num_slices} if num_slices > 1 else {}
  desc = topologies.get_topology_desc(topology_name=topology, platform='tpu', **kwargs)
  del jax
  return list(desc.devices)
