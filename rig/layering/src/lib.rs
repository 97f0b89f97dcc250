//! Reads a crate's own source to find how its modules import each other,
//! so a test can hold the crate to its layering: which layer may import
//! which, and no import cycles between modules. Used by the tests of
//! `ringway-controlplane` and `ringway-dataplane` (`tests/layering.rs`);
//! each states its own layers, this crate only reads the source.
//!
//! An import is a `crate::` or `super::` path in the code, outside comments
//! and string literals; a `use` group counts as each path it names. Test
//! code is left out (`tests.rs` files and inline `#[cfg(test)] mod ... { }`
//! blocks): tests may borrow fixtures from any layer. So are binaries
//! (`src/main.rs`, `src/bin/`), which are crates of their own.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// One `crate::` or `super::` path found in a file.
#[derive(Debug, Clone)]
pub struct Import {
    /// `src/...`, for the message.
    pub file: String,
    pub line: usize,
    /// As written.
    pub path: String,
    /// The module it names (the longest known module prefix); empty for
    /// the crate root.
    pub target: String,
}

/// A crate's modules (`""` is the crate root) and the imports of each.
pub struct CrateImports {
    pub modules: BTreeSet<String>,
    pub imports: BTreeMap<String, Vec<Import>>,
}

impl CrateImports {
    /// Reads the crate whose sources are in `src`.
    pub fn read(src: &Path) -> CrateImports {
        let mut files = Vec::new();
        collect_rs_files(src, &mut files);
        files.retain(|f| !f.starts_with(src.join("bin")) && *f != src.join("main.rs"));

        let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
        let mut imports = BTreeMap::new();
        for file in &files {
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let module = module_of(src, file);
            let shown = format!("src/{}", file.strip_prefix(src).unwrap().to_string_lossy());
            let text = fs::read_to_string(file).unwrap();
            let found = find_imports(&without_tests(&code_only(&text)), &module)
                .into_iter()
                .map(|(line, path, segments)| Import {
                    file: shown.clone(),
                    line,
                    path,
                    target: longest_module(&modules, &segments),
                })
                .collect();
            imports.insert(module, found);
        }
        CrateImports { modules, imports }
    }

    /// What breaks the layering: a top-level module not in `layers`, an
    /// import of the crate root (it cannot be checked), or an import that
    /// `may_import(from, to)` (full module paths) forbids, explained by
    /// `rule_of(from)`. Empty when the crate keeps to its layers.
    pub fn forbidden_imports(
        &self,
        layers: &[&str],
        may_import: impl Fn(&str, &str) -> bool,
        rule_of: impl Fn(&str) -> String,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let unknown: BTreeSet<&str> = self
            .modules
            .iter()
            .map(|m| layer(m))
            .filter(|top| !top.is_empty() && !layers.contains(top))
            .collect();
        for top in unknown {
            problems.push(format!(
                "src/{top}: a top-level module the layering rules do not know; \
                 add it to the layers in tests/layering.rs"
            ));
        }
        for (from, list) in &self.imports {
            if !from.is_empty() && !layers.contains(&layer(from)) {
                continue; // reported above
            }
            for import in list {
                if import.target.is_empty() {
                    problems.push(format!(
                        "{}:{}: `{}` names the crate root; import by the module path \
                         (crate::<module>::...) so the layering can be checked",
                        import.file, import.line, import.path
                    ));
                } else if !may_import(from, &import.target) {
                    problems.push(format!(
                        "{}:{}: {from} may not import {} (`{}`): {}",
                        import.file,
                        import.line,
                        import.target,
                        import.path,
                        rule_of(from)
                    ));
                }
            }
        }
        problems
    }

    /// Every import cycle between modules, each described as its chain of
    /// imports (`a -> b (src/a.rs:3), b -> a (src/b.rs:9)`); at least one
    /// through every group of modules that import each other in a circle.
    pub fn cycles(&self) -> Vec<String> {
        // from -> to -> where the first such import is.
        let mut graph: BTreeMap<&str, BTreeMap<&str, String>> = BTreeMap::new();
        for (from, list) in &self.imports {
            for import in list {
                if import.target != *from && !import.target.is_empty() {
                    graph
                        .entry(from)
                        .or_default()
                        .entry(&import.target)
                        .or_insert_with(|| format!("{}:{}", import.file, import.line));
                }
            }
        }
        find_cycles(&graph)
            .iter()
            .map(|cycle| {
                cycle
                    .windows(2)
                    .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[w[0]][w[1]]))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .collect()
    }
}

/// The crate whose sources are in `src`, or fails the calling test with
/// every import its layers forbid (see [`CrateImports::forbidden_imports`])
/// and every import cycle (see [`CrateImports::cycles`]).
pub fn assert_layered(
    src: &Path,
    layers: &[&str],
    may_import: impl Fn(&str, &str) -> bool,
    rule_of: impl Fn(&str) -> String,
) {
    let krate = CrateImports::read(src);
    let problems = krate.forbidden_imports(layers, may_import, rule_of);
    let cycles = krate.cycles();
    assert!(
        problems.is_empty() && cycles.is_empty(),
        "forbidden imports:\n  {}\nimport cycles:\n  {}",
        problems.join("\n  "),
        cycles.join("\n  ")
    );
}

/// The top-level module of `module` (`security` of `security::tls`).
pub fn layer(module: &str) -> &str {
    module.split("::").next().unwrap_or_default()
}

fn collect_rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/security/tls.rs` -> `security::tls`, `src/model/mod.rs` -> `model`,
/// `src/lib.rs` -> `""`.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts.join("::")
}

/// The longest prefix of `segments` that is a module (`""` if none is).
fn longest_module(modules: &BTreeSet<String>, segments: &[String]) -> String {
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|m| modules.contains(m))
        .unwrap_or_default()
}

/// `text` with comments and the contents of string and char literals blanked
/// out (line breaks kept, so line numbers stay right).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let rest = &chars[i..];
        let end = if rest.starts_with(&['/', '/']) {
            rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            block_comment_len(rest)
        } else if rest.starts_with(&['r', '"']) || rest.starts_with(&['r', '#']) {
            raw_string_len(rest)
        } else if rest[0] == '"' {
            quoted_len(rest, '"')
        } else if rest[0] == '\'' && (rest.get(1) == Some(&'\\') || rest.get(2) == Some(&'\'')) {
            quoted_len(rest, '\'')
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        out.extend(rest[..end].iter().map(|&c| blank(c)));
        i += end;
    }
    out
}

fn block_comment_len(s: &[char]) -> usize {
    let mut depth = 0;
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(&['/', '*']) {
            depth += 1;
            i += 2;
        } else if s[i..].starts_with(&['*', '/']) {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    s.len()
}

fn raw_string_len(s: &[char]) -> usize {
    let hashes = s[1..].iter().take_while(|&&c| c == '#').count();
    if s.get(1 + hashes) != Some(&'"') {
        return 1; // an identifier starting with `r`
    }
    let close: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let body = 2 + hashes;
    (body..s.len())
        .find(|&i| s[i..].starts_with(&close))
        .map_or(s.len(), |i| i + close.len())
}

fn quoted_len(s: &[char], quote: char) -> usize {
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    s.len()
}

/// `code` with its inline test modules (`#[cfg(test)]` then `mod name {`)
/// blanked out up to their closing brace (line breaks kept). Comments and
/// literals must be blanked already, so the braces that are left match.
fn without_tests(code: &str) -> String {
    const CFG_TEST: &str = "#[cfg(test)]";
    let mut out = code.to_owned();
    let mut from = 0;
    while let Some(at) = out[from..].find(CFG_TEST).map(|i| i + from) {
        from = at + CFG_TEST.len();
        let item = out[from..].trim_start();
        if !(item.starts_with("mod ") || item.starts_with("pub(crate) mod ")) {
            continue;
        }
        // `mod tests;` is a file of its own, skipped as a whole.
        let Some(open) = item
            .find(['{', ';'])
            .filter(|&i| item[i..].starts_with('{'))
        else {
            continue;
        };
        let open = out.len() - item.len() + open;
        let mut depth = 0;
        let close = out[open..]
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '{' => 1,
                    '}' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map_or(out.len(), |(i, _)| open + i + 1);
        let blank: String = out[at..close]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(at..close, &blank);
        from = at + blank.len();
    }
    out
}

/// `(line, path as written, absolute module path segments)` of every
/// `crate::` and `super::` path in `code`, which is module `module`'s. A
/// `use` group (`crate::a::{b, c::d}`) counts as each path it names.
fn find_imports(code: &str, module: &str) -> Vec<(usize, String, Vec<String>)> {
    let mut found = Vec::new();
    let mut start = 0;
    while let Some(at) = next_path_start(code, start) {
        let line = code[..at].matches('\n').count() + 1;
        let (len, paths) = read_path(&code[at..]);
        start = at + len;
        for path in paths {
            let absolute = absolute(&path, module);
            found.push((line, path, absolute));
        }
    }
    found
}

/// The paths the path or `use` tree at the start of `code` names, and how
/// long it is.
fn read_path(code: &str) -> (usize, Vec<String>) {
    let head_len = code
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(code.len());
    let head = code[..head_len].trim_end_matches(':');
    if !code[head_len..].starts_with('{') {
        return (head_len, vec![head.to_owned()]);
    }
    // A group: split at its top-level commas, up to the matching brace.
    let mut len = code.len();
    let mut depth = 0;
    let mut items = vec![String::new()];
    for (i, c) in code[head_len..].char_indices() {
        match c {
            '{' if depth == 0 => {
                depth += 1;
                continue;
            }
            '{' => depth += 1,
            '}' if depth == 1 => {
                len = head_len + i + 1;
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 1 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        items.last_mut().unwrap().push(c);
    }
    let paths = items
        .iter()
        .map(|item| item.trim())
        .filter(|item| !item.is_empty())
        .flat_map(|item| read_path(item).1)
        .map(|inner| match inner.as_str() {
            "" | "self" => head.to_owned(),
            _ => format!("{head}::{inner}"),
        })
        .collect();
    (len, paths)
}

/// `path` (starting with `crate` or `super`) as segments from the crate
/// root, seen from `module`.
fn absolute(path: &str, module: &str) -> Vec<String> {
    let mut segments: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = if segments[0] == "crate" {
        segments.remove(0);
        Vec::new()
    } else {
        module.split("::").filter(|s| !s.is_empty()).collect()
    };
    while segments.first() == Some(&"super") {
        segments.remove(0);
        base.pop();
    }
    base.extend(segments);
    base.into_iter().map(str::to_owned).collect()
}

/// Where the next `crate::` or `super::` path starting at or after `from`
/// begins (not in the middle of a longer name or path).
fn next_path_start(code: &str, from: usize) -> Option<usize> {
    ["crate::", "super::"]
        .iter()
        .filter_map(|key| {
            let mut search = from;
            while let Some(i) = code[search..].find(key).map(|i| i + search) {
                let before = code[..i].chars().next_back();
                if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$')
                {
                    return Some(i);
                }
                search = i + key.len();
            }
            None
        })
        .min()
}

/// Cycles, each as its module path back to where it started: at least one
/// through every group of modules that import each other in a circle.
fn find_cycles<'a>(graph: &BTreeMap<&'a str, BTreeMap<&'a str, String>>) -> Vec<Vec<&'a str>> {
    let mut cycles = Vec::new();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    for &start in graph.keys() {
        let mut stack = vec![start];
        walk(graph, &mut stack, &mut done, &mut cycles);
    }
    cycles
}

/// Depth-first from the top of `stack`; a neighbour already on the stack
/// closes a cycle.
fn walk<'a>(
    graph: &BTreeMap<&'a str, BTreeMap<&'a str, String>>,
    stack: &mut Vec<&'a str>,
    done: &mut BTreeSet<&'a str>,
    cycles: &mut Vec<Vec<&'a str>>,
) {
    let node = *stack.last().unwrap();
    if done.contains(node) {
        return;
    }
    for &next in graph.get(node).into_iter().flat_map(|edges| edges.keys()) {
        if let Some(at) = stack.iter().position(|&m| m == next) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(next);
            cycles.push(cycle);
        } else {
            stack.push(next);
            walk(graph, stack, done, cycles);
            stack.pop();
        }
    }
    done.insert(node);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate written to a fresh directory: (path under src/, text).
    fn fixture(files: &[(&str, &str)]) -> (PathBuf, CrateImports) {
        let dir = std::env::temp_dir().join(format!(
            "ringway-layering-{}-{}",
            std::process::id(),
            files.len()
        ));
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in files {
            let file = dir.join(path);
            fs::create_dir_all(file.parent().unwrap()).unwrap();
            fs::write(file, text).unwrap();
        }
        let read = CrateImports::read(&dir);
        (dir, read)
    }

    #[test]
    fn finds_imports_cycles_and_forbidden_layers() {
        let (dir, krate) = fixture(&[
            ("lib.rs", "pub mod low;\npub mod high;\n"),
            ("low/mod.rs", "pub mod a;\npub mod b;\n"),
            // a -> b through a group, b -> a through `super::`.
            ("low/a.rs", "use crate::low::{b::Thing, self};\n"),
            ("low/b.rs", "pub struct Thing;\nfn f() { super::a::g(); }\n"),
            (
                "high.rs",
                // Only the code counts: not comments, strings or tests.
                "// crate::nothing::here\nconst S: &str = \"crate::low::a\";\n\
                 use crate::low::a;\n#[cfg(test)]\nmod tests { use crate::low::b; }\n",
            ),
            ("main.rs", "use crate::high;\n"),
        ]);
        assert!(!krate.modules.contains("main"), "{:?}", krate.modules);
        let targets = |m: &str| -> Vec<String> {
            krate.imports[m].iter().map(|i| i.target.clone()).collect()
        };
        assert_eq!(targets("low::a"), ["low::b", "low"]);
        assert_eq!(targets("low::b"), ["low::a"]);
        assert_eq!(targets("high"), ["low::a"]);
        assert_eq!(krate.imports["high"][0].line, 3);

        let cycles = krate.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert!(
            cycles[0].contains("low::a -> low::b (src/low/a.rs:1)"),
            "{cycles:?}"
        );
        assert!(
            cycles[0].contains("low::b -> low::a (src/low/b.rs:2)"),
            "{cycles:?}"
        );

        // `low` may not look up; `high` may look down.
        let may = |from: &str, to: &str| layer(from) == layer(to) || layer(from) == "high";
        assert!(krate
            .forbidden_imports(&["low", "high"], may, |_| "x".into())
            .is_empty());
        let upside_down = |from: &str, to: &str| layer(from) == layer(to) || layer(from) == "low";
        let problems =
            krate.forbidden_imports(&["low", "high"], upside_down, |_| "low only".into());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("src/high.rs:3: high may not import low::a"));
        let problems = krate.forbidden_imports(&["low"], may, |_| String::new());
        assert!(
            problems[0].contains("src/high: a top-level module"),
            "{problems:?}"
        );
        fs::remove_dir_all(dir).unwrap();
    }
}
