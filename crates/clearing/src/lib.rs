//! # bourse-clearing: clearing apart from trading
//!
//! Follows the cores' committed streams and never touches their state; what it decides goes
//! back as ordinary commands. Start at [`ClearingState`] (positions, P&L, margin, obligations
//! and cash per account; integers and ordered containers only) and [`compute_run`] (a pure
//! function of the state at a cut giving a [`RunPlan`]: prices, margin, [`Movement`]s, margin
//! calls). `service` feeds the state and runs plans ([`execute`]); [`ClearingNode`] is `bourse
//! clearing serve`, with its HTTP API (`server`) and FIX RequestForPositions (`fix`);
//! [`FeeSchedule`], [`SettlementCycle`] and [`ClearingSchedule`] are fees, settlement dates and
//! the day's runs.
//!
//! Design and invariants: ARCHITECTURE.md, `crates/clearing`.

pub mod fees;
pub mod fix;
pub mod node;
pub mod positions;
pub mod report;
pub mod run;
pub mod schedule;
pub mod server;
pub mod service;
pub mod settlement;
pub mod state;

pub use fees::{FeeBase, FeeLine, FeeRate, FeeSchedule};
pub use node::{load_instruments, ClearingConfig, ClearingNode, RunRequest, StandbyLogin};
pub use positions::{AccountTable, FeeBases, Positions};
pub use report::{save_plan, saved_runs, Report, RunTiming};
pub use run::{
    compute_run, compute_run_with_fees, fee_lines, run_client_id, settlement_prices, DebtLine,
    InitialMarginLine, MarginLine, Movement, ObligationLine, RollLine, RunKind, RunPlan,
    SettlementRule,
};
pub use schedule::{ClearingSchedule, Clock, ManualClock, ScheduledRun, SystemClock};
pub use service::{execute, feed_to, replay, stream_end, with_ids, ExecuteOptions, MovementResult};
pub use settlement::{date_obligations, SettlementCycle};
pub use state::{ClearingError, ClearingPosition, ClearingState, StartOfDay};
