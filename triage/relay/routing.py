"""How a request reaches its endpoint: the relay's own routes straight to their function, CORS's
preflight and the browsers' origin headers, and a 405 that names every method a path has."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send


def json_response(status: int, body: object, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


class Cors:
    """The browser origins allowed to call the API (`[relay] cors_origins`; none: no CORS headers,
    a browser on another origin is refused by the browser itself)."""

    HEADERS = "Authorization, Content-Type, X-Feedback-Token"

    def __init__(self, origins: list[str]) -> None:
        self.origins = frozenset(o.rstrip("/") for o in origins)

    def headers(self, origin: str | None) -> dict[str, str]:
        if origin is None or origin.rstrip("/") not in self.origins:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    def preflight(self, origin: str | None, methods: list[str]) -> Response:
        allowed = self.headers(origin)
        if not allowed:
            return json_response(403, {"error": "this origin is not allowed (the relay's [relay] cors_origins)"})
        return Response(status_code=204, headers={
            **allowed,
            "Access-Control-Allow-Methods": ", ".join(methods),
            "Access-Control-Allow-Headers": self.HEADERS,
            "Access-Control-Max-Age": "600",
        })  # fmt: skip


class Dispatch:
    """The ASGI app: the relay's own routes straight to their endpoint, the rest to Starlette.
    Starlette's middleware and router cost about a tenth of the relay's CPU per vote, and the
    relay's frame (`RelayApp._guard`) already turns every failure into a response. A known path
    with another method is a 405 naming every method the path has; `OPTIONS` is CORS's preflight."""

    def __init__(
        self,
        direct: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]],
        fallback: Starlette,
        cors: Cors,
    ) -> None:
        self.direct = direct
        self.fallback = fallback
        self.cors = cors
        self.methods: dict[str, list[str]] = {}
        for path, method in direct:
            self.methods.setdefault(path, []).append(method)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            path, method = scope["path"], scope["method"]
            endpoint = self.direct.get((path, method))
            methods = self.methods.get(path)
            if endpoint is not None or methods is not None:
                scope["app"] = self.fallback
                request = Request(scope, receive, send)
                origin = request.headers.get("origin")
                if endpoint is not None:
                    response = await endpoint(request)
                elif method == "OPTIONS" and methods is not None:
                    response = self.cors.preflight(origin, methods)
                else:
                    allow = ", ".join([*(methods or []), "OPTIONS"])
                    response = json_response(405, {"error": f"{method} is not allowed here: {allow}"}, {"Allow": allow})
                response.headers.update(self.cors.headers(origin))
                await response(scope, receive, send)
                return
        await self.fallback(scope, receive, send)
