//! The store contract suite (`keiro_tests::contract`) on every store: one line per store.

keiro_tests::contract_suite!(postgres => keiro_tests::Harness::postgres().await);
keiro_tests::contract_suite!(postgres_unbatched => keiro_tests::Harness::postgres_unbatched().await);
keiro_tests::contract_suite!(sqlite => keiro_tests::Harness::sqlite());
