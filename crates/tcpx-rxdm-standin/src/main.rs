//! `tcpx-rxdm-standin --prefix DIR [--refuse] [--record FILE]`: serves rxdm's Unix sockets under
//! DIR until SIGINT or SIGTERM, then removes them. Point the plugin's
//! NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX at DIR.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;

use tcpx_rxdm_standin::server::Server;
use tcpx_rxdm_standin::Mode;

const USAGE: &str = "usage: tcpx-rxdm-standin --prefix DIR [--refuse] [--record FILE]";

fn main() -> ExitCode {
    let mut prefix = None;
    let mut record = None;
    let mut mode = Mode::Accept;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--prefix" => prefix = args.next().map(PathBuf::from),
            "--record" => record = args.next().map(PathBuf::from),
            "--refuse" => mode = Mode::Refuse,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("tcpx-rxdm-standin: unknown argument `{other}`\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(prefix) = prefix else {
        eprintln!("tcpx-rxdm-standin: --prefix is required\n{USAGE}");
        return ExitCode::from(2);
    };
    let (tx, rx) = mpsc::channel();
    if let Err(e) = ctrlc::set_handler(move || {
        let _ = tx.send(());
    }) {
        eprintln!("tcpx-rxdm-standin: cannot handle SIGINT/SIGTERM: {e}");
        return ExitCode::FAILURE;
    }
    let mut server = match Server::start(&prefix, mode, record.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tcpx-rxdm-standin: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("tcpx-rxdm-standin: serving {} ({mode:?})", prefix.display());
    let _ = rx.recv();
    server.stop();
    eprintln!(
        "tcpx-rxdm-standin: stopped after {} request(s)",
        server.records().len()
    );
    ExitCode::SUCCESS
}
