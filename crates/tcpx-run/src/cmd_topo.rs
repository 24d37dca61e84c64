//! `tcpx-run topo`: CPUs, NUMA nodes, GPUs, NICs and the derived binding table (the IRQ plan's
//! step 2.1) with NCCL-style TX/RX binding strings, and how the running node's GPUs reach each
//! other (NVLink / PCIe path / peer access, as `nvidia-smi topo -m` shows them). The views are
//! `tcpx_topo::render` and `tcpx_gpu::link_view`.

use std::path::PathBuf;
use std::process::ExitCode;

use tcpx_gpu::link_view::{gpu_links_json, links_here, render_gpu_links};
use tcpx_topo::render::render;
use tcpx_topo::{derive, discover, Backend, BindingRule, SysRoot};

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum BackendArg {
    /// hwloc for the running system, sysfs for a --root fixture
    #[default]
    Auto,
    Hwloc,
    Sysfs,
}

/// Show where CPUs, NUMA nodes, GPUs and NICs are, and the TX/RX cores derived for each NIC.
#[derive(clap::Args, Debug)]
pub struct TopoArgs {
    /// Read /sys and /proc under this directory instead of / (a fixture tree)
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Print JSON (topology and derived plan) instead of tables
    #[arg(long)]
    pub json: bool,
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Read CPUs, NUMA nodes and the PCI tree from this hwloc XML export (`lstopo m.xml` on the
    /// machine whose /sys tree --root points at) instead
    #[arg(long, value_name = "FILE", conflicts_with = "backend")]
    pub hwloc_xml: Option<PathBuf>,
    /// Cores at the start of each NUMA node left out of TX/RX bindings
    #[arg(long, default_value_t = BindingRule::default().reserved_cores, value_parser = crate::args::rule_cores)]
    pub reserved_cores: usize,
    /// Cores given to TX and, after them, to RX on each NUMA node
    #[arg(long, default_value_t = BindingRule::default().cores_per_direction, value_parser = crate::args::direction_cores)]
    pub cores_per_direction: usize,
}

impl TopoArgs {
    pub fn rule(&self) -> BindingRule {
        BindingRule {
            reserved_cores: self.reserved_cores,
            cores_per_direction: self.cores_per_direction,
        }
    }
    pub fn backend(&self) -> Backend {
        if let Some(xml) = &self.hwloc_xml {
            return Backend::HwlocXml(xml.clone());
        }
        match self.backend {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Hwloc => Backend::Hwloc,
            BackendArg::Sysfs => Backend::Sysfs,
        }
    }
}

pub fn run(args: &TopoArgs) -> anyhow::Result<ExitCode> {
    let root = SysRoot::new(&args.root);
    let topo = discover(&root, args.backend())?;
    let plan = derive(&topo, &args.rule());
    let links = links_here(args.root == std::path::Path::new("/"));
    let stale_fabric = crate::cmd_fabric::stale_summary(&args.root);
    if args.json {
        crate::print_json(serde_json::json!({
            "topology": topo,
            "plan": plan,
            "gpu_links": gpu_links_json(&links),
            "stale_fabric": stale_fabric,
        }))?;
    } else {
        print!("{}", render(&topo, &plan));
        print!("\n{}", render_gpu_links(&links));
        if let Some(s) = &stale_fabric {
            println!("\nStale emulated fabric (`tcpx-run fabric down --id <id>` removes it): {s}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
