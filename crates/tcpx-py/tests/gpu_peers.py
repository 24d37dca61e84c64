"""Processes of the GPU test: torch CUDA tensors on one GPU, sent from one process to another."""

import numpy as np
import torch

from tcpx_lab import p2p

from peers import LOOPBACK, pattern


def cuda_receiver(port_base, gpu, sizes, to_host, q):
    """Receives each size into a fresh CUDA tensor (or, with `to_host`, a numpy array) and
    reports the number of wrong bytes per size."""
    ep = p2p.Endpoint(gpu, 2, ip=LOOPBACK, port_base=port_base, timeout_s=60)
    q.put(("meta", ep.get_metadata()))
    ok, _, _, conn = ep.accept()
    results = []
    for n, size in enumerate(sizes):
        if to_host:
            buf = np.zeros(size, dtype=np.uint8)
            ptr = buf.ctypes.data
        else:
            buf = torch.zeros(size, dtype=torch.uint8, device=f"cuda:{gpu}")
            torch.cuda.synchronize()
            ptr = buf.data_ptr()
        ok, mr = ep.reg(ptr, size)
        ok = ep.recv(conn, mr, ptr, size)
        got = buf if to_host else buf.cpu().numpy()
        results.append((size, ok, int(np.count_nonzero(got != pattern(size, n)))))
    q.put(("done", results, ep.last_error()))


def cuda_sender(meta, gpu, sizes):
    ep = p2p.Endpoint(gpu, 2, ip=LOOPBACK, timeout_s=60)
    ok, conn = ep.connect_metadata(meta)
    assert ok
    for n, size in enumerate(sizes):
        t = torch.from_numpy(pattern(size, n)).to(f"cuda:{gpu}")
        # An offset view: the pointer lies inside a larger caching-allocator block.
        big = torch.zeros(size + 1000, dtype=torch.uint8, device=f"cuda:{gpu}")
        big[1000:].copy_(t)
        torch.cuda.synchronize()
        ptr = big.data_ptr() + 1000
        ok, mr = ep.reg(ptr, size)
        assert ok
        assert ep.send(conn, mr, ptr, size), ep.last_error()
