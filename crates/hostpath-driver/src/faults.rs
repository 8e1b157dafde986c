//! Fault injection, off by default: per CSI method a latency, an error with a probability
//! (returned before or after the method did its work) and a hang. Rules come from `--fault`
//! flags and, while it exists, from a control file that is re-read whenever it changes, so a
//! test can switch faults on and off in the middle of a run. The file is recognised as changed
//! by its modification time, length and inode: replace it atomically (write, then rename).

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use sidecar_kit::csi::{go_code_name, parse_code};
use sidecar_kit::duration::parse_go_duration;

/// A rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fault rule {rule:?}: {reason}")]
pub struct FaultParseError {
    /// The rule as written.
    pub rule: String,
    /// What is wrong with it.
    pub reason: String,
}

/// When an injected error is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorTiming {
    /// Instead of doing the work.
    Before,
    /// After the work was done (the caller cannot tell that it happened).
    After,
}

/// An injected error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InjectedError {
    /// The gRPC code returned.
    pub code: tonic::Code,
    /// Probability in [0, 1].
    pub probability: f64,
    /// Before or after the work.
    pub timing: ErrorTiming,
}

/// Everything injected into one method.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultRule {
    /// Added before the method runs.
    pub latency: Option<Duration>,
    /// Error to return.
    pub error: Option<InjectedError>,
    /// Never answer while set (the client's deadline ends the call).
    pub hang: bool,
}

/// Rules by CSI method name (`CreateVolume`) or `*`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultSet {
    rules: BTreeMap<String, FaultRule>,
    /// `seed=N`: the draws of the probabilities start from this seed: the same calls in the
    /// same order draw the same faults (concurrent calls share one sequence, so their order
    /// decides which gets which draw).
    seed: Option<u64>,
}

impl FaultSet {
    /// Parses lines of `METHOD=RULE[,RULE..]`; blank lines and `#` comments are skipped.
    pub fn parse_lines<'a>(
        lines: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, FaultParseError> {
        let mut rules = BTreeMap::new();
        let mut seed = None;
        for line in lines {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(value) = line.strip_prefix("seed=") {
                seed = Some(value.trim().parse::<u64>().map_err(|_| FaultParseError {
                    rule: line.to_string(),
                    reason: "seed must be an unsigned integer".to_string(),
                })?);
                continue;
            }
            let (method, rule) = parse_rule(line)?;
            rules.insert(method, rule);
        }
        Ok(FaultSet { rules, seed })
    }

    /// The rule for a method: its own, else the `*` rule.
    pub fn rule(&self, method: &str) -> Option<&FaultRule> {
        self.rules.get(method).or_else(|| self.rules.get("*"))
    }

    /// Whether no fault is configured.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

fn parse_rule(line: &str) -> Result<(String, FaultRule), FaultParseError> {
    let fail = |reason: &str| FaultParseError {
        rule: line.to_string(),
        reason: reason.to_string(),
    };
    let (method, items) = line
        .split_once('=')
        .ok_or_else(|| fail("expected METHOD=RULES"))?;
    let method = method.trim();
    if method.is_empty() || !(method == "*" || method.chars().all(|c| c.is_ascii_alphanumeric())) {
        return Err(fail(
            "method must be a CSI method name such as CreateVolume, or *",
        ));
    }
    let mut rule = FaultRule::default();
    for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let mut parts = item.split(':');
        match parts.next() {
            Some("latency") => {
                let text = parts
                    .next()
                    .ok_or_else(|| fail("latency needs a duration"))?;
                let d = parse_go_duration(text).map_err(|e| fail(&e.to_string()))?;
                rule.latency = Some(d);
            }
            Some("hang") => rule.hang = true,
            Some("error") => {
                let code_text = parts
                    .next()
                    .ok_or_else(|| fail("error needs a gRPC code"))?;
                let code = parse_code(code_text).ok_or_else(|| fail("unknown gRPC code"))?;
                if code == tonic::Code::Ok {
                    return Err(fail("OK is not an error"));
                }
                let mut probability = 1.0;
                let mut timing = ErrorTiming::Before;
                for extra in parts.by_ref() {
                    match extra {
                        "after" => timing = ErrorTiming::After,
                        "before" => timing = ErrorTiming::Before,
                        p => {
                            probability = p
                                .parse::<f64>()
                                .ok()
                                .filter(|v| (0.0..=1.0).contains(v))
                                .ok_or_else(|| fail("probability must be a number in [0, 1]"))?;
                        }
                    }
                }
                rule.error = Some(InjectedError {
                    code,
                    probability,
                    timing,
                });
            }
            _ => {
                return Err(fail(
                    "rules are latency:DURATION, error:CODE[:P][:after], hang",
                ));
            }
        }
        if parts.next().is_some() {
            return Err(fail("too many ':' fields"));
        }
    }
    Ok((method.to_string(), rule))
}

/// The live fault configuration: flags, overridden by the control file while it exists.
#[derive(Debug)]
pub struct Faults {
    from_flags: FaultSet,
    file: Option<PathBuf>,
    cache: Mutex<FileCache>,
    hang_poll: Duration,
    draws: Mutex<Draws>,
}

/// The draws that decide whether an error with a probability fires, and the seed they
/// started from (None: from the OS).
#[derive(Debug)]
struct Draws {
    seed: Option<u64>,
    rng: rand::rngs::StdRng,
}

#[derive(Debug, Default)]
struct FileCache {
    stamp: Option<(SystemTime, u64, u64)>,
    set: Option<FaultSet>,
}

/// What the method has to do after the injected delay.
#[derive(Debug)]
pub enum Injection {
    /// Run normally.
    Proceed,
    /// Run, then answer this error instead of the result.
    FailAfter(tonic::Status),
}

impl Faults {
    /// Live faults from flags and an optional control file.
    pub fn new(from_flags: FaultSet, file: Option<PathBuf>, hang_poll: Duration) -> Self {
        Faults {
            from_flags,
            file,
            cache: Mutex::new(FileCache::default()),
            hang_poll,
            draws: Mutex::new(Draws {
                seed: None,
                rng: rand::SeedableRng::from_os_rng(),
            }),
        }
    }

    /// The seed of the faults in force (the control file's while it exists, else the flags').
    fn seed(&self) -> Option<u64> {
        if self.file.is_some()
            && let Some(set) = &self.cache.lock().set
        {
            return set.seed;
        }
        self.from_flags.seed
    }

    /// The next draw in [0, 1): a new seed starts the sequence again.
    fn draw(&self) -> f64 {
        use rand::Rng;
        let seed = self.seed();
        let mut draws = self.draws.lock();
        if draws.seed != seed {
            draws.seed = seed;
            draws.rng = match seed {
                Some(seed) => rand::SeedableRng::seed_from_u64(seed),
                None => rand::SeedableRng::from_os_rng(),
            };
        }
        draws.rng.random::<f64>()
    }

    /// The rule currently in force for a method.
    pub fn current(&self, method: &str) -> Option<FaultRule> {
        if let Some(path) = &self.file {
            let stamp = std::fs::metadata(path)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len(), m.ino())));
            let mut cache = self.cache.lock();
            if stamp != cache.stamp {
                cache.stamp = stamp;
                cache.set = match stamp {
                    None => None,
                    Some(_) => match std::fs::read_to_string(path)
                        .map_err(|e| e.to_string())
                        .and_then(|text| {
                            FaultSet::parse_lines(text.lines()).map_err(|e| e.to_string())
                        }) {
                        Ok(set) => {
                            tracing::info!(file = %path.display(), faults = ?set, "fault control file loaded");
                            Some(set)
                        }
                        Err(error) => {
                            tracing::error!(file = %path.display(), %error, "fault control file ignored");
                            cache.set.take()
                        }
                    },
                };
            }
            if let Some(set) = &cache.set {
                return set.rule(method).cloned();
            }
        }
        self.from_flags.rule(method).cloned()
    }

    /// Applies the faults of a method: hangs while a hang is set, sleeps the latency, then
    /// answers an error (before the work) or tells the caller to fail after the work.
    pub async fn inject(&self, method: &str) -> Result<Injection, tonic::Status> {
        let mut rule = self.current(method);
        if rule.as_ref().is_some_and(|r| r.hang) {
            tracing::warn!(method, "injected hang");
            while rule.as_ref().is_some_and(|r| r.hang) {
                tokio::time::sleep(self.hang_poll).await;
                rule = self.current(method);
            }
        }
        let Some(rule) = rule else {
            return Ok(Injection::Proceed);
        };
        if let Some(latency) = rule.latency {
            tokio::time::sleep(latency).await;
        }
        let Some(error) = rule.error else {
            return Ok(Injection::Proceed);
        };
        if error.probability < 1.0 && self.draw() >= error.probability {
            return Ok(Injection::Proceed);
        }
        let status = tonic::Status::new(
            error.code,
            format!(
                "injected fault: {method} fails with {}",
                go_code_name(error.code)
            ),
        );
        tracing::warn!(method, code = go_code_name(error.code), "injected error");
        Ok(match error.timing {
            ErrorTiming::Before => return Err(status),
            ErrorTiming::After => Injection::FailAfter(status),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_rule_form() {
        let set = FaultSet::parse_lines([
            "CreateVolume=latency:200ms,error:UNAVAILABLE:0.2",
            "# a comment",
            "",
            "DeleteVolume=error:DeadlineExceeded:after",
            "Probe=hang",
            "*=latency:1ms",
        ])
        .unwrap();
        let create = set.rule("CreateVolume").unwrap();
        assert_eq!(create.latency, Some(Duration::from_millis(200)));
        assert_eq!(
            create.error,
            Some(InjectedError {
                code: tonic::Code::Unavailable,
                probability: 0.2,
                timing: ErrorTiming::Before
            })
        );
        let delete = set.rule("DeleteVolume").unwrap().error.unwrap();
        assert_eq!(delete.timing, ErrorTiming::After);
        assert_eq!(delete.probability, 1.0);
        assert!(set.rule("Probe").unwrap().hang);
        assert_eq!(
            set.rule("ListVolumes").unwrap().latency,
            Some(Duration::from_millis(1))
        );
    }

    #[test]
    fn refuses_malformed_rules() {
        for line in [
            "CreateVolume",
            "=hang",
            "Create Volume=hang",
            "CreateVolume=error",
            "CreateVolume=error:NOPE",
            "CreateVolume=error:OK",
            "CreateVolume=error:UNAVAILABLE:1.5",
            "CreateVolume=latency",
            "CreateVolume=latency:fast",
            "CreateVolume=explode",
            "CreateVolume=hang:now",
        ] {
            assert!(
                FaultSet::parse_lines([line]).is_err(),
                "{line:?} should be refused"
            );
        }
    }

    #[tokio::test]
    async fn control_file_overrides_flags_and_is_reread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        let flags = FaultSet::parse_lines(["CreateVolume=error:INTERNAL"]).unwrap();
        let faults = Faults::new(flags, Some(path.clone()), Duration::from_millis(5));
        assert_eq!(
            faults.inject("CreateVolume").await.unwrap_err().code(),
            tonic::Code::Internal
        );
        assert!(matches!(
            faults.inject("DeleteVolume").await,
            Ok(Injection::Proceed)
        ));

        std::fs::write(&path, "DeleteVolume=error:ABORTED\n").unwrap();
        assert!(matches!(
            faults.inject("CreateVolume").await,
            Ok(Injection::Proceed)
        ));
        assert_eq!(
            faults.inject("DeleteVolume").await.unwrap_err().code(),
            tonic::Code::Aborted
        );

        std::fs::write(&path, "DeleteVolume=error:UNAVAILABLE:1:after\n").unwrap();
        assert!(matches!(
            faults.inject("DeleteVolume").await,
            Ok(Injection::FailAfter(_))
        ));

        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            faults.inject("CreateVolume").await.unwrap_err().code(),
            tonic::Code::Internal
        );
    }

    // Paused time: the hang's polls (file reads are synchronous) run at virtual instants, so
    // "still hanging after 100 ms" is exact on any machine, not a guess about timing.
    #[tokio::test(start_paused = true)]
    async fn a_hang_lasts_until_it_is_switched_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        std::fs::write(&path, "CreateVolume=hang\n").unwrap();
        let faults = std::sync::Arc::new(Faults::new(
            FaultSet::default(),
            Some(path.clone()),
            Duration::from_millis(5),
        ));
        let hanging = tokio::spawn({
            let faults = faults.clone();
            async move { faults.inject("CreateVolume").await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !hanging.is_finished(),
            "the call must hang while the rule is set"
        );
        std::fs::write(&path, "# no faults, and a different length\n").unwrap();
        let result = tokio::time::timeout(Duration::from_secs(5), hanging)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(result, Ok(Injection::Proceed)));
    }

    #[tokio::test]
    async fn a_seed_replays_the_same_faults() {
        let run = |lines: &'static [&'static str]| async move {
            let faults = Faults::new(
                FaultSet::parse_lines(lines.iter().copied()).unwrap(),
                None,
                Duration::from_millis(5),
            );
            let mut fired = Vec::new();
            for _ in 0..64 {
                fired.push(faults.inject("CreateVolume").await.is_err());
            }
            fired
        };
        let seeded = &["seed=42", "CreateVolume=error:INTERNAL:0.5"];
        let first = run(seeded).await;
        assert_eq!(
            run(seeded).await,
            first,
            "the same seed fires the same faults"
        );
        assert!(first.contains(&true) && first.contains(&false), "{first:?}");
        let other = run(&["seed=43", "CreateVolume=error:INTERNAL:0.5"]).await;
        assert_ne!(other, first, "another seed, other faults");
        assert!(FaultSet::parse_lines(["seed=x"]).is_err());
    }

    #[tokio::test]
    async fn probability_zero_never_fires_and_one_always_fires() {
        let never = Faults::new(
            FaultSet::parse_lines(["CreateVolume=error:INTERNAL:0"]).unwrap(),
            None,
            Duration::from_millis(5),
        );
        let always = Faults::new(
            FaultSet::parse_lines(["CreateVolume=error:INTERNAL:1"]).unwrap(),
            None,
            Duration::from_millis(5),
        );
        for _ in 0..100 {
            assert!(never.inject("CreateVolume").await.is_ok());
            assert!(always.inject("CreateVolume").await.is_err());
        }
    }
}
