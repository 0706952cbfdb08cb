"""The HTTP adapter and the process: routes and statuses (``http``), the one upload-pack
conversation (``upload``), the request scope, the one error mapping, the budgets, the
stream writer, the pack cache, connections, the work pool and metrics. The only layer that
imports aiohttp, asyncio, uvloop or prometheus_client (docs/ARCHITECTURE.md "Layers").
"""

__all__: list[str] = []
