//! The README's "Encrypting payloads" snippet is the `keiro::codec` module's doc example, which
//! `cargo test --doc` compiles: this test keeps the two the same.

/// The first ```` ```rust ```` block after `heading` in `text`, each line as written.
fn block_after(text: &str, heading: &str) -> Vec<String> {
    let start = text.find(heading).expect("the heading is there");
    text[start..]
        .lines()
        .skip_while(|line| !line.starts_with("```rust"))
        .skip(1)
        .take_while(|line| !line.starts_with("```"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_snippet_is_the_compiled_doc_example() {
    let readme = include_str!("../../../README.md");
    let module: String = include_str!("../src/codec/mod.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .map(|line| line.strip_prefix(' ').unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    let snippet = block_after(readme, "## Encrypting payloads");
    assert!(snippet.len() > 5, "the README has the snippet");
    assert_eq!(snippet, block_after(&module, "Encrypting payloads"));
}
