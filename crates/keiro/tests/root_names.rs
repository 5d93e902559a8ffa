//! The crate roots stay small: `keiro`'s root holds what a user writes every day and
//! `keiro-journal`'s the journal's vocabulary; everything else lives in a module named for who it
//! is for. These tests count the names each root exports, read from its `lib.rs` (every feature
//! counted, `#[macro_export]` macros included), and fail when the count grows past the recorded
//! number. A new root name is a decision: raise the number in the same commit, on purpose.

use std::path::Path;

/// Names `keiro`'s root exports: 19 items and 10 modules (141 before they moved into modules;
/// `versions` came as one module, payload encryption as one, `codec`).
const KEIRO_ROOT_NAMES_MAX: usize = 30;
/// Names `keiro-journal`'s root exports (157 before the machinery moved under `batch`, `store`
/// and `span`; events and streams came as one module, `message`, updates as one, `update`, search
/// attributes as one, `attribute`, payload codecs as one, `codec`).
const JOURNAL_ROOT_NAMES_MAX: usize = 109;

#[test]
fn keiro_root_stays_small() {
    check("keiro", "src", KEIRO_ROOT_NAMES_MAX, "KEIRO_ROOT_NAMES_MAX");
}

#[test]
fn journal_root_stays_small() {
    // keiro-journal is this crate's sibling in the workspace.
    check(
        "keiro-journal",
        "../journal/src",
        JOURNAL_ROOT_NAMES_MAX,
        "JOURNAL_ROOT_NAMES_MAX",
    );
}

fn check(krate: &str, src: &str, max: usize, constant: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let names = root_names(&src);
    assert!(
        names.len() <= max,
        "{krate}'s root exports {} names, more than the {max} recorded: {names:?}. Put the new \
         name in the module it is for; if it belongs at the root, raise {constant} in \
         crates/keiro/tests/root_names.rs on purpose",
        names.len(),
    );
}

/// Every name `src/lib.rs` exports at the crate root, plus the crate's `#[macro_export]` macros.
fn root_names(src: &Path) -> Vec<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("the crate has a lib.rs");
    let mut names = Vec::new();
    for item in top_level_items(&strip_comments(&lib)) {
        names.extend(item_names(&item));
    }
    for file in rust_files(src) {
        let text = strip_comments(&std::fs::read_to_string(&file).expect("a readable source"));
        let mut rest = text.as_str();
        while let Some(at) = rest.find("#[macro_export]") {
            rest = &rest[at..];
            let after = &rest[rest.find("macro_rules!").expect("macro_rules! after it") + 12..];
            names.push(format!("{}!", ident(after.trim_start())));
            rest = &rest[1..];
        }
    }
    names.sort();
    names
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a readable source folder") {
        let path = entry.expect("a readable entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The text without `//` and `/* */` comments (doc comments included); string literals with
/// a `//` in them do not occur at a crate root.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The items at brace depth 0, each with its attributes; `#[cfg(test)]` items left out.
fn top_level_items(text: &str) -> Vec<String> {
    let mut items = Vec::new();
    let (mut depth, mut current) = (0_usize, String::new());
    for c in text.chars() {
        current.push(c);
        match c {
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => {
                depth -= 1;
                if depth == 0 && c == '}' && !is_use(&without_attributes(current.trim())) {
                    items.push(std::mem::take(&mut current));
                }
            }
            ';' if depth == 0 => items.push(std::mem::take(&mut current)),
            _ => {}
        }
    }
    items
        .into_iter()
        .filter(|item| !item.replace(' ', "").contains("#[cfg(test)]"))
        .map(|item| without_attributes(item.trim()))
        .collect()
}

/// Whether an item is a `use` (whose group closes before its `;`), whatever its visibility.
fn is_use(item: &str) -> bool {
    let mut words = item.split_whitespace();
    match words.next() {
        Some(first) if first.starts_with("pub") => words.next() == Some("use"),
        first => first == Some("use"),
    }
}

fn without_attributes(mut item: &str) -> String {
    while item.starts_with("#[") {
        let mut depth = 0;
        let end = item
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '[' => depth += 1,
                    ']' => depth -= 1,
                    _ => {}
                }
                c == ']' && depth == 0
            })
            .map(|(i, _)| i)
            .expect("a closed attribute");
        item = item[end + 1..].trim_start();
    }
    item.to_owned()
}

/// The root names one item exports: none unless it is `pub` (not `pub(crate)`).
fn item_names(item: &str) -> Vec<String> {
    let Some(rest) = item.strip_prefix("pub ") else {
        return Vec::new();
    };
    let rest = rest.trim_start();
    if let Some(tree) = rest.strip_prefix("use ") {
        let tree: String = tree
            .trim_end_matches(';')
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        return use_leaves(&tree);
    }
    let mut words = rest.split_whitespace().peekable();
    while let Some(&word) = words.peek() {
        if matches!(word, "async" | "unsafe" | "extern" | "\"C\"")
            || (word == "const" && rest.starts_with("const fn"))
        {
            words.next();
        } else {
            break;
        }
    }
    match words.next() {
        Some(
            "mod" | "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union",
        ) => {
            vec![ident(words.next().expect("a name after the keyword")).to_owned()]
        }
        other => panic!("an item the count does not know: {other:?} in {item:?}"),
    }
}

/// The names a use tree brings in: each leaf, or its `as` alias; `a::{b, c::{d}}` is b and d.
fn use_leaves(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let inner = &tree[open + 1..tree.rfind('}').expect("a closed group")];
        let (mut depth, mut start, mut leaves) = (0, 0, Vec::new());
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    leaves.extend(use_leaves(&inner[start..i]));
                    start = i + 1;
                }
                _ => {}
            }
        }
        leaves.extend(use_leaves(&inner[start..]));
        return leaves;
    }
    if tree.is_empty() {
        return Vec::new();
    }
    let name = match tree.split_once(" as ") {
        Some((_, alias)) => alias.trim(),
        None => tree.rsplit("::").next().expect("a path").trim(),
    };
    assert_ne!(
        name, "*",
        "a glob at the crate root hides how many names it adds: {tree}"
    );
    vec![name.to_owned()]
}

fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

#[test]
fn the_count_reads_grouped_aliased_and_nested_uses() {
    let lib = "//! docs\nmod private;\npub mod public;\n#[cfg(feature = \"x\")]\npub use a::{B, c::{D, E as F}, self as g};\npub(crate) use h::I;\npub const J: u8 = 1;\npub async fn k() {}\npub struct L { pub m: u8 }\n#[cfg(test)]\nmod tests { pub fn n() {} }\n";
    let mut names: Vec<String> = top_level_items(&strip_comments(lib))
        .iter()
        .flat_map(|item| item_names(item))
        .collect();
    names.sort();
    assert_eq!(names, ["B", "D", "F", "J", "L", "g", "k", "public"]);
}
