"""Shared fixtures: test helpers live beside the tests and import as plain modules."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
