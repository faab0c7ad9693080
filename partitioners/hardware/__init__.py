"""The hardware a plan runs on.

- :mod:`~partitioners.hardware.catalogue`: every accelerator and node preset once, each figure
  with its source (:data:`ACCELERATORS`, :data:`NODES`); the inventory presets and the 3D
  planner's GPUs both read it.
- :mod:`~partitioners.hardware.inventory`: :class:`Inventory` (groups -> devices -> memory
  tiers, links), the node presets, :func:`inventory_from_json`, :func:`link_between`.
- :mod:`~partitioners.hardware.collectives`: alpha-beta costs of transfers and collectives
  (:class:`LinkSpec`, :func:`p2p_time_s`, :func:`allreduce_time_s`, ...).
- :mod:`~partitioners.hardware.device_types`: which devices an operator may run on.
"""

from partitioners.hardware.catalogue import ACCELERATORS, NODES, Accelerator, Node
from partitioners.hardware.collectives import LinkSpec
from partitioners.hardware.inventory import Inventory, inventory_from_json, inventory_hash, preset_inventory

__all__ = [
    "ACCELERATORS",
    "NODES",
    "Accelerator",
    "Inventory",
    "LinkSpec",
    "Node",
    "inventory_from_json",
    "inventory_hash",
    "preset_inventory",
]
