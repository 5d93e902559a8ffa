//! Rolling deploys: while a deploy replaces the previous build's processes, they go on sending
//! their own SQL to a schema the new build has migrated (its new migrations, and its function
//! files, of the next revision). "An old build keeps working against new function bodies" is
//! checked here, not left to a convention.
//!
//! The previous build is read from the git history: the newest commit whose function files
//! have a lower revision than this build's (`FUNCTIONS_REVISION`). A schema is migrated as that
//! build migrated it (its migrations, its function files), then upgraded by this build, and
//! everything the previous build calls must still find what it was written against:
//!
//! 1. every function the previous revision's files define exists with the same argument types
//!    and the same result (OUT columns included), in the upgraded schema and in a fresh one of
//!    this build (so this build's files define it, not a leftover of the old ones);
//! 2. every statement of the previous build's store (each `const` SQL statement of
//!    `crates/postgres/src` at that commit, read from its source by [`rust_sql`]) prepares on
//!    the upgraded schema and on a fresh one with the same parameter types and the same result
//!    columns, names and types, as on the schema that build migrated itself (a statement that
//!    does not prepare there is a failure too: the reading went wrong);
//! 3. no function of the previous revision assigns an `outcome` code its previous body did not:
//!    that build maps the codes it knows and refuses any other as malformed.
//!
//! What it cannot see: statements assembled at run time (the list filters), outcome codes
//! produced otherwise than by an `outcome := ...` assignment (arrays, `RETURN QUERY`), and what
//! the previous build does with the rows beyond their names and types.

use keiro_postgres::builds::OtherBuild as _;
use std::collections::{BTreeMap, BTreeSet};

use crate::common::{history, sql, TestResult};
use keiro_postgres::{FunctionFiles, PgStore};
use keiro_tests::pg::TestDb;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const MIGRATE_RS: &str = "crates/postgres/src/migrate.rs";
const REVISION_CONST: &str = "const FUNCTIONS_REVISION: i32 = ";

/// Where a build keeps its SQL files, and the source that lists its function files in the
/// order it applies them (each as an `include_str!` of `include` followed by the file's name).
struct Layout {
    numbered: &'static str,
    functions: &'static str,
    list: &'static str,
    include: &'static str,
}

/// The builds before `keiro-migrations`: the workspace's `migrations/` and `sql/functions/`,
/// listed in the store's `migrate.rs`.
const TOP_LEVEL: Layout = Layout {
    numbered: "migrations/",
    functions: "sql/functions/",
    list: MIGRATE_RS,
    include: "include_str!(\"../../../sql/functions/",
};

/// The builds since, this one among them: the files are the `keiro-migrations` crate's.
const MIGRATIONS_CRATE: Layout = Layout {
    numbered: "crates/migrations/numbered/",
    functions: "crates/migrations/functions/",
    list: "crates/migrations/src/lib.rs",
    include: "include_str!(\"../functions/",
};

/// The layout of the build at `commit`.
fn layout_at(git: &history::Git, commit: &str) -> &'static Layout {
    let crate_list = format!("{commit}:{}", MIGRATIONS_CRATE.list);
    if git.run(&["cat-file", "-e", &crate_list]).is_ok() {
        &MIGRATIONS_CRATE
    } else {
        &TOP_LEVEL
    }
}

/// The previous build, as the git history has it.
struct Previous {
    commit: String,
    revision: i32,
    /// The newest migration it knows.
    newest_migration: i32,
    /// Its function files, named as its runner names them, in the order it applies them.
    files: Vec<(&'static str, &'static str)>,
    /// Its store's source files, with their paths.
    sources: Vec<(String, String)>,
}

/// The revision of the function files at `commit`.
fn revision_at(git: &history::Git, commit: &str) -> Result<i32, String> {
    let source = git.show(commit, MIGRATE_RS)?;
    let at = source
        .find(REVISION_CONST)
        .ok_or_else(|| format!("{commit} has no {REVISION_CONST:?}"))?;
    let digits: String = source[at + REVISION_CONST.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .map_err(|e| format!("{commit}: the revision {digits:?}: {e}"))
}

/// The newest commit whose revision is below `ours`: `HEAD` when this checkout raised the
/// revision without committing it, else the first parent of the commit (on the first-parent
/// line) that raised it to `ours` or beyond. A build that was still being written (commits
/// that added this build's migrations before the commit that raised the revision) is not the
/// previous build: from there the line is walked back, within that revision, to the newest
/// commit whose migrations are all unchanged in this build.
fn previous_commit(git: &history::Git, ours: i32) -> Result<String, String> {
    let head = git.run(&["rev-parse", "HEAD"])?.trim().to_owned();
    if revision_at(git, &head)? < ours {
        return Ok(head);
    }
    let changes = git.run(&["rev-list", "--first-parent", "HEAD", "--", MIGRATE_RS])?;
    for commit in changes.lines() {
        let parent = git.run(&["rev-parse", &format!("{commit}^1")])?;
        let parent = parent.trim();
        if revision_at(git, commit)? >= ours && revision_at(git, parent).is_ok_and(|r| r < ours) {
            return settled(git, parent);
        }
    }
    Err(format!("no commit before revision {ours}"))
}

/// `commit`, or the newest commit before it on the first-parent line, at the same revision,
/// whose migrations all read as this build's (the previous build as it shipped, not a state
/// in the middle of writing this one).
fn settled(git: &history::Git, commit: &str) -> Result<String, String> {
    let revision = revision_at(git, commit)?;
    let mut candidate = commit.to_owned();
    loop {
        if migrations_unchanged(git, &candidate)? {
            return Ok(candidate);
        }
        let parent = git.run(&["rev-parse", &format!("{candidate}^1")])?;
        let parent = parent.trim().to_owned();
        if revision_at(git, &parent)? != revision {
            return Err(format!(
                "no commit at revision {revision} before {commit} has this build's migrations"
            ));
        }
        candidate = parent;
    }
}

/// Whether every migration file at `commit` is byte for byte this build's.
fn migrations_unchanged(git: &history::Git, commit: &str) -> Result<bool, String> {
    let layout = layout_at(git, commit);
    for path in git.files(commit, layout.numbered)? {
        let Some(file) = path.strip_prefix(layout.numbered) else {
            continue;
        };
        let ours = this_build(&format!("{}{file}", MIGRATIONS_CRATE.numbered))?;
        if git.show(commit, &path)? != ours {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A string the test keeps for its whole run (the runner takes `&'static` files).
fn keep(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// The function files a build embeds, in its order, each named as it names them: `read`
/// reads a file of that build by its path, laid out as `layout` says.
fn function_files(
    layout: &Layout,
    read: impl Fn(&str) -> Result<String, String>,
) -> Result<Vec<(&'static str, &'static str)>, String> {
    let list = read(layout.list)?;
    let mut files = Vec::new();
    for piece in list.split(layout.include).skip(1) {
        let name = piece
            .split_once(".sql\")")
            .ok_or("an include of a function file without .sql")?
            .0;
        let sql = read(&format!("{}{name}.sql", layout.functions))?;
        files.push((keep(name.to_owned()), keep(sql)));
    }
    if files.is_empty() {
        return Err(format!("no function files in {}", layout.list));
    }
    Ok(files)
}

/// This checkout's root, where this build's files are.
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// A file of this checkout.
fn this_build(path: &str) -> Result<String, String> {
    std::fs::read_to_string(format!("{ROOT}/{path}")).map_err(|e| format!("reading {path}: {e}"))
}

impl Previous {
    fn read(git: &history::Git, ours: i32) -> Result<Self, String> {
        let commit = previous_commit(git, ours)?;
        let revision = revision_at(git, &commit)?;
        let layout = layout_at(git, &commit);
        let files = function_files(layout, |path| git.show(&commit, path))
            .map_err(|e| format!("{commit}: {e}"))?;
        // Migrations are never edited: the previous build's are this build's first ones.
        let mut newest_migration = 0;
        for path in git.files(&commit, layout.numbered)? {
            let Some(file) = path.strip_prefix(layout.numbered) else {
                continue;
            };
            let ours = this_build(&format!("{}{file}", MIGRATIONS_CRATE.numbered))?;
            if git.show(&commit, &path)? != ours {
                return Err(format!(
                    "{path} differs from {commit}'s: migrations are never edited"
                ));
            }
            let version: i32 = file
                .get(..4)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{path}: no version"))?;
            newest_migration = newest_migration.max(version);
        }
        let mut sources = Vec::new();
        for path in git.files(&commit, "crates/postgres/src/")? {
            if path.ends_with(".rs") {
                let text = git.show(&commit, &path)?;
                sources.push((path, text));
            }
        }
        Ok(Self {
            commit,
            revision,
            newest_migration,
            files,
            sources,
        })
    }
}

/// This build's revision of its function files, as a fresh schema records it.
async fn this_revision(store: &PgStore) -> Result<i32, BoxError> {
    match store.migrate_report().await?.functions {
        FunctionFiles::UpToDate { revision } => Ok(revision),
        other => Err(format!("a migrated schema is up to date, not {other:?}").into()),
    }
}

/// Every function of `schema`: `name(identity arguments)` to its result and OUT columns.
async fn signatures(store: &PgStore, schema: &str) -> Result<BTreeMap<String, String>, BoxError> {
    const SIGNATURES: &str = "\
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')', \
               pg_get_function_result(p.oid) || ' out (' || coalesce(( \
                   SELECT string_agg(a.name || ' ' || format_type(a.type, NULL), ', ' \
                                     ORDER BY a.n) \
                   FROM unnest(p.proargmodes::text[], p.proargnames, p.proallargtypes) \
                        WITH ORDINALITY AS a (mode, name, type, n) \
                   WHERE a.mode IN ('o', 'b', 't')), '') || ')' \
        FROM pg_proc p WHERE p.pronamespace = $1::text::regnamespace";
    Ok(sql(store)
        .await?
        .query(SIGNATURES, &[&schema])
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// What a prepared statement takes and gives: its parameter types and its columns.
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    params: Vec<String>,
    columns: Vec<(String, String)>,
}

impl Shape {
    /// How `now` differs from this shape, one entry per parameter or column.
    fn changes(&self, now: &Self) -> Vec<String> {
        let mut changes = Vec::new();
        for i in 0..self.params.len().max(now.params.len()) {
            let (was, is) = (self.params.get(i), now.params.get(i));
            if was != is {
                changes.push(format!("parameter ${}: {was:?} -> {is:?}", i + 1));
            }
        }
        for i in 0..self.columns.len().max(now.columns.len()) {
            let (was, is) = (self.columns.get(i), now.columns.get(i));
            if was != is {
                changes.push(format!("column {}: {was:?} -> {is:?}", i + 1));
            }
        }
        changes
    }
}

/// Prepares each statement on `store`'s schema: its shape, or the database's refusal.
async fn prepare_all(
    store: &PgStore,
    statements: &[(String, String)],
) -> Result<Vec<Result<Shape, String>>, BoxError> {
    let client = sql(store).await?;
    let mut shapes = Vec::new();
    for (_, statement) in statements {
        shapes.push(match client.prepare(statement).await {
            Ok(prepared) => Ok(Shape {
                params: prepared
                    .params()
                    .iter()
                    .map(|t| t.name().to_owned())
                    .collect(),
                columns: prepared
                    .columns()
                    .iter()
                    .map(|c| (c.name().to_owned(), c.type_().name().to_owned()))
                    .collect(),
            }),
            Err(error) => Err(error
                .as_db_error()
                .map_or_else(|| error.to_string(), |db| db.message().to_owned())),
        });
    }
    Ok(shapes)
}

/// Empties a test's schema (its `TestDb` drops it again at the end).
async fn empty(db: &TestDb) -> TestResult {
    sql(&db.store())
        .await?
        .batch_execute(&format!(
            "DROP SCHEMA \"{0}\" CASCADE; CREATE SCHEMA \"{0}\"",
            db.schema()
        ))
        .await?;
    Ok(())
}

/// Per function name, the string literals of its `outcome := ...;` assignments.
fn outcome_codes(files: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut codes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, file) in files {
        for definition in file.split("CREATE OR REPLACE FUNCTION").skip(1) {
            let name = definition
                .trim_start()
                .split('(')
                .next()
                .unwrap_or_default();
            let body = definition.split("$$").nth(1).unwrap_or_default();
            let entry = codes.entry(name.to_owned()).or_default();
            let mut rest = body;
            while let Some(at) = rest.find("outcome :=") {
                let word_start = rest[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
                let assigned = &rest[at..];
                let end = assigned.find(';').unwrap_or(assigned.len());
                if word_start {
                    // Every other piece between quotes is a literal.
                    entry.extend(
                        assigned[..end]
                            .split('\'')
                            .skip(1)
                            .step_by(2)
                            .map(str::to_owned),
                    );
                }
                rest = &assigned[end..];
            }
        }
    }
    codes
}

#[tokio::test]
async fn the_previous_builds_sql_still_works_against_this_builds_schema() -> TestResult {
    let fresh = TestDb::new().await;
    let ours = this_revision(&fresh.store()).await?;
    let what = format!("the build before function-files revision {ours}");
    let Some(previous) = history::read(&what, |git| Previous::read(git, ours))? else {
        return Ok(());
    };
    let sources: Vec<(&str, &str)> = previous
        .sources
        .iter()
        .map(|(path, text)| (path.as_str(), text.as_str()))
        .collect();
    let (statements, unread) = rust_sql::statements(&sources);
    assert!(
        unread.is_empty(),
        "constants of {} that the reader cannot evaluate: {unread:#?}",
        previous.commit
    );
    assert!(
        statements.len() > 100,
        "only {} statements read from {}",
        statements.len(),
        previous.commit
    );

    // The schema as the previous build left it.
    let db = TestDb::new().await;
    empty(&db).await?;
    let store = db.store();
    let migrated = store
        .migrate_as_older_build(
            previous.newest_migration,
            previous.revision,
            &previous.files,
        )
        .await?;
    assert!(
        matches!(migrated.functions, FunctionFiles::Applied { revision, .. } if revision == previous.revision),
        "{migrated:?}"
    );
    let old_functions = signatures(&store, db.schema()).await?;
    assert!(old_functions.len() > 30, "{old_functions:?}");
    let old_shapes = prepare_all(&store, &statements).await?;

    // This build upgrades it; the previous build's processes are still running.
    let upgraded = store.migrate_report().await?;
    assert!(
        matches!(upgraded.functions, FunctionFiles::Applied { revision, .. } if revision == ours),
        "{upgraded:?}"
    );
    let new_functions = signatures(&store, db.schema()).await?;
    let fresh_functions = signatures(&fresh.store(), fresh.schema()).await?;
    let new_shapes = prepare_all(&store, &statements).await?;
    let fresh_shapes = prepare_all(&fresh.store(), &statements).await?;

    let mut problems = Vec::new();
    for (function, result) in &old_functions {
        for (schema, functions) in [("upgraded", &new_functions), ("fresh", &fresh_functions)] {
            match functions.get(function) {
                None => problems.push(format!("{function} is gone ({schema} schema)")),
                Some(now) if now != result => problems.push(format!(
                    "{function} returned {result}, now {now} ({schema} schema)"
                )),
                Some(_) => {}
            }
        }
    }
    for (i, (name, statement)) in statements.iter().enumerate() {
        let old = match &old_shapes[i] {
            Ok(shape) => shape,
            Err(error) => {
                problems.push(format!(
                    "{name} does not prepare on its own build's schema ({error}): {statement}"
                ));
                continue;
            }
        };
        for (schema, shapes) in [("upgraded", &new_shapes), ("fresh", &fresh_shapes)] {
            match &shapes[i] {
                Err(error) => {
                    problems.push(format!(
                        "{name} no longer prepares ({schema} schema): {error}"
                    ));
                }
                Ok(new) if new != old => problems.push(format!(
                    "{name} changed ({schema} schema): {}",
                    old.changes(new).join("; ")
                )),
                Ok(_) => {}
            }
        }
    }
    let ours_files = function_files(&MIGRATIONS_CRATE, this_build)?;
    let old_codes = outcome_codes(&previous.files);
    for (function, codes) in outcome_codes(&ours_files) {
        let Some(known) = old_codes.get(&function) else {
            continue; // new in this build: the previous one never calls it
        };
        for code in codes.difference(known) {
            problems.push(format!(
                "{function} now assigns outcome '{code}', which the previous build does not know"
            ));
        }
    }
    println!(
        "checked against {} (revision {}): {} functions, {} statements",
        previous.commit,
        previous.revision,
        old_functions.len(),
        statements.len()
    );
    assert!(
        problems.is_empty(),
        "the previous build ({}, revision {}) would break against revision {ours}: {problems:#?}",
        previous.commit,
        previous.revision
    );
    Ok(())
}

pub(crate) mod rust_sql {
    //! The SQL statements a build's store sends, read from its Rust source: each `const` (or
    //! `static`) `&str` whose value is a string literal, a `concat!` of values, a reference to
    //! another such constant, or a call of a `macro_rules!` macro of the sources whose one rule
    //! takes no argument or one `literal` and expands to such a value. A statement is a value
    //! that starts with `SELECT`, `WITH`, `INSERT`, `UPDATE` or `DELETE`; the others (operation
    //! names, fragments of statements assembled at run time) are not sent as they are.

    use std::collections::BTreeMap;

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Token {
        Str(String),
        Ident(String),
        Punct(char),
    }

    /// The tokens of `src` from its start up to the first `;` outside brackets (or its end),
    /// and the length read.
    fn tokens(src: &str) -> Result<(Vec<Token>, usize), String> {
        let chars: Vec<char> = src.chars().collect();
        let mut out = Vec::new();
        let mut depth = 0i32;
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c.is_whitespace() {
                i += 1;
            } else if c == '/' && chars.get(i + 1) == Some(&'/') {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            } else if c == '/' && chars.get(i + 1) == Some(&'*') {
                i += 2;
                while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            } else if c == '"' {
                let (text, end) = string(&chars, i + 1)?;
                out.push(Token::Str(text));
                i = end;
            } else if c == 'r' && matches!(chars.get(i + 1), Some('"' | '#')) {
                let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
                let open = i + 1 + hashes;
                if chars.get(open) != Some(&'"') {
                    return Err("a raw string without its quote".to_owned());
                }
                let close: String = std::iter::once('"')
                    .chain("#".repeat(hashes).chars())
                    .collect();
                let rest: String = chars[open + 1..].iter().collect();
                let end = rest.find(&close).ok_or("an unterminated raw string")?;
                out.push(Token::Str(rest[..end].to_owned()));
                i = open + 1 + rest[..end].chars().count() + close.chars().count();
            } else if c.is_ascii_alphanumeric() || c == '_' {
                let mut ident = String::new();
                while i < chars.len() {
                    if chars[i].is_ascii_alphanumeric() || chars[i] == '_' {
                        ident.push(chars[i]);
                        i += 1;
                    } else if chars[i] == ':' && chars.get(i + 1) == Some(&':') {
                        ident.push_str("::");
                        i += 2;
                    } else {
                        break;
                    }
                }
                out.push(Token::Ident(ident));
            } else {
                match c {
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' => depth -= 1,
                    ';' if depth == 0 => return Ok((out, i + 1)),
                    _ => {}
                }
                out.push(Token::Punct(c));
                i += 1;
            }
        }
        Ok((out, chars.len()))
    }

    /// A string literal's text, from just after its opening quote; and where it ends.
    fn string(chars: &[char], mut i: usize) -> Result<(String, usize), String> {
        let mut text = String::new();
        while i < chars.len() {
            match chars[i] {
                '"' => return Ok((text, i + 1)),
                '\\' => {
                    let escaped = *chars.get(i + 1).ok_or("an escape at the end")?;
                    i += 2;
                    match escaped {
                        'n' => text.push('\n'),
                        't' => text.push('\t'),
                        'r' => text.push('\r'),
                        '0' => text.push('\0'),
                        '\\' | '"' | '\'' => text.push(escaped),
                        '\n' => {
                            while i < chars.len() && chars[i].is_whitespace() {
                                i += 1;
                            }
                        }
                        other => return Err(format!("the escape \\{other} is not read here")),
                    }
                }
                c => {
                    text.push(c);
                    i += 1;
                }
            }
        }
        Err("an unterminated string".to_owned())
    }

    /// A `macro_rules!` macro with one rule.
    struct Macro {
        param: Option<String>,
        body: Vec<Token>,
    }

    /// The name of the `&str` constant `text` starts with (`keyword`, `const` or `static`,
    /// first), and where its value starts; `None` for any other item.
    fn str_const(text: &str, keyword: &str) -> Option<(String, usize)> {
        let rest = text.strip_prefix(keyword)?;
        let name_len = rest
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .filter(|n| *n > 0)?;
        let name = &rest[..name_len];
        let ty = rest[name_len..]
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        let ty = ty.strip_prefix('&')?.trim_start();
        let ty = ty.strip_prefix("'static").unwrap_or(ty).trim_start();
        let value = ty.strip_prefix("str")?.trim_start().strip_prefix('=')?;
        Some((name.to_owned(), text.len() - value.len()))
    }

    /// The macro defined at the start of `text` (just after `macro_rules!`).
    fn macro_rule(text: &str) -> Result<(String, Macro), String> {
        let (tokens, _) = tokens(text)?;
        let name = match tokens.first() {
            Some(Token::Ident(name)) => name.clone(),
            _ => return Err("a macro without a name".to_owned()),
        };
        // name { ( [$ param : literal] ) => { body } [;] }
        let mut at = 2; // past the name and the outer brace
        if tokens.get(1) != Some(&Token::Punct('{')) || tokens.get(at) != Some(&Token::Punct('(')) {
            return Err(format!("macro {name}: not a single rule"));
        }
        at += 1;
        let mut param = None;
        if tokens.get(at) == Some(&Token::Punct('$')) {
            match (tokens.get(at + 1), tokens.get(at + 2), tokens.get(at + 3)) {
                (Some(Token::Ident(p)), Some(Token::Punct(':')), Some(Token::Ident(kind)))
                    if kind == "literal" =>
                {
                    param = Some(p.clone());
                    at += 4;
                }
                _ => return Err(format!("macro {name}: its argument is not one literal")),
            }
        }
        let header = [
            Token::Punct(')'),
            Token::Punct('='),
            Token::Punct('>'),
            Token::Punct('{'),
        ];
        if tokens.get(at..at + 4) != Some(&header[..]) {
            return Err(format!("macro {name}: not a single rule"));
        }
        at += 4;
        let mut depth = 1;
        let start = at;
        while depth > 0 {
            match tokens.get(at) {
                Some(Token::Punct('(' | '[' | '{')) => depth += 1,
                Some(Token::Punct(')' | ']' | '}')) => depth -= 1,
                Some(_) => {}
                None => return Err(format!("macro {name}: unterminated")),
            }
            at += 1;
        }
        let body = tokens[start..at - 1].to_vec();
        Ok((name, Macro { param, body }))
    }

    struct Reader<'a> {
        consts: BTreeMap<String, Vec<(&'a str, Vec<Token>)>>,
        macros: BTreeMap<String, Macro>,
    }

    impl Reader<'_> {
        /// The value of the expression at `tokens[*at..]`, in `file`, with `$param` bound.
        fn eval(
            &self,
            file: &str,
            tokens: &[Token],
            at: &mut usize,
            bound: Option<(&str, &str)>,
            depth: usize,
        ) -> Result<String, String> {
            if depth > 32 {
                return Err("constants refer to each other in a cycle".to_owned());
            }
            let token = tokens.get(*at).ok_or("an expression ends early")?;
            *at += 1;
            match token {
                Token::Str(text) => Ok(text.clone()),
                Token::Punct('$') => match (tokens.get(*at), bound) {
                    (Some(Token::Ident(name)), Some((param, value))) if name == param => {
                        *at += 1;
                        Ok(value.to_owned())
                    }
                    _ => Err("a macro variable that is not its argument".to_owned()),
                },
                Token::Ident(path) if tokens.get(*at) == Some(&Token::Punct('!')) => {
                    let name = path.rsplit("::").next().unwrap_or(path);
                    let rule = self.macros.get(name);
                    if name != "concat" && rule.is_none() {
                        return Err(format!("the macro {name}! is not read here"));
                    }
                    *at += 1;
                    if tokens.get(*at) != Some(&Token::Punct('(')) {
                        return Err(format!("{name}! without parentheses"));
                    }
                    *at += 1;
                    let mut args = Vec::new();
                    while tokens.get(*at) != Some(&Token::Punct(')')) {
                        args.push(self.eval(file, tokens, at, bound, depth + 1)?);
                        match tokens.get(*at) {
                            Some(Token::Punct(',')) => *at += 1,
                            Some(Token::Punct(')')) => {}
                            other => return Err(format!("{name}!: unexpected {other:?}")),
                        }
                    }
                    *at += 1;
                    let Some(rule) = rule else {
                        return Ok(args.concat());
                    };
                    let bound = match (&rule.param, args.as_slice()) {
                        (None, []) => None,
                        (Some(param), [value]) => Some((param.as_str(), value.as_str())),
                        _ => return Err(format!("{name}! called with {} arguments", args.len())),
                    };
                    let mut inner = 0;
                    let value = self.eval(file, &rule.body, &mut inner, bound, depth + 1)?;
                    if inner != rule.body.len() {
                        return Err(format!("{name}!: its body is more than one value"));
                    }
                    Ok(value)
                }
                Token::Ident(path) => {
                    let name = path.rsplit("::").next().unwrap_or(path);
                    let candidates = self
                        .consts
                        .get(name)
                        .ok_or_else(|| format!("{name} is not a &str constant of the sources"))?;
                    let chosen = candidates
                        .iter()
                        .find(|(f, _)| *f == file)
                        .or_else(|| (candidates.len() == 1).then(|| &candidates[0]));
                    if let Some((_, value)) = chosen {
                        let mut inner = 0;
                        return self.eval(file, value, &mut inner, None, depth + 1);
                    }
                    // Several files define it and this one does not (the reader does not follow
                    // `use`): it does not matter which when they agree, or when none of them is
                    // SQL (operation labels such as `GET`, which no statement is built from).
                    let mut values = Vec::new();
                    for (other, value) in candidates {
                        let mut inner = 0;
                        values.push(self.eval(other, value, &mut inner, None, depth + 1)?);
                    }
                    let agree = values.windows(2).all(|pair| pair[0] == pair[1]);
                    if agree || !values.iter().any(|value| is_statement(value)) {
                        Ok(values.swap_remove(0))
                    } else {
                        Err(format!("{name} names several constants"))
                    }
                }
                other => Err(format!("unexpected {other:?}")),
            }
        }
    }

    /// Whether `text` is a statement the store sends as it is.
    fn is_statement(text: &str) -> bool {
        let first = text
            .trim_start()
            .split(|c: char| c.is_whitespace() || c == '(')
            .next()
            .unwrap_or_default()
            .to_ascii_uppercase();
        ["SELECT", "WITH", "INSERT", "UPDATE", "DELETE"].contains(&first.as_str())
    }

    /// The statements of `sources` (paths and texts), each named `path: CONST`, and the
    /// constants that could not be read, with why.
    pub(crate) fn statements(sources: &[(&str, &str)]) -> (Vec<(String, String)>, Vec<String>) {
        let mut reader = Reader {
            consts: BTreeMap::new(),
            macros: BTreeMap::new(),
        };
        let mut unread = Vec::new();
        for (path, text) in sources {
            for (at, _) in text.match_indices("macro_rules!") {
                match macro_rule(&text[at + "macro_rules!".len()..]) {
                    Ok((name, rule)) => {
                        reader.macros.insert(name, rule);
                    }
                    Err(why) => unread.push(format!("{path}: {why}")),
                }
            }
            for line_start in std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1))
            {
                let line = &text[line_start..];
                let code = line.trim_start();
                let code = code
                    .strip_prefix("pub(crate) ")
                    .or_else(|| code.strip_prefix("pub "))
                    .unwrap_or(code);
                let Some((name, value)) =
                    str_const(code, "const ").or_else(|| str_const(code, "static "))
                else {
                    continue;
                };
                let start = line_start + (line.len() - code.len()) + value;
                match tokens(&text[start..]) {
                    Ok((tokens, _)) => reader.consts.entry(name).or_default().push((path, tokens)),
                    Err(why) => unread.push(format!("{path}: {name}: {why}")),
                }
            }
        }
        let mut statements = Vec::new();
        for (name, definitions) in &reader.consts {
            for (path, tokens) in definitions {
                let mut at = 0;
                match reader.eval(path, tokens, &mut at, None, 0) {
                    Ok(_) if at != tokens.len() => {
                        unread.push(format!("{path}: {name}: more than one value"));
                    }
                    Ok(value) if is_statement(&value) => {
                        statements.push((format!("{path}: {name}"), value));
                    }
                    Ok(_) => {}
                    Err(why) => unread.push(format!("{path}: {name}: {why}")),
                }
            }
        }
        (statements, unread)
    }

    #[test]
    fn literals_concatenations_macros_and_references_are_read() {
        let source = r####"
            macro_rules! columns {
                ($source:literal) => {
                    concat!($source, "a, ", $source, "b")
                };
            }
            macro_rules! expired {
                () => {
                    "w.done"
                };
            }
            /// Not a statement: an operation's name.
            const GET: &str = "reading a row";
            pub(crate) const ONE: &str = "SELECT x \
                 FROM t WHERE s = 'a;b' -- \"quoted\"
                 AND y = $1";
            const TWO: &'static str = concat!("SELECT ", columns!("s."), " FROM f() s WHERE ", expired!());
            pub const THREE: &str = r#"WITH q AS (SELECT "c") SELECT * FROM q"#;
            const FOUR: &str = crate::other::BASE;
            const LIMIT: usize = 5;
        "####;
        let other = r#"pub(crate) const BASE: &str = "DELETE FROM t";"#;
        let (mut statements, unread) = statements(&[("a.rs", source), ("other.rs", other)]);
        statements.sort();
        assert!(unread.is_empty(), "{unread:?}");
        assert_eq!(
            statements,
            [
                ("a.rs: FOUR".to_owned(), "DELETE FROM t".to_owned()),
                (
                    "a.rs: ONE".to_owned(),
                    "SELECT x FROM t WHERE s = 'a;b' -- \"quoted\"\n                 AND y = $1"
                        .to_owned()
                ),
                (
                    "a.rs: THREE".to_owned(),
                    r#"WITH q AS (SELECT "c") SELECT * FROM q"#.to_owned()
                ),
                (
                    "a.rs: TWO".to_owned(),
                    "SELECT s.a, s.b FROM f() s WHERE w.done".to_owned()
                ),
                ("other.rs: BASE".to_owned(), "DELETE FROM t".to_owned()),
            ]
        );
    }

    #[test]
    fn a_constant_the_reader_cannot_evaluate_is_reported() {
        let source = r#"const ODD: &str = stringify!(SELECT 1);"#;
        let (statements, unread) = statements(&[("a.rs", source)]);
        assert!(statements.is_empty());
        assert_eq!(unread.len(), 1, "{unread:?}");
        assert!(unread[0].contains("stringify"), "{unread:?}");
    }
}
