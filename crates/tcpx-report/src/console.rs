//! The lines a terminal gets at the end of a plan run: the verdict, each criterion and
//! decision, and where the report and the tuned settings are.

use std::path::Path;

use crate::safe::printable;
use crate::RunReport;

impl RunReport {
    /// The end-of-run summary for a report written to `dir`, one line per item. Text from the
    /// plan or a peer (names, criteria, an incomplete run's error) is [`printable`]: an escape
    /// sequence, bell, CR or line feed in it reaches the terminal escaped (issue 43 item 6).
    pub fn console_summary(&self, dir: &Path) -> String {
        let p = printable;
        let mut out = format!("plan {}: {}\n", p(&self.plan), p(&self.verdict_line()));
        for c in &self.criteria {
            out += &format!(
                "  [{}] {} {}\n",
                c.verdict.as_str(),
                p(&c.text),
                p(&c.detail)
            );
        }
        for d in &self.decisions {
            out += &match d.answer {
                None => format!(
                    "  {}: UNANSWERED -> default branch: {}\n",
                    p(&d.name),
                    p(&d.branch_taken)
                ),
                Some(_) => format!("  {}: -> {}\n", p(&d.name), p(&d.branch_taken)),
            };
        }
        for q in &self.sequential {
            out += &format!(
                "  comparison {}: {} rounds, {}\n",
                p(&q.configurations.join(" vs ")),
                q.rounds,
                q.stop.as_str()
            );
        }
        out += &format!(
            "report: {}\n",
            p(&dir.join("index.html").display().to_string())
        );
        out += &format!(
            "tuned settings: {} (`tcpx-run apply {}`)\n",
            p(&dir.join("tuned.env").display().to_string()),
            crate::safe::shell_arg(&dir.display().to_string())
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
        // A directory with blanks or quotes is one shell word in the printed command.
        let text = r.console_summary(Path::new("my reports/it's x"));
        assert!(
            text.contains(r"(`tcpx-run apply 'my reports/it'\''s x'`)"),
            "{text}"
        );
        // Issue 43: a newline in the directory's name: one line, and the shell gives the name back.
        let text = r.console_summary(Path::new("reports/a\nb"));
        assert!(
            text.contains(r"(`tcpx-run apply $'reports/a\nb'`)"),
            "{text}"
        );
    }

    #[test]
    fn a_run_that_measured_nothing_says_so_instead_of_pass() {
        let rec = |status: &str| {
            serde_json::json!({"phase": "p", "experiment": "e", "label": "l", "knobs": {},
                "not_applied": {}, "status": status, "reason": "window 64: not on socket",
                "size": null, "chunk": null, "send": null, "recv": null,
                "started_s": 0.0, "duration_s": 0.0})
        };
        let report = |records: Vec<serde_json::Value>| -> RunReport {
            serde_json::from_value(serde_json::json!({
                "plan": "p", "plan_path": "plans/p.rhai", "stamp": "s", "started_utc": "",
                "finished_utc": "", "platform": "", "targets": "", "setup": {}, "phases": [],
                "records": records, "samples": [], "criteria": [], "decisions": [],
                "charts": [], "notes": [], "completion": {"state": "complete"}
            }))
            .unwrap()
        };
        let r = report(vec![rec("skipped"), rec("skipped"), rec("failed")]);
        assert!(r.nothing_measured());
        assert_eq!(
            r.verdict_line(),
            "NOTHING MEASURED (every experiment was refused: 2 skipped, 1 failed; 0 criteria)"
        );
        assert!(r
            .console_summary(Path::new("x"))
            .starts_with("plan p: NOTHING MEASURED"));
        assert!(report(vec![])
            .verdict_line()
            .starts_with("NOTHING MEASURED (the plan ran no experiment"));
        let r = report(vec![rec("skipped"), rec("ok")]);
        assert!(!r.nothing_measured());
        assert!(r.verdict_line().starts_with("PASS"), "{}", r.verdict_line());
    }
}
