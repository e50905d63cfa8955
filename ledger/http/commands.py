"""POST endpoints: every command of the Python API, generated from the command registry
(`ledger/commands/registry.py`): one route per `CommandSpec` whose `http` is an `Http`
entry, none for a `NotOverHttp` one. The caller's token names the actor.

Each endpoint is one call of the service, which checks in the rule book's order (input,
existence, role, revision, state, preconditions) and raises the typed error
that `errors.py` maps to a status. Run commands answer the run's new status.

`command_router(commands)` builds the routes: the path (`CommandSpec.http_path`), the
body model, the status (201 with `Location` when the command creates a run), the
response model (the facade method's return type), the summary (the rule book's row)
and the description all come from the entry; the body's fields are the facade
method's keyword arguments by name, checked when the route is built.
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ledger.commands import bodies as B
from ledger.commands.registry import COMMANDS, CommandSpec, Http
from ledger.core.errors import NotAuthorized
from ledger.core.states import describe_roles
from ledger.core.validation import MAX_MANIFEST_BYTES
from ledger.core.views import Actor, Lease
from ledger.http.auth import CommandActor
from ledger.http.deps import CommandLedgerDep, aware, view_response
from ledger.http.errors import error_responses
from ledger.http.reads import RunId
from ledger.http.strict import StrictJSONRoute, strict_body

if typing.TYPE_CHECKING:
    from ledger.service.ledger import Ledger

RUN_ERRORS = error_responses(404, 409)
# the arguments the caller's token fills (claim's actor is the worker)
ACTOR_ARGUMENTS = ("actor", "worker")
LEASE_FIELDS = frozenset(B.LeaseBody.model_fields)
_KW = inspect.Parameter.KEYWORD_ONLY


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


def _lease_holder(lg: Ledger, actor: Actor, body: B.LeaseBody, spec: CommandSpec) -> Lease:
    """The service takes no actor for lease commands (the lease token is the authority)
    and records the lease's `worker_id` as the actor; over HTTP the token's role must be
    one the table allows, and the lease must be this actor's, so the record stays true."""
    lg.item(body.run_id, body.item_id)  # the rule book's order: input and existence before role
    command, roles = spec.name, spec.roles
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


def _facade(spec: CommandSpec) -> Callable[..., Any]:
    from ledger.service.ledger import Ledger

    method: Callable[..., Any] = getattr(Ledger, spec.name)
    return method


def response_model(spec: CommandSpec) -> Any:
    """The view the command answers: the return type of its `Ledger` method."""
    method = _facade(spec)
    namespace = vars(sys.modules[method.__module__])
    return typing.get_type_hints(
        type("Returns", (), {"__annotations__": {"r": method.__annotations__["return"]}}),
        namespace,
    )["r"]


def _check(spec: CommandSpec, http: Http, path_args: list[str]) -> str | None:
    """The entry fits the facade method: every body field is one of its arguments and
    every argument without a default is filled. Returns the actor argument, if any."""
    params = inspect.signature(_facade(spec)).parameters
    arguments = [name for name in params if name not in ("self", "idempotency_key")]
    actor_arg = next((a for a in ACTOR_ARGUMENTS if a in arguments), None)
    filled = {*path_args, *([actor_arg] if actor_arg else [])}
    if http.raw_body is not None:
        filled.add(http.raw_body)
    fields = set(http.body.model_fields) if http.body is not None else set()
    if arguments[:1] == ["lease"]:
        if http.body is None or not issubclass(http.body, B.LeaseBody):
            raise ValueError(f"{spec.name}: a lease command's body is a LeaseBody")
        fields -= LEASE_FIELDS
        filled.add("lease")
    unknown = fields - set(arguments)
    if unknown:
        raise ValueError(f"{spec.name}: body fields {sorted(unknown)} are not its arguments")
    filled |= fields
    unfilled = [
        name
        for name in arguments
        if name not in filled and params[name].default is inspect.Parameter.empty
    ]
    if unfilled:
        raise ValueError(f"{spec.name}: nothing over HTTP fills {unfilled}")
    return actor_arg


def _answer(spec: CommandSpec, result: Any) -> JSONResponse:
    if spec.creates_run:
        return view_response(result, 201, headers={"Location": f"/runs/{result.run_id}"})
    return view_response(result)


def _endpoint(spec: CommandSpec, http: Http, path: str) -> Callable[..., Any]:
    """The route's endpoint: its signature (path parameters, the actor, the ledger, the
    body) is what FastAPI reads for validation and the OpenAPI document."""
    path_args = [a for a in ("run_id", "item_id") if f"{{{a}" in path]
    actor_arg = _check(spec, http, path_args)
    lease_command = spec.arguments[:1] == ("lease",)
    body_type = http.body
    params = [
        inspect.Parameter(a, _KW, annotation=RunId if a == "run_id" else str) for a in path_args
    ]
    params += [
        inspect.Parameter("actor", _KW, annotation=CommandActor),
        inspect.Parameter("lg", _KW, annotation=CommandLedgerDep),
    ]

    def arguments(values: dict[str, Any]) -> dict[str, Any]:
        lg: Ledger = values["lg"]
        kwargs = {a: values[a] for a in path_args}
        if actor_arg is not None:
            kwargs[actor_arg] = values["actor"]
        body: BaseModel | None = values.get("body")
        if body is None and body_type is not None:
            body = body_type()  # an optional body left out: every field's default
        if body is not None:
            for name in type(body).model_fields:
                if not (lease_command and name in LEASE_FIELDS):
                    kwargs[name] = getattr(body, name)
        if lease_command:
            assert isinstance(body, B.LeaseBody)
            kwargs["lease"] = _lease_holder(lg, values["actor"], body, spec)
        return kwargs

    if http.raw_body is not None:
        raw_arg = http.raw_body

        async def raw_endpoint(request: Request, **values: Any) -> JSONResponse:
            raw = await request.body()
            if len(raw) > MAX_MANIFEST_BYTES:
                raise HTTPException(
                    413,
                    f"manifest is {len(raw)} bytes; at most {MAX_MANIFEST_BYTES} bytes allowed",
                )
            kwargs = arguments(values)
            kwargs[raw_arg] = strict_body(raw)
            result = await run_in_threadpool(_facade_of(values["lg"], spec), **kwargs)
            return _answer(spec, result)

        endpoint: Callable[..., Any] = raw_endpoint
        params.insert(0, inspect.Parameter("request", _KW, annotation=Request))
    else:

        def sync_endpoint(**values: Any) -> JSONResponse:
            result = _facade_of(values["lg"], spec)(**arguments(values))
            return _answer(spec, result)

        endpoint = sync_endpoint
        if body_type is not None:
            required = http.requires_body
            params.append(
                inspect.Parameter(
                    "body",
                    _KW,
                    annotation=body_type if required else body_type | None,
                    default=inspect.Parameter.empty if required else None,
                )
            )
    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__name__ = endpoint.__qualname__ = spec.name
    endpoint.__doc__ = http.doc
    return endpoint


def _facade_of(lg: Ledger, spec: CommandSpec) -> Callable[..., Any]:
    """The bound `Ledger` method that makes the command (through its pipeline)."""
    method: Callable[..., Any] = getattr(lg, spec.name)
    return method


def command_router(commands: Mapping[str, CommandSpec] = COMMANDS) -> APIRouter:
    """One POST route per registry entry with an `Http` mapping, in registry order."""
    router = APIRouter(
        tags=["commands"],
        responses=error_responses(400, 401, 403, 422),
        route_class=StrictJSONRoute,
    )
    for spec in commands.values():
        http, path = spec.http, spec.http_path
        if not isinstance(http, Http) or path is None:
            continue
        errors = RUN_ERRORS if spec.arguments[:1] in (("run_id",), ("lease",)) else {}
        extra: dict[str, Any] | None = None
        if http.raw_body is not None:
            errors = error_responses(413)
            extra = {
                "requestBody": {
                    "required": True,
                    "description": "The manifest (the manifest reference in docs/reference/manifest.md); validated by the ledger "
                    "(ManifestInvalid names the field).",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Manifest"}}
                    },
                }
            }
        router.add_api_route(
            path,
            _endpoint(spec, http, path),
            methods=["POST"],
            name=spec.name,
            status_code=201 if spec.creates_run else None,
            response_model=response_model(spec),
            summary=spec.summary,
            responses=errors or None,
            openapi_extra=extra,
        )
    return router


router = command_router()
