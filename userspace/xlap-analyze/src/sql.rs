//! SQL text from names and values that come from data.
//!
//! Point names come from the traced programs' ELF notes, hosts and boot ids
//! from run.json, column names from Parquet files that may have been made
//! elsewhere (a CI artifact): none of it may ever become SQL of its own.
//! Values go in as bound parameters where the statement allows them; where
//! it does not (a column name, a view's file, a `COPY` target, a value list
//! inside DDL) they go through [`ident`] or [`literal`], the only two
//! quoting rules of the crate.
//!
//! A NUL byte cannot be part of SQL text handed to DuckDB: duckdb-rs refuses
//! such a statement as a whole (it never reaches DuckDB cut short), so both
//! functions leave it in place, and names are checked where they enter
//! ([`check_name`]) to say which name in which file is unusable.

use std::path::Path;

/// `name` as a DuckDB identifier: double-quoted, `"` doubled. An ordinary
/// name reads `"name"`, as the SQL spelled it before.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `s` as a DuckDB string literal: single-quoted, `'` doubled (standard
/// strings take no backslash escapes, so nothing else is special).
pub fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A file's path as a string literal, spelled absolute: an engine confined
/// to directories (`crate::confine`) compares a path's spelling with
/// theirs, and takes a relative one as it stands.
pub fn path(p: &Path) -> String {
    literal(&crate::absolute(p).display().to_string())
}

/// String literals separated by `, `: the items of an `IN (...)` or a
/// `[...]` list.
pub fn literals<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    items
        .into_iter()
        .map(|s| literal(s.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// File paths as a list's items.
pub fn paths<P: AsRef<Path>>(items: impl IntoIterator<Item = P>) -> String {
    items
        .into_iter()
        .map(|p| path(p.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a name read from a file cannot be a point or column name, if it
/// cannot: quoting carries every other character, but a control character
/// (NUL above all) cannot enter SQL text, and would garble the tables and
/// messages that show the name.
pub fn check_name(name: &str) -> Result<(), String> {
    match name.chars().find(|c| c.is_control()) {
        Some(c) => Err(format!(
            "the name {name:?} holds the control character U+{:04X}, which no point or column name may hold",
            c as u32
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_names_are_quoted_as_before() {
        assert_eq!(ident("app_send_start_ns"), "\"app_send_start_ns\"");
        assert_eq!(literal("dev.queue"), "'dev.queue'");
        assert_eq!(literals(["a", "b"]), "'a', 'b'");
        assert_eq!(path(Path::new("/r/it's")), "'/r/it''s'");
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            path(Path::new("r")),
            literal(&cwd.join("r").display().to_string())
        );
    }

    #[test]
    fn quotes_are_doubled() {
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(ident("a'b"), "\"a'b\"");
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(literal("a\"b"), "'a\"b'");
        assert_eq!(literal("x'); DROP TABLE t; --"), "'x''); DROP TABLE t; --'");
    }

    /// What DuckDB reads back is the name itself, whatever it holds.
    #[test]
    fn duckdb_reads_back_the_exact_name() {
        let conn = duckdb::Connection::open_in_memory().unwrap();
        for name in [
            "send_start'x",
            "a\"b",
            "x'); COPY (SELECT 1) TO '/tmp/xlap-sql-test.csv'; --",
            "..",
            "\\'",
            "e\u{301}",
        ] {
            let sql = format!("SELECT {} AS {}", literal(name), ident(name));
            let mut stmt = conn.prepare(&sql).unwrap();
            let value: String = stmt.query_row([], |r| r.get(0)).unwrap();
            assert_eq!(value, name);
            assert_eq!(stmt.column_names(), vec![name.to_string()]);
        }
        assert!(!Path::new("/tmp/xlap-sql-test.csv").exists());
    }

    /// A NUL byte is refused with the statement, never read up to the NUL.
    #[test]
    fn a_nul_byte_refuses_the_statement() {
        let conn = duckdb::Connection::open_in_memory().unwrap();
        let sql = format!("SELECT {} AS {}", literal("a\0b"), ident("c\0d"));
        assert!(conn.prepare(&sql).is_err());
        assert!(conn.execute_batch(&sql).is_err());
    }

    #[test]
    fn control_characters_make_a_name_unusable() {
        assert!(check_name("app.send_start'x; --\"..").is_ok());
        assert!(check_name("app.é").is_ok());
        let e = check_name("app.a\0b").unwrap_err();
        assert!(e.contains("U+0000"), "{e}");
        assert!(check_name("app.a\nb").is_err());
    }
}
