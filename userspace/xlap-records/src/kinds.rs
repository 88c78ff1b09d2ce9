//! How kinds are named in output, by the recorder's live view and by the
//! analyses alike.

/// The kind the analyses give the packets of a layout without a kind field
/// (the packets table keeps `kind` null for them, as captured): one kind,
/// named [`KIND_ALL_NAME`]. Above every 32-bit kind, so it meets none.
pub const KIND_ALL: u64 = 1 << 32;
/// The name of [`KIND_ALL`].
pub const KIND_ALL_NAME: &str = "all";

/// How output names a kind: `kind 1 (data)`, `kind 7`, or `kind all`.
pub fn kind_label(kind: u64, name: Option<&str>) -> String {
    match (kind, name) {
        (KIND_ALL, _) => format!("kind {KIND_ALL_NAME}"),
        (k, Some(n)) => format!("kind {k} ({n})"),
        (k, None) => format!("kind {k}"),
    }
}
