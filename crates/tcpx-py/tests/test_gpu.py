"""torch CUDA tensors between two processes on one GPU (GPU0 -> GPU0) over loopback, byte-exact.
Skipped, with the reason, where torch or a CUDA GPU is missing; TCPX_REQUIRE_GPU=1 makes that a
failure instead."""

import os

import pytest

import tcpx_lab

REQUIRE = os.environ.get("TCPX_REQUIRE_GPU") == "1"
try:
    import torch
except ImportError:
    torch = None

if not (torch is not None and torch.cuda.is_available() and tcpx_lab.cuda_available()):
    why = "no CUDA GPU here (torch and tcpx_lab both need to see one)"
    if REQUIRE:
        raise RuntimeError(f"TCPX_REQUIRE_GPU=1 but {why}")
    pytest.skip(why, allow_module_level=True)

import gpu_peers  # noqa: E402
from peers import free_port_base  # noqa: E402
from test_p2p import assert_sizes_arrived, two_sided  # noqa: E402

SIZES = [1, 4097, 1 << 20, 64 << 20 | 3]


@pytest.mark.parametrize("to_host", [False, True], ids=["cuda-to-cuda", "cuda-to-host"])
def test_cuda_tensors_arrive_byte_exact(to_host):
    msgs = two_sided(
        gpu_peers.cuda_receiver,
        (free_port_base(), 0, SIZES, to_host),
        gpu_peers.cuda_sender,
        (0, SIZES),
    )
    assert_sizes_arrived(msgs, SIZES)


def test_registering_a_cuda_tensor_is_detected_and_bounded():
    ep = tcpx_lab.p2p.Endpoint(0, 1, ip="127.0.0.1", port_base=free_port_base())
    t = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda:0")
    ok, mr = ep.reg(t.data_ptr(), t.numel())
    assert ok
    # Far past the end of the allocation: refused by the driver's address range, not a crash.
    with pytest.raises(ValueError):
        ep.reg(t.data_ptr(), 1 << 40)
