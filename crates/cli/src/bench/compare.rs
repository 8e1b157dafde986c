//! `volstack bench --compare A.json B.json`: two earlier results files side by side. For each
//! scenario in both: every figure's median in A and in B with their ratio, and one chart of
//! claims Bound over time with the median run of each.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::summary::{median_run, summarize};
use super::{BenchArgs, Report, short_name, time_axis};

fn load(path: &Path) -> anyhow::Result<Vec<Report>> {
    let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{}: not a results file of `volstack bench` (a JSON array of scenario runs)",
            path.display()
        )
    })
}

/// The scenarios of `a` that `b` has too, in `a`'s order.
fn common(a: &[Report], b: &[Report]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in a {
        if b.iter().any(|o| o.scenario == r.scenario) && !out.contains(&r.scenario) {
            out.push(r.scenario.clone());
        }
    }
    out
}

/// Rows of (figure, unit, A's median, B's median, B/A).
pub(super) fn table(a: &[Report], b: &[Report]) -> Vec<(String, &'static str, f64, f64, f64)> {
    let (sa, sb) = (summarize(a), summarize(b));
    sa.into_iter()
        .filter_map(|(name, unit, (ma, _, _))| {
            let (_, _, (mb, _, _)) = sb.iter().find(|(n, _, _)| *n == name)?;
            let ratio = if ma == 0.0 { f64::NAN } else { mb / ma };
            Some((name, unit, ma, *mb, ratio))
        })
        .collect()
}

pub(super) fn run(args: &BenchArgs, files: &[PathBuf]) -> anyhow::Result<()> {
    let [path_a, path_b] = files else {
        bail!("--compare takes two results files");
    };
    let (a, b) = (load(path_a)?, load(path_b)?);
    let scenarios = common(&a, &b);
    if scenarios.is_empty() {
        bail!(
            "--compare: {} and {} have no scenario in common",
            path_a.display(),
            path_b.display()
        );
    }
    std::fs::create_dir_all(&args.chart_dir)
        .with_context(|| format!("create {}", args.chart_dir.display()))?;
    for scenario in scenarios {
        let runs_a: Vec<Report> = a
            .iter()
            .filter(|r| r.scenario == scenario)
            .cloned()
            .collect();
        let runs_b: Vec<Report> = b
            .iter()
            .filter(|r| r.scenario == scenario)
            .cloned()
            .collect();
        let (Some(median_a), Some(median_b)) = (
            median_run(&runs_a.iter().collect::<Vec<_>>()),
            median_run(&runs_b.iter().collect::<Vec<_>>()),
        ) else {
            continue;
        };
        let (name_a, name_b) = labels(&median_a, &median_b);
        println!(
            "scenario {scenario}: A = {name_a} ({} runs, {} claims), B = {name_b} ({} runs, {} claims); medians",
            runs_a.len(),
            median_a.claims,
            runs_b.len(),
            median_b.claims
        );
        println!("  {:<44} {:>12} {:>12} {:>9}", "figure", "A", "B", "B/A");
        for (figure, unit, va, vb, ratio) in table(&runs_a, &runs_b) {
            println!(
                "  {:<44} {:>12} {:>12} {:>9}",
                figure,
                format!("{va:.2} {unit}"),
                format!("{vb:.2} {unit}"),
                if ratio.is_finite() {
                    format!("{ratio:.2}x")
                } else {
                    "-".to_string()
                }
            );
        }
        let path = args.chart_dir.join(format!("compare-{scenario}.png"));
        let lines = [
            crate::chart::Line {
                label: format!(
                    "A: {name_a}, all Bound in {:.2} s",
                    median_a.seconds_to_all_bound
                ),
                points: median_a.bound_over_time.clone(),
            },
            crate::chart::Line {
                label: format!(
                    "B: {name_b}, all Bound in {:.2} s",
                    median_b.seconds_to_all_bound
                ),
                points: median_b.bound_over_time.clone(),
            },
        ];
        let title = format!(
            "{scenario}: {} claims, {name_a} against {name_b}",
            median_a.claims
        );
        crate::chart::write_png(
            &path,
            &crate::chart::Chart {
                title: &title,
                x_desc: time_axis(&scenario),
                y_desc: "claims Bound",
                lines: &lines,
            },
        )
        .with_context(|| format!("draw {}", path.display()))?;
        println!("  chart {}", path.display());
    }
    Ok(())
}

/// The two provisioners' names: the shortest tails of their command lines (whole path
/// components) that tell them apart, e.g. `goprov/csi-provisioner` and
/// `release/csi-provisioner`.
fn labels(a: &Report, b: &Report) -> (String, String) {
    let (sa, sb) = (short_name(&a.provisioner), short_name(&b.provisioner));
    if sa != sb || a.provisioner == b.provisioner {
        return (sa, sb);
    }
    let tail = |command: &str, parts: usize| {
        let components: Vec<&str> = command.split('/').collect();
        components[components.len().saturating_sub(parts)..].join("/")
    };
    let most = a
        .provisioner
        .split('/')
        .count()
        .max(b.provisioner.split('/').count());
    (2..=most)
        .map(|parts| (tail(&a.provisioner, parts), tail(&b.provisioner, parts)))
        .find(|(ta, tb)| ta != tb)
        .unwrap_or_else(|| (a.provisioner.clone(), b.provisioner.clone()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn report(scenario: &str, run: usize, seconds: f64, command: &str) -> Report {
        Report {
            scenario: scenario.into(),
            run,
            provisioner: command.into(),
            seconds_to_all_bound: seconds,
            ..Report::default()
        }
    }

    #[test]
    fn figures_are_compared_by_their_medians() {
        let a = [
            report("storm", 1, 4.0, "/go/csi-provisioner"),
            report("storm", 2, 2.0, "/go/csi-provisioner"),
            report("storm", 3, 3.0, "/go/csi-provisioner"),
            report("defaults", 1, 20.0, "/go/csi-provisioner"),
        ];
        let b = [report("storm", 1, 1.5, "/ours/csi-provisioner")];
        assert_eq!(common(&a, &b), vec!["storm".to_string()]);
        let rows = table(&a[..3], &b);
        let bound = rows.iter().find(|r| r.0 == "all Bound after").unwrap();
        assert_eq!((bound.2, bound.3, bound.4), (3.0, 1.5, 0.5));
    }

    #[test]
    fn same_program_names_are_told_apart_by_their_paths() {
        let a = report("storm", 1, 1.0, "/tmp/go/csi-provisioner");
        let b = report("storm", 1, 1.0, "/tmp/ours/csi-provisioner");
        assert_eq!(
            labels(&a, &b),
            (
                "go/csi-provisioner".to_string(),
                "ours/csi-provisioner".to_string()
            )
        );
        let c = report("storm", 1, 1.0, "/tmp/go/csi-provisioner --v=5");
        assert_eq!(
            labels(&a, &c),
            (
                "go/csi-provisioner".to_string(),
                "go/csi-provisioner --v=5".to_string()
            )
        );
        let c = report("storm", 1, 1.0, "/x/go-provisioner");
        assert_eq!(
            labels(&c, &b),
            ("go-provisioner".to_string(), "csi-provisioner".to_string())
        );
    }
}
