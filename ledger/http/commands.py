"""POST endpoints: every command of API.md. The caller's token names the actor.

Each endpoint is one call of the service, which checks in SPEC order (input,
existence, role, revision, state, preconditions) and raises the typed error
that `errors.py` maps to a status. Run commands answer the run's new status.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..commands.registry import COMMANDS
from ..errors import NotAuthorized
from ..states import describe_roles, item_rule
from ..validation import MAX_MANIFEST_BYTES
from ..views import Actor, CancelOutcome, ItemStatus, Lease, ReconcileReport, RunStatus
from . import bodies as B
from .auth import CommandActor
from .deps import CommandLedgerDep, aware, view_response
from .errors import error_responses
from .reads import RunId
from .strict import StrictJSONRoute, strict_body

router = APIRouter(
    tags=["commands"],
    responses=error_responses(400, 401, 403, 422),
    route_class=StrictJSONRoute,
)

RUN_ERRORS = error_responses(404, 409)


def _expected(body: B.Expected | None) -> dict[str, Any]:
    if body is None or body.expected_revision is None:
        return {}
    return {"expected_revision": body.expected_revision}


def _lease(body: B.LeaseBody) -> Lease:
    expires_at = aware(body.expires_at)
    assert expires_at is not None
    return Lease(
        run_id=body.run_id,
        item_id=body.item_id,
        token=body.token,
        worker_id=body.worker_id,
        attempt=body.attempt,
        expires_at=expires_at,
        payload=None,
    )


def _lease_holder(lg: Any, actor: Actor, body: B.LeaseBody, command: str) -> Lease:
    """The service takes no actor for lease commands (the lease token is the authority)
    and records the lease's `worker_id` as the actor; over HTTP the token's role must be
    one the table allows, and the lease must be this actor's, so the record stays true."""
    lg.item(body.run_id, body.item_id)  # SPEC order: input and existence before role
    roles = item_rule(command).roles
    if actor.role not in roles:
        raise NotAuthorized(
            f"role {actor.role!r} may not {command}; allowed roles: {describe_roles(roles)}"
        )
    if body.worker_id != actor.id:
        raise NotAuthorized(
            f"actor {actor.id!r} may not {command} a lease held by worker {body.worker_id!r}; "
            "only the lease holder may"
        )
    return _lease(body)


def _parse_json_body(raw: bytes) -> Any:
    return strict_body(raw)


# --- runs ----------------------------------------------------------------------


@router.post(
    "/runs",
    status_code=201,
    response_model=RunStatus,
    summary=COMMANDS["submit"].summary,
    responses=error_responses(413),
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "The manifest (see API.md); validated by the ledger (ManifestInvalid names the field).",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Manifest"}}},
        }
    },
)
async def submit(request: Request, actor: CommandActor, lg: CommandLedgerDep) -> JSONResponse:
    """`lg.submit(manifest, actor)`. The body is the manifest itself."""
    raw = await request.body()
    if len(raw) > MAX_MANIFEST_BYTES:
        raise HTTPException(
            413, f"manifest is {len(raw)} bytes; at most {MAX_MANIFEST_BYTES} bytes allowed"
        )
    manifest = _parse_json_body(raw)
    status: RunStatus = await run_in_threadpool(lg.submit, manifest, actor)
    return view_response(status, 201, headers={"Location": f"/runs/{status.run_id}"})


@router.post(
    "/runs/{run_id}/start",
    response_model=RunStatus,
    summary=COMMANDS["start"].summary,
    responses=RUN_ERRORS,
)
def start(
    run_id: RunId, actor: CommandActor, lg: CommandLedgerDep, body: B.Expected | None = None
) -> JSONResponse:
    """`lg.start(run_id, actor)`."""
    result = lg.start(run_id, actor, **_expected(body))
    return view_response(result)


@router.post(
    "/runs/{run_id}/amend",
    response_model=RunStatus,
    summary=COMMANDS["amend"].summary,
    responses=RUN_ERRORS,
)
def amend(
    run_id: RunId, body: B.AmendBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.amend(run_id, actor, reason, items, withdraw, policy)`."""
    result = lg.amend(
        run_id,
        actor,
        body.reason,
        items=body.items,
        withdraw=body.withdraw,
        policy=body.policy,
        **_expected(body),
    )
    return view_response(result)


@router.post(
    "/runs/{run_id}/claim",
    response_model=list[Lease],
    summary=COMMANDS["claim"].summary,
    responses=RUN_ERRORS,
)
def claim(
    run_id: RunId, actor: CommandActor, lg: CommandLedgerDep, body: B.ClaimBody | None = None
) -> JSONResponse:
    """`lg.claim(run_id, worker, limit)`: `[]` when a running run has nothing claimable.
    The token's actor is the worker (its id becomes the leases' `worker_id`)."""
    body = body or B.ClaimBody()
    result = list(lg.claim(run_id, actor, limit=body.limit, **_expected(body)))
    return view_response(result)


@router.post(
    "/runs/{run_id}/request_review",
    response_model=RunStatus,
    summary=COMMANDS["request_review"].summary,
    responses=RUN_ERRORS,
)
def request_review(
    run_id: RunId, body: B.RequestReviewBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.request_review(run_id, actor, decision, reviewer=...)`."""
    result = lg.request_review(
        run_id, actor, body.decision, reviewer=body.reviewer, **_expected(body)
    )
    return view_response(result)


@router.post(
    "/runs/{run_id}/decide",
    response_model=RunStatus,
    summary=COMMANDS["decide"].summary,
    responses=RUN_ERRORS,
)
def decide(
    run_id: RunId, body: B.DecideBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.decide(run_id, actor, input_version, approve, reason)`."""
    result = lg.decide(
        run_id, actor, body.input_version, body.approve, body.reason, **_expected(body)
    )
    return view_response(result)


@router.post(
    "/runs/{run_id}/pause",
    response_model=RunStatus,
    summary=COMMANDS["pause"].summary,
    responses=RUN_ERRORS,
)
def pause(
    run_id: RunId, body: B.OptionalReasonBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.pause(run_id, actor, reason)`."""
    result = lg.pause(run_id, actor, body.reason, **_expected(body))
    return view_response(result)


@router.post(
    "/runs/{run_id}/resume",
    response_model=RunStatus,
    summary=COMMANDS["resume"].summary,
    responses=RUN_ERRORS,
)
def resume(
    run_id: RunId,
    actor: CommandActor,
    lg: CommandLedgerDep,
    body: B.OptionalReasonBody | None = None,
) -> JSONResponse:
    """`lg.resume(run_id, actor)`."""
    body = body or B.OptionalReasonBody()
    result = lg.resume(run_id, actor, reason=body.reason, **_expected(body))
    return view_response(result)


@router.post(
    "/runs/{run_id}/cancel",
    response_model=CancelOutcome,
    summary=COMMANDS["cancel"].summary,
    responses=RUN_ERRORS,
)
def cancel(
    run_id: RunId, body: B.OptionalReasonBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.cancel(run_id, actor, reason)`: durable intent; repeating it writes nothing."""
    result = lg.cancel(run_id, actor, body.reason, **_expected(body))
    return view_response(result)


@router.post(
    "/runs/{run_id}/complete",
    response_model=RunStatus,
    summary=COMMANDS["complete"].summary,
    responses=RUN_ERRORS,
)
def complete(
    run_id: RunId, actor: CommandActor, lg: CommandLedgerDep, body: B.Expected | None = None
) -> JSONResponse:
    """`lg.complete(run_id, actor)`: 409 NotComplete names what blocks success."""
    result = lg.complete(run_id, actor, **_expected(body))
    return view_response(result)


@router.post(
    "/runs/{run_id}/fail",
    response_model=RunStatus,
    summary=COMMANDS["fail"].summary,
    responses=RUN_ERRORS,
)
def fail(
    run_id: RunId, body: B.FailBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.fail(run_id, actor, reason, transient, failure_reason)`."""
    result = lg.fail(
        run_id,
        actor,
        body.reason,
        body.transient,
        failure_reason=body.failure_reason,
        **_expected(body),
    )
    return view_response(result)


@router.post(
    "/runs/{run_id}/retry",
    status_code=201,
    response_model=RunStatus,
    summary=COMMANDS["retry"].summary,
    responses=RUN_ERRORS,
)
def retry(
    run_id: RunId, actor: CommandActor, lg: CommandLedgerDep, body: B.RetryBody | None = None
) -> JSONResponse:
    """`lg.retry(run_id, actor)`: replays the original's latest input exactly."""
    body = body or B.RetryBody()
    result = lg.retry(run_id, actor, reason=body.reason)
    return view_response(result, 201)


@router.post(
    "/runs/{run_id}/repair",
    status_code=201,
    response_model=RunStatus,
    summary=COMMANDS["repair"].summary,
    responses=RUN_ERRORS,
)
def repair(
    run_id: RunId, actor: CommandActor, lg: CommandLedgerDep, body: B.RepairBody | None = None
) -> JSONResponse:
    """`lg.repair(run_id, actor, items, corrections, reason, config_version, policy)`."""
    body = body or B.RepairBody()
    result = lg.repair(
        run_id,
        actor,
        items=body.items,
        corrections=body.corrections,
        reason=body.reason,
        config_version=body.config_version,
        policy=body.policy,
    )
    return view_response(result, 201)


@router.post(
    "/runs/{run_id}/compensate",
    status_code=201,
    response_model=RunStatus,
    summary=COMMANDS["compensate"].summary,
    responses=RUN_ERRORS,
)
def compensate(
    run_id: RunId, body: B.CompensateBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.compensate(run_id, actor, reason, items)`."""
    result = lg.compensate(run_id, actor, body.reason, items=body.items)
    return view_response(result, 201)


# --- items ---------------------------------------------------------------------

ItemPath = "/runs/{run_id}/items/{item_id:path}"


@router.post(
    f"{ItemPath}/skip",
    response_model=ItemStatus,
    summary=COMMANDS["skip"].summary,
    responses=RUN_ERRORS,
)
def skip(
    run_id: RunId, item_id: str, body: B.ReasonBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.skip(run_id, item_id, actor, reason)`."""
    result = lg.skip(run_id, item_id, actor, body.reason, **_expected(body))
    return view_response(result)


@router.post(
    f"{ItemPath}/release",
    response_model=ItemStatus,
    summary=COMMANDS["release"].summary,
    responses=RUN_ERRORS,
)
def release(
    run_id: RunId, item_id: str, body: B.ReasonBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.release(run_id, item_id, actor, reason)`."""
    result = lg.release(run_id, item_id, actor, body.reason, **_expected(body))
    return view_response(result)


@router.post(
    f"{ItemPath}/reject_item",
    response_model=ItemStatus,
    summary=COMMANDS["reject_item"].summary,
    responses=RUN_ERRORS,
)
def reject_item(
    run_id: RunId, item_id: str, body: B.RejectItemBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.reject_item(run_id, item_id, actor, rule, detail)`."""
    result = lg.reject_item(
        run_id, item_id, actor, body.rule, detail=body.detail, **_expected(body)
    )
    return view_response(result)


# --- leases (the lease holder) ------------------------------------------------


@router.post(
    "/leases/heartbeat",
    response_model=Lease,
    summary=COMMANDS["heartbeat"].summary,
    responses=RUN_ERRORS,
)
def heartbeat(body: B.LeaseBody, actor: CommandActor, lg: CommandLedgerDep) -> JSONResponse:
    """`lg.heartbeat(lease)`: 409 LeaseLost when the lease is not live."""
    lease = _lease_holder(lg, actor, body, "heartbeat")
    result = lg.heartbeat(lease)
    return view_response(result)


@router.post(
    "/leases/accept",
    response_model=ItemStatus,
    summary=COMMANDS["accept"].summary,
    responses=RUN_ERRORS,
)
def accept(body: B.AcceptBody, actor: CommandActor, lg: CommandLedgerDep) -> JSONResponse:
    """`lg.accept(lease, evidence, stage)`."""
    lease = _lease_holder(lg, actor, body, "accept")
    result = lg.accept(lease, evidence=body.evidence, stage=body.stage)
    return view_response(result)


@router.post(
    "/leases/reject",
    response_model=ItemStatus,
    summary=COMMANDS["reject"].summary,
    responses=RUN_ERRORS,
)
def reject(body: B.RejectBody, actor: CommandActor, lg: CommandLedgerDep) -> JSONResponse:
    """`lg.reject(lease, rule, detail, stage)`."""
    lease = _lease_holder(lg, actor, body, "reject")
    result = lg.reject(lease, body.rule, detail=body.detail, stage=body.stage)
    return view_response(result)


@router.post(
    "/leases/fail_attempt",
    response_model=ItemStatus,
    summary=COMMANDS["fail_attempt"].summary,
    responses=RUN_ERRORS,
)
def fail_attempt(
    body: B.FailAttemptBody, actor: CommandActor, lg: CommandLedgerDep
) -> JSONResponse:
    """`lg.fail_attempt(lease, error, stage, retryable)`."""
    lease = _lease_holder(lg, actor, body, "fail_attempt")
    result = lg.fail_attempt(lease, body.error, stage=body.stage, retryable=body.retryable)
    return view_response(result)


# --- reconcile -------------------------------------------------------------------


@router.post(
    "/reconcile",
    response_model=ReconcileReport,
    summary=COMMANDS["reconcile"].summary,
)
def reconcile(actor: CommandActor, lg: CommandLedgerDep) -> JSONResponse:
    """`lg.reconcile()` at the store's clock (a caller cannot choose `now`)."""
    result = lg.reconcile(actor=actor)
    return view_response(result)
