"""The call page as a signaling front serves it: ``GET /call`` and its script ``GET /call.js``.

Same origin as ``/v1/calls``, so the page's POST needs no CORS and reads every answer header.
Only aiohttp and the package's own files are imported: the front's start-up stays as fast.

The page's responses close their connection (``Connection: close``): each session's page
then POSTs its offer over a connection of its own, paying the TCP handshake as the aiortc
client does (docs/scenarios.md, "Network floor"), instead of reusing the one that loaded it.
"""
from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

PAGE_PATH = "/call"
_FILES = {PAGE_PATH: ("call.html", "text/html"), "/call.js": ("call.js", "text/javascript")}


@functools.cache
def page_file(name: str) -> bytes:
    """The bytes of one of the page's files (package data, read once per process)."""
    return resources.files("services.browser").joinpath("page", name).read_bytes()


async def _serve(request: web.Request) -> web.Response:
    name, content_type = _FILES[request.path]
    response = web.Response(body=page_file(name), content_type=content_type, charset="utf-8",
                            headers={"Cache-Control": "no-store"})
    response.force_close()
    return response


def page_routes() -> list[web.RouteDef]:
    """The page's routes, for ``app.add_routes``; the query string (``?offer=...``) is the
    page's own business."""
    return [web.get(path, _serve) for path in _FILES]
