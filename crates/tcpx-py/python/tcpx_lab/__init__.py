"""tcpx_lab: tcpx-lab from Python.

- ``tcpx_lab.p2p.Endpoint``: the UCCL P2P Engine's endpoint API (connect/accept/reg/send/recv,
  vectored and asynchronous variants, metadata) over tcpx-lab's transports, on torch tensors and
  numpy arrays in place.
- ``tcpx_lab.run_plan(path, **opts)``: runs an experiment plan and returns its report as a dict.

Importing needs neither CUDA nor hwloc; CUDA is looked for when GPU memory is registered.
"""

from ._native import __version__, cuda_available
from . import p2p
from .plan import run_plan

__all__ = ["__version__", "cuda_available", "p2p", "run_plan"]
