"""Backend clients; each turns one upstream protocol into the deltas of `streamer.deltas`.

- `chat_decode`: Chat Completions payloads -> deltas (pure).
- `chat`: the pooled HTTP/1.1 client, `ChatUpstream` and its `ChatStream`.

Nothing is imported here, so the pure decoder can be used without loading aiohttp.
"""
