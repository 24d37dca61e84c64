"""``run_plan``: an experiment plan from Python, for notebooks."""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def _find_tcpx_run():
    """The tcpx-run binary: $TCPX_RUN, then PATH, then target/{release,debug} above the cwd."""
    exe = os.environ.get("TCPX_RUN")
    if exe:
        return exe
    exe = shutil.which("tcpx-run")
    if exe:
        return exe
    here = Path.cwd().resolve()
    for d in [here, *here.parents]:
        for profile in ("release", "debug"):
            cand = d / "target" / profile / "tcpx-run"
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    raise FileNotFoundError(
        "tcpx-run not found: build it (cargo build --release -p tcpx-run) and put it on PATH, "
        "or set TCPX_RUN to its path"
    )


def run_plan(path, **opts):
    """Runs the plan at ``path`` with ``tcpx-run plan`` and returns its report.json as a dict.

    Keyword options are ``tcpx-run plan`` flags: ``targets="loopback"`` gives
    ``--targets loopback``, ``yes=True`` gives ``--yes`` (False leaves it out), underscores become
    dashes. ``reports=DIR`` keeps the run directory (charts, CSV, summary) under DIR; without it
    the run goes to a temporary directory that is removed afterwards. The run's directory is in
    the returned dict under ``"run_dir"`` when kept.

    A plan whose criteria fail still returns its report (look at the criteria in it); a run that
    wrote no report raises ``RuntimeError`` with the end of tcpx-run's output.
    """
    timeout = opts.pop("timeout_s", None)
    if timeout is not None and not (
        isinstance(timeout, (int, float))
        and not isinstance(timeout, bool)
        and 0 < timeout <= 7 * 86400
    ):
        raise ValueError(f"timeout_s {timeout!r}: give seconds, more than 0 and at most a week")
    exe = _find_tcpx_run()
    keep = opts.pop("reports", None)
    reports = Path(keep) if keep is not None else Path(tempfile.mkdtemp(prefix="tcpx-plan-"))
    args = [exe, "plan", "--reports", str(reports)]
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            args.append(flag)
        elif v is False or v is None:
            continue
        else:
            args += [flag, str(v)]
    # The path after `--`: a plan named like a flag (`-x.rhai`) is still the plan.
    args += ["--", str(path)]
    try:
        before = set(reports.glob("*/report.json")) if reports.exists() else set()
        proc = subprocess.run(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout
        )
        made = sorted(set(reports.glob("*/report.json")) - before)
        if not made:
            tail = (proc.stdout + proc.stderr)[-4000:]
            how = (
                f"was killed by signal {-proc.returncode}"
                if proc.returncode < 0
                else f"exited with {proc.returncode}"
            )
            raise RuntimeError(f"tcpx-run plan {path} {how} and wrote no report:\n{tail}")
        with open(made[-1]) as f:
            report = json.load(f)
        if keep is not None:
            report["run_dir"] = str(made[-1].parent)
        return report
    finally:
        if keep is None:
            shutil.rmtree(reports, ignore_errors=True)
