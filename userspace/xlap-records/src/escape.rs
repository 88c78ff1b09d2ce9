//! Escaping of every text that came from data (run ids, host names, stage
//! and marker names: what a traced program or a run directory from
//! elsewhere controls) into the documents xlap-trace writes: one module,
//! as SQL has one quoting module (`xlap_analyze::sql`). A field can change
//! a document's text, never its structure: no heading, table row, element
//! or terminal control sequence of its own.

/// Text for XML and HTML, in element content and in attribute values
/// alike; characters XML 1.0 does not allow (most C0 controls) become
/// U+FFFD.
pub fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || matches!(c, '\u{fffe}' | '\u{ffff}') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// Text for one Markdown table cell or within a line of Markdown
/// (GitHub's flavour, which also renders HTML): on one line, so a field
/// cannot end a cell, nor start a heading, a list or a quote; the
/// characters of inline constructs escaped, so it cannot open a code span,
/// a link or an HTML element. Numbers and words stay as they are.
pub fn markdown(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            // Inline constructs (emphasis, code, links, strikethrough, the
            // table's cells); block ones need a line start, which a field
            // never has (its line breaks are gone below). `_` is left: the
            // names are snake case, and an underscore within a word
            // emphasises nothing.
            '\\' | '`' | '*' | '[' | ']' | '|' | '~' => {
                out.push('\\');
                out.push(c);
            }
            // A line break (or any control) would end the cell or line.
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Text as a Markdown code span for a table cell: shown as it is, on one
/// line; fenced by more backticks than it holds (a backtick in the text
/// cannot close it), its `|` escaped (a table splits cells before it
/// parses code spans; GitHub's flavour takes `\|` there).
pub fn code(s: &str) -> String {
    let text: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .replace('|', "\\|");
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    // A space on each side when the text starts or ends with a backtick
    // (CommonMark strips one from each side).
    let pad = if text.starts_with('`') || text.ends_with('`') || text.is_empty() {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{text}{pad}{fence}")
}

/// Text for a terminal: control characters (escape sequences, carriage
/// returns, line breaks) shown as `\u{..}` instead of acting.
pub fn terminal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_text_opens_no_element_and_keeps_attributes_closed() {
        assert_eq!(
            xml("<script>\"a\" & 'b'</script>"),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
        assert_eq!(xml("a\u{0}b\u{1b}c"), "a\u{fffd}b\u{fffd}c");
    }

    /// The forged verdict of issue 50: a run id that starts a heading.
    #[test]
    fn markdown_fields_stay_in_their_cell_and_line() {
        let forged = "x\n\n### ✅ xlap-trace: pass\n<!--";
        let e = markdown(forged);
        assert!(!e.contains('\n') && !e.contains('<'), "{e}");
        assert!(!e.starts_with('#'));
        assert_eq!(markdown("a|b"), "a\\|b");
        assert_eq!(markdown("`code`"), "\\`code\\`");
        assert_eq!(markdown("plain words 42.5"), "plain words 42.5");
    }

    #[test]
    fn code_spans_hold_backticks_and_pipes() {
        assert_eq!(code("e2e.p50"), "`e2e.p50`");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`x`"), "`` `x` ``");
        assert_eq!(code("a|b\nc"), "`a\\|b c`");
    }

    #[test]
    fn terminal_text_sends_no_control_sequence() {
        assert_eq!(terminal("a\u{1b}[2Jb\r\n"), "a\\u{1b}[2Jb\\u{d}\\u{a}");
    }
}
