"""Version 1 of the HTTP API: one router per resource."""

from fastapi import APIRouter

from service.api.problems import problem_responses

router = APIRouter(prefix="/v1", responses=problem_responses(400, 401, 403, 422, 503))

from service.api.v1 import (  # noqa: E402  (routers attach to the v1 router)
    feedback,
    moe,
    parallel,
    plans,
)

router.include_router(plans.router)
router.include_router(moe.router)
router.include_router(parallel.router)
router.include_router(feedback.router)

__all__ = ["router"]
