"""The HTTP adapter and the process: CLI, settings, routes and the one error mapping, request
decoding, the stream writer, connections, the work pool and metrics. The only layer that
imports aiohttp, asyncio, uvloop or prometheus_client (docs/ARCHITECTURE.md "Layers").
"""

__all__: list[str] = []
