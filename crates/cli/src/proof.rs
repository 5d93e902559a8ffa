//! What `keiro demo` and `keiro chaos` both check of a finished workload, as pure functions over
//! plain data: each output is a chain of the step results in their places, recomputed from the
//! values the steps must return, and every expected step of every instance is journaled.

use std::collections::BTreeSet;

/// The next link of a workflow's output: folds `value`, the result of the step at `position`,
/// into `chain`, through a bit mixer (SplitMix64's finalizer). Unlike a sum, the same results
/// in another order or at other positions give another chain, so an output recomputed from the
/// expected results catches a replay that answered a step with another step's result.
pub(crate) fn chain(chain: u64, position: u64, value: u64) -> u64 {
    mix(mix(chain ^ position.wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ value)
}

/// SplitMix64's finalizer: every input bit moves about half of the output bits.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The output of the steps' `values` in order, from `seed` (the instance's number): what a
/// correct run's body folds with [`chain`] as it goes.
pub(crate) fn chained(seed: u64, values: impl IntoIterator<Item = u64>) -> u64 {
    (0u64..)
        .zip(values)
        .fold(seed, |acc, (position, value)| chain(acc, position, value))
}

/// What [`check_steps`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Steps {
    /// Expected steps that were journaled.
    pub(crate) journaled: u64,
    /// `<instance> step <step> was never journaled`, for each expected step that was not.
    pub(crate) missing: Vec<String>,
    /// `<instance> journaled an unknown step <step>`, for each journaled step not expected.
    pub(crate) unknown: Vec<String>,
}

/// Checks that every step `expected` names (per instance, its label and the journal names of
/// its steps) was journaled, and that nothing else was: `journaled` holds the `(instance,
/// step)` pairs of the journal's step rows.
pub(crate) fn check_steps(
    expected: &[(String, Vec<String>)],
    journaled: &BTreeSet<(String, String)>,
) -> Steps {
    let mut found = Steps::default();
    let mut known = BTreeSet::new();
    for (instance, steps) in expected {
        for step in steps {
            let key = (instance.clone(), step.clone());
            if journaled.contains(&key) {
                found.journaled += 1;
            } else {
                found
                    .missing
                    .push(format!("{instance} step {step} was never journaled"));
            }
            known.insert(key);
        }
    }
    for (instance, step) in journaled.difference(&known) {
        found
            .unknown
            .push(format!("{instance} journaled an unknown step {step}"));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> BTreeSet<(String, String)> {
        list.iter()
            .map(|(i, s)| ((*i).to_owned(), (*s).to_owned()))
            .collect()
    }

    #[test]
    fn a_missing_and_an_unknown_step_are_named() {
        let expected = vec![
            ("i1".to_owned(), vec!["a".to_owned(), "b".to_owned()]),
            ("i2".to_owned(), vec!["a".to_owned()]),
        ];
        let found = check_steps(
            &expected,
            &pairs(&[("i1", "a"), ("i2", "a"), ("i2", "x"), ("i3", "a")]),
        );
        assert_eq!(found.journaled, 2);
        assert_eq!(found.missing, ["i1 step b was never journaled"]);
        assert_eq!(
            found.unknown,
            [
                "i2 journaled an unknown step x",
                "i3 journaled an unknown step a"
            ]
        );
        let all = check_steps(&expected, &pairs(&[("i1", "a"), ("i1", "b"), ("i2", "a")]));
        assert_eq!(
            (all.journaled, all.missing.len(), all.unknown.len()),
            (3, 0, 0)
        );
    }

    #[test]
    fn a_replay_that_swapped_two_results_gives_another_output() {
        let right = chained(7, [70, 71, 72, 73, 74]);
        assert_ne!(
            right,
            chained(7, [71, 70, 72, 73, 74]),
            "two results swapped"
        );
        assert_ne!(
            right,
            chained(7, [70, 71, 72, 74, 73]),
            "the last two swapped"
        );
        assert_ne!(right, chained(8, [70, 71, 72, 73, 74]), "another instance");
        assert_eq!(right, chained(7, [70, 71, 72, 73, 74]));
    }
}
