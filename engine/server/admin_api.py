"""Administration: POST /v1/admin/expert-budget resizes the expert cache while the server runs
(engine.elastic), between two engine steps, without dropping requests. Body
`{"expert_budget": "8GiB"}` (a size with a unit, bytes as a number, or "auto"); the answer is the
budget and cache now, as in /v1/stats. Needs the API key when the server has one."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from engine.config import parse_size
from engine.errors import UserError
from engine.server import messages as m
from engine.server.state import Server, get_server

router = APIRouter()


class BudgetRequest(m.Body):
    expert_budget: str | int


@router.post("/v1/admin/expert-budget")
async def expert_budget(body: BudgetRequest, s: Server = Depends(get_server)) -> dict:
    elastic = s.batcher.llm.elastic
    try:
        await run_in_threadpool(elastic.set_budget, parse_size(body.expert_budget))
    except UserError as e:
        raise m.APIError(400, str(e), param="expert_budget") from None
    return elastic.stats()
