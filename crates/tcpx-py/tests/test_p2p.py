"""tcpx_lab.p2p.Endpoint between two processes over loopback (CPU memory): byte-exact transfers,
vectored and asynchronous ones, and what bad input gets (an exception or success=False, as the
p2p module's docs say)."""

import multiprocessing as mp

import numpy as np
import pytest

import peers
from peers import free_port_base
import tcpx_lab
from tcpx_lab import p2p

CTX = mp.get_context("spawn")
WAIT_S = 120


def expect(q, tag):
    msg = q.get(timeout=WAIT_S)
    assert msg[0] == tag, msg
    return msg[1:]


def join(*procs):
    for p in procs:
        p.join(WAIT_S)
        if p.is_alive():
            p.kill()
            p.join()
            pytest.fail(f"{p.name} did not finish within {WAIT_S} s")
        assert p.exitcode == 0, f"{p.name} exited with {p.exitcode}"


def two_sided(recv_fn, recv_args, send_fn, send_args):
    """Runs the receiver, hands its metadata to the sender, returns the receiver's messages."""
    q = CTX.Queue()
    r = CTX.Process(target=recv_fn, args=(*recv_args, q), name="receiver")
    r.start()
    try:
        (meta,) = expect(q, "meta")
        s = CTX.Process(target=send_fn, args=(meta, *send_args), name="sender")
        s.start()
        msgs = [q.get(timeout=WAIT_S)]
        while msgs[-1][0] != "done":
            msgs.append(q.get(timeout=WAIT_S))
        join(s, r)
        return msgs
    finally:
        if r.is_alive():
            r.kill()


def assert_sizes_arrived(msgs, sizes):
    """The receiver's last message reports every size, in order, received and byte-exact."""
    _, results, err = msgs[-1]
    assert [r[0] for r in results] == sizes
    for size, ok, bad in results:
        assert ok, f"{size} B: recv failed: {err}"
        assert bad == 0, f"{size} B: {bad} bytes differ"


SIZES = [1, 3, 4096, 65_537, 1 << 20, 3 * (1 << 20) + 5, 64 << 20]


@pytest.mark.parametrize("use_bytearray", [False, True])
def test_sizes_1_byte_to_64_mib_arrive_byte_exact(use_bytearray):
    msgs = two_sided(
        peers.receiver, (free_port_base(), SIZES, use_bytearray), peers.sender, (SIZES,)
    )
    accepted = msgs[0]
    assert accepted == ("accepted", True, "127.0.0.1", 0)
    assert_sizes_arrived(msgs, SIZES)


def test_sendv_recvv_place_each_part_and_nothing_else():
    # Parts of different sizes at offsets inside two registered regions, out of order.
    layout = [(1, 100, 5000), (0, 0, 1), (0, 4096, 300_000), (1, 700_000, 1 << 18)]
    msgs = two_sided(peers.vector_receiver, (free_port_base(), layout), peers.vector_sender, (layout,))
    _, ok, bad = msgs[-1]
    assert ok
    assert bad == [0, 0]


def test_async_transfers_complete_through_poll_in_order():
    sizes = [1 << 20, 17, 5 << 20, 4096]
    msgs = two_sided(peers.async_receiver, (free_port_base(), sizes), peers.async_sender, (sizes,))
    _, polls, bad = msgs[-1]
    assert polls >= len(sizes)
    assert bad == [0] * len(sizes)


def test_accept_reports_the_peer_and_a_vanished_peer_fails_the_transfer():
    base = free_port_base()
    ep = p2p.Endpoint(0, 1, ip=peers.LOOPBACK, port_base=base, timeout_s=60)
    assert ep.port == base
    q = CTX.Queue()
    c = CTX.Process(target=peers.quitter, args=(base, 5, q), name="quitter")
    c.start()
    ok, ip, gpu, conn = ep.accept()
    assert (ok, ip, gpu) == (True, "127.0.0.1", 5)
    assert expect(q, "connected")[0] is True
    join(c)
    buf = np.zeros(1 << 20, dtype=np.uint8)
    ok, mr = ep.reg(buf.ctypes.data, buf.nbytes)
    # The peer exited without sending: the transfer fails, reported as success=False.
    assert ep.recv(conn, mr, buf.ctypes.data, buf.nbytes) is False
    assert ep.last_error()
    # The connection takes no more transfers, and says why.
    assert ep.recv(conn, mr, buf.ctypes.data, 10) is False
    assert "failed earlier" in ep.last_error()
    ok, tid = ep.recv_async(conn, mr, buf.ctypes.data, 10)
    assert ok is False


@pytest.mark.parametrize("ring", ["1K", "256K", "banana", "2G"])
def test_a_staging_ring_the_endpoint_cannot_use_is_refused_naming_the_variable(monkeypatch, ring):
    # Below the knob's range, shorter than the endpoint's 512 KiB chunk, not a size, above 1G.
    monkeypatch.setenv("TCPX_STAGING_RING", ring)
    with pytest.raises(ValueError, match="TCPX_STAGING_RING=" + ring):
        p2p.Endpoint(0, 1, ip=peers.LOOPBACK, port_base=free_port_base(), timeout_s=1)
    monkeypatch.setenv("TCPX_STAGING_RING", "auto")
    p2p.Endpoint(0, 1, ip=peers.LOOPBACK, port_base=free_port_base(), timeout_s=1)


def test_bad_input_raises_and_nothing_crashes():
    ep = p2p.Endpoint(0, 1, ip=peers.LOOPBACK, port_base=free_port_base(), timeout_s=1)
    buf = np.zeros(4096, dtype=np.uint8)
    ok, mr = ep.reg(buf.ctypes.data, buf.nbytes)
    assert ok
    # reg: null, empty, unmapped and read-only memory are refused before anything is touched.
    with pytest.raises(ValueError):
        ep.reg(0, 16)
    with pytest.raises(ValueError):
        ep.reg(buf.ctypes.data, 0)
    with pytest.raises(ValueError, match="not mapped"):
        ep.reg(0x1000, 64)
    with pytest.raises(ValueError, match="not mapped|permissions"):
        ep.reg(buf.ctypes.data, 1 << 40)
    # Connecting to a port nobody listens on: ConnectionError or TimeoutError after timeout_s.
    closed = free_port_base()
    with pytest.raises((ConnectionError, TimeoutError)):
        ep.connect(peers.LOOPBACK, 0, remote_port=closed)
    # Unknown ids.
    with pytest.raises(KeyError, match="conn_id"):
        ep.send(12345, mr, buf.ctypes.data, 16)
    with pytest.raises(KeyError, match="transfer_id"):
        ep.poll_async(999)
    with pytest.raises(KeyError):
        ep.dereg(999)
    with pytest.raises(ValueError, match="metadata"):
        ep.connect_metadata(b"short")
    with pytest.raises(ValueError, match="not an IP"):
        ep.connect("not-an-ip", 0)
    with pytest.raises(ValueError):
        p2p.Endpoint(0, 1, transport="carrier-pigeon")
    with pytest.raises(ValueError):
        p2p.Endpoint(0, 0)


def test_ranges_outside_the_registered_region_are_refused():
    base = free_port_base()
    server = p2p.Endpoint(0, 1, ip=peers.LOOPBACK, port_base=base, timeout_s=30)
    meta = server.get_metadata()
    assert p2p.Endpoint.parse_metadata(meta) == ("127.0.0.1", base, 0)
    q = CTX.Queue()
    c = CTX.Process(target=peers.quitter, args=(base, 0, q), name="quitter")
    c.start()
    ok, _, _, conn = server.accept()
    expect(q, "connected")
    join(c)
    buf = np.zeros(8192, dtype=np.uint8)
    ok, mr = server.reg(buf.ctypes.data + 4096, 4096)
    p = buf.ctypes.data
    with pytest.raises(ValueError, match="not inside registered region"):
        server.recv(conn, mr, p, 16)  # before the region
    with pytest.raises(ValueError, match="not inside registered region"):
        server.recv(conn, mr, p + 4096, 4097)  # one byte past its end
    with pytest.raises(ValueError, match="at least 1 byte"):
        server.recv(conn, mr, p + 4096, 0)
    with pytest.raises(KeyError, match="mr_id"):
        server.recv(conn, mr + 100, p + 4096, 16)
    with pytest.raises(ValueError, match="accepted"):
        server.send(conn, mr, p + 4096, 16)  # an accepted connection receives
    with pytest.raises(ValueError, match="num_iovs"):
        server.recvv(conn, [mr, mr], [p + 4096], [16], 2)
    assert server.dereg(mr) is True
    with pytest.raises(KeyError, match="mr_id"):
        server.recv(conn, mr, p + 4096, 16)


def test_chunk_and_window_are_the_auto_rules():
    # The socket backend over one socket per channel: the rule's row in docs/PERFORMANCE.md
    # ("Chunk and window") that tcpx-run bench takes too: 512K x 16 for host memory, 8M x 16
    # for GPU memory staged through host (an endpoint given a GPU it can open).
    ep = p2p.Endpoint(0, 2, ip=peers.LOOPBACK, port_base=free_port_base(), timeout_s=1)
    staged = tcpx_lab.cuda_available()
    assert (ep.chunk, ep.window) == ((8 << 20, 16) if staged else (512 << 10, 16))
