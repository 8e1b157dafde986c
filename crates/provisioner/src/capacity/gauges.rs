//! Upstream's three capacity gauges: objects wanted, wanted objects that exist, and objects
//! that exist and will be deleted.

use std::collections::{BTreeSet, HashMap};

use prometheus::IntGauge;

use super::decide::Item;

/// The three gauges upstream exports (no labels).
#[derive(Clone)]
pub(super) struct Gauges {
    goal: IntGauge,
    current: IntGauge,
    obsolete: IntGauge,
}

impl Gauges {
    pub(super) fn register(
        metrics: &sidecar_kit::metrics::Metrics,
    ) -> Result<Gauges, prometheus::Error> {
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let g = IntGauge::new(name, help)?;
            metrics.registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        Ok(Gauges {
            goal: gauge(
                "csistoragecapacities_desired_goal",
                "[ALPHA] Number of CSIStorageCapacity objects that are supposed to be managed automatically.",
            )?,
            current: gauge(
                "csistoragecapacities_desired_current",
                "[ALPHA] Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.",
            )?,
            obsolete: gauge(
                "csistoragecapacities_obsolete",
                "[ALPHA] Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value.",
            )?,
        })
    }
}

/// (wanted, wanted that exist, obsolete) from the wanted items and the objects of each item.
/// Obsolete counts objects, not items: a second object of a wanted item is obsolete too.
pub(super) fn counts(
    wanted: &BTreeSet<Item>,
    index: &HashMap<Item, BTreeSet<String>>,
) -> (usize, usize, usize) {
    let current = wanted.iter().filter(|i| index.contains_key(i)).count();
    let obsolete = index
        .iter()
        .map(|(item, names)| {
            if wanted.contains(item) {
                names.len().saturating_sub(1)
            } else {
                names.len()
            }
        })
        .sum();
    (wanted.len(), current, obsolete)
}

impl Gauges {
    /// Sets the gauges from the wanted items and the objects of each item.
    pub(super) fn set(&self, wanted: &BTreeSet<Item>, index: &HashMap<Item, BTreeSet<String>>) {
        let (goal, current, obsolete) = counts(wanted, index);
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.goal.set(n(goal));
        self.current.set(n(current));
        self.obsolete.set(n(obsolete));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn obsolete_counts_every_object_of_an_unwanted_item_and_the_extra_ones_of_a_wanted_one() {
        let item = |class: &str| Item {
            class: class.into(),
            segment: Default::default(),
        };
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let wanted = BTreeSet::from([item("a"), item("b")]);
        let index = HashMap::from([
            (item("a"), names(&["a-1", "a-2"])),
            (item("gone"), names(&["g-1"])),
        ]);
        // Wanted a and b; a exists (twice: one obsolete); gone's object is obsolete.
        assert_eq!(counts(&wanted, &index), (2, 1, 2));
        assert_eq!(counts(&BTreeSet::new(), &HashMap::new()), (0, 0, 0));
    }
}
