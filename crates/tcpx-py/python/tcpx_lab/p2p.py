"""UCCL P2P Engine-compatible endpoints over tcpx-lab's transports.

::

    from tcpx_lab import p2p
    ep = p2p.Endpoint(local_gpu_idx=0, num_cpus=4)
    ok, conn_id = ep.connect("10.0.0.2", remote_gpu_idx=0)      # client: sends
    ok, mr_id = ep.reg(t.data_ptr(), t.numel() * t.element_size())
    ok = ep.send(conn_id, mr_id, t.data_ptr(), t.numel() * t.element_size())

    ok, ip, gpu, conn_id = ep.accept()                          # server: receives
    ok = ep.recv(conn_id, mr_id, r.data_ptr(), nbytes)

Signatures and return values are UCCL's:

- ``Endpoint(local_gpu_idx, num_cpus, *, transport="socket", port_base=None, plugin=None,
  ip=None, timeout_s=300.0)``; the endpoint listens on ``ip``, port ``port_base +
  local_gpu_idx`` (port_base 5500 unless given or set in ``TCPX_P2P_PORT_BASE``) from the first
  ``accept()`` or ``get_metadata()`` on, and drops connections there that do not speak its
  protocol. ``num_cpus`` channels stripe each message; give both sides the same. ``ip`` (or
  ``TCPX_P2P_IP``) is the address it listens on, data connections bind to and metadata
  advertises. ``timeout_s`` (more than 0, at most 86400) bounds ``connect``/``accept`` (Ctrl-C
  ends them sooner) and how long a transfer, blocking or polled, may go without progress (at
  most 30 s): ``poll_async`` then reports ``(False, False)``.
- ``connect(remote_ip_addr, remote_gpu_idx) -> (success, conn_id)``,
  ``connect_metadata(metadata) -> (success, conn_id)``, ``get_metadata() -> bytes``,
  ``Endpoint.parse_metadata(metadata) -> (ip, port, gpu_idx)``
- ``accept() -> (success, remote_ip_addr, remote_gpu_idx, conn_id)``
- ``reg(ptr, size) -> (success, mr_id)``, ``dereg(mr_id) -> success``
- ``send/recv(conn_id, mr_id, ptr, size) -> success``
- ``sendv/recvv(conn_id, mr_id_list, ptr_list, size_list, num_iovs) -> success``
- ``send_async/recv_async(conn_id, mr_id, ptr, size) -> (success, transfer_id)``,
  ``poll_async(transfer_id) -> (success, is_done)``

A connection carries data one way: the side that connected sends, the side that accepted
receives. Transfers on a connection complete in the order they were posted, and a send and the
receive matching it have the same size (for sendv/recvv: the same list of sizes).

Memory is borrowed, not copied: ``reg`` takes the address and size of memory you own (torch
``data_ptr()``, numpy ``ctypes.data``, a bytearray's address); CUDA device memory is recognised
through CUDA's pointer attributes, anything else must be host memory mapped readable and writable.
Keep it alive until ``dereg`` and until every transfer using it finished, and leave it alone while
a transfer uses it. GPU streams: finish the GPU work that writes a tensor before sending it
(``torch.cuda.synchronize()``); received bytes are in place when ``recv`` returns or
``poll_async`` says done. ``send``/``recv`` outside a registered region are refused.

Errors: misuse and setup failures raise (``KeyError`` for an unknown conn_id, mr_id or
transfer_id; ``ValueError`` for a range outside the region, a send on an accepted connection or
bad arguments; ``ConnectionError``/``TimeoutError`` when ``connect``/``accept`` find no peer;
``RuntimeError`` when a backend is not available). A transfer that fails once started (the peer
went away, no progress for 30 s, ...) returns ``success=False`` as UCCL does; ``last_error()``
says why, and that connection takes no more transfers. Every blocking call releases the GIL.
"""

from ._native import Endpoint

__all__ = ["Endpoint"]
