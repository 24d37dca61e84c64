//! An error and its causes as one line, the form every report and message of tcpx-lab uses.

/// `e` and each of its sources, joined by `": "` (`e: cause: cause's cause`): what the binary
/// prints for an error (`anyhow`'s `{:#}`), for the libraries that write an error into a report,
/// a log line or a child's message themselves.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn every_cause_follows_its_error_once() {
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
        let e = Layer(
            "writing x.csv",
            Some(Box::new(Layer(
                "opening x.csv",
                Some(Box::new(Layer("disk full", None))),
            ))),
        );
        assert_eq!(error_chain(&e), "writing x.csv: opening x.csv: disk full");
    }
}
