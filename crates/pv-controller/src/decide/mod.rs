//! Pure decisions of the PV controller.

pub mod binder;
pub mod classes;
