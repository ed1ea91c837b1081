"""The Anthropic Messages kind (`--upstream-api anthropic`): `POST {base}/messages`.

profiles.py: what each `/v1/messages` implementation takes, as data; blocks.py: content
parts and the sealed thinking blocks; lowering.py: Responses items -> alternating messages;
request.py: the whole request body; decoder.py: the events -> deltas (event_shapes.py: the
per-token ones sliced), stream.py: the body's state machine, a whole answer, tap's reading;
errors.py: a non-2xx answer or an `error` event in OpenAI's shape; kind.py: the row.
"""
