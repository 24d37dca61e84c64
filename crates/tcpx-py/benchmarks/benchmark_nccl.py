"""The NCCL twin of benchmark_tcpx_lab.py: torch.distributed send/recv between two ranks, same
sizes, same table, for the side-by-side (UCCL's benchmark_nccl.py).

    torchrun --nnodes=2 --nproc_per_node=1 --node-rank=R --master_addr=<A> benchmark_nccl.py --device gpu
    torchrun --standalone --nproc_per_node=2 benchmark_nccl.py        # one node, GPU0 and GPU1

NCCL refuses two ranks on one GPU of one host. On one node with fewer GPUs than ranks, both ranks
share GPU 0 as 2 NCCL hosts: each sets its own NCCL_HOSTID before NCCL starts, so NCCL sees two
nodes and carries the bytes over its network transport (NET/Socket over loopback with
`NCCL_SOCKET_IFNAME=lo`, or a net plugin); the header says so. With two GPUs,
`NCCL_NET=Socket NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1` makes one node go through NET/Socket as
two nodes would. `--device cpu` uses gloo instead.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    args = bc.common_args(__doc__.splitlines()[0]).parse_args()
    sizes = bc.parse_sizes(args.sizes)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    gpu_mode = args.device == "gpu"
    placement = "local pair"
    if gpu_mode:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        try:
            gpu, host_id, placement = bc.nccl_placement(
                torch.cuda.device_count(), int(os.environ.get("RANK", "0")), world,
                int(os.environ.get("LOCAL_WORLD_SIZE", str(world))), bc.gpu_index(args))
        except ValueError as e:
            sys.exit(f"benchmark_nccl.py: {e}")
        if host_id is not None:
            # Before NCCL reads it (at the communicator's creation).
            os.environ["NCCL_HOSTID"] = host_id
            args.local_gpu_idx = gpu
        torch.cuda.set_device(gpu)
        device = torch.device(f"cuda:{gpu}")
    else:
        device = torch.device("cpu")
    if gpu_mode:
        # The GPU named, not one guessed from the rank (ranks may share a GPU).
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    role = "recv" if rank == 0 else "send"
    buf = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    rows = []
    for n, size in enumerate(sizes):
        view = buf[:size]
        if role == "send":
            bc.fill(view, size, n)
        if gpu_mode:
            torch.cuda.synchronize(device)
        dist.barrier()
        times = []
        for it in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            if role == "send":
                dist.send(view, dst=0)
            else:
                dist.recv(view, src=1)
            if gpu_mode:
                torch.cuda.synchronize(device)
            if it >= args.warmup:
                times.append(time.perf_counter() - t0)
        wrong = bc.wrong_bytes(view, size, n) if role == "recv" else None
        rows.append(bc.summarize(size, role, times, wrong))
    gathered = [None, None]
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        args.num_cpus = int(os.environ.get("NCCL_NCHANNELS_PER_NET_PEER", "0")) or "default"
        header = bc.header("torch.distributed benchmark", placement, "rank 1", args,
                           "nccl" if gpu_mode else "gloo")
        try:
            bc.check_pair(gathered[1], gathered[0], sizes)
        except ValueError as e:
            sys.exit(f"torch.distributed benchmark: {e}")
        bc.print_pair(header, gathered[1], gathered[0], args.json)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
