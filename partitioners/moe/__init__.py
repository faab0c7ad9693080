"""Online Mixture-of-Experts expert re-placement: replicate hot experts, pack, move little.

- :mod:`~partitioners.moe.rebalance`: :func:`rebalance` (the entry point),
  :func:`balance_stats`, :func:`lower_bound`.
- :mod:`~partitioners.moe.replicas`: how many copies of each expert (water-filling).
- :mod:`~partitioners.moe.packing`: the first packing of copies onto GPUs.
- :mod:`~partitioners.moe.moves`: local moves that lower the hottest GPU.
- :mod:`~partitioners.moe.relabel`: a fresh plan's GPUs onto those already holding its experts.
- :mod:`~partitioners.moe.baselines`: greedy LPT, the baseline it is measured against.
"""

from partitioners.moe.rebalance import BalanceStats, RebalanceResult, balance_stats, lower_bound, rebalance

__all__ = ["BalanceStats", "RebalanceResult", "balance_stats", "lower_bound", "rebalance"]
