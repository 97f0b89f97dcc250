//! The crate's layering (see `src/lib.rs`), checked on the source text so it
//! cannot silently regress:
//!
//! 1. `model/` imports nothing outside `model/`.
//! 2. `publish` imports only `model`.
//! 3. `security/` imports only `model`, `publish` and `backoff`.
//! 4. `sources/` imports only `model`, `publish`, `backoff` and
//!    `security::pki`.
//! 5. `devcp/` may import anything; `backoff` imports nothing.
//! 6. No import cycles between modules (one module per file), anywhere.
//!
//! An import is a `crate::` or `super::` path in the code, outside comments
//! and string literals. Test code is exempt (`tests.rs` files and inline
//! `#[cfg(test)] mod ... { }` blocks): tests may borrow fixtures from any
//! layer, e.g. the TLS tests get certificates from the built-in CA. The
//! `src/bin/` programs are separate crates.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules under `src/`; a new one must be added to
/// [`may_import`] before this test passes.
const LAYERS: [&str; 6] = [
    "model", "publish", "backoff", "security", "sources", "devcp",
];

/// Whether module `from` may import module `to` (full module paths such as
/// `security::tls`), as far as the layers go. Imports inside one layer are
/// left to the cycle check.
fn may_import(from: &str, to: &str) -> bool {
    let (from_layer, to_layer) = (layer(from), layer(to));
    if from_layer == to_layer {
        return true;
    }
    match from_layer {
        "model" | "backoff" => false,
        "publish" => to_layer == "model",
        "security" => matches!(to_layer, "model" | "publish" | "backoff"),
        "sources" => matches!(to_layer, "model" | "publish" | "backoff") || to == "security::pki",
        // The crate root only declares and re-exports.
        "" | "devcp" => true,
        _ => false,
    }
}

fn layer(module: &str) -> &str {
    module.split("::").next().unwrap_or_default()
}

/// One `crate::` or `super::` path found in a file.
struct Import {
    file: String,
    line: usize,
    /// As written, for the message.
    path: String,
    /// The module it names (the longest known module prefix).
    target: String,
}

#[test]
fn modules_import_only_what_their_layer_allows() {
    let (modules, imports) = read_crate();
    let mut problems = Vec::new();

    let unknown: BTreeSet<&str> = modules
        .iter()
        .map(|m| layer(m))
        .filter(|top| !top.is_empty() && !LAYERS.contains(top))
        .collect();
    for top in unknown {
        problems.push(format!(
            "src/{top}: a top-level module the layering rules do not know; \
             add it to LAYERS and may_import in tests/layering.rs"
        ));
    }
    for (from, list) in &imports {
        if !from.is_empty() && !LAYERS.contains(&layer(from)) {
            continue; // reported above
        }
        for import in list {
            if import.target.is_empty() {
                problems.push(format!(
                    "{}:{}: `{}` names the crate root; import by the module path \
                     (crate::model::..., crate::security::...) so the layering can be checked",
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
    assert!(
        problems.is_empty(),
        "forbidden imports:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn no_import_cycles_between_modules() {
    let (_, imports) = read_crate();
    // from -> to -> where the first such import is.
    let mut graph: BTreeMap<&str, BTreeMap<&str, String>> = BTreeMap::new();
    for (from, list) in &imports {
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
    let cycles = find_cycles(&graph);
    let described: Vec<String> = cycles
        .iter()
        .map(|cycle| {
            cycle
                .windows(2)
                .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[w[0]][w[1]]))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect();
    assert!(
        described.is_empty(),
        "import cycles:\n  {}",
        described.join("\n  ")
    );
}

fn rule_of(from: &str) -> &'static str {
    match layer(from) {
        "model" => "model/ imports nothing outside model/",
        "backoff" => "backoff imports nothing",
        "publish" => "publish imports only model",
        "security" => "security/ imports only model, publish and backoff",
        "sources" => "sources/ imports only model, publish, backoff and security::pki",
        _ => "see tests/layering.rs",
    }
}

/// Every module of the crate (`""` is the crate root), and the imports of
/// each.
fn read_crate() -> (BTreeSet<String>, BTreeMap<String, Vec<Import>>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect_rs_files(&src, &mut files);
    files.retain(|f| !f.starts_with(src.join("bin")));

    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut imports = BTreeMap::new();
    for file in &files {
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let module = module_of(&src, file);
        let shown = format!("src/{}", file.strip_prefix(&src).unwrap().to_string_lossy());
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
    (modules, imports)
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
