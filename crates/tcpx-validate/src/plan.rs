//! The validation a plan asks for (`validate()` in a plan), run on the leader's node once the
//! plan has chosen its tuned settings: send/recv and all-reduce at 64 MiB, both arms over a net
//! plugin where tuned.env names one, as `tcpx-run validate` does.

use tcpx_plan::Validation;

use crate::{
    net_plugin_env, plan_validation, prerequisites, run_validation, BenchCommand, Collective,
    Setup, ValidateConfig,
};

/// Validates `tuned` on this node: `gpus` GPUs, `nccl` whether the nccl backend opens here,
/// `command` the bare `tcpx-run` command each run starts. Not available (with the reason) where
/// the machine cannot run it or the plugin's chunk is refused.
pub fn validate_for_plan(
    gpus: usize,
    nccl: bool,
    tuned: &[(String, String)],
    command: BenchCommand<'_>,
) -> Validation {
    let cfg = ValidateConfig {
        sizes: vec![64 << 20],
        reps: 5,
        iters: 20,
        warmup: 5,
        send_gpu: 0,
        recv_gpu: 1,
    };
    let nccl = if nccl {
        Ok("the nccl backend".to_string())
    } else {
        Err("the nccl backend cannot open here (`tcpx-run doctor` says why)".to_string())
    };
    let placement = match prerequisites(Ok(gpus), nccl, &cfg) {
        Ok((_, p)) => p,
        Err(why) => return Validation::NotAvailable(why),
    };
    // A tuned.env that names a net plugin runs both arms over it (GDR level LOC, a plugin
    // chunk that is never 0), as `tcpx-run validate` does.
    let mut setup = Setup::plain(placement);
    match net_plugin_env(None, tuned, None, None) {
        Ok(x) => setup.extras = x,
        Err(why) => return Validation::NotAvailable(why),
    }
    let both = [Collective::SendRecv, Collective::AllReduce];
    plan_validation(&run_validation(
        &cfg,
        tuned,
        &setup,
        &both,
        command,
        &mut |_, _, _| {},
    ))
}
