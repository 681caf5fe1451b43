#!/usr/bin/env python3
"""A TCP relay on 127.0.0.1 that passes what the server sends at RATE
bytes a second: a registry slow enough to stop in the middle of a layer.
usage: throttle.py LISTEN_PORT TARGET_PORT RATE"""
import asyncio
import sys

listen, target, rate = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
CHUNK = 16 * 1024


async def pipe(reader, writer, slow):
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
            if slow:
                await asyncio.sleep(len(data) / rate)
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def relay(client_reader, client_writer):
    server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target)
    await asyncio.gather(
        pipe(client_reader, server_writer, False),
        pipe(server_reader, client_writer, True),
    )


async def main():
    server = await asyncio.start_server(relay, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


asyncio.run(main())
