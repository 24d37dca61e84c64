"""tcpx_lab.run_plan: a small plan run by the real tcpx-run binary over loopback, its report
returned as a dict. Needs tcpx-run: $TCPX_RUN (CI sets it to the one `cargo test` built), else
target/debug or target/release of this checkout; skipped, with the reason, when none is built."""

import os
import shutil
import tomllib
from pathlib import Path

import pytest

import tcpx_lab

REPO = Path(__file__).resolve().parents[3]


def tcpx_run():
    exe = os.environ.get("TCPX_RUN")
    if exe:
        assert Path(exe).is_file(), f"TCPX_RUN={exe} does not exist"
        return exe
    for profile in ("debug", "release"):
        p = REPO / "target" / profile / "tcpx-run"
        if p.is_file():
            return str(p)
    pytest.skip("no tcpx-run built (cargo build -p tcpx-run, or set TCPX_RUN)")


PLAN = """let b = experiment(#{ sizes: ["1M"], iters: 2, warmup: 0, sample: false, flows: 1, channels: 1 });
let r = run(b.with_knobs(#{ name: "tiny" }));
criterion("tiny ran", r.ok);
criterion("impossible", false);
"""


def plan_dir(tmp_path):
    (tmp_path / "targets").mkdir()
    shutil.copy(REPO / "plans/targets/loopback.toml", tmp_path / "targets")
    shutil.copy(REPO / "plans/common.rhai", tmp_path)
    p = tmp_path / "tiny.rhai"
    p.write_text(PLAN)
    return p


def test_run_plan_returns_the_report_and_keeps_the_run_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("TCPX_RUN", tcpx_run())
    plan = plan_dir(tmp_path)
    kept = tmp_path / "reports"
    report = tcpx_lab.run_plan(plan, targets="loopback", reports=kept, timeout_s=300)
    recs = [r for r in report["records"] if r["experiment"] == "tiny"]
    # One record per repetition, as many as the target set asks for.
    repeat = tomllib.loads((REPO / "plans/targets/loopback.toml").read_text())["base"]["repeat"]
    assert sorted(r["rep"] for r in recs) == list(range(1, repeat + 1)), recs
    assert all(r["status"] == "ok" for r in recs), recs
    crit = {c.get("text", c.get("name")): c.get("verdict") for c in report["criteria"]}
    # A failing criterion is a result, not an exception.
    assert crit == {"tiny ran": "pass", "impossible": "fail"}, report["criteria"]
    assert Path(report["run_dir"], "report.json").is_file()

    # Without reports=, nothing is left behind.
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("tcpx-plan-*"))
    report = tcpx_lab.run_plan(plan, targets="loopback", timeout_s=300)
    assert "run_dir" not in report
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("tcpx-plan-*")) == before


def test_run_plan_raises_with_tcpx_runs_message_when_no_report_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("TCPX_RUN", tcpx_run())
    bad = tmp_path / "bad.rhai"
    bad.write_text("this is not rhai (\n")
    with pytest.raises(RuntimeError, match="wrote no report"):
        tcpx_lab.run_plan(bad, timeout_s=60)


def test_run_plan_passes_the_path_after_dashes_and_reports_an_import_cycle(tmp_path, monkeypatch):
    """Issue 43: a plan importing itself overflowed tcpx-run's stack (run_plan saw -6); it is
    refused at its import, exit 2, and the error reaches Python. A plan named like a flag is
    still the plan (the path goes after `--`)."""
    monkeypatch.setenv("TCPX_RUN", tcpx_run())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    shutil.copy(REPO / "plans/targets/loopback.toml", tmp_path / "targets")
    (tmp_path / "m.rhai").write_text('import "m" as s;\n')
    (tmp_path / "-p.rhai").write_text('import "m" as s;\nphase("x");\n')
    with pytest.raises(RuntimeError) as e:
        tcpx_lab.run_plan("-p.rhai", targets="loopback", dry_run=True, timeout_s=60)
    msg = str(e.value)
    assert "exited with 2" in msg, msg
    assert "import cycle" in msg and "m.rhai -> m.rhai" in msg, msg
