"""The pure core: synchronous code over plain data (names, lowering, deltas, output)."""
