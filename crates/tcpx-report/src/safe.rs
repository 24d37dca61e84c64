//! The one place where text the tool did not choose (experiment names, labels, plan names,
//! values from a tuned.json, whatever a peer or a file said) is made safe for the files and
//! snippets users source, eval or feed to a parser, and where input files are read with a bound.
//!
//! * [`env_name`]: a variable name is `[A-Z_][A-Z0-9_]*` or refused.
//! * [`env_value`]: a value holds no control character (newline, CR, NUL, ESC, DEL, C1) or is
//!   refused: no format can carry a NUL, and a line-based reader could not read it back.
//! * [`shell_word`]: one POSIX shell word, bare or single-quoted; nothing in it expands.
//! * [`comment`]: one line of text for a `# ...` comment: control characters, the Unicode line
//!   and paragraph separators and backslashes are written as escapes, so a comment ends where
//!   the tool ends it.
//! * [`printable`]: text for the report files people read (results.csv, samples.csv, summary.md,
//!   index.html, the terminal's summary): every control character written as an escape, so no
//!   escape sequence, bell, carriage return or line feed from a peer or a plan reaches them raw.
//! * [`yaml_string`]: a YAML double-quoted scalar that any YAML 1.1 or 1.2 parser reads back as
//!   the same string.
//! * [`read_bounded`]: reads at most a stated number of bytes of a regular file and refuses a
//!   longer one, naming the file and the limit (a 20 GB file ends in milliseconds); a FIFO, a
//!   device such as `/dev/zero` or a directory is refused unread ([`tcpx_topo::open_regular`]).

use std::path::Path;

use crate::error::{refuse, Context, Error, Result};
pub use tcpx_topo::text::{comment, shell_arg, shell_word};
use tcpx_topo::text::{escape_char, is_line_breaking};

/// True for a variable name the tool writes: `[A-Z_][A-Z0-9_]*`.
pub fn is_env_name(name: &str) -> bool {
    let mut cs = name.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_uppercase() || c == '_')
        && cs.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// `name` when it is a variable name ([`is_env_name`]), else an error quoting it escaped.
pub fn env_name(name: &str) -> Result<&str> {
    if !is_env_name(name) {
        refuse!(
            "`{}` is not a variable name (names are [A-Z_][A-Z0-9_]*)",
            comment(name)
        );
    }
    Ok(name)
}

/// `value` when it holds no control character, else an error naming the first (escaped).
pub fn env_value<'a>(name: &str, value: &'a str) -> Result<&'a str> {
    if let Some(c) = value.chars().find(|c| is_line_breaking(*c)) {
        refuse!(
            "the value of {} holds the control character {} (`{}`): values are one line of printable text",
            comment(name),
            escape_char(c),
            comment(value)
        );
    }
    Ok(value)
}

/// `text` as one line of printable text: every [`is_line_breaking`] character (ESC, BEL, CR,
/// LF, DEL, C1, the Unicode line separators) written as an escape (`\x1b`, `\x07`, `\r`,
/// `\n`), everything else as it is. Unlike [`comment`], backslashes are not doubled: the report
/// files are read by people and spreadsheets (report.json keeps the exact text).
pub fn printable(text: &str) -> String {
    if !text.chars().any(is_line_breaking) {
        return text.to_string();
    }
    let mut s = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_line_breaking(c) {
            s.push_str(&escape_char(c));
        } else {
            s.push(c);
        }
    }
    s
}

/// `value` as a YAML double-quoted scalar: `\` and `"` escaped, and every character that is
/// not printable in YAML (control characters, NEL, the line and paragraph separators, the
/// byte-order mark, surrogates cannot occur in a `str`) written as `\xNN` / `\uNNNN`, so no
/// parser folds or drops it.
pub fn yaml_string(value: &str) -> String {
    let mut s = String::with_capacity(value.len() + 2);
    s.push('"');
    for c in value.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            c if is_line_breaking(c) || matches!(c, '\u{fffe}' | '\u{ffff}') => {
                if (c as u32) < 0x100 {
                    s.push_str(&format!("\\x{:02x}", c as u32));
                } else {
                    s.push_str(&format!("\\u{:04x}", c as u32));
                }
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// Reads `path` as UTF-8 text of at most `limit` bytes; a longer file is refused after reading
/// `limit + 1` bytes, anything but a regular file before reading, with the file, the limit and
/// `what` it should have been in the message.
pub fn read_bounded(path: &Path, limit: u64, what: &str) -> Result<String> {
    let bytes = read_bounded_bytes(path, limit, what)?;
    String::from_utf8(bytes).map_err(|e| {
        Error::Refused(format!(
            "{} is not UTF-8 text ({e}): is it {what}?",
            path.display()
        ))
    })
}

/// [`read_bounded`] without the UTF-8 check.
pub fn read_bounded_bytes(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    // A FIFO, device or directory is refused unread, naming the path (a FIFO's plain open
    // would wait for a writer forever).
    let file = tcpx_topo::open_regular(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            Error::Refused(format!("{e} (expected {what})"))
        } else {
            Error::Context {
                context: format!("opening {}", path.display()),
                cause: Box::new(e.into()),
            }
        }
    })?;
    let read = tcpx_topo::read_at_most(file, limit)
        .with_context(|| format!("reading {}", path.display()))?;
    let Some(bytes) = read else {
        refuse!(
            "{} is larger than {} (the limit for {what}): is it the right file?",
            path.display(),
            human_bytes(limit)
        );
    };
    Ok(bytes)
}

/// `1 MiB`, `64 MiB`, `512 KiB`, `100 B`.
pub fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_upper_case_words() {
        for ok in ["A", "_", "NCCL_MIN_NCHANNELS", "_X9"] {
            assert!(is_env_name(ok), "{ok}");
        }
        for bad in [
            "",
            "1X",
            "a",
            "A B",
            "EVIL;touch x",
            "A=B",
            "A\nB",
            "É",
            "A-B",
        ] {
            assert!(env_name(bad).is_err(), "{bad:?}");
        }
        let e = env_name("A\nB").unwrap_err().to_string();
        assert!(e.contains("`A\\nB`") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn values_with_control_characters_are_refused_with_the_character() {
        assert!(env_value("A", "eth1:8-21;eth2:8-21").is_ok());
        assert!(env_value("A", "it's $(x) `y`").is_ok());
        for bad in [
            "a\nb",
            "a\rb",
            "\0",
            "\x1b[31m",
            "\u{85}",
            "a\u{2028}b",
            "\x7f",
        ] {
            let e = env_value("A", bad).unwrap_err().to_string();
            assert!(!e.contains('\n') && !e.contains('\r'), "{e}");
        }
    }

    #[test]
    fn bounded_reads_refuse_endless_and_long_files_naming_them() {
        let e = read_bounded(Path::new("/dev/zero"), 1 << 20, "a tuned file")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev/zero is a character device, not a regular file")
                && e.contains("a tuned file"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        // A FIFO with no writer: a plain open waited for one forever.
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read_bounded(&f, 1 << 20, "a tuned file").map_err(|e| e.to_string()));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO hung")
            .unwrap_err();
        assert!(
            e.contains(&fifo.display().to_string()) && e.contains("FIFO"),
            "{e}"
        );
        let big = dir.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(4 << 30)
            .unwrap();
        let e = read_bounded(&big, 1 << 20, "a tuned file")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("big is larger than 1 MiB (the limit for a tuned file)"),
            "{e}"
        );
        let p = dir.path().join("f");
        std::fs::write(&p, "12345").unwrap();
        assert_eq!(read_bounded(&p, 5, "x").unwrap(), "12345");
        let e = read_bounded(&p, 4, "x").unwrap_err().to_string();
        assert!(e.contains("larger than 4 B"), "{e}");
        let e = read_bounded(&dir.path().join("absent"), 4, "x").unwrap_err();
        assert!(format!("{e:#}").contains("absent"), "{e:#}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the text, a comment is one line that starts no other.
        #[test]
        fn any_comment_is_one_line(text in any::<String>()) {
            let c = comment(&text);
            prop_assert!(!c.chars().any(is_line_breaking), "{c:?}");
        }

        /// Whatever the text, its printable form holds no control character.
        #[test]
        fn printable_text_has_no_control_character(text in any::<String>()) {
            let p = printable(&text);
            prop_assert!(!p.chars().any(is_line_breaking), "{p:?}");
        }

        /// Any value a YAML double-quoted scalar can hold is read back exactly.
        #[test]
        fn yaml_strings_parse_back(value in any::<String>()) {
            let doc = format!("v: {}\n", yaml_string(&value));
            let parsed: std::collections::BTreeMap<String, String> =
                serde_norway::from_str(&doc).map_err(|e| TestCaseError::fail(format!("{doc:?}: {e}")))?;
            prop_assert_eq!(&parsed["v"], &value);
        }
    }
}
