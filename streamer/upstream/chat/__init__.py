"""Chat Completions backends: the stream decoder (bytes -> deltas) and the client."""
