//! A validation's settings from the text its caller was given, and how a validation ended: the
//! status word its JSON document gives and the exit status a script reads.

use std::path::Path;

use crate::{CollectiveGains, Outcome, ValidateConfig};

impl ValidateConfig {
    /// The settings from their texts: `gpus` as `S,R`, `sizes` as byte counts (`1M,64M`, powers
    /// of 1024); `reps` and `iters` at least 1, no size 0. Each error names the flag to fix.
    pub fn from_flags(
        gpus: &str,
        sizes: &str,
        reps: u32,
        iters: u32,
        warmup: u32,
    ) -> Result<ValidateConfig, String> {
        let (send_gpu, recv_gpu) = gpus
            .split_once(',')
            .and_then(|(s, r)| Some((s.trim().parse().ok()?, r.trim().parse().ok()?)))
            .ok_or_else(|| format!("--gpus `{gpus}`: write it as S,R (e.g. 0,1)"))?;
        if reps == 0 || iters == 0 {
            return Err("--reps and --iters must be at least 1".into());
        }
        let parsed = tcpx_model::parse_sizes(sizes).map_err(|e| format!("--size: {e}"))?;
        if parsed.contains(&0) {
            return Err(format!(
                "--size `{sizes}`: a size of 0 bytes measures nothing; give 1 byte or more (e.g. 1M)"
            ));
        }
        Ok(ValidateConfig {
            sizes: parsed,
            reps,
            iters,
            warmup,
            send_gpu,
            recv_gpu,
        })
    }
}

/// A net plugin given as a path (not a bare name NCCL looks up itself) must be a file: a missing
/// one made NCCL fall back to its own transport.
pub fn check_net_plugin_path(p: &Path) -> Result<(), String> {
    if p.components().count() > 1 && !p.is_file() {
        return Err(format!(
            "--net-plugin {}: no such file (give the plugin's .so, e.g. /usr/local/tcpx/lib64/libnccl-net.so)",
            p.display()
        ));
    }
    Ok(())
}

/// How a validation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every collective measured and NCCL's logs show what was asked.
    Ok,
    /// A run failed.
    Failed,
    /// Measured, but NCCL's logs do not show what was asked (a silent fallback, a tuned
    /// variable never read).
    Unproven,
    /// Nothing was validated here (no libnccl or GPU).
    NotAvailable,
}

impl Verdict {
    /// The verdict of `results` whose logs showed `problems`.
    pub fn of(results: &[CollectiveGains], problems: &[String]) -> Verdict {
        let failed = results
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Failed { .. }));
        let na = results
            .iter()
            .all(|c| matches!(c.outcome, Outcome::NotAvailable { .. }));
        if failed {
            Verdict::Failed
        } else if !problems.is_empty() {
            Verdict::Unproven
        } else if na {
            Verdict::NotAvailable
        } else {
            Verdict::Ok
        }
    }

    /// The JSON document's `status`. A run with nothing available says `n/a` before anything
    /// else (its collectives carry the reason).
    pub fn status(self, results: &[CollectiveGains]) -> &'static str {
        let na = results
            .iter()
            .all(|c| matches!(c.outcome, Outcome::NotAvailable { .. }));
        match self {
            _ if na => "n/a",
            Verdict::Failed => "failed",
            Verdict::Unproven => "unproven",
            Verdict::NotAvailable => "n/a",
            Verdict::Ok => "ok",
        }
    }

    /// The exit status: 0 validated, 2 a run failed, 3 unproven, 4 nothing validated (not a
    /// success a script could take for "tuned settings hold").
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Ok => 0,
            Verdict::Failed => 2,
            Verdict::Unproven => 3,
            Verdict::NotAvailable => 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collective;

    #[test]
    fn flags_become_settings_or_errors_naming_the_flag() {
        let c = ValidateConfig::from_flags(" 0 , 1", "1M,64M", 5, 20, 5).unwrap();
        assert_eq!((c.send_gpu, c.recv_gpu), (0, 1));
        assert_eq!(c.sizes, [1 << 20, 64 << 20]);
        for (gpus, size, reps, iters, says) in [
            ("0", "1M", 5, 20, "--gpus `0`: write it as S,R"),
            ("0,x", "1M", 5, 20, "--gpus"),
            ("0,1", "1M", 0, 20, "--reps and --iters must be at least 1"),
            ("0,1", "1M", 5, 0, "--reps and --iters"),
            ("0,1", "lots", 5, 20, "--size: "),
            ("0,1", "0,1M", 5, 20, "a size of 0 bytes measures nothing"),
        ] {
            let e = ValidateConfig::from_flags(gpus, size, reps, iters, 5).unwrap_err();
            assert!(e.contains(says), "{gpus} {size} {reps} {iters}: {e}");
        }
    }

    #[test]
    fn a_plugin_path_must_be_a_file_a_bare_name_need_not() {
        assert!(check_net_plugin_path(Path::new("libnccl-net.so")).is_ok());
        let e = check_net_plugin_path(Path::new("/nonexistent/libnccl-net.so")).unwrap_err();
        assert!(e.contains("no such file"), "{e}");
    }

    #[test]
    fn the_verdict_orders_failure_then_proof_then_availability() {
        let with = |outcome: Outcome| CollectiveGains {
            collective: Collective::SendRecv,
            outcome,
            evidence: Vec::new(),
        };
        let measured = || with(Outcome::Measured { sizes: Vec::new() });
        let failed = || with(Outcome::Failed { reason: "x".into() });
        let na = || with(Outcome::NotAvailable { reason: "x".into() });
        let problem = vec!["NCCL used Socket".to_string()];
        let v = Verdict::of(&[measured(), failed()], &problem);
        assert_eq!((v, v.exit_code()), (Verdict::Failed, 2));
        let v = Verdict::of(&[measured()], &problem);
        assert_eq!(
            (v, v.exit_code(), v.status(&[measured()])),
            (Verdict::Unproven, 3, "unproven")
        );
        let v = Verdict::of(&[na()], &[]);
        assert_eq!(
            (v, v.exit_code(), v.status(&[na()])),
            (Verdict::NotAvailable, 4, "n/a")
        );
        let v = Verdict::of(&[measured()], &[]);
        assert_eq!(
            (v, v.exit_code(), v.status(&[measured()])),
            (Verdict::Ok, 0, "ok")
        );
    }
}
