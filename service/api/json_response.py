"""JSON responses encoded by pydantic-core instead of the standard library.

The routes that hand back documents they built themselves (plan documents, Chrome
traces, feedback, MoE placements) return them as responses directly, skipping
FastAPI's validation of what they just made. Starlette's ``JSONResponse`` encodes with
``json.dumps``, whose C encoder holds the GIL for the whole document: the 192 MB answer
to a MoE rebalance at ``HYPERPLACE_MOE_MAX_SLOTS`` (512 layers x 8,000 experts) took
2.3 s to encode, during which no other request, health checks included, advanced.
``pydantic_core.to_json`` (already FastAPI's own encoder for declared response models)
writes the same JSON in 0.7 s.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from fastapi.responses import JSONResponse

__all__ = ["DocumentResponse"]


class DocumentResponse(JSONResponse):
    """A ``JSONResponse`` whose body pydantic-core writes: compact, UTF-8, the same JSON values.

    Non-finite floats, which ``json.dumps(allow_nan=False)`` refuses with a 500, become
    ``null`` as JSON has no infinity; the service's own documents already write ``null``
    for unbounded figures.
    """

    def render(self, content: Any) -> bytes:
        return pydantic_core.to_json(content, inf_nan_mode="null")
