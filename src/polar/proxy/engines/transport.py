"""HTTP to an inference server: a pooled client, SSE decoding, and the one
place where transport failures become :class:`~polar.proxy.errors.EngineError`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from polar.proxy.engines.http1 import (
    ConnectFailure,
    ConnectionLost,
    Http1Pool,
    ProtocolFailure,
    ReadTimeout,
    Response,
)
from polar.proxy.errors import (
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
)
from polar.proxy.logtext import clip


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str | None
    data: bytes


class SSEDecoder:
    """Incremental ``text/event-stream`` decoder (the WHATWG framing rules that matter here).

    Feed raw bytes as they arrive; complete events come out. Only ``event:``
    and ``data:`` fields are kept; comments and ``id:``/``retry:`` are skipped.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events ``chunk`` completes (a line not ended yet waits for the next)."""
        buffer = self._buffer + chunk if self._buffer else chunk
        end = buffer.rfind(b"\n") + 1
        self._buffer = buffer[end:]
        if not end:
            return []
        events: list[SSEEvent] = []
        data = self._data
        # The lines split in C: a burst of steps is parsed in one pass.
        for line in buffer[: end - 1].split(b"\n"):
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if data:
                    events.append(SSEEvent(self._event, b"\n".join(data)))
                    data = self._data = []
                self._event = None
            elif line[:5] == b"data:":
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line[:1] != b":":  # not a comment
                name, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    self._event = value.decode("utf-8", "replace")
        return events

    def close(self) -> list[SSEEvent]:
        """Flush an event the server did not terminate with a blank line."""
        events = self.feed(b"\n") if self._buffer else []
        if self._data:
            events.append(SSEEvent(self._event, b"\n".join(self._data)))
            self._event, self._data = None, []
        return events


def error_message(body: bytes) -> tuple[str, str | None]:
    """Message and parameter from an engine's error body (vLLM, SGLang or plain text)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
        return (text[:2000] or "empty error body"), None
    if isinstance(doc, dict):
        inner = doc.get("error", doc)
        if isinstance(inner, dict):
            message = inner.get("message") or inner.get("detail") or inner
            param = inner.get("param")
            return clip(str(message), 2000), clip(param, 200) if isinstance(param, str) else None
        if isinstance(inner, str):
            return clip(inner, 2000), None
    return clip(str(doc), 2000), None


class Transport(Protocol):
    """What an engine needs to reach its server: one engine (:class:`EngineTransport`)
    or several serving one model (:class:`~polar.proxy.engines.pool.EnginePool`)."""

    @property
    def base_url(self) -> str: ...

    async def aclose(self) -> None: ...

    async def get_json(self, path: str) -> Any: ...

    async def post_json(
        self,
        path: str,
        body: Any,
        headers: Mapping[str, str] | None = None,
        *,
        idempotent: bool = False,
    ) -> Any: ...

    def stream_sse(
        self, path: str, body: Any, headers: Mapping[str, str] | None = None
    ) -> AsyncGenerator[list[SSEEvent], None]: ...


class EngineTransport:
    """Pooled HTTP/1.1 to one engine base URL, with errors mapped to the gateway's tree."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 900.0,
        idle_timeout_s: float = 60.0,
        total_timeout_s: float = 3600.0,
        max_connections: int = 1024,
        keepalive_s: float = 4.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._pool = Http1Pool(
            self.base_url,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            idle_timeout_s=idle_timeout_s,
            total_timeout_s=total_timeout_s,
            max_idle=max_connections,
            keepalive_s=keepalive_s,
            default_headers=headers,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def get_json(self, path: str) -> Any:
        """GET a path, return the decoded JSON reply."""
        with _mapped_errors(path):
            response = await self._request("GET", path, b"", {}, idempotent=True)
            content = await response.read()
        return _json_reply(path, response.status, content)

    async def post_json(
        self,
        path: str,
        body: Any,
        headers: Mapping[str, str] | None = None,
        *,
        idempotent: bool = False,
    ) -> Any:
        """POST a JSON body, return the decoded JSON reply. ``idempotent``: the
        request changes nothing on the engine (``/tokenize``), so it is sent again
        when an idle connection the engine had closed lost it."""
        with _mapped_errors(path):
            response = await self._request(
                "POST", path, _encode(body), dict(headers or {}), idempotent=idempotent
            )
            content = await response.read()
        return _json_reply(path, response.status, content)

    async def _request(
        self, method: str, path: str, body: bytes, headers: dict[str, str], *, idempotent: bool
    ) -> Response:
        try:
            return await self._pool.request(method, path, body, headers)
        except ConnectionLost as exc:
            if not (idempotent and exc.reused):
                raise
        return await self._pool.request(method, path, body, headers)

    async def stream_sse(
        self, path: str, body: Any, headers: Mapping[str, str] | None = None
    ) -> AsyncGenerator[list[SSEEvent], None]:
        """POST a JSON body and yield the reply's server-sent events as they
        arrive, a list of those one network read completed at a time (an engine
        under load sends several steps at once; see
        :func:`polar.proxy.engines.replies.read_stream`).

        An HTTP error status is raised before the first event. Closing the
        iterator early closes the connection, which makes vLLM and SGLang
        abort the generation.
        """
        with _mapped_errors(path):
            response = await self._pool.request(
                "POST", path, _encode(body), {**(headers or {}), "accept": "text/event-stream"}
            )
        if response.status >= 400:
            with _mapped_errors(path):
                content = await response.read()
            raise _http_error(response.status, content)
        decoder = SSEDecoder()
        chunks = response.chunks()
        try:
            with _mapped_errors(path, mid_stream=True):
                async for chunk in chunks:
                    events = decoder.feed(chunk)
                    if events:
                        yield events
            rest = decoder.close()
            if rest:
                yield rest
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


def _json_reply(path: str, status: int, content: bytes) -> Any:
    if status >= 400:
        raise _http_error(status, content)
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise EngineProtocolError(f"engine sent invalid JSON from {path}: {exc}") from exc


def _encode(body: Any) -> bytes:
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError as exc:  # a value the client sent that JSON cannot carry
        raise InvalidRequest(f"the request cannot be sent to the engine: {exc}") from None


def _http_error(status: int, body: bytes) -> EngineHTTPError:
    message, param = error_message(body)
    return EngineHTTPError(
        f"engine returned {status}: {message}", upstream_status=status, param=param
    )


@contextlib.contextmanager
def _mapped_errors(path: str, *, mid_stream: bool = False) -> Iterator[None]:
    try:
        yield
    except ReadTimeout as exc:
        raise EngineTimeout(f"engine timed out on {path} ({exc})") from exc
    except (ConnectFailure, ConnectionLost) as exc:
        where = "mid-stream" if mid_stream else "before replying"
        # An idle pooled connection the engine had closed: retry at once.
        stale = isinstance(exc, ConnectionLost) and exc.reused and not mid_stream
        raise EngineUnavailable(
            f"engine connection failed {where} on {path}: {exc}"
            + (" (a kept-alive connection)" if stale else ""),
            backoff=not stale,
        ) from exc
    except ProtocolFailure as exc:
        raise EngineProtocolError(f"engine sent a bad reply on {path}: {exc}") from exc
