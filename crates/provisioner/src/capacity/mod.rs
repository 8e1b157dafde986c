//! Storage-capacity tracking (CSIStorageCapacity), upstream's `--enable-capacity`.
//!
//! - `decide`: segments, tracked classes, and the changes to the objects (pure).

pub mod decide;
