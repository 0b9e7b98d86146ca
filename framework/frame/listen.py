"""The listening socket of ``frame serve``, bound before anything heavy is imported or loaded.

It lives outside ``frame.server`` (whose package imports the engine, and so torch) so that a port in use is one
sentence within a second or two of the command, not after the model loaded.
"""

from __future__ import annotations

import errno
import socket

from frame.errors import ConfigError


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening address, bound now (as uvicorn binds it), so a port in use is one sentence before the engine
    loads rather than after; connections are refused until the server starts listening on it."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise ConfigError(f"--host {host} is not an address of this machine ({err.strerror}); pass an IP address "
                          "or a resolvable name.", param="host") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ConfigError(f"Port {port} on {host} is already in use; stop what holds it or pass another --port.",
                              param="port") from None
        raise ConfigError(f"Cannot listen on {host}:{port} ({err.strerror}); pass another --host or --port.",
                          param="port") from None
    return sock
