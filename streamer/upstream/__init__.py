"""Backend clients; each turns one upstream protocol into the deltas of `streamer.core.deltas`.

- `batch`: `Batch`, what every upstream stream hands the pipeline per read (pure).
- `chat.stream`: a Chat Completions body's bytes -> deltas, and its end (`ChatDecoder`, pure).
- `chat.decoder`: one chunk's payload, or a whole completion -> deltas (pure).
- `chat.http_errors`: a backend's non-2xx answer -> `RequestError` (pure).
- `kind`, `kinds`: a backend kind as one record (`BackendKind`), and the rows (pure).
- `backend_client`, `backend_stream`: the pooled HTTP/1.1 client every kind composes over its
  `Wire`, and a 2xx answer read through the kind's decoder (I/O only).

Nothing is imported here, so the pure decoder can be used without loading the client.
"""
