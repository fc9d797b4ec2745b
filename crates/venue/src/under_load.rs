//! Accounts added under load: a profile's `[accounts_under_load]`, run through the venue's
//! admin service (the admin path: one bulk addition under one request id, each account added
//! with its cash by one command through the replicated path) on a thread of its own while the load runs,
//! as SPECTRA's 2020 test added its client accounts during the load.

use bourse_admin::AdminService;
use bourse_loadgen::profile::AccountsUnderLoad;
use bourse_loadgen::results::AccountsAdded;
use std::sync::Arc;
use std::time::Duration;

pub use bourse_loadgen::profile::ACCOUNTS_UNDER_LOAD_ID_BASE;
/// Lines per chunk of the generated bulk body.
const LINES_PER_CHUNK: u64 = 1_024;
/// The operator named in the audit log.
const OPERATOR: &str = "loadtest";

/// A plan, then the thread running it.
pub(crate) struct UnderLoad {
    pub plan: AccountsUnderLoad,
    pub audit_path: std::path::PathBuf,
    pub running: Option<std::thread::JoinHandle<AccountsAdded>>,
}

/// The bulk body: one account of the plan's market a line, made a chunk at a time as the
/// service reads it.
fn chunks(
    plan: &AccountsUnderLoad,
) -> impl Iterator<Item = Result<Vec<u8>, std::convert::Infallible>> + Send + 'static {
    let (count, cash) = (plan.count, plan.cash);
    let market = serde_json::Value::from(plan.market.as_str()).to_string();
    (0..count.div_ceil(LINES_PER_CHUNK)).map(move |k| {
        let mut chunk = Vec::with_capacity(96 * LINES_PER_CHUNK as usize);
        for i in k * LINES_PER_CHUNK..((k + 1) * LINES_PER_CHUNK).min(count) {
            chunk.extend_from_slice(
                format!(
                    "{{\"account\":{},\"firm\":{},\"cash\":{cash},\"markets\":[{market}]}}\n",
                    u64::from(ACCOUNTS_UNDER_LOAD_ID_BASE) + i,
                    1 + i % 100
                )
                .as_bytes(),
            );
        }
        Ok(chunk)
    })
}

/// Starts the thread: it waits until `start_s` after the run's start, sends the bulk
/// addition to the market named in the plan, and reports what it did.
pub(crate) fn start(
    service: Arc<AdminService>,
    runtime: bourse_cluster::tokio::runtime::Handle,
    plan: AccountsUnderLoad,
    run_start_unix_ns: u64,
) -> std::io::Result<std::thread::JoinHandle<AccountsAdded>> {
    std::thread::Builder::new()
        .name("accounts-under-load".into())
        .spawn(move || {
            let due = run_start_unix_ns + (plan.start_s * 1e9) as u64;
            let now = bourse_loadgen::unix_ns();
            if due > now {
                std::thread::sleep(Duration::from_nanos(due - now));
            }
            let body = futures_util::stream::iter(chunks(&plan));
            let start_unix_ns = bourse_loadgen::unix_ns();
            let answer = runtime.block_on(service.bulk(OPERATOR, "accounts-under-load", body));
            let end_unix_ns = bourse_loadgen::unix_ns();
            let added = answer.body["accounts_added"].as_u64().unwrap_or(0);
            AccountsAdded {
                market: plan.market.clone(),
                accounts: added,
                // One `add_funded_account` per account: its deposit is in the same command.
                commands: added,
                start_unix_ns,
                end_unix_ns,
                outcome: answer.outcome().to_string(),
                error: answer.body["error"].as_str().map(String::from),
                // Filled in by the deployment once the load is done.
                traded_accounts: 0,
                positions_held: 0,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_body_names_the_market_on_every_line_and_counts_exactly() {
        let plan = AccountsUnderLoad {
            market: "derivatives".into(),
            count: 2_500,
            start_s: 0.0,
            cash: 7,
            traded: 0,
        };
        let mut n = 0u64;
        for chunk in chunks(&plan) {
            let bytes = chunk.unwrap();
            for line in std::str::from_utf8(&bytes).unwrap().lines() {
                let a: bourse_admin::NewAccount = serde_json::from_str(line).unwrap();
                assert_eq!(a.account.0, ACCOUNTS_UNDER_LOAD_ID_BASE + n as u32);
                assert_eq!(a.markets, Some(vec!["derivatives".to_string()]));
                assert_eq!(a.cash.0, 7);
                n += 1;
            }
        }
        assert_eq!(n, 2_500);
    }
}
