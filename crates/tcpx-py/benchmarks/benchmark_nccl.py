"""The NCCL twin of benchmark_tcpx_lab.py: torch.distributed send/recv between two ranks, same
sizes, same table, for the side-by-side (UCCL's benchmark_nccl.py).

    torchrun --nnodes=2 --nproc_per_node=1 --node-rank=R --master_addr=<A> benchmark_nccl.py --device gpu
    torchrun --standalone --nproc_per_node=2 benchmark_nccl.py        # one node, GPU0 and GPU1

NCCL needs one GPU per rank: on one node that takes two GPUs (NCCL refuses two ranks on one GPU).
`NCCL_NET=Socket NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1` makes one node go through NET/Socket as
two nodes would. `--device cpu` uses gloo instead.
"""

import json
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
    if gpu_mode:
        gpu = bc.gpu_index(args)
        if torch.cuda.device_count() < 2 and os.environ.get("WORLD_SIZE") == os.environ.get("LOCAL_WORLD_SIZE"):
            sys.exit("benchmark_nccl.py on one node needs two GPUs (one per rank): N/A here")
        torch.cuda.set_device(gpu)
        device = torch.device(f"cuda:{gpu}")
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if gpu_mode else "gloo")
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
        print(bc.header("torch.distributed benchmark", "local pair", "rank 1", args,
                        "nccl" if gpu_mode else "gloo"))
        both = []
        for s, r in zip(gathered[1], gathered[0]):
            print(bc.row(r, s))
            both += [s, r]
        print(bc.footer(both))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(both, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
