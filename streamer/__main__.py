"""`python -m streamer` is the `streamer` command."""

from .cli import main

raise SystemExit(main())
