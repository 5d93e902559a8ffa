//! A build's function files (those of `keiro-migrations`, or in tests another build's)
//! and the pure decision of what to do with them, given what a schema records: apply the
//! missing and changed ones, leave a newer build's in place, or refuse a revision whose files
//! differ. The runner in `migrate.rs` reads the record and carries the decision out.

use sha2::{Digest, Sha256};

pub(crate) use keiro_migrations::FunctionFile;

/// The SHA-256 of one function file, as `keiro_functions` records it.
pub(crate) fn file_checksum(file: &FunctionFile) -> Vec<u8> {
    Sha256::digest(file.sql.as_bytes()).to_vec()
}

/// A build's function files and their revision: this build's (`FUNCTIONS` in `migrate.rs`),
/// or in tests those of an older or a newer build.
pub(crate) struct FunctionSet<'a> {
    pub(crate) revision: i32,
    pub(crate) files: &'a [FunctionFile],
}

impl<'a> FunctionSet<'a> {
    /// The SHA-256 of every file's name and checksum, in order: it changes when a file is
    /// edited, added, removed, renamed or moved in the order.
    pub(crate) fn checksum(&self) -> Vec<u8> {
        let mut digest = Sha256::new();
        for file in self.files {
            digest.update(file.name.as_bytes());
            digest.update([0]);
            digest.update(file_checksum(file));
        }
        digest.finalize().to_vec()
    }

    /// What to do with these files, given what the schema records: leave a newer revision's
    /// files alone, refuse this revision with other files, else apply each file that is
    /// missing or differs (a build of an equal revision may still find one to apply: a build
    /// from before revisions were recorded puts its files back without a trace of its own).
    pub(crate) fn plan(&self, recorded: &FunctionsRecorded) -> FunctionsPlan<'a> {
        let record = match &recorded.revision {
            Some((revision, _)) if *revision > self.revision => {
                return FunctionsPlan::Leave(FunctionFiles::NewerRevision {
                    ours: self.revision,
                    schema: *revision,
                });
            }
            Some((revision, sum)) if *revision == self.revision => {
                if *sum != self.checksum() {
                    return FunctionsPlan::Changed;
                }
                false
            }
            _ => true,
        };
        let files = self
            .files
            .iter()
            .filter(|file| {
                !recorded
                    .files
                    .iter()
                    .any(|(name, sum)| name == file.name && *sum == file_checksum(file))
            })
            .collect();
        FunctionsPlan::Apply { files, record }
    }
}

/// What a schema records of its function files.
#[derive(Default)]
pub(crate) struct FunctionsRecorded {
    /// Each file's name and the checksum it was last applied with.
    pub(crate) files: Vec<(String, Vec<u8>)>,
    /// The newest revision recorded, with its combined checksum: none before a build that
    /// records revisions migrated the schema.
    pub(crate) revision: Option<(i32, Vec<u8>)>,
}

/// What one migration run does with a build's function files.
pub(crate) enum FunctionsPlan<'a> {
    /// Apply these files (none when all are in place), then record the build's revision when
    /// `record` (the schema records none, or an older one).
    Apply {
        files: Vec<&'a FunctionFile>,
        record: bool,
    },
    /// Leave them, for this reason.
    Leave(FunctionFiles),
    /// The schema records the build's revision with other files.
    Changed,
}

/// What a migration run did with the function files of `keiro-migrations`.
///
/// ```
/// use keiro_postgres::FunctionFiles;
///
/// let report = FunctionFiles::NewerRevision { ours: 3, schema: 4 };
/// assert!(!matches!(report, FunctionFiles::Applied { .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FunctionFiles {
    /// Every file of this build's revision was in place already.
    UpToDate {
        /// The build's revision of its function files.
        revision: i32,
    },
    /// These files (`journal` for `functions/journal.sql`), new to the schema or changed,
    /// were applied, in order.
    Applied {
        /// The build's revision of its function files, now recorded in the schema.
        revision: i32,
        /// The files applied.
        files: Vec<&'static str>,
    },
    /// Left alone: a build with newer function files (a higher revision) applied its own.
    NewerRevision {
        /// This build's revision.
        ours: i32,
        /// The revision the schema records.
        schema: i32,
    },
    /// Left alone: the schema holds a migration this build does not know, so a newer build
    /// migrated it.
    NewerMigration {
        /// The newest migration the schema holds.
        version: i32,
    },
    /// Not checked: the role may neither read their bookkeeping nor apply a file.
    Unreadable,
    /// Not applied yet: the run stopped short of this build's newest migration (tests).
    Pending,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a schema records after `set` was applied to it.
    fn recorded_by(set: &FunctionSet<'_>) -> FunctionsRecorded {
        FunctionsRecorded {
            files: set
                .files
                .iter()
                .map(|f| (f.name.to_owned(), file_checksum(f)))
                .collect(),
            revision: Some((set.revision, set.checksum())),
        }
    }

    /// The names of the files a plan applies, and whether it records the revision; `None`
    /// when it leaves them or refuses.
    fn applies(plan: &FunctionsPlan<'_>) -> Option<(Vec<&'static str>, bool)> {
        match plan {
            FunctionsPlan::Apply { files, record } => {
                Some((files.iter().map(|f| f.name).collect(), *record))
            }
            _ => None,
        }
    }

    #[test]
    fn only_the_newest_revision_applies_its_files() {
        let old_files = [
            FunctionFile {
                name: "journal",
                sql: "SELECT 1",
            },
            FunctionFile {
                name: "lease",
                sql: "SELECT 2",
            },
        ];
        let new_files = [
            FunctionFile {
                name: "journal",
                sql: "SELECT 1",
            },
            FunctionFile {
                name: "lease",
                sql: "SELECT 3",
            },
        ];
        let old = FunctionSet {
            revision: 4,
            files: &old_files,
        };
        let new = FunctionSet {
            revision: 5,
            files: &new_files,
        };

        // Before any revision was recorded, every file is checked and the revision recorded.
        let unrevised = FunctionsRecorded {
            revision: None,
            ..recorded_by(&old)
        };
        assert_eq!(applies(&new.plan(&unrevised)), Some((vec!["lease"], true)));
        assert_eq!(applies(&old.plan(&unrevised)), Some((vec![], true)));
        // The newer build replaces the older one's files; the older one leaves the newer's.
        assert_eq!(
            applies(&new.plan(&recorded_by(&old))),
            Some((vec!["lease"], true))
        );
        assert!(matches!(
            old.plan(&recorded_by(&new)),
            FunctionsPlan::Leave(FunctionFiles::NewerRevision { ours: 4, schema: 5 })
        ));
        // The same revision: nothing to do, or a file put back by a build from before
        // revisions, or another set of files under the same number.
        assert_eq!(
            applies(&new.plan(&recorded_by(&new))),
            Some((vec![], false))
        );
        let put_back = FunctionsRecorded {
            revision: Some((new.revision, new.checksum())),
            ..recorded_by(&old)
        };
        assert_eq!(applies(&new.plan(&put_back)), Some((vec!["lease"], false)));
        let same_number = FunctionSet {
            revision: 5,
            files: &old_files,
        };
        assert!(matches!(
            same_number.plan(&recorded_by(&new)),
            FunctionsPlan::Changed
        ));
    }

    #[test]
    fn the_combined_checksum_sees_names_contents_and_order() {
        let file = |name, sql| FunctionFile { name, sql };
        let (a, b) = (file("a", "SELECT 1"), file("b", "SELECT 1"));
        let sum = |files: &[FunctionFile]| FunctionSet { revision: 1, files }.checksum();
        let ab = sum(&[a, b]);
        assert_eq!(ab, sum(&[a, b]));
        assert_ne!(ab, sum(&[b, a]));
        assert_ne!(ab, sum(&[a]));
        assert_ne!(ab, sum(&[a, file("b", "SELECT 2")]));
        assert_ne!(ab, sum(&[a, file("c", "SELECT 1")]));
    }
}
