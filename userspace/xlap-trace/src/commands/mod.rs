//! One module per command (or family of commands): each turns its
//! arguments into the libraries' options and prints what they return.

pub mod analyze;
pub mod ci;
pub mod correlate;
pub mod demo;
pub mod estimate;
pub mod peer_link;
pub mod points;
pub mod record;
pub mod report;
pub mod schema;
pub mod stage;
