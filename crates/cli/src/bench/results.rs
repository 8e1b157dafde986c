//! Where a benchmark run writes its JSON results: one file per kind of results (provisioning
//! scenarios, attach, pool, capacity), chosen from `--output` and each kind's own flag.

use std::path::PathBuf;

use anyhow::Context;

use super::BenchArgs;

/// The kinds of results a run writes, each to its own file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Results {
    /// storm, defaults, steady, backlog.
    Provisioning,
    /// attach.
    Attach,
    /// pool.
    Pool,
    /// capacity.
    Capacity,
}

impl Results {
    fn of(scenario: &str) -> Results {
        match scenario {
            "attach" => Results::Attach,
            "pool" => Results::Pool,
            "capacity" => Results::Capacity,
            _ => Results::Provisioning,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Results::Provisioning => "results",
            Results::Attach => "attach",
            Results::Pool => "pool",
            Results::Capacity => "capacity",
        }
    }
}

/// Where `kind`'s results go (see `--output`).
pub(super) fn results_path(args: &BenchArgs, kind: Results) -> PathBuf {
    let own = match kind {
        Results::Provisioning => None,
        Results::Attach => args.attach_output.as_deref(),
        Results::Pool => args.pool_output.as_deref(),
        Results::Capacity => args.capacity_output.as_deref(),
    };
    let mut kinds: Vec<Results> = args.scenarios.iter().map(|s| Results::of(s)).collect();
    kinds.sort();
    kinds.dedup();
    choose_results_path(kind, own, args.output.as_deref(), kinds.len())
}

/// [`results_path`]'s rule: the kind's own flag; else `--output` when the run writes one kind
/// of results, or beside it with the kind's name for the other kinds; else
/// `bench-<kind>.json`.
pub fn choose_results_path(
    kind: Results,
    own: Option<&std::path::Path>,
    output: Option<&std::path::Path>,
    kinds_in_run: usize,
) -> PathBuf {
    if let Some(own) = own {
        return own.to_path_buf();
    }
    match output {
        Some(output) if kinds_in_run <= 1 || kind == Results::Provisioning => output.to_path_buf(),
        Some(output) => {
            let stem = output
                .file_stem()
                .map_or_else(|| "bench".into(), |s| s.to_string_lossy().into_owned());
            let name = match output.extension() {
                Some(ext) => format!("{stem}-{}.{}", kind.name(), ext.to_string_lossy()),
                None => format!("{stem}-{}", kind.name()),
            };
            output.with_file_name(name)
        }
        None => PathBuf::from(format!("bench-{}.json", kind.name())),
    }
}

/// Writes a scenario's results as JSON to `path` and says so.
pub(super) fn write_results(
    path: &std::path::Path,
    results: &impl serde::Serialize,
) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(results)?)
        .with_context(|| format!("write {}", path.display()))?;
    println!("results written to {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn results_go_to_their_own_flag_then_to_output_then_to_the_default() {
        let f = Some(Path::new("/r/run.json"));
        let own = Some(Path::new("/own.json"));
        // (kind, own flag, --output, kinds in the run) → file
        let cases = [
            (Results::Attach, None, f, 1, "/r/run.json"),
            (Results::Attach, own, f, 1, "/own.json"),
            (Results::Attach, None, f, 2, "/r/run-attach.json"),
            (Results::Provisioning, None, f, 2, "/r/run.json"),
            (Results::Pool, None, Some(Path::new("out")), 3, "out-pool"),
            (Results::Capacity, None, f, 3, "/r/run-capacity.json"),
            (Results::Attach, None, None, 1, "bench-attach.json"),
            (Results::Provisioning, None, None, 2, "bench-results.json"),
        ];
        for (kind, own, output, kinds, want) in cases {
            assert_eq!(
                choose_results_path(kind, own, output, kinds),
                PathBuf::from(want),
                "{kind:?} {own:?} {output:?} {kinds}"
            );
        }
    }
}
