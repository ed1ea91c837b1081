"""Content blocks (pure): Responses content parts -> Messages blocks, and the thinking blocks
the gateway keeps sealed.

Text parts are `text` blocks (empty or blank ones left out: the API refuses text blocks
without non-whitespace text); an image is a
`base64` source (a data URL) or a `url` source; a PDF file is a `document` block where the
profile takes them; what a block cannot carry (a file id, another file) is a short
bracketed note, as for a Chat backend. A malformed image data URL is a 400 naming the part.

Thinking. A Messages answer's thinking and redacted_thinking blocks must go back exactly as
they came (their signatures cover them) before the `tool_use` blocks they preceded. The
decoder hands the streamer one `ReasoningBlob` holding every such block of the answer so
far, each run of them with the id of the `tool_use` block it followed (`after`); the
streamer seals it into the reasoning item's `encrypted_content`, and the lowering opens it
(`thinking_groups`) and puts each run back where it was.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from streamer.core.errors import invalid
from streamer.core.input_items import TEXT_PARTS

BLOB_KEY = "anthropic_thinking"
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_PDF = "application/pdf"


@dataclass(frozen=True, slots=True)
class ThinkingRun:
    """Consecutive thinking/redacted_thinking blocks, and the tool_use id they followed."""

    after: str | None
    blocks: tuple[dict[str, Any], ...]


def thinking_blob(runs: list[ThinkingRun]) -> str:
    """The runs as one string (what `ReasoningBlob` carries, sealed by the streamer)."""
    groups = [{"after": run.after, "blocks": list(run.blocks)} for run in runs]
    return orjson.dumps({BLOB_KEY: groups}).decode()


def thinking_runs(blob: Any) -> list[ThinkingRun] | None:
    """The runs a blob of `thinking_blob` holds; None for any other blob (another kind's)."""
    if not isinstance(blob, str) or not blob.startswith("{"):
        return None
    try:
        value = orjson.loads(blob)
    except orjson.JSONDecodeError:
        return None
    groups = value.get(BLOB_KEY) if isinstance(value, dict) else None
    if not isinstance(groups, list):
        return None
    runs: list[ThinkingRun] = []
    for group in groups:
        if not isinstance(group, dict) or not isinstance(group.get("blocks"), list):
            continue
        after = group.get("after")
        blocks = tuple(b for b in group["blocks"] if _thinking_block(b))
        if blocks:
            runs.append(ThinkingRun(after if isinstance(after, str) else None, blocks))
    return runs


def _thinking_block(block: Any) -> bool:
    if not isinstance(block, dict):
        return False
    if block.get("type") == "thinking":
        return isinstance(block.get("thinking"), str) and isinstance(block.get("signature"), str)
    return block.get("type") == "redacted_thinking" and isinstance(block.get("data"), str)


# -- content parts ------------------------------------------------------------------------


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def content_blocks(content: Any, param: str, documents: bool) -> list[dict[str, Any]]:
    """A message's content (a string or parts) as blocks; empty text is left out."""
    if isinstance(content, str):
        return [text_block(content)] if content.strip() else []
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content or ()):
        block = part_block(part, f"{param}[{j}]", documents)
        if block is not None:
            out.append(block)
    return out


def part_block(part: Mapping[str, Any], param: str, documents: bool) -> dict[str, Any] | None:
    kind = part.get("type")
    if kind in TEXT_PARTS or kind == "refusal":
        text = part.get("refusal" if kind == "refusal" else "text")
        return text_block(text) if isinstance(text, str) and text.strip() else None
    if kind == "input_image":
        return _image(part, param)
    if kind == "input_file":
        return _file(part, documents)
    return None  # a part type input validation let through: nothing to send


def _image(part: Mapping[str, Any], param: str) -> dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        return text_block(f"[image omitted: file {part.get('file_id')}]")
    if not url.startswith("data:"):
        return {"type": "image", "source": {"type": "url", "url": url}}
    media_type, data = _data_url(url, f"{param}.image_url")
    if media_type not in IMAGE_TYPES:
        raise invalid(
            f"Invalid value for '{param}.image_url': the image type {media_type!r} is not "
            f"supported (one of {', '.join(IMAGE_TYPES)}).",
            f"{param}.image_url",
            "unsupported_image_media_type",
        )
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _file(part: Mapping[str, Any], documents: bool) -> dict[str, Any]:
    name = part.get("filename") or part.get("file_id") or part.get("file_url") or "a file"
    data, url = part.get("file_data"), part.get("file_url")
    if documents and isinstance(data, str) and data.startswith(f"data:{_PDF};base64,"):
        source = {"type": "base64", "media_type": _PDF, "data": data.partition(",")[2]}
        return {"type": "document", "source": source}
    if documents and isinstance(url, str) and url.startswith(("https://", "http://")):
        return {"type": "document", "source": {"type": "url", "url": url}}
    why = "the backend takes no files" if not documents else "only PDF data or URLs are sent"
    return text_block(f"[file omitted: {name}; {why}]")


def _data_url(url: str, param: str) -> tuple[str, str]:
    """`data:<type>;base64,<data>` -> (type, data), or a 400 naming `param`."""
    head, comma, data = url[5:].partition(",")
    media_type, _, encoding = head.partition(";")
    if not comma or encoding != "base64" or not data:
        raise invalid(
            f"Invalid value for '{param}': expected a base64 data URL.", param, "invalid_image_url"
        )
    try:
        base64.b64decode(data[:64] + "=" * (-len(data[:64]) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid(
            f"Invalid value for '{param}': the data URL is not valid base64.",
            param,
            "invalid_base64_image",
        ) from None
    return media_type.strip().lower(), data
