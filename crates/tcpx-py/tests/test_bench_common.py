"""The benchmarks' shared helpers that need no GPU: where NCCL ranks go (one GPU as 2 NCCL
hosts when a node has fewer GPUs than ranks), with the same host ids as the Rust side, and the
two-rank table both benchmarks print."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_common as bc  # noqa: E402


def test_one_gpu_makes_two_nccl_hosts_with_distinct_ids():
    placed = [bc.nccl_placement(1, r, 2, 2, r) for r in range(2)]
    assert [p[0] for p in placed] == [0, 0]
    assert [p[1] for p in placed] == ["tcpx-lab-host0", "tcpx-lab-host1"]
    assert placed[0][2] == ("1 GPU as 2 NCCL hosts (GPU 0, NCCL_HOSTID tcpx-lab-host0 and "
                            "tcpx-lab-host1)")
    assert placed[0][2] == placed[1][2]


def test_enough_gpus_or_several_nodes_keep_nccls_own_host():
    # Two GPUs on one node: a GPU per rank, NCCL_HOSTID untouched.
    assert bc.nccl_placement(2, 1, 2, 2, 1) == (1, None, "GPU 1 of rank 1")
    # Two nodes of one rank each: each node's own GPU and host.
    assert bc.nccl_placement(1, 1, 2, 1, 0) == (0, None, "GPU 0 of rank 1")


def test_a_gpu_asked_for_that_exists_is_shared_and_no_gpu_is_refused():
    assert bc.nccl_placement(2, 0, 4, 4, 1)[0] == 1
    assert bc.nccl_placement(1, 1, 2, 2, 5)[0] == 0
    with pytest.raises(ValueError, match="no GPU"):
        bc.nccl_placement(0, 0, 2, 2, 0)


def test_a_pair_prints_a_row_per_size_with_its_sender_and_writes_both_sides(tmp_path, capsys):
    send = [bc.summarize(n, "send", [1e-3, 2e-3], None) for n in (4096, 1 << 20)]
    recv = [bc.summarize(n, "recv", [2e-3, 3e-3], 0) for n in (4096, 1 << 20)]
    out = tmp_path / "rows.json"
    bc.print_pair("# the header", send, recv, str(out))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# the header"
    assert lines[1:3] == [bc.row(recv[0], send[0]), bc.row(recv[1], send[1])]
    assert lines[3:] == bc.footer(recv).splitlines()
    assert json.loads(out.read_text()) == [send[0], recv[0], send[1], recv[1]]
    # Without a path nothing is written.
    bc.print_pair("# the header", send, recv, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.json"]


def test_impossible_figures_from_a_rank_are_refused_naming_it():
    """Issue 43 item 4: the rows a rank reports cross a process or host boundary. Real rows pass;
    a time rewritten to 1e308, -0.5 or 1e-300 s, a rate of 1e294 or -5 GB/s, a size other than
    asked, wrong bytes beyond the size or a missing row is refused naming the rank."""
    sizes = [4096, 1 << 20]
    send = [bc.summarize(n, "send", [1e-3, 2e-3], None) for n in sizes]
    recv = [bc.summarize(n, "recv", [2e-3, 3e-3], 0) for n in sizes]
    bc.check_pair(send, recv, sizes)

    def with_(rows, i, **changes):
        out = [dict(r) for r in rows]
        out[i].update(changes)
        return out

    for us in [1e308 * 1e6, -0.5e6, 1e-300 * 1e6, float("nan"), 0.0]:
        with pytest.raises(ValueError, match=r"^rank 1 \(the sender\) reported impossible figures: avg_us"):
            bc.check_pair(with_(send, 1, avg_us=us), recv, sizes)
    for gbs in [1.05e294, -5.0, float("inf")]:
        with pytest.raises(ValueError, match=r"^rank 0 \(the receiver\) reported impossible figures: algbw"):
            bc.check_pair(send, with_(recv, 0, algbw_gbs=gbs), sizes)
    with pytest.raises(ValueError, match="rank 1 .* a row of 2048 B where 4096 B were asked"):
        bc.check_pair(with_(send, 0, size=2048), recv, sizes)
    with pytest.raises(ValueError, match="rank 0 .* wrong bytes"):
        bc.check_pair(send, with_(recv, 1, wrong=(1 << 20) + 1), sizes)
    with pytest.raises(ValueError, match="rank 1 .* 1 rows for the 2 sizes asked"):
        bc.check_pair(send[:1], recv, sizes)
    # 1 MiB in 0.01 us would be 100 TB/s.
    with pytest.raises(ValueError, match="faster than any link"):
        bc.check_pair(with_(send, 1, avg_us=0.01, p50_us=0.01, p99_us=0.01), recv, sizes)
