//! Pure decisions of the PV controller and its companions.

pub mod attach_detach;
pub mod binder;
pub mod binding;
pub mod classes;
pub mod consumers;
pub mod ephemeral;
pub mod in_tree;
pub mod matching;
pub mod protection;
pub mod reasons;
pub mod reclaim;
pub mod recycle;

#[cfg(test)]
mod attach_detach_tests;
