"""What one simulated step costs in energy: :func:`step_energy`.

Large clusters are bought and run by the joule, edge devices by the battery. The model
is the simplest one public measurements support [1]_ [2]_:

    energy_j = sum over counted devices d of
                   busy_s[d] x active_power_w[d] + (makespan_s - busy_s[d]) x idle_power_w[d]
               + sum over links of bytes moved x energy_j_per_byte of the link

* *Busy* time is the time the simulator has the device running an operator; a device
  running a kernel draws close to its board power (TDP/TBP) on the dense GEMM and
  attention kernels that dominate a step (ML.ENERGY's H100 measurements [2]_ put LLM
  training and prefill within 10-20% of TDP). Memory-bound kernels draw less: the
  figure is an upper estimate for them, and no vendor publishes the compute / memory
  split, so the model keeps one active figure per device.
* *Idle* time is the rest of the step on a device the job holds: its CUDA context keeps
  it out of its deepest power state [1]_.
* *Counted devices* are the devices the plan uses, plus (``count_idle_devices``) every
  other device the request made available: a job that holds 8 GPUs and runs on 2 pays
  for 6 idle ones unless the caller frees them (``max_devices``, or excluding them).
* Transfers pay their link's energy per bit (NVLink, PCIe, a NIC hop through a switch;
  :mod:`partitioners.hardware.catalogue`, ``[LINKPJ]``).

Host CPUs, switches' static power, cooling (PUE) and DRAM refresh are left out: they
scale with wall time and machine count, which ``makespan_s`` and ``devices_counted``
already give a caller who wants to add them.

References
----------
.. [1] S. S. Vadari, "The Model Parking Tax: Quantifying the Hidden Energy Cost of
   Always-On GPU Model Deployment", arXiv:2605.23918, 2026 (idle power with a CUDA
   context on H100, A100, L40S).
.. [2] J.-W. Chung, R. Wu, J. J. Ma, M. Chowdhury, "Where Do the Joules Go? Diagnosing
   Inference Energy Consumption", arXiv:2601.22076, 2026 (energy of 1,858
   configurations on H100 and B200).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from partitioners.hardware.inventory import Inventory

__all__ = ["StepEnergy", "devices_without_power", "step_energy"]


@dataclass(frozen=True)
class StepEnergy:
    """Energy of one step, split by where it goes.

    Attributes
    ----------
    compute_j : float
        Busy time x active power, over the counted devices.
    idle_j : float
        Idle time x idle power, over the counted devices.
    transfer_j : float
        Bytes moved between devices x their link's energy per byte.
    devices_counted : int
    """

    compute_j: float
    idle_j: float
    transfer_j: float
    devices_counted: int

    @property
    def total_j(self) -> float:
        return self.compute_j + self.idle_j + self.transfer_j


def devices_without_power(inventory: Inventory, devices: npt.ArrayLike) -> list[str]:
    """Names of ``devices`` whose inventory entry gives no power figures."""
    ids = np.asarray(devices, dtype=np.int64)
    if inventory.device_active_power_w is None:
        return [str(inventory.device_names[d]) for d in ids.tolist()]
    missing = ids[~np.isfinite(inventory.device_active_power_w[ids])]
    return [str(inventory.device_names[d]) for d in missing.tolist()]


def _link_energy_j_per_byte(inventory: Inventory, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]) -> np.ndarray:
    """Energy per byte of each (src, dst) pair by its link class; 0 where the inventory gives none."""
    same_group = inventory.device_group[src] == inventory.device_group[dst]
    group_energy = inventory.group_link_energy_j_per_byte
    intra = (
        np.zeros(src.shape[0]) if group_energy is None else group_energy[inventory.device_group[src]].astype(np.float64)
    )
    per_byte = np.where(same_group, intra, inventory.inter_link_energy_j_per_byte)
    return np.nan_to_num(per_byte, nan=0.0)


def step_energy(
    inventory: Inventory,
    *,
    makespan_s: float,
    device_busy_s: npt.NDArray[np.float64],
    counted_devices: npt.ArrayLike,
    link_src: npt.ArrayLike = (),
    link_dst: npt.ArrayLike = (),
    link_bytes: npt.ArrayLike = (),
) -> StepEnergy:
    """Energy of one step of ``makespan_s`` (module docstring: the model and what it leaves out).

    Parameters
    ----------
    device_busy_s : numpy.ndarray, shape (n_devices,)
        Compute time per device (:attr:`SimulationResult.device_busy_s`).
    counted_devices : array of int
        Devices whose power the step pays: those used, and those held idle.
    link_src, link_dst, link_bytes : arrays
        Bytes per directed device pair (:attr:`SimulationResult.link_bytes`).

    Raises
    ------
    ValueError
        A counted device has no power figures (check :func:`devices_without_power` first).
    """
    counted = np.unique(np.asarray(counted_devices, dtype=np.int64))
    missing = devices_without_power(inventory, counted)
    if missing:
        raise ValueError(f"no power figures for devices {missing[:5]}")
    assert inventory.device_active_power_w is not None and inventory.device_idle_power_w is not None
    busy = np.minimum(np.asarray(device_busy_s, dtype=np.float64)[counted], makespan_s)
    compute_j = float(busy @ inventory.device_active_power_w[counted])
    idle_j = float((makespan_s - busy) @ inventory.device_idle_power_w[counted])
    src = np.asarray(link_src, dtype=np.int64)
    dst = np.asarray(link_dst, dtype=np.int64)
    moved = np.asarray(link_bytes, dtype=np.float64)
    transfer_j = float(moved @ _link_energy_j_per_byte(inventory, src, dst)) if moved.size else 0.0
    return StepEnergy(compute_j, idle_j, transfer_j, int(counted.shape[0]))
