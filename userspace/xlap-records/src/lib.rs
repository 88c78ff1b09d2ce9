//! Decoded stamps, the stamp-point vocabulary, the Arrow schema of what
//! xlap-trace writes, and writers for it. Pure Rust: testable without root.

pub mod points;
pub mod schema;
pub mod stamp;
pub mod writer;

pub use points::{Layer, PointInfo, Side};
pub use stamp::Stamp;
