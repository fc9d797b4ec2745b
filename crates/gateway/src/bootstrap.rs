//! What a gateway does before it serves: [`bootstrap`] creates the configuration's
//! instruments and accounts in the cores that own them (idempotently: a replicated core that
//! already has them after a gateway restart is fine, and cash is deposited only where an
//! account is new), and `restore_order_state` loads the order table (and the instruments
//! learned at run time) a previous run saved when the links resume exactly where it is exact
//! (`crate::recovery`).

use crate::config::GatewayConfig;
use crate::recovery;
use crate::router::Router;
use crate::server::now_ns;
use bourse_core::*;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Loads the order state a previous run saved (`crate::recovery`) if every link resumes its
/// core's stream exactly where the state is exact; a state that does not match the links
/// (cores in process, or links started elsewhere) is set aside with a warning, since events
/// it has not seen are gone for it.
pub(crate) fn restore_order_state(
    router: &mut Router,
    dir: &std::path::Path,
) -> Result<(), String> {
    let Some(mut state) = recovery::read_state(dir)? else {
        return Ok(());
    };
    let positions: Vec<Option<u64>> = router
        .links_mut()
        .iter()
        .map(|l| l.stream_position())
        .collect();
    let matches = positions.iter().all(Option::is_some) && positions == state.positions;
    recovery::consume_state(dir).map_err(|e| format!("order state in {}: {e}", dir.display()))?;
    if !matches {
        eprintln!(
            "gateway: the saved order state (stream positions {:?}) does not match the links \
             ({positions:?}); starting without it",
            state.positions
        );
        return Ok(());
    }
    let (live, finished) = (state.live.len(), state.finished.len());
    state.positions.clear();
    // Instruments first: the restored orders may be in instruments added at run time.
    let instruments = std::mem::take(&mut state.instruments);
    let left_out = router.restore_instruments(&instruments);
    let dropped = router.import_state(state);
    eprintln!(
        "gateway: restored {live} live and {finished} finished orders and {} instruments \
         added at run time from {}{}{}",
        instruments.len() - left_out,
        dir.display(),
        if dropped > 0 {
            format!(" ({dropped} of sessions no longer configured dropped)")
        } else {
            String::new()
        },
        if left_out > 0 {
            format!(" ({left_out} instruments of cores no longer configured left out)")
        } else {
            String::new()
        }
    );
    Ok(())
}

/// How long bootstrap waits for a core's answers (a replicated core may be electing a leader).
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(30);

/// Submits `commands` (core, command) and waits for every answer; returns them in order, with
/// whether each command's events included an AccountAdded.
fn admin_round(
    router: &mut Router,
    commands: Vec<(usize, Command)>,
) -> Result<Vec<(Option<RejectReason>, bool)>, String> {
    let deadline = std::time::Instant::now() + BOOTSTRAP_TIMEOUT;
    router.clear_admin_answers();
    let mut keys = Vec::with_capacity(commands.len());
    for (core, cmd) in commands {
        loop {
            match router.submit_admin(core, cmd.clone()) {
                Ok(key) => {
                    keys.push(key);
                    break;
                }
                Err(bourse_core::link::SubmitError::Closed) => {
                    return Err(format!("core {core} closed during bootstrap"))
                }
                Err(
                    bourse_core::link::SubmitError::Full | bourse_core::link::SubmitError::NoQuorum,
                ) => {
                    router.poll_core(usize::MAX);
                    if std::time::Instant::now() > deadline {
                        return Err(format!("core {core} did not take the bootstrap commands"));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    while router.admin_answered() < keys.len() {
        if router.poll_core(usize::MAX) == 0 {
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "the cores answered {} of {} bootstrap commands within {} s",
                    router.admin_answered(),
                    keys.len(),
                    BOOTSTRAP_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let (done, added) = router.take_admin_answers();
    let done: HashMap<_, _> = done.into_iter().collect();
    let added: HashSet<_> = added.into_iter().collect();
    Ok(keys
        .iter()
        .map(|k| (done.get(k).copied().flatten(), added.contains(k)))
        .collect())
}

/// Creates the config's instruments in the cores that own them and every account in every
/// core that bootstraps, then deposits each account's cash where the account was new.
/// Idempotent: an instrument or account the core already has (a replicated core after a
/// gateway restart) is fine and its cash is not deposited again.
pub fn bootstrap(router: &mut Router, config: &GatewayConfig) -> Result<(), String> {
    let plan = config.core_plan();
    let ts = now_ns();
    let mut round = Vec::new();
    let mut what = Vec::new();
    for (core, entry) in plan.iter().enumerate() {
        if !entry.bootstraps(config.core.bootstrap) {
            continue;
        }
        for i in config
            .instruments
            .iter()
            .filter(|i| entry.instruments.contains(&i.instrument))
        {
            round.push((
                core,
                Command::new(ts, CommandBody::AddInstrument(i.clone())),
            ));
            what.push((core, format!("instrument {}", i.symbol), None));
        }
        for a in &config.accounts {
            round.push((
                core,
                Command::new(
                    ts,
                    CommandBody::AddAccount(AccountSpec {
                        account: a.account,
                        firm: a.firm,
                        may_short: a.may_short,
                        stp: StpMode::None,
                        stp_scope: StpScope::Account,
                    }),
                ),
            ));
            what.push((core, format!("account {}", a.account.0), Some(a)));
        }
    }
    if round.is_empty() {
        return Ok(());
    }
    let answers = admin_round(router, round)?;
    let mut deposits = Vec::new();
    for ((core, name, account), (reject, added)) in what.into_iter().zip(answers) {
        let core_name = &plan[core].name;
        match reject {
            None
            | Some(RejectReason::DuplicateInstrument)
            | Some(RejectReason::DuplicateAccount) => {}
            Some(r) => {
                return Err(format!(
                    "bootstrap of core {core_name}: {name} refused: {r:?}"
                ))
            }
        }
        if let Some(a) = account {
            if added && a.cash > 0 {
                deposits.push((
                    core,
                    Command::new(
                        ts,
                        CommandBody::Deposit {
                            account: a.account,
                            amount: Cash(i128::from(a.cash)),
                        },
                    ),
                ));
            }
        }
    }
    if deposits.is_empty() {
        return Ok(());
    }
    let n = deposits.len();
    let answers = admin_round(router, deposits)?;
    if let Some(r) = answers.iter().find_map(|(r, _)| *r) {
        return Err(format!(
            "bootstrap: a deposit was refused: {r:?} ({n} deposits)"
        ));
    }
    Ok(())
}
