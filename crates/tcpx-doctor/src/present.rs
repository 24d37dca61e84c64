//! Doctor's inputs completed from the caller's environment lookup, and its [`Report`] as the text
//! and the JSON `tcpx-run doctor` prints.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::{Inputs, Report};

impl Inputs {
    /// Each setting not given takes its NCCL variable from `var` (the caller's lookup, e.g.
    /// `std::env::var_os`); a blank value counts as unset.
    pub fn or_env(mut self, var: impl Fn(&str) -> Option<OsString>) -> Inputs {
        let setting = |given: Option<String>, name: &str| {
            given
                .or_else(|| var(name).and_then(|v| v.into_string().ok()))
                .filter(|s| !s.trim().is_empty())
        };
        self.plugin = setting(self.plugin, "NCCL_NET_PLUGIN");
        self.unix_prefix = self.unix_prefix.or_else(|| {
            var("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        self.ifname = setting(self.ifname, "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME");
        self.ctrl_dev = setting(self.ctrl_dev, "NCCL_GPUDIRECTTCPX_CTRL_DEV");
        self.tx_bindings = setting(self.tx_bindings, "NCCL_GPUDIRECTTCPX_TX_BINDINGS");
        self.rx_bindings = setting(self.rx_bindings, "NCCL_GPUDIRECTTCPX_RX_BINDINGS");
        self.dynamic_chunk = setting(self.dynamic_chunk, "NCCL_DYNAMIC_CHUNK_SIZE");
        self
    }
}

impl Report {
    /// One line per finding (status, check, detail) with its fix under it, then the verdict.
    pub fn to_text(&self) -> String {
        let mut out = String::from("tcpx-run doctor: GPUDirect-TCPX prerequisites\n\n");
        let width = self
            .findings
            .iter()
            .map(|f| f.check.len())
            .max()
            .unwrap_or(0);
        for f in &self.findings {
            out += &format!(
                "  [{:^7}] {:<width$}  {}\n",
                f.status.word(),
                f.check,
                f.detail
            );
            if let Some(fix) = &f.fix {
                out += &format!("  {:9} {:<width$}  fix: {fix}\n", "", "");
            }
        }
        out += "\n";
        if self.tcpx_usable {
            out += "GPUDirect-TCPX: usable here (run a transfer and watch rx_devmem_pkts grow).\n";
        } else {
            out += &format!(
                "GPUDirect-TCPX is not available on this machine: {}.\n\
                 The `socket` backend works anywhere; `--require tcpx` makes this a failure.\n",
                self.missing.join("; ")
            );
        }
        out
    }

    /// `tcpx_usable`, `missing` and every finding (status in lower case).
    pub fn to_json(&self) -> serde_json::Value {
        let findings: Vec<_> = self
            .findings
            .iter()
            .map(|f| {
                serde_json::json!({
                    "check": f.check, "status": f.status.word().to_lowercase(),
                    "detail": f.detail, "fix": f.fix,
                })
            })
            .collect();
        serde_json::json!({
            "tcpx_usable": self.tcpx_usable,
            "missing": self.missing,
            "findings": findings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Finding, Status};

    #[test]
    fn flags_win_over_variables_and_blank_counts_as_unset() {
        let env = |k: &str| -> Option<OsString> {
            match k {
                "NCCL_NET_PLUGIN" => Some("env.so".into()),
                "NCCL_GPUDIRECTTCPX_CTRL_DEV" => Some("  ".into()),
                "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME" => Some("eth1,eth2".into()),
                "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX" => Some("/run/rx".into()),
                _ => None,
            }
        };
        let i = Inputs::default().or_env(env);
        assert_eq!(i.plugin.as_deref(), Some("env.so"));
        assert_eq!(i.ctrl_dev, None);
        assert_eq!(i.ifname.as_deref(), Some("eth1,eth2"));
        assert_eq!(i.unix_prefix, Some(PathBuf::from("/run/rx")));
        let given = Inputs {
            plugin: Some("flag.so".into()),
            tx_bindings: Some("".into()),
            ..Inputs::default()
        }
        .or_env(env);
        assert_eq!(given.plugin.as_deref(), Some("flag.so"));
        assert_eq!(given.tx_bindings, None);
    }

    #[test]
    fn the_text_aligns_checks_and_gives_fixes_and_the_verdict() {
        let r = Report {
            findings: vec![
                Finding {
                    check: "plugin".into(),
                    status: Status::Fail,
                    detail: "not found".into(),
                    fix: Some("install it".into()),
                },
                Finding {
                    check: "user".into(),
                    status: Status::Ok,
                    detail: "root".into(),
                    fix: None,
                },
            ],
            tcpx_usable: false,
            missing: vec!["the plugin".into()],
        };
        let text = r.to_text();
        assert!(text.contains("  [ FAIL  ] plugin  not found\n"), "{text}");
        assert!(text.contains("            fix: install it\n"), "{text}");
        assert!(
            text.contains("not available on this machine: the plugin.\n"),
            "{text}"
        );
        let v = r.to_json();
        assert_eq!(v["findings"][0]["status"], "fail");
        assert_eq!(v["tcpx_usable"], false);
    }
}
