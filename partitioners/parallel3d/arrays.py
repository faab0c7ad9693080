"""Array types of the vectorised cost model, which evaluates many candidate layouts at once.

Every per-layout quantity (degrees, seconds, bytes, masks) is a 1-D array with one entry
per layout; naming the dtype lets mypy check the arithmetic without a cast at run time.
"""

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = ["BoolArray", "FloatArray", "IntArray"]

FloatArray: TypeAlias = npt.NDArray[np.float64]
"""Float64 values, one per layout (or a grid of them)."""
IntArray: TypeAlias = npt.NDArray[np.int64]
"""Integer degrees or indices, one per layout."""
BoolArray: TypeAlias = npt.NDArray[np.bool_]
"""A mask over layouts."""
