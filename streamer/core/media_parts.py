"""Images and files a Chat backend can be sent (pure): what it cannot is a 400, not a note.

A Chat request carries an image as a URL (http or data) and a file as a `file` part
(`file_data` or `file_id`), the latter only where the backend takes files (`file_parts`).
An image by `file_id`, a file by `file_url`, or a file for a backend without file input
would reach the model as a note it cannot read while the client believes it was sent:
each is refused, naming the part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamer.core.errors import invalid

_PARTS_OF = {
    "message": "content",
    "function_call_output": "output",
    "custom_tool_call_output": "output",
}


def check_media(items: Sequence[dict[str, Any]], *, file_parts: bool, start: int = 0) -> None:
    """Raise a 400 for the first image or file part in `items` (the request's own input,
    from its item `start`) that the backend cannot be sent."""
    for i, item in enumerate(items, start):
        field = _PARTS_OF.get(item.get("type", "message"))
        parts = item.get(field) if field else None
        if parts.__class__ is not list:  # a string: no parts (most outputs and messages)
            continue
        for j, part in enumerate(parts):
            why = _refusal(part, file_parts) if isinstance(part, dict) else None
            if why:
                raise invalid(why, f"input[{i}].{field}[{j}]", "unsupported_content")


def _refusal(part: dict[str, Any], file_parts: bool) -> str | None:
    kind = part.get("type")
    if kind == "input_image" and not part.get("image_url") and part.get("file_id"):
        return (
            "An input_image by file_id is not supported by this gateway (it serves no Files "
            "API): send image_url, a URL or a data URL."
        )
    if kind != "input_file":
        return None
    if not (part.get("file_data") or part.get("file_id")):
        if part.get("file_url"):
            return (
                "An input_file by file_url is not supported by this gateway: send file_data "
                "(base64) with a filename."
            )
        return None
    if not file_parts:
        return (
            "This backend takes no file parts (its profile says so): send the file's text, "
            "or start the gateway with --file-parts if the backend does take them."
        )
    return None
