"""Published training runs the 3D-parallel planner is checked against, and its predictions of them.

Data, not timing: the tests hold the planner to these rows and ``bench/`` prints the tables.

- :mod:`~partitioners.parallel3d.published.runs`: SC21, Korthikanti et al., Megatron-Bridge,
  NeMo, DeepSeek-V3 rows with their sources.
- :mod:`~partitioners.parallel3d.published.sc21`: predictions of SC21's figures.
- :mod:`~partitioners.parallel3d.published.llm_foundry`: MosaicML's MPT throughput tables.
- :mod:`~partitioners.parallel3d.published.hopper`: the fit of ``HOPPER_IN_TRAINING``.
"""
