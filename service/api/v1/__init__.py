"""Version 1 of the HTTP API: one router per resource."""

from fastapi import APIRouter

from service.api.problems import problem_responses

router = APIRouter(prefix="/v1", responses=problem_responses(401, 403, 422, 503))

__all__ = ["router"]
