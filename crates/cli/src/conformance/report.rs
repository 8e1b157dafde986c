//! The conformance report: a line per capability (passed, failed, skipped because the driver
//! does not advertise it), how long it took, and for a failure what went wrong with the
//! objects' events; as a terminal table, JSON, and a self-contained HTML page.

use serde::Serialize;

/// How a capability fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Every check held.
    Passed,
    /// A check did not hold (see the detail).
    Failed,
    /// Not advertised by the driver, or not asked for (`--only`/`--skip`).
    Skipped,
}

/// One capability's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Its name (`--only`/`--skip` take it).
    pub capability: String,
    /// What it checks.
    pub description: String,
    /// How it fared.
    pub outcome: Outcome,
    /// Seconds it took.
    pub seconds: f64,
    /// Why it failed or was skipped.
    pub detail: String,
    /// The events of the objects involved, for a failure.
    pub events: Vec<String>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The driver's name and version.
    pub driver: String,
    /// Its vendor version.
    pub version: String,
    /// When it ran (RFC 3339).
    pub started: String,
    /// The results, in the order run.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether nothing failed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.outcome != Outcome::Failed)
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let width = self
            .checks
            .iter()
            .map(|c| c.capability.len())
            .max()
            .unwrap_or(10)
            .max(10);
        let mut out = format!(
            "conformance of {} {} ({})\n\n{:width$}  {:8}  {:>8}  detail\n",
            self.driver, self.version, self.started, "capability", "result", "time"
        );
        for c in &self.checks {
            let outcome = match c.outcome {
                Outcome::Passed => "pass",
                Outcome::Failed => "FAIL",
                Outcome::Skipped => "skip",
            };
            out.push_str(&format!(
                "{:width$}  {:8}  {:>7.2}s  {}\n",
                c.capability,
                outcome,
                c.seconds,
                if c.detail.is_empty() {
                    &c.description
                } else {
                    &c.detail
                }
            ));
            for event in &c.events {
                out.push_str(&format!("{:width$}    event: {event}\n", ""));
            }
        }
        let count = |o| self.checks.iter().filter(|c| c.outcome == o).count();
        out.push_str(&format!(
            "\n{} passed, {} failed, {} skipped\n",
            count(Outcome::Passed),
            count(Outcome::Failed),
            count(Outcome::Skipped)
        ));
        out
    }

    /// A self-contained HTML page.
    pub fn html(&self) -> String {
        let mut rows = String::new();
        for c in &self.checks {
            let (class, label) = match c.outcome {
                Outcome::Passed => ("pass", "passed"),
                Outcome::Failed => ("fail", "failed"),
                Outcome::Skipped => ("skip", "skipped"),
            };
            let events: String = c
                .events
                .iter()
                .map(|e| format!("<li>{}</li>", escape(e)))
                .collect();
            rows.push_str(&format!(
                "<tr class=\"{class}\"><td><b>{}</b><br><small>{}</small></td><td>{label}</td><td>{:.2} s</td><td>{}{}</td></tr>\n",
                escape(&c.capability),
                escape(&c.description),
                c.seconds,
                escape(&c.detail),
                if events.is_empty() { String::new() } else { format!("<ul>{events}</ul>") }
            ));
        }
        let count = |o| self.checks.iter().filter(|c| c.outcome == o).count();
        format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>CSI conformance: {driver}</title>\n<style>\nbody {{ font-family: sans-serif; margin: 2em; color: #222; }}\ntable {{ border-collapse: collapse; width: 100%; }}\ntd, th {{ border: 1px solid #ccc; padding: 0.4em 0.6em; vertical-align: top; text-align: left; }}\nth {{ background: #eee; }}\ntd:nth-child(3) {{ white-space: nowrap; }}\ntr.pass td:nth-child(2) {{ background: #d4f4d4; }}\ntr.fail td:nth-child(2) {{ background: #f8d0d0; }}\ntr.skip td:nth-child(2) {{ background: #eeeeee; color: #666; }}\nsmall {{ color: #555; }}\n</style></head><body>\n<h1>CSI conformance: {driver} {version}</h1>\n<p>Run by <code>volstack conformance</code> on {started}: {passed} passed, {failed} failed, {skipped} skipped.</p>\n<table><tr><th>capability</th><th>result</th><th>time</th><th>detail</th></tr>\n{rows}</table>\n</body></html>\n",
            driver = escape(&self.driver),
            version = escape(&self.version),
            started = escape(&self.started),
            passed = count(Outcome::Passed),
            failed = count(Outcome::Failed),
            skipped = count(Outcome::Skipped),
        )
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let check = |name: &str, outcome, detail: &str| Check {
            capability: name.into(),
            description: format!("{name} works"),
            outcome,
            seconds: 0.5,
            detail: detail.into(),
            events: if outcome == Outcome::Failed {
                vec!["Warning ProvisioningFailed <oops>".into()]
            } else {
                Vec::new()
            },
        };
        Report {
            driver: "d.example".into(),
            version: "1.0".into(),
            started: "2026-11-26T00:00:00Z".into(),
            checks: vec![
                check("provision", Outcome::Passed, ""),
                check("clone", Outcome::Failed, "CreateVolume failed: <bad>"),
                check(
                    "snapshot",
                    Outcome::Skipped,
                    "CREATE_DELETE_SNAPSHOT not advertised",
                ),
            ],
        }
    }

    #[test]
    fn the_report_says_each_outcome_in_each_form_and_escapes_what_the_driver_said() {
        let r = report();
        assert!(!r.passed());
        let table = r.table();
        assert!(table.contains("FAIL"), "{table}");
        assert!(table.contains("1 passed, 1 failed, 1 skipped"), "{table}");
        assert!(
            table.contains("event: Warning ProvisioningFailed <oops>"),
            "{table}"
        );
        let html = r.html();
        assert!(html.contains("<tr class=\"fail\">"), "{html}");
        assert!(html.contains("CreateVolume failed: &lt;bad&gt;"), "{html}");
        assert!(!html.contains("<bad>"), "driver text is escaped");
        let json = serde_json::to_value(&r).unwrap_or_default();
        assert_eq!(json["checks"][2]["outcome"], "skipped");
        let mut ok = report();
        ok.checks.remove(1);
        assert!(ok.passed());
    }
}
