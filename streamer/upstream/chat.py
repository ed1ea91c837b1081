"""The pooled Chat Completions client: one backend, its SSE stream -> batches of deltas.

Every request asks the backend to stream (`stream: true`, usage included); a backend that
answers with a whole JSON completion anyway is decoded into the same deltas, so callers
have one path. Failures before the stream starts raise `RequestError` with the backend's
own status and message (502 when it cannot be reached); failures after it started are
yielded as a final `UpstreamError` delta, so the caller can end its response cleanly.

The backend's API key only ever travels in the `Authorization` header; no message, repr
or exception built here contains it (exceptions are raised `from None` for that reason:
aiohttp errors may carry the request headers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict
from yarl import URL

from ..deltas import Delta, UpstreamError
from ..errors import RequestError
from ..sse import SSEDecoder, SSEError
from .chat_decode import INVALID_CHUNK, ChatChunkDecoder, decode_body, http_error

ERROR_BODY_LIMIT = 1 << 20  # enough for any error message; a larger body is cut
JSON_BODY_LIMIT = 64 << 20  # a whole non-streamed completion
_DRAIN_LIMIT = 1 << 16  # bytes read after [DONE] to reach EOF and keep the connection
_DRAIN_TIMEOUT = 0.1  # the end of the body follows [DONE] at once; never hold the caller longer
# Shorter than the 5 s keep-alive of uvicorn (vLLM, SGLang) and llama.cpp, so a pooled
# connection is dropped here before the server drops it under a request.
KEEPALIVE_TIMEOUT = 4.0


class ChatUpstream:
    """A Chat Completions backend at `base_url` (what the OpenAI SDK would take: `.../v1`)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        connect_timeout: float = 10,
        idle_timeout: float = 300,
        session: aiohttp.ClientSession | None = None,
        max_connections: int = 0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._url = URL(self.base_url)
        self._chat_url = URL(self.base_url + "/chat/completions")
        self._models_url = URL(self.base_url + "/models")
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self._auth: dict[str, str] = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = session
        self._owns_session = session is None
        self._max_connections = max_connections  # 0: unlimited, the backend sets the pace
        # sock_read bounds both the wait for headers and every gap between reads; aiohttp
        # stops it while reading is paused by flow control, so a slow client is not idle
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=connect_timeout,
            sock_connect=connect_timeout,
            sock_read=idle_timeout,
        )

    def __repr__(self) -> str:
        return f"ChatUpstream({self._where()!r})"

    async def open(
        self,
        chat_request: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        on_raw: Callable[[bytes], None] | None = None,
    ) -> ChatStream:
        """Send a chat request and return its stream once the backend has answered 2xx.

        `on_raw`, if given, sees every byte of a 2xx body as it is read (for recordings).
        """
        body = dict(chat_request)
        body["stream"] = True
        options = body.get("stream_options")
        body["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
        sent = CIMultiDict(
            {
                "Content-Type": "application/json",
                "Accept": "text/event-stream",
                "Accept-Encoding": "identity",
            }
        )
        sent.update(self._auth)
        if headers:
            for key, value in headers.items():
                sent[key] = value
        resp = await self._request(
            "POST", self._chat_url, data=orjson.dumps(body), headers=sent, allow_redirects=False
        )
        try:
            if resp.status >= 300:
                raise await _http_error(resp)
            if "json" in resp.content_type:
                try:
                    raw = await _read_limited(resp, JSON_BODY_LIMIT)
                except TimeoutError:
                    raise self._timed_out() from None
                except (aiohttp.ClientError, OSError):
                    raise self._closed_early("sending its answer") from None
                if on_raw is not None:
                    on_raw(raw)
                deltas = decode_body(raw)
                resp.release()
                return ChatStream(
                    None, deltas=deltas, status=resp.status, headers=dict(resp.headers)
                )
        except BaseException:
            if resp.content.is_eof():
                resp.release()
            else:
                resp.close()
            raise
        return ChatStream(resp, idle_timeout=self.idle_timeout, on_raw=on_raw)

    async def get_models(self) -> tuple[int, bytes]:
        """The backend's `GET /models`, status and body as they came."""
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self.connect_timeout,
            sock_connect=self.connect_timeout,
            sock_read=min(self.idle_timeout, 30),
        )
        resp = await self._request("GET", self._models_url, headers=self._auth, timeout=timeout)
        try:
            return resp.status, await _read_limited(resp, JSON_BODY_LIMIT)
        except TimeoutError:
            raise self._timed_out() from None
        except (aiohttp.ClientError, OSError):
            raise self._closed_early("listing its models") from None
        finally:
            resp.release()

    async def ping(self) -> bool:
        """Readiness: the backend answers `GET /models` with anything but a 5xx."""
        timeout = aiohttp.ClientTimeout(total=self.connect_timeout)
        try:
            resp = await self._request("GET", self._models_url, headers=self._auth, timeout=timeout)
        except RequestError:
            return False
        resp.close()  # the body is not needed; do not wait for it
        return resp.status < 500

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_TIMEOUT
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
            self._owns_session = True
        return self._session

    async def _request(self, method: str, url: URL, **kwargs: Any) -> aiohttp.ClientResponse:
        kwargs.setdefault("timeout", self._timeout)
        try:
            return await self._client().request(method, url, **kwargs)
        except aiohttp.ClientConnectorError as exc:
            os_error = exc.os_error
            if isinstance(os_error, ConnectionRefusedError):
                reason = "connection refused"
            else:
                reason = os_error.strerror or type(os_error).__name__
            raise self._unreachable(reason) from None
        except aiohttp.ConnectionTimeoutError:
            raise self._unreachable(f"no connection within {self.connect_timeout:g} s") from None
        except TimeoutError:
            raise self._timed_out() from None
        except (aiohttp.ClientError, OSError):
            raise self._closed_early("answering") from None

    def _timed_out(self) -> RequestError:
        return RequestError(
            f"The backend did not answer within {self.idle_timeout:g} s.",
            status=504,
            type="server_error",
            code="upstream_timeout",
        )

    def _closed_early(self, doing: str) -> RequestError:
        return RequestError(
            f"The backend at {self._where()} closed the connection before {doing}.",
            status=502,
            type="server_error",
            code="upstream_error",
        )

    def _unreachable(self, reason: str) -> RequestError:
        return RequestError(
            f"Could not connect to the backend at {self._where()}: {reason}.",
            status=502,
            type="server_error",
            code="upstream_unreachable",
        )

    def _where(self) -> str:
        # host and port only: a base URL may carry credentials in its userinfo
        return f"{self._url.host}:{self._url.port}"


class ChatStream:
    """Async iterator of `list[Delta]`, one list per network read that completed something.

    It ends after `[DONE]` or at EOF. A failure mid-stream (the backend closing early,
    an idle gap longer than `idle_timeout`, an error payload, malformed JSON) is yielded
    as a last batch ending in `UpstreamError`, and the connection is dropped.
    """

    def __init__(
        self,
        response: aiohttp.ClientResponse | None,
        *,
        idle_timeout: float = 300,
        deltas: list[Delta] | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        on_raw: Callable[[bytes], None] | None = None,
    ) -> None:
        self._resp = response
        self._on_raw = on_raw
        self._pending = deltas
        self.idle_timeout = idle_timeout
        self.streaming = response is not None  # False: the backend answered plain JSON
        self.status = response.status if response is not None else (status or 200)
        self.headers = dict(response.headers) if response is not None else (headers or {})
        self._sse = SSEDecoder()
        self._chat = ChatChunkDecoder()
        self._ended = response is None

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> list[Delta]:
        if self._pending is not None:
            batch, self._pending = self._pending, None
            if batch:
                return batch
        resp = self._resp
        if self._ended or resp is None:
            if resp is not None:
                await self._drain()
            raise StopAsyncIteration
        while True:
            try:
                chunk = await resp.content.readany()
            except asyncio.CancelledError:
                self._abort()
                raise
            except TimeoutError:
                if self._chat.finished:  # complete but for [DONE]: end as a backend EOF would
                    self._abort()
                    raise StopAsyncIteration from None
                return self._fail(
                    [], "upstream_timeout", f"The backend sent nothing for {self.idle_timeout:g} s."
                )
            except (aiohttp.ClientError, OSError):
                if self._chat.finished:  # the answer was complete; only the epilogue is lost
                    self._abort()
                    raise StopAsyncIteration from None
                return self._fail(
                    [], "server_error", "The backend closed the stream before it finished."
                )
            if not chunk:
                return self._eof()
            if self._on_raw is not None:
                self._on_raw(chunk)
            batch = self._decode(chunk, eof=False)
            if batch:
                return batch

    async def aclose(self) -> None:
        """Let go of the backend now: keep the connection if the stream is complete, else cut it."""
        self._ended = True
        self._pending = None
        resp, self._resp = self._resp, None
        if resp is not None:
            if resp.content.is_eof() and resp.content.exception() is None:
                resp.release()
            else:
                resp.close()

    async def __aenter__(self) -> ChatStream:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _decode(self, chunk: bytes, *, eof: bool) -> list[Delta]:
        try:
            messages = self._sse.close() if eof else self._sse.feed(chunk)
        except SSEError as exc:
            return self._fail(
                [], INVALID_CHUNK, f"The backend broke the event-stream framing: {exc}."
            )
        out: list[Delta] = []
        chat = self._chat
        for message in messages:
            deltas = chat.feed(message.data, message.event)
            if deltas:
                if type(deltas[-1]) is UpstreamError:
                    out.extend(deltas)
                    self._ended = True
                    self._abort()
                    return out
                out.extend(deltas)
            if chat.done:
                self._ended = True  # the next __anext__ drains to EOF and ends
                break
        return out

    def _eof(self) -> list[Delta]:
        batch = self._decode(b"", eof=True)
        if not self._ended and not self._chat.finished and not self._chat.done:
            return self._fail(
                batch, "server_error", "The backend closed the stream before it finished."
            )
        self._ended = True
        if self._resp is not None:
            self._resp.release()
            self._resp = None
        if batch:
            return batch
        raise StopAsyncIteration

    def _fail(self, batch: list[Delta], code: str, message: str) -> list[Delta]:
        self._ended = True
        self._abort()
        batch.append(UpstreamError(code, message))
        return batch

    def _abort(self) -> None:
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.close()

    async def _drain(self) -> None:
        """After [DONE]: read the (normally already buffered) end of the body, to reuse the connection."""
        resp, self._resp = self._resp, None
        if resp is None:
            return
        seen = 0
        try:
            async with asyncio.timeout(_DRAIN_TIMEOUT):
                while seen <= _DRAIN_LIMIT:
                    chunk = await resp.content.readany()
                    if not chunk:
                        resp.release()
                        return
                    seen += len(chunk)
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        except asyncio.CancelledError:
            resp.close()
            raise
        resp.close()


async def _read_limited(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    buf = bytearray()
    while len(buf) < limit:
        chunk = await resp.content.readany()
        if not chunk:
            break
        buf += chunk
    return bytes(buf[:limit])


async def _http_error(resp: aiohttp.ClientResponse) -> RequestError:
    """A backend's non-2xx answer, with its status, message, type, code and param kept."""
    if resp.status < 400:
        return http_error(resp.status, b"", resp.headers)
    try:
        raw = await _read_limited(resp, ERROR_BODY_LIMIT)
    except (TimeoutError, aiohttp.ClientError, OSError):
        raw = b""
    return http_error(resp.status, raw, resp.headers)
