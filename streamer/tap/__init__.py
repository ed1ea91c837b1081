"""`streamer tap`: read a Responses (or Chat Completions) stream, check its grammar, show it.

- `grammar`: the pure checker (`GrammarChecker`, `Violation`, `RULES`);
- `sources`: files, stdin, HTTP(S) and WebSocket sources, with format detection;
- `render`: the timeline, `--follow` and `--json` output and the summary;
- `command`: argument parsing and the run (`add_tap_parser`, `run_tap`, `main`).
"""

from streamer.tap.grammar import RULES, GrammarChecker, Violation

__all__ = ["RULES", "GrammarChecker", "Violation"]
