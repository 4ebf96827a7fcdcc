//! A plain Markdown table for bench targets whose columns are not the three routes of [`report::table`]
//! (the interception benchmark's mitmdump column, the sandbox start benchmark's phases).
//!
//! [`report::table`]: crate::report::table

use std::fmt::Write as _;

/// Renders `header` and `rows` as a Markdown table with padded columns; the columns in `numeric` are
/// right-aligned, the others left-aligned.
pub fn render(header: &[&str], rows: &[Vec<String>], numeric: &[usize]) -> String {
    // At least three wide: a Markdown delimiter cell needs room for its dashes and colon.
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count().max(3)).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String], rule: bool| {
        out.push('|');
        for (i, w) in widths.iter().enumerate() {
            let cell = cells.get(i).map_or("", String::as_str);
            let _ = match (rule, numeric.contains(&i)) {
                (true, true) => write!(out, " {}: |", "-".repeat(w.saturating_sub(1))),
                (true, false) => write!(out, " {} |", "-".repeat(*w)),
                (false, true) => write!(out, " {cell:>w$} |"),
                (false, false) => write!(out, " {cell:<w$} |"),
            };
        }
        out.push('\n');
    };
    line(
        &mut out,
        &header.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>(),
        false,
    );
    line(&mut out, &[], true);
    for row in rows {
        line(&mut out, row, false);
    }
    out
}

/// A number for a table cell: no decimals from 100 up, two below; `-` for none.
pub fn num(value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let table = render(
            &["name", "value"],
            &[vec!["a".into(), "1".into()], vec!["longer".into(), "1234".into()]],
            &[1],
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "| name   | value |");
        assert_eq!(lines[1], "| ------ | ----: |");
        assert_eq!(lines[2], "| a      |     1 |");
        assert_eq!(num(Some(1234.4)), "1234");
        assert_eq!(num(Some(0.456)), "0.46");
        assert_eq!(num(None), "-");
    }
}
