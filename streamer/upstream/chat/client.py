"""The pooled Chat Completions client: one backend, its SSE stream -> batches of deltas.

Every request asks the backend to stream (`stream: true`, usage included); a backend that
answers with a whole JSON completion anyway is decoded into the same deltas, so callers
have one path. Failures before the stream starts raise `RequestError` with the backend's
own status and message (502 when it cannot be reached); failures after it started are
yielded as a final `UpstreamError` delta, so the caller can end its response cleanly.

The HTTP is `http1_pool.ConnectionPool`, a lean client on asyncio protocols: a general client
cost more per request and per HTTP chunk than the whole pipeline behind it. Connections are
pooled per client identity (`http1_pool.ClientPools`, keyed by `Turn.client`): a backend that
desynchronises a connection can only hand a client its own words.

The backend's API key only ever travels in the `Authorization` header; no message, repr
or exception built here contains it (exceptions are raised `from None` for that reason).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import orjson

from streamer.core.deltas import Delta
from streamer.core.errors import RequestError, server_error
from streamer.identity import client_identity
from streamer.redact import secrets_of
from streamer.upstream.batch import Batch
from streamer.upstream.body_budget import ByteBudget
from streamer.upstream.chat.http_errors import http_error
from streamer.upstream.chat.rejected_params import rejected_params, without
from streamer.upstream.chat.stream import ChatDecoder, EndCause, decode_body
from streamer.upstream.http1.connection import READ_SIZE, Response
from streamer.upstream.http1.connection_limit import ConnectionLimit, OpenConnections
from streamer.upstream.http1.content_coding import (
    ContentCodingError,
    DecodedResponse,
    UnsupportedCoding,
    decoder_for,
)
from streamer.upstream.http1.pool import ClientPools, ConnectionPool
from streamer.upstream.http1.proxy import Proxy
from streamer.upstream.http1.wire import (
    ConnectError,
    HTTPClientError,
    ProtocolError,
    ReadTimeout,
    ServerDisconnected,
)

log = logging.getLogger("streamer.upstream")

ERROR_BODY_LIMIT = 1 << 20  # enough for any error message; a larger body is cut
# A whole non-streamed completion: 4x the default --max-output-bytes (JSON escapes, and
# arguments are JSON in a JSON string), so an answer within the output limit always fits.
JSON_BODY_LIMIT = 64 << 20
JSON_BUDGET_LIMIT = 256 << 20  # all whole-JSON answers being read at once (the default)
TOO_LARGE = "upstream_response_too_large"
_DRAIN_LIMIT = 1 << 16  # bytes read after [DONE] to reach EOF and keep the connection
_DRAIN_TIMEOUT = 0.1  # the end of the body follows [DONE] at once; never hold the caller longer
# Shorter than the 5 s keep-alive of uvicorn (vLLM, SGLang) and llama.cpp, so a pooled
# connection is dropped here before the server drops it under a request.
KEEPALIVE_TIMEOUT = 4.0
PROBE = "probe"  # the pool of readiness probes and unauthenticated model listings (not a digest)
_CHAT_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "text/event-stream",
    "Accept-Encoding": "identity",
}


class ChatUpstream:
    """A Chat Completions backend at `base_url` (what the OpenAI SDK would take: `.../v1`).

    Another API over the same shell (upstream/responses/client.py) changes the class
    attributes: the endpoint, the stream (its decoder) and the whole-JSON decoding.
    """

    endpoint = "/chat/completions"
    stream: type[ChatStream]  # ChatStream (set below it)
    decode_whole: Callable[[bytes | bytearray], list[Delta]] = staticmethod(decode_body)

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        connect_timeout: float = 10,
        idle_timeout: float = 300,
        first_byte_timeout: float | None = None,
        max_connections: int = 0,
        keepalive: bool = True,
        client_pools: int = 256,
        proxy: Proxy | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_json_body: int = JSON_BODY_LIMIT,
        json_budget: ByteBudget | None = None,
        open_connections: OpenConnections | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.stream_usage = True  # ask for `stream_options.include_usage` (profiles.py)
        # optional parameters this backend answered 400 to: left out from then on (a subset
        # of the fixed `rejected_params.DROPPABLE`, so bounded)
        self.rejected: frozenset[str] = frozenset()
        self._parts = parts = urlsplit(self.base_url)  # the pools take it parsed
        self._proxy = proxy  # None: direct (see `proxy.select_proxy`)
        self._forward_proxy = proxy is not None and parts.scheme != "https"
        # one bound for every pool to this origin (0: unlimited, the backend sets the pace)
        self.connection_limit = ConnectionLimit(max_connections) if max_connections > 0 else None
        # every backend connection of the process, all upstreams together (its fd budget)
        self.open_connections = open_connections
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._path = parts.path
        self.connect_timeout = connect_timeout
        # `first_byte_timeout` bounds the wait for the answer's first body byte (the head
        # may come first; a backend reading a long prompt sends nothing), `idle_timeout`
        # every gap between body reads after it (llama.cpp goes silent after SIGTERM); they
        # do not run while reading is paused by flow control, so a slow client is not idle
        self.idle_timeout = idle_timeout
        self.first_byte_timeout = idle_timeout if first_byte_timeout is None else first_byte_timeout
        self._api_key = api_key
        self._keepalive = keepalive  # False: a new connection per request, nothing shared
        self._client_pools = client_pools  # most client identities with a pool of their own
        self._pools: ClientPools | None = None
        if ssl_context is None and parts.scheme == "https":
            ssl_context = ssl.create_default_context()  # the system's CAs
        self._ssl_context = ssl_context
        self._read_buffer = memoryview(bytearray(READ_SIZE))  # one for all pools (see Connection)
        self._chat_head = b""  # the request head up to Content-Length, without extra headers
        self.max_json_body = max_json_body
        # shared by every answer of this upstream (one per process): the app passes one
        self.json_budget = json_budget or ByteBudget(JSON_BUDGET_LIMIT)

    def __repr__(self) -> str:
        return f"ChatUpstream({self._where()!r})"

    @property
    def pools(self) -> ClientPools:
        """The keep-alive connections to the backend, per client (made on first use)."""
        if self._pools is None:
            self._pools = ClientPools(self._new_pool, self._client_pools if self._keepalive else 1)
        return self._pools

    def pool_for(self, client: str) -> ConnectionPool:
        """The pool that carries the requests of `client` (with keep-alive off: one for all,
        since it keeps nothing)."""
        return self.pools.get(client if self._keepalive else "")

    @property
    def pool(self) -> ConnectionPool:
        """The anonymous client's pool."""
        return self.pool_for("")

    def _new_pool(self) -> ConnectionPool:
        pool = ConnectionPool(
            self._parts,
            connect_timeout=self.connect_timeout,
            keepalive=KEEPALIVE_TIMEOUT,
            ssl_context=self._ssl_context,
            proxy=self._proxy,
            limiter=self.connection_limit,
            open_limit=self.open_connections,
            reuse=self._keepalive,
            read_buffer=self._read_buffer,
        )
        if not self._chat_head:  # the same for every pool: one origin, one reuse policy
            target = self._path + self.endpoint
            head = pool.head("POST", target, self._headers(_CHAT_HEADERS, pool), None)
            self._chat_head = head[:-2]  # without the blank line
        return pool

    async def open(
        self,
        backend_request: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        on_raw: Callable[[bytes], None] | None = None,
        client: str = "",
    ) -> ChatStream:
        """Send a chat request and return its stream once the backend has answered 2xx.

        `on_raw`, if given, sees every byte of a 2xx body as it is read (for recordings).
        `client` (`Turn.client`) picks the connections: only this client's requests use them.
        A 400 naming optional parameters the backend does not take is sent again once
        without them, before anything reaches the caller; they stay out from then on.
        """
        try:
            return await self._open(self._streaming(backend_request), headers, on_raw, client)
        except _Rejected as rejected:
            self._remember(rejected)
        try:  # once: what a second 400 names is remembered, and the 400 passes through
            return await self._open(self._streaming(backend_request), headers, on_raw, client)
        except _Rejected as rejected:
            self._remember(rejected)
            raise rejected.error from None

    def _remember(self, rejected: _Rejected) -> None:
        new = [name for name in rejected.names if name not in self.rejected]
        if new:
            self.rejected = self.rejected | set(new)
            log.warning(
                "the backend at %s answered %d to %s: left out of every request from now on",
                self._where(),
                rejected.status,
                ", ".join(new),
            )

    async def _open(
        self,
        body: dict[str, Any],
        headers: dict[str, str] | None,
        on_raw: Callable[[bytes], None] | None,
        client: str,
    ) -> ChatStream:
        data = orjson.dumps(body)
        pool = self.pool_for(client)
        if headers:
            head = pool.head(
                "POST",
                self._path + self.endpoint,
                self._headers({**_CHAT_HEADERS, **headers}, pool),
                len(data),
            )
        else:
            head = self._chat_head + b"Content-Length: %d\r\n\r\n" % len(data)
        raw_resp = await self._request(
            pool, head + data, self.first_byte_timeout, self.idle_timeout
        )
        resp: Response | DecodedResponse = raw_resp
        try:
            if resp.status >= 300:
                raise await self._http_error(raw_resp, body)
            resp = self._decoding(raw_resp)
            if "json" in resp.content_type:
                raw = await self._read_json(resp)
                try:
                    if on_raw is not None:
                        on_raw(bytes(raw))
                    deltas = self.decode_whole(raw)
                finally:
                    self.json_budget.give(len(raw))
                resp.release()
                return self.stream.answered(deltas)
            return await self.stream.reading(
                resp,
                idle_timeout=self.idle_timeout,
                on_raw=on_raw,
                first_byte_timeout=self.first_byte_timeout,
            )
        except BaseException:
            resp.release()  # kept if the whole body is in, else cut
            raise

    def _streaming(self, backend_request: dict[str, Any]) -> dict[str, Any]:
        """The request as sent: always streamed, with usage asked for unless the profile
        drops `stream_options` (a backend that rejects it)."""
        body = dict(backend_request)
        body["stream"] = True
        options = body.get("stream_options")
        if self.stream_usage:
            body["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        else:
            body.pop("stream_options", None)
        return without(body, self.rejected)

    async def _read_json(self, resp: Response | DecodedResponse) -> bytearray:
        """A whole JSON body, its bytes taken from `json_budget` (the caller gives them back).

        Past `max_json_body` the turn fails with a 502, past the shared budget with a 503;
        either way the rest is not read and the connection is cut (`release`).
        """
        budget, cap = self.json_budget, self.max_json_body
        declared = resp.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise self._too_large(cap)
        raw = bytearray()  # grown in place and decoded as it is: the body is not copied
        try:
            while data := await resp.read():
                if len(raw) + len(data) > cap:
                    raise self._too_large(cap)
                if not budget.take(len(data)):
                    raise self._over_budget(budget)
                raw += data
        except TimeoutError:
            budget.give(len(raw))
            raise self._timed_out() from None
        except ContentCodingError as exc:  # before ProtocolError: it is one
            budget.give(len(raw))
            raise self._undecodable(exc) from None
        except ProtocolError as exc:
            budget.give(len(raw))
            raise self._invalid(exc) from None
        except (HTTPClientError, OSError):
            budget.give(len(raw))
            raise self._closed_early("sending its answer") from None
        except BaseException:
            budget.give(len(raw))
            raise
        return raw

    def _too_large(self, cap: int) -> RequestError:
        message = (
            f"The backend at {self._where()} sent a JSON answer larger than the gateway "
            f"accepts ({cap} bytes)."
        )
        return server_error(message, 502, TOO_LARGE)

    def _over_budget(self, budget: ByteBudget) -> RequestError:
        message = (
            "The gateway is holding as many whole-JSON backend answers as it may "
            f"({budget.limit} bytes, --max-backend-json-bytes); try again shortly."
        )
        return server_error(message, 503, TOO_LARGE)

    async def get_models(self, *, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """The backend's `GET /models`, status and body as they came (`headers`: as `open`)."""
        raw_resp = await self._get_models(min(self.idle_timeout, 30), headers)
        return await self._whole_answer(raw_resp, "listing its models")

    async def _whole_answer(self, raw_resp: Response, doing: str) -> tuple[int, bytes]:
        """Status and body (at most `JSON_BODY_LIMIT` bytes) of an answer that is not a turn;
        its failures in the turn's terms."""
        resp: Response | DecodedResponse = raw_resp
        try:
            resp = self._decoding(raw_resp)
            return resp.status, await resp.read_all(JSON_BODY_LIMIT)
        except TimeoutError:
            raise self._timed_out() from None
        except ContentCodingError as exc:
            raise self._undecodable(exc) from None
        except (HTTPClientError, OSError):
            raise self._closed_early(doing) from None
        finally:
            resp.release()  # kept if the whole body is in, else cut

    async def models_answer(self, limit: int) -> tuple[int, dict[str, str], bytes]:
        """`GET /models` as the startup profile probe reads it: status, headers, and the
        body up to `limit` bytes (as the probe's pool asks, without client headers)."""
        raw_resp = await self._get_models(self.connect_timeout)
        resp: Response | DecodedResponse = raw_resp
        try:
            resp = self._decoding(raw_resp)
            body = await resp.read_all(limit)
            return raw_resp.status, {k: v for k, v in raw_resp.headers.items()}, body
        finally:
            resp.release()  # kept if the whole body is in, else cut

    async def post_json(
        self,
        path: str,
        body: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        client: str = "",
    ) -> tuple[int, bytes]:
        """POST `body` to `path` from the server's root (the base URL less a trailing `/v1`):
        a backend's own routes such as `/tokenize`. Status and body (at most
        `JSON_BODY_LIMIT` bytes) as they came; bounded by the idle timeout."""
        root = self._path[:-3] if self._path.endswith("/v1") else self._path
        data = orjson.dumps(body)
        pool = self.pool_for(client)
        asked = {**_CHAT_HEADERS, "Accept": "application/json", **(headers or {})}
        merged = self._headers(asked, pool)
        head = pool.head("POST", root + path, merged, len(data))
        timeout = min(self.idle_timeout, 30)
        raw_resp = await self._request(pool, head + data, timeout, timeout)
        return await self._whole_answer(raw_resp, "answering")

    async def ping(self) -> bool:
        """Readiness: the backend answers `GET /models` with anything but a 5xx."""
        try:
            async with asyncio.timeout(self.connect_timeout):
                resp = await self._get_models(self.connect_timeout)
        except (RequestError, TimeoutError):
            return False
        resp.release()  # the body is not needed: kept if it is all there, else cut
        return resp.status < 500

    async def close(self) -> None:
        if self._pools is not None:
            await self._pools.close()
        self._pools = None

    def _headers(self, headers: dict[str, str], pool: ConnectionPool) -> list[tuple[str, str]]:
        """Headers merged case-insensitively, the later winning; the key added if none came."""
        merged = {k.lower(): (k, v) for k, v in headers.items()}
        if "authorization" not in merged:
            if self._api_key:
                merged["authorization"] = ("Authorization", f"Bearer {self._api_key}")
            elif pool.basic_auth:  # credentials in the base URL
                merged["authorization"] = ("Authorization", pool.basic_auth)
        return list(merged.values())

    async def _get_models(self, timeout: float, headers: dict[str, str] | None = None) -> Response:
        # a forwarded Authorization names the client, as it does for its turns
        auth = headers.get("Authorization") if headers else None
        pool = self.pool_for(client_identity(auth) if auth else PROBE)
        head = pool.head("GET", self._path + "/models", self._headers(headers or {}, pool), None)
        return await self._request(pool, head, timeout)

    async def _request(
        self, pool: ConnectionPool, payload: bytes, timeout: float, idle: float | None = None
    ) -> Response:
        try:
            return await pool.request(payload, timeout, idle)
        except ConnectError as exc:
            raise self._unreachable(exc.reason) from None
        except ReadTimeout:
            raise self._timed_out() from None
        except ProtocolError as exc:
            raise self._invalid(exc) from None
        except (HTTPClientError, OSError):
            raise self._closed_early("answering") from None

    def _invalid(self, exc: ProtocolError) -> RequestError:
        return RequestError(
            f"The backend at {self._where()} sent an invalid HTTP answer: {exc}.",
            status=502,
            type="server_error",
            code="upstream_error",
        )

    def _decoding(self, resp: Response) -> Response | DecodedResponse:
        """`resp`, or its body decoded if a `Content-Encoding` came (a proxy compressed it)."""
        try:
            decoder = decoder_for(_content_encoding(resp))
        except UnsupportedCoding as exc:
            raise self._undecodable(exc) from None
        return resp if decoder is None else DecodedResponse(resp, decoder)

    def _undecodable(self, exc: ContentCodingError) -> RequestError:
        message = f"The backend at {self._where()} sent an answer that cannot be decoded: {exc}."
        return server_error(message, 502, "upstream_error")

    async def _http_error(self, resp: Response, sent: dict[str, Any] | None = None) -> RequestError:
        """A non-2xx answer; the forward proxy's own 407 is a 502 that names it. With
        `sent`, a 400 that names optional parameters of it is `_Rejected`."""
        if resp.status == 407 and self._forward_proxy and self._proxy is not None:
            where = self._proxy.where
            message = (
                f"The proxy at {where} refused the request to the backend at {self._where()}: "
                "407 Proxy Authentication Required."
            )
            return server_error(message, 502, "upstream_unreachable")
        try:
            decoder = decoder_for(_content_encoding(resp))
        except UnsupportedCoding as exc:  # the status matters more than the body's text
            error = http_error(resp.status, b"", resp.headers)
            error.message += f" (its body is in Content-Encoding {exc.coding!r}, not decoded)"
            return error
        return await _http_error(
            resp if decoder is None else DecodedResponse(resp, decoder), self._api_key, sent
        )

    def _timed_out(self) -> RequestError:
        message = f"The backend did not answer within {self.first_byte_timeout:g} s."
        return server_error(message, 504, "upstream_timeout")

    def _closed_early(self, doing: str) -> RequestError:
        message = f"The backend at {self._where()} closed the connection before {doing}."
        return server_error(message, 502, "upstream_error")

    def _unreachable(self, reason: str) -> RequestError:
        message = f"Could not connect to the backend at {self._where()}: {reason}."
        return server_error(message, 502, "upstream_unreachable")

    def _where(self) -> str:
        # host and port only: a base URL may carry credentials in its userinfo
        return f"{self._host}:{self._port}"


class ChatStream:
    """A 2xx answer's deltas: `first`, the batch that came with the head (None if nothing
    did), then, iterated, one `Batch` per network read that completed something.

    The decoding, the batch sizes and what the end of the body means are `ChatDecoder`'s;
    this shell only reads, feeds, and lets go of the connection: kept once the body is read
    whole, cut on a failure. A failure mid-stream (the backend closing early, an idle gap
    longer than `idle_timeout`, an error payload, malformed JSON) is the last batch, ending
    in `UpstreamError`.
    """

    decoder = ChatDecoder  # a subclass reads another API's events (ResponsesDecoder)

    def __init__(
        self,
        response: Response | DecodedResponse | None,
        *,
        idle_timeout: float = 300,
        on_raw: Callable[[bytes], None] | None = None,
        first: Batch | None = None,
        first_byte_timeout: float | None = None,
    ) -> None:
        self._resp = response
        self._on_raw = on_raw
        self._decoder = self.decoder(idle_timeout, first_byte_timeout)
        self.first = first

    @classmethod
    async def reading(
        cls,
        response: Response | DecodedResponse,
        *,
        idle_timeout: float = 300,
        on_raw: Callable[[bytes], None] | None = None,
        first_byte_timeout: float | None = None,
    ) -> ChatStream:
        """The stream of an event-stream answer, its first batch decoded if its first bytes
        came with the head (that read does not wait)."""
        stream = cls(
            response,
            idle_timeout=idle_timeout,
            on_raw=on_raw,
            first_byte_timeout=first_byte_timeout,
        )
        if response.buffered:
            deltas = await stream._read(response)
            decoder = stream._decoder
            if deltas or (decoder.ended and not decoder.pending):
                stream.first = stream._batch(deltas)
        return stream

    @classmethod
    def answered(cls, deltas: list[Delta]) -> ChatStream:
        """A whole (JSON) answer, decoded already: all of it is the first batch."""
        return cls(None, first=Batch(deltas, end=True))

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> Batch:
        decoder = self._decoder
        while True:
            resp = self._resp
            if decoder.pending:
                deltas = decoder.take()
            elif resp is None:
                raise StopAsyncIteration
            elif decoder.ended:  # [DONE] came before the end of the body: read that too
                await self._drain()
                raise StopAsyncIteration
            else:
                deltas = await self._read(resp)
            if deltas:
                return self._batch(deltas)
            if decoder.ended and not decoder.pending and self._resp is None:
                raise StopAsyncIteration

    async def _read(self, resp: Response | DecodedResponse) -> list[Delta]:
        """One read, fed to the decoder; the end of the body, or its failure, ended there."""
        decoder = self._decoder
        detail = ""
        try:
            chunk = await resp.read()
        except asyncio.CancelledError:
            self._abort()
            raise
        except TimeoutError:
            cause = EndCause.TIMEOUT
        except ContentCodingError as exc:  # before ProtocolError: it is one
            cause, detail = EndCause.UNDECODABLE, str(exc)
        except ProtocolError as exc:
            cause, detail = EndCause.INVALID, str(exc)
        except ServerDisconnected:
            cause = EndCause.EOF
        except (HTTPClientError, OSError):
            cause = EndCause.RESET
        else:
            if chunk:
                if self._on_raw is not None:
                    self._on_raw(chunk)
                return decoder.feed(chunk)
            cause = EndCause.CLEAN
        deltas = decoder.end(cause, detail)
        if cause is EndCause.CLEAN and not decoder.failed:
            self._release()
        else:
            self._abort()
        return deltas

    def _batch(self, deltas: list[Delta]) -> Batch:
        """`deltas` as a batch, the last one if the decoder has ended and the body is in."""
        decoder = self._decoder
        if not decoder.ended or decoder.pending:
            return Batch(deltas)
        if decoder.failed:
            self._abort()
        elif self._resp is not None and not self._resp.complete:
            return Batch(deltas)  # [DONE] before the end of the body: the next call drains it
        self._release()
        return Batch(deltas, end=True)

    async def aclose(self) -> None:
        """Let go of the backend now: keep the connection if the stream is complete, else cut it."""
        self._decoder.ended = True
        self._release()

    async def __aenter__(self) -> ChatStream:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _release(self) -> None:
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.release()  # kept if the whole body is in, else cut

    def _abort(self) -> None:
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.abort()

    async def _drain(self) -> None:
        """After [DONE]: read the (normally already there) end of the body, to reuse the connection."""
        resp, self._resp = self._resp, None
        if resp is None:
            return
        seen = 0
        try:
            if not resp.complete:
                async with asyncio.timeout(_DRAIN_TIMEOUT):
                    while seen <= _DRAIN_LIMIT and (chunk := await resp.read()):
                        seen += len(chunk)
        except (TimeoutError, HTTPClientError, OSError):
            pass
        except asyncio.CancelledError:
            resp.abort()
            raise
        resp.release()  # kept if the whole body is in, else cut


ChatUpstream.stream = ChatStream


def _content_encoding(resp: Response) -> str | None:
    values = resp.headers.getall("Content-Encoding", None)
    return ",".join(values) if values else None


class _Rejected(RequestError):
    """A backend's 400 that names optional parameters of the request (`names`) it does
    not take: `ChatUpstream.open` sends the request again without them."""

    def __init__(self, error: RequestError, names: tuple[str, ...]) -> None:
        super().__init__(
            error.message,
            param=error.param,
            code=error.code,
            status=error.status,
            type=error.type,
            headers=error.headers,
        )
        self.error = error
        self.names = names


async def _http_error(
    resp: Response | DecodedResponse,
    api_key: str | None = None,
    sent: dict[str, Any] | None = None,
) -> RequestError:
    """A backend's non-2xx answer, with its status, message, type, code and param kept
    (and the backend key scrubbed from its text before that is cut); `_Rejected` if it
    names optional parameters of `sent`."""
    if resp.status < 400:
        return http_error(resp.status, b"", resp.headers)
    try:
        raw = await resp.read_all(ERROR_BODY_LIMIT)
    except (TimeoutError, HTTPClientError, OSError):
        raw = b""
    exc = http_error(resp.status, raw, resp.headers, secrets_of((api_key,)))
    if exc.status == 429 and exc.code is None:  # clients key on it, as on OpenAI's own 429s
        exc.code = "rate_limit_exceeded"
    names = rejected_params(resp.status, raw, sent) if sent is not None else ()
    return _Rejected(exc, names) if names else exc
