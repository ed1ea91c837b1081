"""Backend clients; each turns one upstream protocol into the deltas of `streamer.core.deltas`.

- `batch`: `Batch`, what every upstream stream hands the pipeline per read (pure).
- `chat.decoder`: Chat Completions bytes and payloads -> deltas (`ChatDecoder`, pure).
- `chat.client`: the pooled HTTP/1.1 client, `ChatUpstream` and its `ChatStream` (I/O only).

Nothing is imported here, so the pure decoder can be used without loading the client.
"""
