//! Every relative link in README.md and docs/**/*.md resolves: the file or
//! folder it names exists inside the repository, and a `#fragment` into a
//! markdown file names one of its headings, by GitHub's heading slugs
//! (lower case, punctuation dropped, spaces to hyphens, `-1`, `-2`, ... for
//! repeated headings) or an explicit `<a id>`/`<a name>`.
//!
//! Links are inline (`[text](target)`, images too) and reference
//! definitions (`[label]: target`); those inside code spans and fenced code
//! blocks are not links and are skipped, and so are targets with a scheme
//! (`https:`, `mailto:`, ...). The checker is plain std and checks itself on
//! made-up documents below, so that it cannot pass by finding nothing.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("dataplane/ has a parent")
        .to_path_buf()
}

/// README.md and every `.md` file under docs/, sorted, relative to `root`.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("README.md")];
    let mut dirs = vec![PathBuf::from("docs")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for entry in entries {
            let entry = entry.expect("readable docs/ entry");
            let rel = dir.join(entry.file_name());
            if entry.file_type().expect("file type").is_dir() {
                dirs.push(rel);
            } else if rel.extension().is_some_and(|e| e == "md") {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// A link found in a document: its 1-based line and its target as written.
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    target: String,
}

/// The document with every fenced code block's text replaced by spaces
/// (newlines kept, so offsets and line numbers stay where they were).
fn without_fences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fence: Option<(char, usize)> = None;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let run = |c: char| trimmed.chars().take_while(|&x| x == c).count();
        let opens = [('`', run('`')), ('~', run('~'))]
            .into_iter()
            .find(|&(_, n)| n >= 3 && indent <= 3);
        let in_code = match (fence, opens) {
            (None, Some(f)) => {
                fence = Some(f);
                true
            }
            (None, None) => false,
            (Some((c, n)), _) => {
                // A closing fence: the same character, at least as long,
                // and nothing else on the line.
                if run(c) >= n && trimmed.trim_end().chars().all(|x| x == c) {
                    fence = None;
                }
                true
            }
        };
        if in_code {
            out.extend(line.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
        } else {
            out.push_str(line);
        }
    }
    out
}

/// `para` with the text of its code spans (a run of n backticks up to the
/// next run of exactly n) replaced by spaces; unmatched backticks stay.
fn without_code_spans(para: &str) -> String {
    let chars: Vec<char> = para.chars().collect();
    let mut out = chars.clone();
    let run_at = |i: usize| chars[i..].iter().take_while(|&&c| c == '`').count();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let n = run_at(i);
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = run_at(j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                for c in &mut out[i..j + n] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = j + n;
            }
            None => i += n,
        }
    }
    out.into_iter().collect()
}

/// The paragraphs (runs of non-blank lines) of `text`, each with the
/// 1-based line it starts on.
fn paragraphs(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            out.extend(current.take());
            continue;
        }
        let para = current.get_or_insert_with(|| (n + 1, String::new()));
        para.1.push_str(line);
        para.1.push('\n');
    }
    out.extend(current);
    out
}

/// The index just past the `close` that balances the `open` at `start`,
/// skipping backslash escapes.
fn balanced(chars: &[char], start: usize, open: char, close: char) -> Option<usize> {
    let mut depth = 0;
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Every link of a markdown document, outside code.
fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (first_line, para) in paragraphs(&without_fences(text)) {
        let chars: Vec<char> = without_code_spans(&para).chars().collect();
        let line_at = |i: usize| first_line + chars[..i].iter().filter(|&&c| c == '\n').count();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '\\' => i += 2,
                '[' => {
                    let Some(end) = balanced(&chars, i, '[', ']') else {
                        i += 1;
                        continue;
                    };
                    let at_line_start = i == 0 || chars[i - 1] == '\n';
                    if chars.get(end) == Some(&'(') {
                        // Inline: `[text](target "title")` or `(<target>)`.
                        let Some(close) = balanced(&chars, end, '(', ')') else {
                            i = end;
                            continue;
                        };
                        let inner: String = chars[end + 1..close - 1].iter().collect();
                        let inner = inner.trim();
                        let target = match inner.strip_prefix('<') {
                            Some(rest) => rest.split('>').next().unwrap_or(""),
                            None => inner.split_whitespace().next().unwrap_or(""),
                        };
                        out.push(Link {
                            line: line_at(end),
                            target: target.to_string(),
                        });
                        // The link text may hold an image link: look inside.
                        i += 1;
                    } else if at_line_start && chars.get(end) == Some(&':') {
                        // A reference definition: `[label]: target`.
                        let rest: String = chars[end + 1..].iter().collect();
                        let target = rest.split_whitespace().next().unwrap_or("");
                        let target = target.trim_start_matches('<').trim_end_matches('>');
                        out.push(Link {
                            line: line_at(end),
                            target: target.to_string(),
                        });
                        i = end;
                    } else {
                        i += 1;
                    }
                }
                _ => i += 1,
            }
        }
    }
    out
}

/// A heading's text as GitHub renders it: link targets, backticks,
/// emphasis markers and HTML tags dropped.
fn rendered(heading: &str) -> String {
    let chars: Vec<char> = heading.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '`' | '*' => i += 1,
            '\\' if i + 1 < chars.len() => {
                out.push(chars[i + 1]);
                i += 2;
            }
            ']' if chars.get(i + 1) == Some(&'(') => {
                i = balanced(&chars, i + 1, '(', ')').unwrap_or(chars.len());
            }
            '[' | ']' => i += 1,
            '<' => {
                i = chars[i..]
                    .iter()
                    .position(|&c| c == '>')
                    .map_or(chars.len(), |p| i + p + 1)
            }
            // `_` as emphasis only at a word's edge; snake_case keeps it.
            '_' if i == 0
                || i + 1 == chars.len()
                || !chars[i - 1].is_alphanumeric()
                || !chars[i + 1].is_alphanumeric() =>
            {
                i += 1
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// GitHub's slug of a heading's rendered text: lower case; letters,
/// numbers, `-`, `_` and spaces kept, everything else dropped; each space
/// a hyphen.
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The fragments a markdown document answers to: its headings' slugs
/// (repeats numbered as GitHub numbers them) and explicit HTML anchors.
fn anchors(text: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut add = |base: String, out: &mut HashSet<String>| {
        let mut candidate = base.clone();
        while out.contains(&candidate) {
            let n = seen.entry(base.clone()).or_insert(0);
            *n += 1;
            candidate = format!("{base}-{n}");
        }
        out.insert(candidate);
    };
    let prose = without_fences(text);
    let lines: Vec<&str> = prose.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        let atx = indent <= 3
            && (1..=6).contains(&hashes)
            && trimmed[hashes..]
                .chars()
                .next()
                .is_none_or(char::is_whitespace);
        if atx {
            let body = trimmed[hashes..].trim();
            // An optional closing run of #s.
            let body = match body.trim_end_matches('#') {
                b if b.is_empty() || b.ends_with(' ') => b.trim_end(),
                _ => body,
            };
            add(slug(&rendered(body)), &mut out);
        } else if i > 0 {
            // A setext heading: a paragraph line underlined with = or -.
            let under = line.trim();
            let prev = lines[i - 1].trim();
            let underline = !under.is_empty()
                && (under.chars().all(|c| c == '=') || under.chars().all(|c| c == '-'));
            let prev_is_text = !prev.is_empty()
                && !prev.starts_with('#')
                && !prev.starts_with('|')
                && !prev.starts_with('-')
                && !prev.starts_with('*')
                && indent <= 3;
            if underline && prev_is_text {
                add(slug(&rendered(prev)), &mut out);
            }
        }
        for attr in ["id=\"", "name=\""] {
            for (pos, _) in line.match_indices(attr) {
                if line[..pos]
                    .rfind('<')
                    .is_some_and(|lt| line[lt..pos].starts_with("<a "))
                {
                    let value = &line[pos + attr.len()..];
                    if let Some(end) = value.find('"') {
                        out.insert(value[..end].to_string());
                    }
                }
            }
        }
    }
    out
}

/// `%XX` escapes decoded (as a browser does before asking for the file).
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' {
            if let (Some(h), Some(l)) = (
                bytes.get(i + 1).and_then(|&b| hex(b)),
                bytes.get(i + 2).and_then(|&b| hex(b)),
            ) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` folded, or None when it climbs out of its root.
fn normalised(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn has_scheme(target: &str) -> bool {
    let Some(colon) = target.find(':') else {
        return false;
    };
    let scheme = &target[..colon];
    scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// What is wrong with `target`, linked from the document `doc` (relative
/// to `root`), or None when it resolves.
fn broken(root: &Path, doc: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("empty link target".into());
    }
    if has_scheme(target) {
        return None;
    }
    let (path, fragment) = match target.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (target, None),
    };
    let path = path.split('?').next().unwrap_or("");
    if path.starts_with('/') {
        return Some("absolute path: link relative to the document instead".into());
    }
    let file = if path.is_empty() {
        doc.to_path_buf()
    } else {
        let joined = doc
            .parent()
            .unwrap_or(Path::new(""))
            .join(percent_decoded(path));
        match normalised(&joined) {
            Some(p) => p,
            None => return Some("points outside the repository".into()),
        }
    };
    let on_disk = root.join(&file);
    if !on_disk.exists() {
        return Some(format!("{} does not exist", file.display()));
    }
    // Without a fragment, the file existing is enough.
    let fragment = fragment?;
    // A folder shows its README; other files' fragments (#L10 in source)
    // are not headings and are not checked.
    let markdown = if on_disk.is_dir() {
        on_disk.join("README.md")
    } else {
        on_disk.clone()
    };
    if markdown.extension().is_none_or(|e| e != "md") || !markdown.is_file() {
        return None;
    }
    let text = fs::read_to_string(&markdown).ok()?;
    let fragment = percent_decoded(fragment);
    if anchors(&text).contains(&fragment) {
        None
    } else {
        Some(format!(
            "no heading or anchor #{fragment} in {}",
            markdown.strip_prefix(root).unwrap_or(&markdown).display()
        ))
    }
}

/// Every broken link of the documents, as `file:line -> target: why`, and
/// how many links were checked.
fn check(root: &Path, docs: &[PathBuf]) -> (Vec<String>, usize) {
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in docs {
        let text = fs::read_to_string(root.join(doc))
            .unwrap_or_else(|e| panic!("reading {}: {e}", doc.display()));
        for link in links(&text) {
            checked += 1;
            if let Some(why) = broken(root, doc, &link.target) {
                problems.push(format!(
                    "{}:{} -> {}: {why}",
                    doc.display(),
                    link.line,
                    link.target
                ));
            }
        }
    }
    (problems, checked)
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves() {
    let root = repo();
    let docs = documents(&root);
    assert!(
        docs.iter().any(|d| d == Path::new("docs/README.md")),
        "docs/README.md (the index of docs/) is missing: {docs:?}"
    );
    let (problems, checked) = check(&root, &docs);
    assert!(
        problems.is_empty(),
        "{} broken link(s) in README.md and docs/:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // README links into docs/, and docs/ links among itself: a checker
    // that finds nothing is broken too.
    assert!(checked >= 50, "only {checked} links found in {docs:?}");
}

/// Made-up documents in a scratch repository: the checker finds what is
/// broken there, names file, line and target, and leaves alone what is not
/// a link.
#[test]
fn the_checker_reports_broken_files_and_anchors() {
    let root = tempfile::tempdir().unwrap();
    let write = |rel: &str, text: &str| {
        let p = root.path().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    };
    write(
        "README.md",
        "# Top\n\
         \n\
         See [the guide](docs/guide.md#how-it-works) and [a section](#ports--flags).\n\
         A broken [file](docs/missing.md) and a [bad anchor](docs/guide.md#nowhere).\n\
         A link [split over\n\
         two lines](docs/guide.md#nowhere-either), an image ![x](docs/pic.png).\n\
         Not links: `[code](docs/missing-in-code.md)`, ``[two](x.md)``, [web](https://example.com),\n\
         [mail](mailto:a@b.c), [just brackets] (no target).\n\
         \n\
         ```sh\n\
         echo [fenced](docs/missing-in-fence.md)\n\
         ```\n\
         \n\
         ## Ports & flags\n\
         \n\
         [ref]: docs/gone.md\n",
    );
    write(
        "docs/guide.md",
        "# Guide\n\
         \n\
         ## How it works\n\
         \n\
         ## Repeat\n\
         \n\
         ## Repeat\n\
         \n\
         Back to [top](../README.md#top), [the repeat](#repeat-1), [not twice](#repeat-2),\n\
         [out of the repo](../../x.md), [a folder](../docs/), [source line](../src.rs#L3).\n",
    );
    write("docs/pic.png", "");
    let docs = documents(root.path());
    assert_eq!(
        docs,
        [PathBuf::from("README.md"), PathBuf::from("docs/guide.md")]
    );
    let (problems, checked) = check(root.path(), &docs);
    let expected: BTreeSet<String> = [
        "README.md:4 -> docs/missing.md: docs/missing.md does not exist",
        "README.md:4 -> docs/guide.md#nowhere: no heading or anchor #nowhere in docs/guide.md",
        "README.md:6 -> docs/guide.md#nowhere-either: no heading or anchor #nowhere-either in docs/guide.md",
        "README.md:16 -> docs/gone.md: docs/gone.md does not exist",
        "docs/guide.md:9 -> #repeat-2: no heading or anchor #repeat-2 in docs/guide.md",
        "docs/guide.md:10 -> ../../x.md: points outside the repository",
        "docs/guide.md:10 -> ../src.rs#L3: src.rs does not exist",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(problems.iter().cloned().collect::<BTreeSet<_>>(), expected);
    // Found: guide, section, file, anchor, split, image, web, mail, ref;
    // top, repeat-1, repeat-2, out, folder, source. Not the code ones.
    assert_eq!(
        checked,
        15,
        "{:?}",
        links(&fs::read_to_string(root.path().join("README.md")).unwrap())
    );
}

#[test]
fn slugs_follow_github() {
    for (heading, expected) in [
        ("ringway ÷ ztunnel, same run", "ringway--ztunnel-same-run"),
        (
            "Mesh at scale: `scale-bench` and `churn-bench`",
            "mesh-at-scale-scale-bench-and-churn-bench",
        ),
        (
            "Istio's ztunnel side by side",
            "istios-ztunnel-side-by-side",
        ),
        ("In-pod mode", "in-pod-mode"),
        ("**Bold** and [a link](x.md)", "bold-and-a-link"),
        ("snake_case_name", "snake_case_name"),
        ("1. Numbered", "1-numbered"),
    ] {
        assert_eq!(slug(&rendered(heading)), expected, "{heading}");
    }
    let doc =
        "# A\n\n## A\n\n```\n# not a heading\n```\n\nSetext\n------\n\n<a id=\"custom\"></a>\n";
    let found = anchors(doc);
    for a in ["a", "a-1", "setext", "custom"] {
        assert!(found.contains(a), "{a} not in {found:?}");
    }
    assert!(!found.contains("not-a-heading"), "{found:?}");
}
