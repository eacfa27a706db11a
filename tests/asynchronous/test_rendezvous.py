"""The address of a rendezvous is listening before it is given out: no other process can take its port
between the moment rank 0 names it and the moment the group forms (CI saw ``EADDRINUSE`` there, when
the address was a port found free and closed again)."""

import errno
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rlcore.asynchronous.bridge import WeightBridge
from rlcore.runtime.platforms import CpuPlatform
from rlcore.runtime.rendezvous import host_store, store_at
from rlcore.workers.hybrid import HybridWorker


def take_port(address: str) -> socket.socket | None:
    """Another process's bind of the address's port: the socket if it got the port, None if refused."""
    host, port = address.rsplit(":", 1)
    thief = socket.socket()
    try:
        thief.bind((host, int(port)))
    except OSError as exc:
        thief.close()
        assert exc.errno == errno.EADDRINUSE, exc
        return None
    return thief


def test_the_address_a_worker_gives_out_cannot_be_taken_and_its_bridge_forms():
    worker = HybridWorker.__new__(HybridWorker)  # only the method that names the address
    address = worker.rendezvous_address(2)
    thief = take_port(address)
    try:
        assert thief is None, f"{address} was free to take before the bridge formed"
    finally:
        if thief is not None:
            thief.close()

    platform = CpuPlatform()
    with ThreadPoolExecutor(max_workers=1) as pool:  # both ends in this process, as in the colocated tests
        sender = pool.submit(WeightBridge, address, 0, 2, platform, torch.device("cpu"), 60, "host")
        receiver = WeightBridge(address, 1, 2, platform, torch.device("cpu"), 60, "host")
        sender = sender.result(timeout=60)
        weights = [("w", torch.arange(6.0).reshape(2, 3))]
        sent = pool.submit(sender.send, iter([weights]))
        (bucket,) = list(receiver.receive())
        assert sent.result(timeout=60) == 24
    assert bucket[0][0] == "w" and torch.equal(bucket[0][1], weights[0][1])


def test_a_hosted_store_is_taken_by_rank_0_only_and_once():
    address = host_store("127.0.0.1", 2)
    client = store_at(address, 1, 2)  # rank 1 connects to it, leaving it to rank 0
    hosted = store_at(address, 0, 2)
    client.set("key", "value")
    assert hosted.get("key") == b"value" and hosted.port == int(address.rsplit(":", 1)[1])
    with pytest.raises(Exception, match="(?i)address already in use|EADDRINUSE|bind"):
        store_at(address, 0, 2)  # taken already: rank 0 would bind it itself, and cannot
