"""Rendezvous stores that are listening before their address is given out.

A port found free and closed again can be taken by another process (Ray's connections, an engine's
server, any ``connect``'s ephemeral port) before the store binds it: CI saw ``EADDRINUSE`` as a weight
bridge's store started. So the rank that will host a group's store binds it first, on a port the OS
picks, and keeps it (``host_store``); its ``host:port`` goes to the other ranks, which connect to a
socket already listening (``store_at``).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

_HOSTED: dict[str, dist.TCPStore] = {}  # address -> the store this process hosts there, until taken


def listening_store(host: str, world_size: int | None, timeout: timedelta) -> dist.TCPStore:
    """A store bound on ``host`` at a port the OS picks (``.port``), listening as it returns."""
    return dist.TCPStore(host, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)


def host_store(host: str, world_size: int, timeout: timedelta = timedelta(seconds=1800)) -> str:
    """Bind a store on ``host`` at a port the OS picks, held in this process; returns its address."""
    store = listening_store(host, world_size, timeout)
    address = f"{host}:{store.port}"
    _HOSTED[address] = store
    return address


def store_at(address: str, rank: int, world_size: int, timeout: timedelta = timedelta(seconds=1800)) -> dist.TCPStore:
    """The store at ``address`` for ``rank``: the one this process hosts there (``host_store``), else a
    client of it; rank 0 binds it itself where the address came from elsewhere (a caller's own port)."""
    if rank == 0 and (store := _HOSTED.pop(address, None)) is not None:
        return store
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)
