//! The integration tests of `bourse-fix`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-fix --test it MODULE::`.

mod acceptance;
mod codec_proptest;
mod common;
mod echo_poss_resend;
mod gap_fill_during_resend;
mod poss_dup_below_expected;
