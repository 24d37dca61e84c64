//! The lines a terminal gets at the end of a plan run: the verdict, each criterion and
//! decision, and where the report and the tuned settings are.

use std::path::Path;

use crate::RunReport;

impl RunReport {
    /// The end-of-run summary for a report written to `dir`, one line per item.
    pub fn console_summary(&self, dir: &Path) -> String {
        let mut out = format!("plan {}: {}\n", self.plan, self.verdict_line());
        for c in &self.criteria {
            out += &format!("  [{}] {} {}\n", c.verdict.as_str(), c.text, c.detail);
        }
        for d in &self.decisions {
            out += &match d.answer {
                None => format!(
                    "  {}: UNANSWERED -> default branch: {}\n",
                    d.name, d.branch_taken
                ),
                Some(_) => format!("  {}: -> {}\n", d.name, d.branch_taken),
            };
        }
        for q in &self.sequential {
            out += &format!(
                "  comparison {}: {} rounds, {}\n",
                q.configurations.join(" vs "),
                q.rounds,
                q.stop.as_str()
            );
        }
        out += &format!("report: {}\n", dir.join("index.html").display());
        out += &format!(
            "tuned settings: {} (`tcpx-run apply {}`)\n",
            dir.join("tuned.env").display(),
            dir.display()
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_verdicts_decisions_and_files() {
        let mut r: RunReport = serde_json::from_value(serde_json::json!({
            "plan": "p", "plan_path": "plans/p.rhai", "stamp": "s", "started_utc": "",
            "finished_utc": "", "platform": "", "targets": "", "setup": {}, "phases": [],
            "records": [], "samples": [], "criteria": [], "decisions": [
                {"phase": "1", "name": "DP1", "question": "q", "answer": null,
                 "branch_taken": "no", "branch_not_taken": "yes", "detail": ""},
                {"phase": "1", "name": "DP2", "question": "q", "answer": true,
                 "branch_taken": "yes", "branch_not_taken": "no", "detail": ""}
            ], "charts": [], "notes": [], "completion": {"state": "complete"}
        }))
        .unwrap();
        r.criteria.clear();
        let text = r.console_summary(Path::new("reports/x"));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("plan p: "), "{text}");
        assert_eq!(lines[1], "  DP1: UNANSWERED -> default branch: no");
        assert_eq!(lines[2], "  DP2: -> yes");
        assert_eq!(lines[3], "report: reports/x/index.html");
        assert_eq!(
            lines[4],
            "tuned settings: reports/x/tuned.env (`tcpx-run apply reports/x`)"
        );
    }
}
