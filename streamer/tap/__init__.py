"""`streamer tap`: read a Responses (or Chat Completions) stream, check its grammar, show it.

- `grammar`: the pure checker (`GrammarChecker`), one event at a time;
- `rules`: the rule catalogue (`RULES`) and the `Violation` record;
- `items`: an open output item and what streams into it (parts, deltas, done texts);
- `identity`: which tool a call names, and whether a request declared it (`ToolCheck`);
- `sources`: files, stdin, HTTP(S) and WebSocket sources, with format detection;
- `render`: the timeline, `--follow` and `--json` output;
- `summary`: the summary that ends every run (items, calls, tokens, timing);
- `command`: argument parsing and the run (`add_tap_parser`, `run_tap`, `main`);
- `replay`: `streamer replay`, a `serve --tap-dir` recording through today's pipeline.

A malformed event never raises: the checker and the renderer cope with any JSON value in any
field; what breaks the grammar is reported as a violation.
"""

from streamer.tap.grammar import RULES, GrammarChecker, Violation

__all__ = ["RULES", "GrammarChecker", "Violation"]
