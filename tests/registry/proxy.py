#!/usr/bin/env python3
"""A TCP relay on 127.0.0.1 in front of a registry that counts what the
client asks and what the server sends, and can shape the traffic.

usage: proxy.py LISTEN_PORT TARGET_PORT STATS_FILE [--rate BYTES_PER_S] [--latency MS]

STATS_FILE holds {"requests": N, "bytes": M} (HTTP requests seen, bytes
sent to the client), rewritten as they change; a relay started again over
the same file counts on from what it holds. --rate caps what the server
sends over all connections together, as one link does; --latency delays
each request on its way to the server."""
import argparse
import asyncio
import json
import os

p = argparse.ArgumentParser()
p.add_argument("listen", type=int)
p.add_argument("target", type=int)
p.add_argument("stats")
p.add_argument("--rate", type=float, default=0)
p.add_argument("--latency", type=float, default=0)
args = p.parse_args()
try:
    with open(args.stats) as f:
        stats = json.load(f)
except FileNotFoundError:
    stats = {"requests": 0, "bytes": 0}
CHUNK = 64 * 1024
# When the shaped link is next free (the event loop's clock): every
# connection's chunks take their turn on it.
link_free = 0.0
METHODS = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"PATCH ", b"DELETE ")


def save():
    tmp = args.stats + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stats, f)
    os.replace(tmp, args.stats)


async def upstream(reader, writer):
    try:
        while data := await reader.read(CHUNK):
            # A request begins a chunk of its own on a keep-alive connection
            # once the last answer is read: counting request lines is enough.
            if data.startswith(METHODS):
                stats["requests"] += 1
                save()
                if args.latency:
                    await asyncio.sleep(args.latency / 1000)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def downstream(reader, writer):
    global link_free
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(CHUNK):
            if args.rate:
                now = loop.time()
                link_free = max(now, link_free) + len(data) / args.rate
                await asyncio.sleep(link_free - now)
            writer.write(data)
            await writer.drain()
            stats["bytes"] += len(data)
            save()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def relay(client_reader, client_writer):
    try:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", args.target)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(
        upstream(client_reader, server_writer),
        downstream(server_reader, client_writer),
    )


async def main():
    save()
    server = await asyncio.start_server(relay, "127.0.0.1", args.listen)
    async with server:
        await server.serve_forever()


asyncio.run(main())
