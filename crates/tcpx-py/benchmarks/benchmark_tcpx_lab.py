"""Point-to-point bandwidth of tcpx_lab.p2p.Endpoint, in the shape of UCCL's benchmark_uccl.py.

Two ranks, the receiver (rank 0 / --role server) and the sender (rank 1 / --role client):

    torchrun --nnodes=2 --nproc_per_node=1 --node-rank=0 --master_addr=<A> benchmark_tcpx_lab.py --device gpu
    torchrun --nnodes=2 --nproc_per_node=1 --node-rank=1 --master_addr=<A> benchmark_tcpx_lab.py --device gpu
    torchrun --standalone --nproc_per_node=2 benchmark_tcpx_lab.py --local-gpu-idx 0   # one node, GPU0 -> GPU0
    python benchmark_tcpx_lab.py --role server --device cpu                             # without torchrun
    python benchmark_tcpx_lab.py --role client --remote-ip <A> --device cpu

Under torchrun the endpoints exchange metadata through torch.distributed (gloo) and rank 0 prints
both sides' rows; with --role each side prints its own. The table is `tcpx-run bench`'s.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

import torch  # noqa: E402

from tcpx_lab import p2p  # noqa: E402


def main():
    p = bc.common_args(__doc__.splitlines()[0])
    p.add_argument("--role", choices=["server", "client"], default=None)
    p.add_argument("--remote-ip", default=None)
    p.add_argument("--ip", default=None, help="this side's address (default TCPX_P2P_IP or the host name's)")
    p.add_argument("--transport", default="socket")
    p.add_argument("--port-base", type=int, default=None)
    args = p.parse_args()
    sizes = bc.parse_sizes(args.sizes)
    gpu = bc.gpu_index(args)

    dist = None
    if args.role is None:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_world_size() != 2:
            sys.exit("run with exactly two ranks (torchrun ... --nproc_per_node=1 on two nodes, or 2 on one)")
        role = "server" if dist.get_rank() == 0 else "client"
    else:
        role = args.role
    ip = args.ip
    if ip is None and dist is not None and os.environ.get("MASTER_ADDR") in ("127.0.0.1", "localhost"):
        ip = "127.0.0.1"
    ep = p2p.Endpoint(gpu, args.num_cpus, transport=args.transport, port_base=args.port_base, ip=ip)

    if role == "server":
        meta = ep.get_metadata()
        if dist is not None:
            dist.broadcast_object_list([meta], src=0)
        ok, peer_ip, peer_gpu, conn = ep.accept()
        peer = f"{peer_ip} gpu {peer_gpu}"
    else:
        if dist is not None:
            box = [None]
            dist.broadcast_object_list(box, src=0)
            ok, conn = ep.connect_metadata(box[0])
            peer = "{}:{}".format(*p2p.Endpoint.parse_metadata(box[0])[:2])
        else:
            if not args.remote_ip:
                sys.exit("--role client needs --remote-ip")
            ok, conn = ep.connect(args.remote_ip, gpu)
            peer = args.remote_ip
    assert ok

    device = torch.device(f"cuda:{gpu}") if args.device == "gpu" else torch.device("cpu")
    buf = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    ok, mr = ep.reg(buf.data_ptr(), buf.numel())
    assert ok
    rows = []
    for n, size in enumerate(sizes):
        if role == "client":
            bc.fill(buf[:size], size, n)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if dist is not None:
            dist.barrier()
        times = []
        for it in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            if role == "client":
                ok = ep.send(conn, mr, buf.data_ptr(), size)
            else:
                ok = ep.recv(conn, mr, buf.data_ptr(), size)
            if not ok:
                sys.exit(f"{role}: transfer of {size} B failed: {ep.last_error()}")
            if it >= args.warmup:
                times.append(time.perf_counter() - t0)
        wrong = bc.wrong_bytes(buf[:size], size, n) if role == "server" else None
        rows.append(bc.summarize(size, "send" if role == "client" else "recv", times, wrong))

    if dist is not None:
        gathered = [None, None]
        dist.all_gather_object(gathered, rows)
        if dist.get_rank() == 0:
            header = bc.header("tcpx_lab benchmark", "local pair", peer, args, ep.transport)
            try:
                bc.check_pair(gathered[1], gathered[0], sizes)
            except ValueError as e:
                sys.exit(f"tcpx_lab benchmark: {e}")
            bc.print_pair(header, gathered[1], gathered[0], args.json)
        dist.destroy_process_group()
    else:
        print(bc.header("tcpx_lab benchmark", role, peer, args, ep.transport))
        for r in rows:
            print(bc.row(r))
        print(bc.footer(rows))
        bc.write_json(args.json, rows)


if __name__ == "__main__":
    main()
