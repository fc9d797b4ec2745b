//! # bourse-clearing: clearing apart from trading
//!
//! Clearing follows the cores' committed streams (`bourse_cluster::StreamConsumer`) and never
//! touches their state directly; what it decides goes back to them as ordinary commands.
//!
//! - [`ClearingState`] (`state`): per account and instrument, position in lots, average cost,
//!   realised P&L, variation margin paid, equity and FX settlement obligations; per account
//!   and core, cash as the core has it. Fixed-point integers only, ordered containers only,
//!   no clock: fed the same entries it reaches the same [`ClearingState::state_hash`].
//!   Positions and fee bases are held packed per account (`positions`: [`Positions`]).
//! - [`compute_run`] (`run`): a pure function of the state at a cut (a vector of per-core
//!   stream positions) giving a [`RunPlan`]: settlement prices ([`SettlementRule`], a VWAP of
//!   the last trades), variation margin per futures position (zero-sum per instrument before
//!   rounding, the rounding kept apart), obligations, and the net cash [`Movement`]s per
//!   account and core, each keyed by [`run_client_id`] and a seq, so a rerun applies nothing
//!   twice; initial margin per account and core ([`InitialMarginLine`]) and the margin calls
//!   (`MarginCall` commands, same keys) where the collateral after the movements is short.
//!   A debit the core refuses (`ClearingDebit` above the free cash) becomes the account's
//!   debt in the state ([`DebtLine`]s: the next run collects it).
//! - `service`: feeding the state from the streams ([`feed_to`], [`replay`] of saved runs,
//!   checking their hashes) and [`execute`], which submits a plan's movements through
//!   `bourse_cluster::Client`, skipping what an earlier attempt of the run applied.
//! - [`ClearingNode`] (`node`): the clearing service (`bourse clearing serve`): feeds that
//!   follow every core continuously, runs on request (resumable, idempotent by run id),
//!   snapshots through `bourse_journal`'s snapshot store, a standby that reads its primary's
//!   runs and can take over; `server`: its HTTP/JSON API (positions, P&L, margin and
//!   obligations per account and firm, run reports, `POST /v1/runs`, `/metrics` with the lag).
//! - [`FeeSchedule`] (`fees`): trading fees per instrument or market, maker and taker apart,
//!   charged by runs from what each account traded since the last ([`FeeLine`]s), debited
//!   to the account and credited to the venue's account.
//! - `fix`: clearing data over FIX 4.4 (`[fix]`): RequestForPositions answered with a
//!   RequestForPositionsAck and PositionReports (quantities by PosType, amounts FMTM, IMTM,
//!   SETL by PosAmtType), intraday or as the day's end-of-day run left them, under the HTTP
//!   side's per-firm rule; [`fix::PositionsClient`] is its blocking client.
//! - [`SettlementCycle`] (`settlement`): equity and FX obligations dated T+n business days
//!   on the venue's calendar (`[settlement_cycle]`, T+1 and T+0 by default), fixed in the
//!   plan; `GET /v1/settlements/{date}` sums what settles on a day. An end-of-day run also
//!   rolls the state to the next business day (positions' start of day, [`StartOfDay`]).
//! - `report`: saved plans and run reports (JSON and CSV, whole and per firm).
//! - [`ClearingSchedule`] (`schedule`): runs on the venue's trading day (an intermediate run
//!   at the start of each clearing pause, the end of day's at the day's end) over a [`Clock`]
//!   that tests set.

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
