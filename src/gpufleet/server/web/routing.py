"""Console routes answer in HTML, errors included.

The API's handlers (``server/errors.py``) turn domain errors into JSON. A console route
uses ``HtmlRoute`` instead: no session → redirect to the login page; a domain error on a
page or a form → an error page with the same message and status (a form's also links back
to the page it came from).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from fastapi.routing import APIRoute

from gpufleet.core.errors import GpufleetError
from gpufleet.server.errors import describe_validation_errors, status_for
from gpufleet.server.web.session import LoginRequired, login_url, set_flash, take_flash
from gpufleet.server.web.templating import html_response, render_text

Handler = Callable[[Request], Coroutine[Any, Any, Response]]

ERROR_TITLES = {
    400: "Bad request",
    401: "Not logged in",
    403: "Not allowed",
    404: "Not found",
    409: "Conflict",
    422: "Invalid input",
    429: "Too many requests",
    502: "A driver failed",
    503: "Unavailable",
}


def render_page(
    request: Request,
    template: str,
    context: dict[str, Any],
    *,
    status_code: int = 200,
) -> Response:
    """Render a page; the one-time flash message (if any) is shown and cleared."""
    flash = take_flash(request)
    body = render_text(
        template,
        {"request": request, "flash": flash, "dashboards_url": _dashboards_url(request), **context},
    )
    response = html_response(request, body, status_code=status_code)
    if flash is not None:
        response.delete_cookie("gpufleet_flash", path="/")
    return response


# The folder ``gpufleet grafana sync`` makes in each project's organisation
# (gpufleet.grafana.sync.FOLDER_UID; tests/web/test_grafana_link.py holds them equal).
DASHBOARD_FOLDER_UID = "gpufleet"


def _dashboards_url(request: Request) -> str | None:
    """The projects' Grafana dashboards (``gpufleet grafana sync`` puts each project's in
    the folder ``gpufleet`` of its own organisation), when a Grafana is configured. Grafana
    opens the folder in the viewer's current organisation: their project's, for a member
    of one project."""
    grafana: str | None = request.app.state.ctx.settings.grafana_url
    if not grafana:
        return None
    return f"{grafana.rstrip('/')}/dashboards/f/{DASHBOARD_FOLDER_UID}/"


def error_page(request: Request, *, status_code: int, message: str, back: str = "") -> Response:
    return render_page(
        request,
        "error.html",
        {
            "user": None,
            "title": ERROR_TITLES.get(status_code, "Error"),
            "status_code": status_code,
            "message": message,
            "back": back,
        },
        status_code=status_code,
    )


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


class HtmlRoute(APIRoute):
    def get_route_handler(self) -> Handler:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await original(request)
            except LoginRequired as exc:
                target = request.url.path
                if request.url.query and request.method == "GET":
                    target += "?" + request.url.query
                if request.method != "GET":
                    target = getattr(request.state, "form_next", "") or "/"
                response = redirect(login_url(target))
                if exc.message:
                    set_flash(response, text=exc.message, kind="error")
                return response
            except GpufleetError as exc:
                # A refused form answers with its real status (the request-audit records
                # refusals by status) and a way back to the page it came from.
                back = getattr(request.state, "form_next", "") if request.method == "POST" else ""
                return error_page(
                    request, status_code=status_for(exc), message=exc.message, back=back
                )
            except RequestValidationError as exc:
                message, _field = describe_validation_errors(list(exc.errors()))
                return error_page(request, status_code=422, message=message)

        return handler
