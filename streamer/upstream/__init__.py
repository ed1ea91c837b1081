"""Backend clients; each turns one upstream protocol into the deltas of `streamer.core.deltas`.

- `batch`: `Batch`, what every upstream stream hands the pipeline per read (pure).
- `chat.stream`: a Chat Completions body's bytes -> deltas, and its end (`ChatDecoder`, pure).
- `chat.decoder`: one chunk's payload, or a whole completion -> deltas (pure).
- `chat.http_errors`: a backend's non-2xx answer -> `RequestError` (pure).
- `chat.client`: the pooled HTTP/1.1 client, `ChatUpstream` and its `ChatStream` (I/O only).

Nothing is imported here, so the pure decoder can be used without loading the client.
"""
