//! Which IRQ serves which NIC queue, in which direction.
//!
//! Names the drivers give their MSI-X vectors (as `/proc/interrupts` shows them):
//! * gve (Google gVNIC): `gve-ntfy-blk<i>@pci:<bus id>`; with `2Q` notification blocks, blocks
//!   `0..Q` serve TX queues `0..Q` and blocks `Q..2Q` serve RX queues `0..Q` (the driver's
//!   `gve_tx_idx_to_ntfy` / `gve_rx_idx_to_ntfy`). `gve-mgmnt@pci:<bus id>` is the admin vector.
//!   Drivers before early 2023 named them `<ifname>-ntfy-block.<i>` and `<ifname>-mgmnt`.
//! * virtio-net: `virtio<N>-input.<q>` (RX), `virtio<N>-output.<q>` (TX), `virtio<N>-config` /
//!   `-control`; the NIC is `/sys/bus/virtio/devices/virtio<N>/net/*` (other virtio devices, such
//!   as vsock or balloon, have no `net` directory and are not NICs).
//! * mlx5: `mlx5_comp<q>@pci:<bus id>` (a completion vector serves TX and RX of channel q),
//!   `mlx5_async<i>@pci:<bus id>` (control).
//! * many others (ixgbe, i40e, ice, bnxt, ena): `<ifname>-TxRx-<q>`, `<ifname>-tx-<q>`,
//!   `<ifname>-rx-<q>`, possibly prefixed with the driver name.

use serde::Serialize;
use tcpx_topo::SysRoot;

use crate::interrupts::{Interrupts, IrqId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Tx,
    Rx,
    /// One vector for both directions of a queue pair (mlx5, TxRx).
    Combined,
    /// Admin / config / async vectors: not on the data path.
    Control,
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Direction::Tx => "tx",
            Direction::Rx => "rx",
            Direction::Combined => "txrx",
            Direction::Control => "ctrl",
        })
    }
}

/// One NIC IRQ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueIrq {
    pub irq: u32,
    pub nic: String,
    /// Queue number within its direction; None for control vectors.
    pub queue: Option<u32>,
    pub direction: Direction,
    /// The action name it was recognised from.
    pub name: String,
}

/// The network interface(s) registered under a device directory (`.../net/<ifname>`).
fn netdev_under(root: &SysRoot, dir: &str) -> Option<String> {
    root.list_dir(format!("{dir}/net")).into_iter().next()
}

fn split_pci_suffix(name: &str) -> Option<(&str, &str)> {
    name.split_once("@pci:")
}

fn trailing_number(s: &str) -> Option<u32> {
    let digits: String = s.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() {
        return None;
    }
    digits.chars().rev().collect::<String>().parse().ok()
}

/// Recognise the NIC queue IRQs in `interrupts`, looking NIC names up under `root`.
pub fn map_queue_irqs(interrupts: &Interrupts, root: &SysRoot) -> Vec<QueueIrq> {
    let nic_names = root.list_dir("/sys/class/net");
    // gve needs the block count per device first.
    let mut gve_blocks: std::collections::BTreeMap<String, u32> = Default::default();
    for line in &interrupts.lines {
        for action in line.name.split(',').map(str::trim) {
            if let Some((head, bdf)) = split_pci_suffix(action) {
                if head.starts_with("gve-ntfy-blk") {
                    *gve_blocks.entry(bdf.to_string()).or_default() += 1;
                }
            } else if let Some((ifname, _)) = action.split_once("-ntfy-block.") {
                *gve_blocks.entry(ifname.to_string()).or_default() += 1;
            }
        }
    }
    let mut out = Vec::new();
    for line in &interrupts.lines {
        let IrqId::Num(irq) = line.id else { continue };
        for action in line
            .name
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            if let Some(q) = classify(action, root, &nic_names, &gve_blocks) {
                out.push(QueueIrq {
                    irq,
                    nic: q.0,
                    queue: q.1,
                    direction: q.2,
                    name: action.to_string(),
                });
                break;
            }
        }
    }
    out
}

fn classify(
    action: &str,
    root: &SysRoot,
    nic_names: &[String],
    gve_blocks: &std::collections::BTreeMap<String, u32>,
) -> Option<(String, Option<u32>, Direction)> {
    if let Some((head, bdf)) = split_pci_suffix(action) {
        let nic = netdev_under(root, &format!("/sys/bus/pci/devices/{bdf}"))?;
        if let Some(blk) = head
            .strip_prefix("gve-ntfy-blk")
            .and_then(|b| b.parse::<u32>().ok())
        {
            let half = gve_blocks.get(bdf).copied().unwrap_or(0) / 2;
            return Some(if blk < half {
                (nic, Some(blk), Direction::Tx)
            } else {
                (nic, Some(blk - half), Direction::Rx)
            });
        }
        if head.starts_with("gve-mgmnt") || head.starts_with("mlx5_async") {
            return Some((nic, None, Direction::Control));
        }
        if let Some(q) = head
            .strip_prefix("mlx5_comp")
            .and_then(|q| q.parse::<u32>().ok())
        {
            return Some((nic, Some(q), Direction::Combined));
        }
        return None;
    }
    if let Some(rest) = action.strip_prefix("virtio") {
        let (num, what) = rest.split_once('-')?;
        num.parse::<u32>().ok()?;
        let nic = netdev_under(root, &format!("/sys/bus/virtio/devices/virtio{num}"))?;
        return if let Some(q) = what.strip_prefix("input.") {
            Some((nic, q.parse().ok(), Direction::Rx))
        } else if let Some(q) = what.strip_prefix("output.") {
            Some((nic, q.parse().ok(), Direction::Tx))
        } else {
            Some((nic, None, Direction::Control))
        };
    }
    // Older gve: "<ifname>-ntfy-block.<i>", "<ifname>-mgmnt".
    if let Some((ifname, blk)) = action.split_once("-ntfy-block.") {
        let blk: u32 = blk.parse().ok()?;
        if !nic_names.iter().any(|n| n == ifname) {
            return None;
        }
        let half = gve_blocks.get(ifname).copied().unwrap_or(0) / 2;
        return Some(if blk < half {
            (ifname.to_string(), Some(blk), Direction::Tx)
        } else {
            (ifname.to_string(), Some(blk - half), Direction::Rx)
        });
    }
    if let Some(ifname) = action.strip_suffix("-mgmnt") {
        if nic_names.iter().any(|n| n == ifname) {
            return Some((ifname.to_string(), None, Direction::Control));
        }
    }
    // "<ifname>-TxRx-<q>" and friends, possibly "<driver>-<ifname>-...".
    let queue = trailing_number(action);
    for nic in nic_names {
        let Some(pos) = action.find(&format!("{nic}-")) else {
            continue;
        };
        if pos > 0 && !action[..pos].ends_with('-') {
            continue;
        }
        let kind = action[pos + nic.len() + 1..].to_ascii_lowercase();
        let dir = if kind.starts_with("txrx") || kind.starts_with("combined") {
            Direction::Combined
        } else if kind.starts_with("tx") {
            Direction::Tx
        } else if kind.starts_with("rx") {
            Direction::Rx
        } else {
            continue;
        };
        return Some((nic.clone(), queue, dir));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The NIC, queue and direction an IRQ action name is expected to be classified as, or none.
    type Expected = Option<(&'static str, Option<u32>, Direction)>;

    /// Classifies each IRQ action name of `cases` for the NICs `nics` (old gve drivers: `blocks`
    /// notification blocks each) and checks the NIC, queue and direction expected, or none.
    fn check_classified(nics: &[&str], blocks: &[(&str, u32)], cases: &[(&str, Expected)]) {
        let root = SysRoot::new("/nonexistent");
        let nics: Vec<String> = nics.iter().map(|n| n.to_string()).collect();
        let blocks = blocks.iter().map(|(n, b)| (n.to_string(), *b)).collect();
        for (action, want) in cases {
            let want = want.map(|(nic, queue, dir)| (nic.to_string(), queue, dir));
            assert_eq!(classify(action, &root, &nics, &blocks), want, "{action}");
        }
    }

    #[test]
    fn generic_names_need_a_known_nic() {
        check_classified(
            &["eth1", "ens5"],
            &[],
            &[
                ("eth1-TxRx-3", Some(("eth1", Some(3), Direction::Combined))),
                (
                    "i40e-eth1-TxRx-0",
                    Some(("eth1", Some(0), Direction::Combined)),
                ),
                ("ens5-rx-2", Some(("ens5", Some(2), Direction::Rx))),
                ("ens5-tx-7", Some(("ens5", Some(7), Direction::Tx))),
                ("xeth1-tx-7", None),
                ("eth9-tx-0", None),
                ("timer", None),
            ],
        );
    }

    #[test]
    fn old_gve_names_use_the_interface_name() {
        check_classified(
            &["eth1"],
            &[("eth1", 4)],
            &[
                ("eth1-ntfy-block.1", Some(("eth1", Some(1), Direction::Tx))),
                ("eth1-ntfy-block.2", Some(("eth1", Some(0), Direction::Rx))),
                ("eth1-mgmnt", Some(("eth1", None, Direction::Control))),
                ("eth9-ntfy-block.0", None),
            ],
        );
    }
}
