//! The crate's one integration test binary: a deterministic simulation of replica groups
//! (`sim`), random faults over many seeds (`seeds`), and the scenarios that pin pre-vote,
//! the leader's lease and recovery (`scenarios`).

mod scenarios;
mod seeds;
mod sim;
