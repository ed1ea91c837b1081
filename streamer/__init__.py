"""streamer: an asyncio gateway for the OpenAI Responses API, namespace tools included.

The pure core is importable on its own: the naming layer (`ResponsesToolNames`),
the event streamer (`OutputItemStreamer`) and the model-delta vocabulary.
"""

from streamer.core.deltas import (
    Delta,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
)
from streamer.core.errors import RequestError
from streamer.core.events import Event
from streamer.core.output import OutputItemStreamer
from streamer.core.tools import (
    FlatTool,
    NamingConfig,
    ResolvedChoice,
    ResponsesToolNames,
    ToolIdentity,
)

__version__ = "0.1.0"

__all__ = [
    "Delta",
    "Event",
    "Finish",
    "FlatTool",
    "NamingConfig",
    "OutputItemStreamer",
    "ReasoningDelta",
    "RefusalDelta",
    "RequestError",
    "ResolvedChoice",
    "ResponsesToolNames",
    "TextDelta",
    "ToolCallDelta",
    "ToolIdentity",
    "UpstreamError",
    "Usage",
]
