//! `volstack faults`: writes the reference driver's fault control file atomically, so a
//! running driver switches faults at its next request.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use hostpath_driver::faults::FaultSet;

/// Flags of `volstack faults`.
#[derive(Debug, clap::Args)]
pub struct FaultsArgs {
    /// The file the driver was started with (--fault-file).
    #[arg(long)]
    pub file: PathBuf,
    /// Rules, METHOD=RULE[,RULE..] (see `volstack driver --help`). None clears every fault.
    pub rules: Vec<String>,
}

/// Validates the rules and replaces the control file.
pub fn run(args: FaultsArgs) -> anyhow::Result<()> {
    FaultSet::parse_lines(args.rules.iter().map(String::as_str))?;
    let mut text = String::from("# written by volstack faults\n");
    for rule in &args.rules {
        text.push_str(rule);
        text.push('\n');
    }
    let dir = args
        .file
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let mut tmp = tempfile_in(&dir)?;
    tmp.1.write_all(text.as_bytes())?;
    tmp.1.sync_all()?;
    std::fs::rename(&tmp.0, &args.file)
        .with_context(|| format!("failed to replace {}", args.file.display()))?;
    println!("{} fault rule(s) in force", args.rules.len());
    Ok(())
}

fn tempfile_in(dir: &std::path::Path) -> anyhow::Result<(PathBuf, std::fs::File)> {
    let path = dir.join(format!(".faults.{}.tmp", std::process::id()));
    let file = std::fs::File::create(&path)
        .with_context(|| format!("failed to create {}", path.display()))?;
    Ok((path, file))
}
