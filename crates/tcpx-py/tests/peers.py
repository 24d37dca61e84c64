"""The other process of each two-process test (started with multiprocessing's spawn), the
shared pattern both sides compute, and a free loopback port for the tests."""

import ctypes
import socket

import numpy as np

from tcpx_lab import p2p

LOOPBACK = "127.0.0.1"


def free_port_base():
    """A port nobody listens on now (the endpoint for GPU 0 takes port_base + 0)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def pattern(size, seed):
    """Deterministic bytes that differ per size and seed (a shifted or dropped byte shows)."""
    i = np.arange(size, dtype=np.uint64)
    return ((i * np.uint64(2654435761) + np.uint64(seed * 977 + size)) >> np.uint64(7)).astype(
        np.uint8
    )


def bytearray_ptr(ba):
    return ctypes.addressof((ctypes.c_char * len(ba)).from_buffer(ba))


def receiver(port_base, sizes, use_bytearray, q, num_cpus=2):
    """Accepts one connection, receives each size in turn into a fresh buffer, reports which
    sizes arrived intact as (size, ok, mismatches). With `use_bytearray` every other buffer is a
    bytearray instead of a numpy array."""
    ep = p2p.Endpoint(0, num_cpus, ip=LOOPBACK, port_base=port_base, timeout_s=60)
    q.put(("meta", ep.get_metadata()))
    ok, ip, gpu, conn = ep.accept()
    q.put(("accepted", ok, ip, gpu))
    results = []
    for n, size in enumerate(sizes):
        if use_bytearray and n % 2 == 1:
            ba = bytearray(size)
            ptr = bytearray_ptr(ba)
            view = lambda: np.frombuffer(ba, dtype=np.uint8)  # noqa: E731
        else:
            arr = np.zeros(size, dtype=np.uint8)
            ptr = arr.ctypes.data
            view = lambda: arr  # noqa: E731
        ok, mr = ep.reg(ptr, size)
        assert ok
        ok = ep.recv(conn, mr, ptr, size)
        got = view()
        bad = int(np.count_nonzero(got != pattern(size, n))) if ok else -1
        results.append((size, ok, bad))
    q.put(("done", results, ep.last_error()))


def sender(meta, sizes, num_cpus=2):
    ep = p2p.Endpoint(0, num_cpus, ip=LOOPBACK, timeout_s=60)
    ok, conn = ep.connect_metadata(meta)
    assert ok
    for n, size in enumerate(sizes):
        data = pattern(size, n)
        ok, mr = ep.reg(data.ctypes.data, size)
        assert ok
        assert ep.send(conn, mr, data.ctypes.data, size), ep.last_error()


def vector_receiver(port_base, layout, q):
    """Receives one recvv of `layout` [(region, offset, size)] over two regions."""
    ep = p2p.Endpoint(0, 2, ip=LOOPBACK, port_base=port_base, timeout_s=60)
    q.put(("meta", ep.get_metadata()))
    ok, _, _, conn = ep.accept()
    regions = [np.zeros(1 << 20, dtype=np.uint8), np.zeros(1 << 20, dtype=np.uint8)]
    mrs = [ep.reg(r.ctypes.data, r.nbytes)[1] for r in regions]
    ok = ep.recvv(
        conn,
        [mrs[r] for r, _, _ in layout],
        [regions[r].ctypes.data + off for r, off, _ in layout],
        [size for _, _, size in layout],
        len(layout),
    )
    # Whole regions compared: each part in place, every other byte still zero.
    expected = [np.zeros_like(r) for r in regions]
    for n, (r, off, size) in enumerate(layout):
        expected[r][off : off + size] = pattern(size, n)
    bad = [int(np.count_nonzero(a != e)) for a, e in zip(regions, expected)]
    q.put(("done", ok, bad))


def vector_sender(meta, layout):
    ep = p2p.Endpoint(0, 2, ip=LOOPBACK, timeout_s=60)
    ok, conn = ep.connect_metadata(meta)
    parts = [pattern(size, n) for n, (_, _, size) in enumerate(layout)]
    mrs = [ep.reg(p.ctypes.data, p.nbytes)[1] for p in parts]
    assert ep.sendv(
        conn, mrs, [p.ctypes.data for p in parts], [p.nbytes for p in parts], len(parts)
    ), ep.last_error()


def async_receiver(port_base, sizes, q):
    """Posts every receive at once with recv_async, then polls them all to completion."""
    ep = p2p.Endpoint(0, 2, ip=LOOPBACK, port_base=port_base, timeout_s=60)
    q.put(("meta", ep.get_metadata()))
    ok, _, _, conn = ep.accept()
    bufs = [np.zeros(s, dtype=np.uint8) for s in sizes]
    ids = post_all(ep, ep.recv_async, conn, bufs)
    polls = poll_all(ep, ids)
    bad = [int(np.count_nonzero(b != pattern(b.nbytes, n))) for n, b in enumerate(bufs)]
    q.put(("done", polls, bad))


def post_all(ep, post, conn, bufs):
    """Registers each buffer and posts it whole with `post` (`ep.recv_async` or
    `ep.send_async`); the transfer ids, in order."""
    ids = []
    for b in bufs:
        ok, mr = ep.reg(b.ctypes.data, b.nbytes)
        ok, tid = post(conn, mr, b.ctypes.data, b.nbytes)
        assert ok
        ids.append(tid)
    return ids


def poll_all(ep, ids, limit_s=60):
    import time

    pending = set(ids)
    polls = 0
    deadline = time.monotonic() + limit_s
    while pending and time.monotonic() < deadline:
        for tid in list(pending):
            ok, done = ep.poll_async(tid)
            assert ok, ep.last_error()
            polls += 1
            if done:
                pending.discard(tid)
    assert not pending, f"transfers {sorted(pending)} not done within {limit_s} s"
    return polls


def async_sender(meta, sizes):
    ep = p2p.Endpoint(0, 2, ip=LOOPBACK, timeout_s=60)
    ok, conn = ep.connect_metadata(meta)
    data = [pattern(s, n) for n, s in enumerate(sizes)]
    poll_all(ep, post_all(ep, ep.send_async, conn, data))


def quitter(port_base, gpu, q):
    """Connects (announcing GPU `gpu`), tells the test, then exits without sending."""
    ep = p2p.Endpoint(gpu, 1, ip=LOOPBACK, timeout_s=60)
    ok, conn = ep.connect(LOOPBACK, 0, remote_port=port_base)
    q.put(("connected", ok, conn))


def connect_on_cue(port_base, gpu, go, q):
    """Makes its endpoint, says it is ready, and connects (announcing GPU `gpu`) once `go` is
    set, then exits without sending."""
    ep = p2p.Endpoint(gpu, 1, ip=LOOPBACK, timeout_s=60)
    q.put(("ready",))
    if go.wait(60):
        ok, conn = ep.connect(LOOPBACK, 0, remote_port=port_base)
        q.put(("connected", ok, conn))


def silent_sender(meta, q, release):
    """Connects and sends nothing until `release` is set (a peer that went quiet)."""
    ep = p2p.Endpoint(0, 1, ip=LOOPBACK, timeout_s=60)
    ok, conn = ep.connect_metadata(meta)
    q.put(("connected", ok))
    release.wait(120)
