"""``/graphql`` over HTTP: authentication, request shape, batching, and execution of
cached documents on a worker thread.

Contract:
- the key comes from ``?api_key=``, ``Authorization: Bearer KEY`` or a bare
  ``Authorization: KEY``; a missing or invalid key answers HTTP 401 with a GraphQL
  error body (RunPod's SDK relies on the status);
- a body is one operation ``{query, variables?, operationName?}`` or a JSON array of at
  most ``max_batch`` of them (answered by an array, in order);
- ``GET ?query=`` runs queries only; mutations need POST;
- execution errors answer 200 with ``errors[]`` (``extensions.code``); only a request
  that is not GraphQL at all answers 400 (or 413 when too large), among them a body or
  ``variables`` nesting arrays and objects deeper than 64 levels (refused before
  parsing).

A whole request runs on one worker thread, outside the server's event loop, each
operation with its own context. The use cases are synchronous, and so are most
resolvers; the batched loaders (api/graphql/loaders.py) are Strawberry DataLoaders,
so an operation is executed on an event loop of the worker thread's own
(:func:`_thread_loop`): it serves that operation alone, so a resolver's blocking read
stalls no other request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from inspect import isawaitable
from types import CoroutineType
from typing import Any, TypeGuard

from fastapi import APIRouter, Request
from fastapi.responses import Response
from graphql import DocumentNode, ExecutionResult, OperationType, execute, get_operation_ast
from starlette.concurrency import run_in_threadpool

from gpuyard.api.fast.fastpath import list_marks, shared
from gpuyard.api.fast.view_cache import Rendered
from gpuyard.api.graphql.context import GpuUuidCache, GqlContext
from gpuyard.api.graphql.errors import format_error, request_error
from gpuyard.api.graphql.limits import DocumentCache
from gpuyard.api.graphql.schema import SCHEMA
from gpuyard.api.graphql.settings import GraphQLSettings
from gpuyard.api.http.idempotency import IdempotencyKeyHeader
from gpuyard.api.http.json_body import OFF_LOOP_BYTES
from gpuyard.api.state import AppState, app_state, key_from_request, selection_from
from gpuyard.core.errors import GpuyardError
from gpuyard.core.input_rules import MAX_JSON_DEPTH, json_too_deep
from gpuyard.core.text import nul_path
from gpuyard.services.fleet.runtime_stats import RuntimeStatsCache
from gpuyard.services.tenancy.auth import Principal
from gpuyard.settings import Settings


@dataclass(frozen=True)
class Operation:
    query: str
    variables: dict[str, Any] | None
    operation_name: str | None


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _dumps(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _dumps(body), status_code=status, media_type="application/json", headers=headers
    )


def parse_json(text: bytes | str, what: str) -> Any:
    """``text`` parsed, or BadRequest (400) when it is not JSON or nests arrays and
    objects deeper than MAX_JSON_DEPTH: the depth is judged before parsing, so no
    parser (or resolver) ever recurses on a hostile document."""
    if json_too_deep(text):
        raise BadRequest(f"{what} nests arrays and objects deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: a backstop only
        raise BadRequest(f"{what} is not valid JSON") from exc


async def parse_json_off_loop(text: bytes | str, what: str) -> Any:
    """:func:`parse_json`, on a worker thread when ``text`` is large (api/http/json_body.py's
    rule: the depth scan and the parse would otherwise hold the event loop)."""
    if len(text) <= OFF_LOOP_BYTES:
        return parse_json(text, what)
    return await run_in_threadpool(parse_json, text, what)


_NUL_IN_QUERY = re.compile(r"\x00|\\u0000|\\u\{0+\}", re.IGNORECASE)


def _operation(raw: Any, max_length: int) -> Operation:
    if not isinstance(raw, dict):
        raise BadRequest("each operation must be a JSON object with a 'query' string")
    query = raw.get("query")
    variables = raw.get("variables")
    name = raw.get("operationName")
    if not isinstance(query, str) or not query.strip():
        raise BadRequest("'query' must be a non-empty string")
    if len(query) > max_length:
        raise BadRequest(f"'query' is longer than {max_length} characters", 413)
    if isinstance(variables, str) and variables:
        # From a GET query string, at most a URL long: parsed in place.
        variables = parse_json(variables, "'variables'")
    if variables is not None and not isinstance(variables, dict):
        raise BadRequest("'variables' must be an object")
    if name is not None and not isinstance(name, str):
        raise BadRequest("'operationName' must be a string")
    # NUL, raw or escaped in a string literal, never reaches the store (PostgreSQL
    # refuses it in text).
    where = "query" if _NUL_IN_QUERY.search(query) else None
    if where is None and variables:
        found = nul_path(variables)
        where = None if found is None else f"variables.{found}" if found else "variables"
    if where is not None:
        raise BadRequest(f"{where}: must not contain NUL (\\u0000) characters")
    return Operation(query, variables or None, name or None)


class _ThreadLoop(threading.local):
    """Each worker thread's event loop, made on its first operation and closed with
    the thread (a loop per operation would cost about ten times as much to set up)."""

    loop: asyncio.AbstractEventLoop | None = None

    def __del__(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.close()


_thread = _ThreadLoop()

# What resolvers and graphql-core itself return to be awaited: coroutines (async
# resolvers, the executor's own) and asyncio futures (its gathers and tasks).
_AWAITABLE = (CoroutineType, asyncio.Future)


def _is_awaitable(value: Any) -> TypeGuard[Any]:
    """graphql-core asks this of every resolved value; its default also probes each
    object for ``__await__``, a failed attribute lookup per field of a list."""
    return isinstance(value, _AWAITABLE)


def _thread_loop() -> asyncio.AbstractEventLoop:
    """The calling thread's own event loop (never the server's: this runs on workers)."""
    loop = _thread.loop
    if loop is None or loop.is_closed():
        loop = _thread.loop = asyncio.new_event_loop()
    return loop


class GraphQLExecutor:
    """Runs operations on the schema with the cached, validated documents. What it
    holds beyond them is shared by every request of the app: GPU UUIDs and the runtime
    stats cache."""

    def __init__(
        self, settings: GraphQLSettings, stats_cache: RuntimeStatsCache | None = None
    ) -> None:
        self.settings = settings
        self.schema = SCHEMA._schema
        self.documents = DocumentCache(self.schema, settings)
        self.gpu_uuids = GpuUuidCache()
        self.stats_cache = stats_cache or RuntimeStatsCache(
            ttl_s=settings.runtime_stats_ttl_s,
            error_ttl_s=settings.runtime_stats_error_ttl_s,
            thread_name_prefix="gql-stats",
        )

    def run(
        self,
        op: Operation,
        state: AppState,
        principal: Principal,
        *,
        allow_mutations: bool,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """The response object of one operation. Never raises for a bad document or a
        failing resolver: those become ``errors[]``. ``idempotency_key`` is the
        request's header, for the deploy mutations."""
        prepared = self.documents.prepare(op.query)
        if prepared.document is None:
            return {"errors": [format_error(e) for e in prepared.errors]}
        document = prepared.document
        if not allow_mutations:
            operation = get_operation_ast(document, op.operation_name)
            if operation is not None and operation.operation != OperationType.QUERY:
                return request_error("VALIDATION_ERROR", "mutations are only accepted over POST")
        context = GqlContext(
            state,
            principal,
            gpu_uuids=self.gpu_uuids,
            stats_cache=self.stats_cache,
            idempotency_key=idempotency_key,
        )
        result = _thread_loop().run_until_complete(self._execute(document, op, context))
        body: dict[str, Any] = {"data": result.data}
        if result.errors:
            body["errors"] = [format_error(e) for e in result.errors]
        return body

    async def _execute(
        self, document: DocumentNode, op: Operation, context: GqlContext
    ) -> ExecutionResult:
        # Called on the loop, so the loaders the resolvers make bind to it.
        result = execute(
            self.schema,
            document,
            context_value=context,
            variable_values=op.variables,
            operation_name=op.operation_name,
            hide_suggestions=not self.settings.introspection,
            is_awaitable=_is_awaitable,
        )
        if isawaitable(result):
            result = await result
        assert isinstance(result, ExecutionResult)
        return result

    def reads_only(self, ops: list[Operation]) -> bool:
        """Whether every operation is a valid query (no mutation): its answer may be
        kept and given again (api/fast/view_cache.py)."""
        for op in ops:
            document = self.documents.prepare(op.query).document
            operation = None if document is None else get_operation_ast(document, op.operation_name)
            if operation is None or operation.operation != OperationType.QUERY:
                return False
        return True

    def run_all(
        self,
        ops: list[Operation],
        state: AppState,
        principal: Principal,
        allow_mutations: bool,
        idempotency_key: str | None = None,
    ) -> list[dict[str, Any]]:
        return [
            self.run(
                op,
                state,
                principal,
                allow_mutations=allow_mutations,
                idempotency_key=idempotency_key,
            )
            for op in ops
        ]


async def _operations(request: Request, settings: GraphQLSettings) -> tuple[list[Operation], bool]:
    """The request's operations and whether it was a batch. Raises BadRequest."""
    limit = settings.max_query_length
    if request.method == "GET":
        params = request.query_params
        raw: Any = {
            "query": params.get("query"),
            "variables": params.get("variables"),
            "operationName": params.get("operationName"),
        }
    else:
        body = await request.body()
        if len(body) > (limit + 65_536) * settings.max_batch:
            raise BadRequest("request body is too large", 413)
        raw = await parse_json_off_loop(body, "request body")
    if isinstance(raw, list):
        if not raw:
            raise BadRequest("an empty batch")
        if len(raw) > settings.max_batch:
            raise BadRequest(f"a batch holds at most {settings.max_batch} operations")
        return [_operation(r, limit) for r in raw], True
    return [_operation(raw, limit)], False


def _subject(key: str | None, principal: Principal, ops: list[Operation], batch: bool) -> str:
    """The view cache's name for a query's answer: a digest of the caller's key (a
    user's own fields differ), project scope and the operations."""
    scope = None if principal.project_ids is None else sorted(principal.project_ids)
    raw = json.dumps(
        [key, scope, batch, [[o.query, o.variables, o.operation_name] for o in ops]],
        sort_keys=True,
        default=str,
    )
    return "graphql:" + hashlib.sha256(raw.encode()).hexdigest()


def build_router(app_settings: Settings) -> APIRouter:
    """The ``/graphql`` route, with the limits of ``app_settings``' ``graphql_*`` fields."""
    settings = GraphQLSettings.of(app_settings)
    executor = GraphQLExecutor(settings)
    router = APIRouter(tags=["graphql"])

    @router.post("/graphql", operation_id="graphql_post")
    async def graphql_endpoint(
        request: Request, idempotency_key: IdempotencyKeyHeader = None
    ) -> Response:
        """GraphQL (seed 001 and RunPod's names). See README's GraphQL section. The
        deploy mutations honour ``Idempotency-Key`` (the key covers the mutation's name
        and input)."""
        state = app_state(request)
        try:
            principal = await state.principal(key_from_request(request), selection_from(request))
        except GpuyardError as exc:
            headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
            return _json(request_error(exc.code, exc.message), exc.http_status, headers)
        try:
            ops, batch = await _operations(request, settings)
        except BadRequest as exc:
            code = "PAYLOAD_TOO_LARGE" if exc.status == 413 else "VALIDATION_ERROR"
            return _json(request_error(code, exc.message), exc.status)
        post = request.method == "POST"
        # A query polled by many clients is run once: its answer is kept like a REST
        # page (api/fast/view_cache.py), per key, selection and document. Only answers of
        # queries without errors are kept; a mutation is never shared.
        subject = _subject(key_from_request(request), principal, ops, batch)
        marks = list_marks(state.ctx)
        kept = state.queries.get(subject, principal.account_id, marks)
        if kept is None:
            if not await run_in_threadpool(executor.reads_only, ops):
                results = await run_in_threadpool(
                    executor.run_all, ops, state, principal, post, idempotency_key
                )
                return _json(results if batch else results[0])

            def answer() -> Rendered:
                stamp = state.queries.stamp()
                results = executor.run_all(ops, state, principal, post)
                rendered = Rendered(0, _dumps(results if batch else results[0]))
                if not any("errors" in r for r in results):
                    state.queries.put(subject, principal.account_id, marks, rendered, stamp)
                return rendered

            kept = await shared((subject, principal.account_id), lambda: run_in_threadpool(answer))
        return Response(kept.data, media_type="application/json")

    router.get("/graphql", operation_id="graphql_get")(graphql_endpoint)
    return router
