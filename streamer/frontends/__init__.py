"""Transports only: HTTP (SSE, JSON), WebSocket, background turns, retrieval."""
