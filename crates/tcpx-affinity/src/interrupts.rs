//! `/proc/interrupts`: per-CPU counts, interrupt chip and action names.

use serde::Serialize;

/// The row key: a numbered IRQ or a named architecture counter (`NMI`, `LOC`, `ERR`, ...).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(untagged)]
pub enum IrqId {
    Num(u32),
    Named(String),
}

impl std::fmt::Display for IrqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IrqId::Num(n) => write!(f, "{n}"),
            IrqId::Named(s) => f.write_str(s),
        }
    }
}

/// One row of `/proc/interrupts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IrqLine {
    pub id: IrqId,
    /// One count per column of [`Interrupts::cpus`] (shorter for rows such as `ERR`).
    pub counts: Vec<u64>,
    /// Interrupt chip (`PCI-MSIX-0000:00:03.0`, `IR-PCI-MSI`, `IO-APIC`); None for named rows.
    pub chip: Option<String>,
    /// Hardware IRQ number and trigger (`1-edge`).
    pub hwirq: Option<String>,
    /// Action (handler) names, or a named row's description.
    pub name: String,
}

impl IrqLine {
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// A parsed `/proc/interrupts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interrupts {
    /// CPU number of each count column (the header lists online CPUs only).
    pub cpus: Vec<u32>,
    pub lines: Vec<IrqLine>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("/proc/interrupts line {line}: {why}")]
pub struct InterruptsParseError {
    pub line: usize,
    pub why: String,
}

impl Interrupts {
    pub fn parse(text: &str) -> Result<Self, InterruptsParseError> {
        let mut lines_iter = text.lines().enumerate();
        let (_, header) =
            lines_iter
                .find(|(_, l)| !l.trim().is_empty())
                .ok_or(InterruptsParseError {
                    line: 1,
                    why: "empty file".into(),
                })?;
        let cpus: Vec<u32> = header
            .split_whitespace()
            .map(|t| {
                t.strip_prefix("CPU")
                    .and_then(|n| n.parse().ok())
                    .ok_or(InterruptsParseError {
                        line: 1,
                        why: format!("header token {t:?} is not CPU<n>"),
                    })
            })
            .collect::<Result<_, _>>()?;
        if cpus.is_empty() {
            return Err(InterruptsParseError {
                line: 1,
                why: "header lists no CPU".into(),
            });
        }
        let mut lines = Vec::new();
        for (idx, raw) in lines_iter {
            if raw.trim().is_empty() {
                continue;
            }
            let err = |why: String| InterruptsParseError { line: idx + 1, why };
            let (key, rest) = raw
                .split_once(':')
                .ok_or_else(|| err(format!("no ':' in {raw:?}")))?;
            let key = key.trim();
            let id = match key.parse::<u32>() {
                Ok(n) => IrqId::Num(n),
                Err(_) => IrqId::Named(key.to_string()),
            };
            let mut tokens = rest.split_whitespace().peekable();
            let mut counts = Vec::with_capacity(cpus.len());
            while counts.len() < cpus.len() {
                match tokens.peek().and_then(|t| t.parse::<u64>().ok()) {
                    Some(v) => {
                        counts.push(v);
                        tokens.next();
                    }
                    None => break,
                }
            }
            let rest: Vec<&str> = tokens.collect();
            let (chip, hwirq, name) = match id {
                IrqId::Num(_) => {
                    if counts.len() != cpus.len() {
                        return Err(err(format!(
                            "{} counts for {} CPUs in {raw:?}",
                            counts.len(),
                            cpus.len()
                        )));
                    }
                    let chip = rest.first().map(|s| s.to_string());
                    // "1-edge", "1048576-edge", "2-fasteoi": a number, '-', a trigger type.
                    let has_hwirq = rest.get(1).is_some_and(|t| {
                        t.split_once('-')
                            .is_some_and(|(n, _)| n.chars().all(|c| c.is_ascii_digit()))
                    });
                    let hwirq = has_hwirq.then(|| rest[1].to_string());
                    let skip = 1 + usize::from(has_hwirq);
                    (
                        chip,
                        hwirq,
                        rest.iter()
                            .skip(skip)
                            .copied()
                            .collect::<Vec<_>>()
                            .join(" "),
                    )
                }
                IrqId::Named(_) => (None, None, rest.join(" ")),
            };
            lines.push(IrqLine {
                id,
                counts,
                chip,
                hwirq,
                name,
            });
        }
        Ok(Self { cpus, lines })
    }

    pub fn get(&self, irq: u32) -> Option<&IrqLine> {
        self.lines.iter().find(|l| l.id == IrqId::Num(irq))
    }

    /// Count of `line` on CPU `cpu` (0 when the CPU has no column).
    pub fn count_on(&self, line: &IrqLine, cpu: u32) -> u64 {
        self.cpus
            .iter()
            .position(|&c| c == cpu)
            .and_then(|i| line.counts.get(i))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "           CPU0       CPU1       \n\
  0:         31          0   IO-APIC   2-edge      timer\n\
 38:          0       1480 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0\n\
 39:       1128          0 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0\n\
 55:          5          6  IR-PCI-MSI 1048576-edge      mlx5_comp0@pci:0000:3b:00.0, extra\n\
 60:          0          0  PCI-MSI-edge      eth1-TxRx-0\n\
NMI:          0          0   Non-maskable interrupts\n\
LOC:      27459      28408   Local timer interrupts\n\
ERR:          0\n\
MIS:          0\n";

    #[test]
    fn parses_counts_chip_and_names() {
        let p = Interrupts::parse(SAMPLE).unwrap();
        assert_eq!(p.cpus, vec![0, 1]);
        let l = p.get(38).unwrap();
        assert_eq!(l.counts, vec![0, 1480]);
        assert_eq!(l.chip.as_deref(), Some("PCI-MSIX-0000:00:03.0"));
        assert_eq!(l.hwirq.as_deref(), Some("1-edge"));
        assert_eq!(l.name, "virtio2-input.0");
        assert_eq!(
            p.get(55).unwrap().name,
            "mlx5_comp0@pci:0000:3b:00.0, extra"
        );
        assert_eq!(p.get(55).unwrap().hwirq.as_deref(), Some("1048576-edge"));
        // Old kernels print chip and trigger as one token.
        assert_eq!(p.get(60).unwrap().hwirq, None);
        assert_eq!(p.get(60).unwrap().name, "eth1-TxRx-0");
        let loc = p
            .lines
            .iter()
            .find(|l| l.id == IrqId::Named("LOC".into()))
            .unwrap();
        assert_eq!(loc.total(), 27459 + 28408);
        assert_eq!(loc.name, "Local timer interrupts");
        let err = p
            .lines
            .iter()
            .find(|l| l.id == IrqId::Named("ERR".into()))
            .unwrap();
        assert_eq!(err.counts, vec![0]);
        assert_eq!(p.count_on(p.get(39).unwrap(), 0), 1128);
    }

    #[test]
    fn header_with_offline_cpu_keeps_column_numbers() {
        let p = Interrupts::parse("   CPU0  CPU2\n 5:  1  2  IO-APIC 5-edge x\n").unwrap();
        assert_eq!(p.cpus, vec![0, 2]);
        assert_eq!(p.count_on(p.get(5).unwrap(), 2), 2);
        assert_eq!(p.count_on(p.get(5).unwrap(), 1), 0);
    }

    #[test]
    fn rejects_broken_input() {
        assert!(Interrupts::parse("").is_err());
        assert!(Interrupts::parse("foo bar\n").is_err());
        let e = Interrupts::parse("  CPU0 CPU1\n 5: 1 IO-APIC 5-edge x\n").unwrap_err();
        assert_eq!(e.line, 2);
    }
}
