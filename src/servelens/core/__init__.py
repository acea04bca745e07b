"""Pure measurement core: no I/O, no clock reads, no asyncio, no prometheus_client.

Everything here takes plain numbers (integer nanoseconds, token counts) and returns
frozen values, so it can be tested with synthetic timestamps and reused by the gateway,
the bench client, the simulator and library users alike.
"""
