"""What could make a plan that does not fit in memory fit: the hint of :class:`DoesNotFit`.

A hint is only useful when every change it names can help. So it names an option only
where that option is above its minimum (``micro_batches`` above 1,
``memory_headroom_fraction`` above 0, ``max_devices`` set and below the inventory's
size, ``mode`` training), and asks for more devices only when one operator alone does
not already exceed every device's budget (then only devices with more memory, or
smaller tensors, help).
"""

from __future__ import annotations

from partitioners.hardware.inventory import Inventory
from partitioners.placement.options import PlacementOptions

__all__ = ["fit_remedies"]


def fit_remedies(options: PlacementOptions, inventory: Inventory, *, one_operator_too_big: bool) -> str:
    """The changes that could make the plan fit, as the end of a sentence (``"try ...; or ..."``).

    Parameters
    ----------
    options : PlacementOptions
        The options the plan was made with.
    inventory : Inventory
    one_operator_too_big : bool
        Some operator's own inputs and outputs exceed the largest usable device budget:
        more devices of the same kind cannot help.

    Returns
    -------
    str
    """
    remedies: list[str] = []
    n_devices = inventory.n_devices
    if one_operator_too_big:
        remedies.append("devices with more memory (one operator's own tensors exceed every device's budget)")
    elif options.max_devices is not None and options.max_devices < n_devices:
        remedies.append(f"a higher max_devices (now {options.max_devices} of the inventory's {n_devices})")
    else:
        remedies.append("more devices (a larger inventory)")
    if options.memory_headroom_fraction > 0:
        remedies.append(f"a lower memory_headroom_fraction (now {options.memory_headroom_fraction:g})")
    if options.micro_batches > 1:
        remedies.append(f"fewer micro_batches (now {options.micro_batches})")
    if options.mode == "training":
        remedies.append("mode=inference if no backward pass, gradients or optimizer state are needed")
    remedies.append("a smaller batch (for an ONNX graph, smaller options.dims)")
    return "try " + "; ".join(remedies[:-1]) + ("; or " if len(remedies) > 1 else "") + remedies[-1]
