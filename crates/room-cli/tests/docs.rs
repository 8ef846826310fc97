//! The README is a front door and the docs say what is true: the README stays within its
//! size, every `room` command it or the docs show exists (`room … --help` accepts it), and every
//! relative link from the README, ARCHITECTURE.md and docs/ resolves to a file (and to a heading
//! where it names one).

use std::path::{Path, PathBuf};

/// The README's bound, in lines.
const README_LINES_MAX: usize = 150;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every markdown file the links are checked in.
fn documents() -> Vec<String> {
    let mut out = vec!["README.md".to_string(), "ARCHITECTURE.md".to_string()];
    let mut dirs = vec![root().join("docs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                let rel = p
                    .strip_prefix(root())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push(
                    rel.replace("/../..", "")
                        .trim_start_matches("./")
                        .to_string(),
                );
            }
        }
    }
    out
}

/// The command lines in a markdown text's `sh` code blocks, each split at `&&` and `|`, comments
/// dropped, continuation lines joined.
fn command_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let code = line.split(" #").next().unwrap_or("").trim_end();
        pending.push_str(code.trim_end_matches('\\'));
        pending.push(' ');
        if code.ends_with('\\') {
            continue;
        }
        for part in pending.split("&&").flat_map(|p| p.split('|')) {
            let part = part.trim().trim_end_matches('&').trim();
            if part.starts_with("room ") {
                out.push(part.to_string());
            }
        }
        pending.clear();
    }
    out
}

/// The heading anchors of a markdown text, as GitHub makes them.
fn anchors(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = read("README.md");
    let n = readme.lines().count();
    assert!(
        n <= README_LINES_MAX,
        "README.md has {n} lines; the reference belongs in docs/"
    );
    // the two commands first
    let first_block: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("```sh"))
        .skip(1)
        .take(2)
        .collect();
    assert!(first_block[0].starts_with("cargo run --release -- demo"));
    assert!(first_block[1].starts_with("scripts/test"));
}

#[test]
fn every_command_shown_exists() {
    let mut checked = 0;
    for doc in documents() {
        for line in command_lines(&read(&doc)) {
            // the words before the first option: a command path and its positionals
            let words: Vec<&str> = line
                .split_whitespace()
                .skip(1)
                .take_while(|w| !w.starts_with('-') && !w.starts_with('<') && !w.contains('='))
                .collect();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_room"))
                .args(&words)
                .arg("--help")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{doc}: `{line}`: room {} --help failed: {}",
                words.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "{checked} commands checked");
}

#[test]
fn every_relative_link_resolves() {
    for doc in documents() {
        let text = read(&doc);
        let dir = Path::new(&doc).parent().unwrap_or(Path::new(""));
        for target in links(&text) {
            if target.starts_with("http") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                PathBuf::from(&doc)
            } else {
                dir.join(file)
            };
            let full = root().join(&path);
            assert!(
                full.exists(),
                "{doc}: link {target} → {} is missing",
                path.display()
            );
            if let Some(a) = anchor
                && full.extension().is_some_and(|x| x == "md")
            {
                let heads = anchors(&std::fs::read_to_string(&full).unwrap());
                assert!(
                    heads.iter().any(|h| h == a),
                    "{doc}: link {target}: no heading #{a} in {} ({heads:?})",
                    path.display()
                );
            }
        }
    }
}

/// The targets of markdown links `](…)` in a text.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(j) = after.find(')') else { break };
        let t = &after[..j];
        if !t.is_empty() && !t.contains(char::is_whitespace) {
            out.push(t.to_string());
        }
        rest = &after[j..];
    }
    out
}

/// The commands of `room ARGS --help` (its `Commands:` section), without `help`.
fn subcommands(args: &[&str]) -> Vec<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_room"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|c| c != "help")
        .collect()
}

/// The command reference cannot drift from the grammar: every command and subcommand `room
/// --help` lists is in docs/reference/cli.md (as `room COMMAND SUB` or as one of a row's
/// `/`-joined alternatives).
#[test]
fn the_command_reference_covers_the_grammar() {
    let cli = read("docs/reference/cli.md");
    let mut missing = Vec::new();
    for c in subcommands(&[]) {
        if !cli.contains(&format!("`room {c}")) {
            missing.push(c.clone());
        }
        for sub in subcommands(&[c.as_str()]) {
            if !cli.contains(&format!("room {c} {sub}")) && !cli.contains(&format!("`{sub}")) {
                missing.push(format!("{c} {sub}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/reference/cli.md does not describe: {missing:?}"
    );
}
