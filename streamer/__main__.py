"""`python -m streamer` is the `streamer` command."""

from streamer.cli import main

raise SystemExit(main())
