//! The statements of `queries/views.sql`, the shared work of the bundled
//! analyses: how the file splits into statements, which line is code, what
//! each statement makes.

/// The shared work of the bundled analyses.
pub const VIEWS_SQL: &str = include_str!("../../../queries/views.sql");

/// The statements of a SQL file: each ends with `;` at the end of a line.
pub fn statements(sql: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, _) in sql.match_indices(";\n") {
        out.push(&sql[start..=i]);
        start = i + 2;
    }
    if !sql[start..].trim().is_empty() {
        out.push(&sql[start..]);
    }
    out
}

/// The statements of `queries/views.sql` that make something (comments
/// alone are skipped).
pub fn shared_statements() -> Vec<&'static str> {
    statements(VIEWS_SQL)
        .into_iter()
        .filter(|s| s.lines().any(is_code))
        .collect()
}

/// Whether a line of `views.sql` is code: neither blank nor a comment.
pub fn is_code(line: &str) -> bool {
    !line.trim().is_empty() && !line.trim_start().starts_with("--")
}

/// The statements of `views.sql` that make `tables` (the stored tables,
/// crate::stored::TABLES): those up to the last of them. The stored
/// tables are named by these alone, so a change to the statements after
/// them (the outliers) leaves the tables runs keep valid.
pub fn statements_making(tables: &[&str]) -> Vec<&'static str> {
    let all = shared_statements();
    let last = all
        .iter()
        .rposition(|s| statement_name(s).is_some_and(|n| tables.contains(&n)))
        .unwrap_or(all.len() - 1);
    all[..=last].to_vec()
}

/// The name a `views.sql` statement creates (`CREATE OR REPLACE TEMP
/// TABLE name AS`) or sets (`SET VARIABLE name =`).
pub fn statement_name(stmt: &str) -> Option<&str> {
    stmt.lines().find_map(|l| {
        if l.starts_with("CREATE") {
            l.split_whitespace().nth(5)
        } else if l.starts_with("SET VARIABLE") {
            l.split_whitespace().nth(2)
        } else {
            None
        }
    })
}
