//! Text the tool did not choose (a path, a name, whatever a file or a peer said) made safe for
//! the one-line forms every layer prints: a `# ...` comment ([`comment`]) and a shell word for a
//! command users paste ([`shell_word`], [`shell_arg`]). Here, at the bottom, so that every crate
//! prints them the same way; `tcpx_report::safe` builds the file formats on them.

/// Characters that could end or rewrite a line for some reader: every control character (C0,
/// DEL, C1, NEL included), the Unicode line and paragraph separators and the byte-order mark.
pub fn is_line_breaking(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}')
}

/// `c` as an escape: `\n`, `\r`, `\t`, `\xNN` below U+0100, else `\u{NNNN}`.
pub fn escape_char(c: char) -> String {
    match c {
        '\n' => "\\n".into(),
        '\r' => "\\r".into(),
        '\t' => "\\t".into(),
        c if (c as u32) < 0x100 => format!("\\x{:02x}", c as u32),
        c => format!("\\u{{{:04x}}}", c as u32),
    }
}

/// `text` as one line for a comment: backslashes doubled, every [`is_line_breaking`] character
/// written as an escape (`\n`, `\r`, `\t`, `\xNN`, `\u{NNNN}`).
pub fn comment(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\\' {
            s.push_str("\\\\");
        } else if is_line_breaking(c) {
            s.push_str(&escape_char(c));
        } else {
            s.push(c);
        }
    }
    s
}

/// `value` as one shell word: bare when it has only characters no shell treats specially,
/// else single-quoted (a `'` as `'\''`). Inside single quotes nothing expands, so the word is
/// the value exactly; callers refuse values with a NUL (no shell word holds one).
pub fn shell_word(value: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-.,:/=+@%".contains(c);
    if !value.is_empty() && value.chars().all(safe) {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// `text` (a path, say) for a command line the tool prints for users to paste: a
/// [`shell_word`], or, when it holds a control character no pasted line can carry (a newline in
/// a directory name), an ANSI-C quoted word `$'...'` (bash, zsh, ksh, busybox and POSIX.1-2024
/// sh) whose escapes give back exactly those bytes: still one line, and the same path.
pub fn shell_arg(text: &str) -> String {
    if !text.chars().any(is_line_breaking) {
        return shell_word(text);
    }
    let mut s = String::from("$'");
    for c in text.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '\'' => s.push_str("\\'"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if is_line_breaking(c) => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    s.push_str(&format!("\\x{b:02x}"));
                }
            }
            c => s.push(c),
        }
    }
    s.push('\'');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_arguments_are_one_shell_word() {
        assert_eq!(
            shell_arg("reports/20261124T000000Z-p"),
            "reports/20261124T000000Z-p"
        );
        assert_eq!(shell_arg("my reports/x;y"), "'my reports/x;y'");
        assert_eq!(shell_arg("it's"), r"'it'\''s'");
        // Issue 43: a newline in a path is written so that the shell gives it back.
        assert_eq!(shell_arg("a\nb"), r"$'a\nb'");
        assert_eq!(shell_arg("it's\n\\x\u{2028}"), r"$'it\'s\n\\x\xe2\x80\xa8'");
        let dir = std::env::temp_dir().join(format!("tcpx topo\nit's {}", std::process::id()));
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "printf %s {}",
                shell_arg(&dir.display().to_string())
            ))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            dir.display().to_string()
        );
    }

    #[test]
    fn comments_stay_on_one_line() {
        assert_eq!(comment("a\nb\\c\r\u{2028}"), "a\\nb\\\\c\\r\\u{2028}");
        assert_eq!(comment("plain text: 1.5 GB/s"), "plain text: 1.5 GB/s");
    }
}
