//! How this binary starts a flow process of a multi-process run: itself, as `tcpx-run bench`
//! with the experiment as JSON, writing its `ChildReport` where the supervisor says.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use anyhow::Context;
use tcpx_flows::{ChildFault, FlowJob, Launcher};

/// Starts `tcpx-run bench` children from this very executable.
pub struct SelfLauncher {
    exe: PathBuf,
}

impl SelfLauncher {
    /// A launcher of this executable, shared by the runs that start flow processes.
    pub fn shared() -> anyhow::Result<Arc<dyn Launcher>> {
        let exe = std::env::current_exe().context("finding this program to start its children")?;
        Ok(Arc::new(SelfLauncher { exe }))
    }
}

impl Launcher for SelfLauncher {
    fn tool_command(&self) -> std::io::Result<Command> {
        Ok(Command::new(&self.exe))
    }

    fn flow_command(&self, job: &FlowJob<'_>) -> std::io::Result<Command> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(["bench", "--role", job.side.as_str(), "--peer"])
            .arg(job.addr.to_string())
            .args(["--experiment-json", &serde_json::to_string(job.exp)?])
            .args(["--no-csv", "--report-json"])
            .arg(job.report);
        // The fault hooks of tests, mapped onto the child's hidden flags.
        match job.fault {
            None => {}
            Some(ChildFault::ExitAfterAccept) => {
                cmd.arg("--test-exit-after-accept");
            }
            Some(ChildFault::ExitBeforeConnect) => {
                cmd.arg("--test-exit-before-connect");
            }
        }
        Ok(cmd)
    }
}
