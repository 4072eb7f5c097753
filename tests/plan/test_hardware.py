"""Topologies and chips of `jtc.plan.hardware` (no libtpu needed)."""
import pytest

from jtc.plan import hardware


def test_slice_names_and_topologies_name_the_same_slices():
  for slice_name, topology in hardware.SLICES.items():
    assert hardware.topology_name(slice_name) == hardware.topology_name(topology) == topology
    assert hardware.chip_of(topology) is hardware.CHIPS[topology.split(':')[0]]


def test_bad_topology_and_mesh_are_named():
  from jtc.rl import sharding  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="unknown topology 'v9z:2x2'.*v5e:2x2"):
    hardware.topology_name('v9z:2x2')
  with pytest.raises(ValueError, match='does not multiply to the 4 devices'):
    sharding.mesh_sizes(data=2, fsdp=1, tensor=1, n_devices=4)
