//! `bourse bench clearing`: an intermediate clearing of N accounts × M futures positions in
//! process (no network): filling the clearing state from trade events, the run itself
//! (`compute_run`: settlement prices, variation margin per position, movements), settling
//! it, and the state's snapshot encoding (streamed into its hash, as `state_hash` does, so a
//! state of 100,000,000 positions is never held twice); positions/s of the run, the state's
//! resident memory per position and the process's peak resident memory. It excludes the streams, the network and submitting the movements
//! (one command per account that moved, measured by `bench cluster`), and trading beside it.

use super::common::{self, Machine};
use anyhow::{bail, Result};
use bourse_clearing::{compute_run, ClearingState, RunKind, SettlementRule};
use bourse_core::*;
use clap::Args;
use serde_json::json;
use std::time::Instant;

#[derive(Args)]
pub struct ClearingBenchArgs {
    /// Accounts holding positions.
    #[arg(long, default_value_t = 100_000)]
    accounts: u32,
    /// Futures positions per account (each in another instrument).
    #[arg(long, default_value_t = 5)]
    positions_per_account: u32,
    /// Futures instruments (at least positions-per-account).
    #[arg(long, default_value_t = 100)]
    instruments: u32,
    /// Runs to time (each on the same state, settled in between).
    #[arg(long, default_value_t = 5)]
    runs: u32,
    #[arg(long)]
    json: bool,
}

/// The counterparty of every trade: the house account, which ends holding the other side.
const HOUSE: AccountId = AccountId(u32::MAX);

fn instrument(id: u32) -> Instrument {
    Instrument {
        instrument: InstrumentId(id),
        symbol: format!("F{id}"),
        market: Market::Futures,
        price_scale: 0,
        tick: Price(10),
        lot_size: 1,
        multiplier: 1,
        initial_margin: Cash(5_000_0000),
        band_bps: 1000,
        reference_price: Price(100_000),
        volatility: Default::default(),
    }
}

fn trade(n: u64, account: AccountId, instrument: u32, price: i64, ts_ns: u64) -> Event {
    let fill = |account| Fill {
        order_id: OrderId(n),
        account,
        cl_ord_id: ClOrdId(n),
        qty_leaves: Qty(0),
        qty_filled: Qty(1),
    };
    Event::Trade {
        trade_id: TradeId(n),
        instrument: InstrumentId(instrument),
        price: Price(price),
        qty: Qty(1 + (n % 7) as i64),
        aggressor: Side::Buy,
        buy: fill(account),
        sell: fill(HOUSE),
        auction: false,
        ts_ns,
    }
}

pub fn bench(args: ClearingBenchArgs) -> Result<()> {
    if args.instruments == 0 || args.positions_per_account > args.instruments {
        bail!("--instruments must be at least --positions-per-account and positive");
    }
    if args.accounts == 0 || args.accounts == u32::MAX || args.runs == 0 {
        bail!("--accounts and --runs must be positive (and accounts below u32::MAX)");
    }
    let machine = Machine::this();
    let defs: Vec<Instrument> = (1..=args.instruments).map(instrument).collect();
    let rss_empty = common::rss_bytes();
    let mut state = ClearingState::new(1, defs);
    let fill_started = Instant::now();
    let mut n = 0u64;
    for a in 0..args.accounts {
        for p in 0..args.positions_per_account {
            n += 1;
            let i = (a + p) % args.instruments + 1;
            let price = 99_000 + ((n * 7_919) % 200) as i64 * 10;
            state
                .apply_event(0, &trade(n, AccountId(a + 1), i, price, n))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    let fill_s = fill_started.elapsed().as_secs_f64();
    let positions = state.positions().len() as u64;
    let rss_full = common::rss_bytes();
    let bytes_per_position = rss_full.saturating_sub(rss_empty) as f64 / positions as f64;
    let rule = SettlementRule::default();
    let mut hist = common::histogram();
    let mut movements = 0;
    for run in 1..=args.runs {
        let started = Instant::now();
        let plan = compute_run(&state, run, RunKind::Intermediate, &rule);
        let took = started.elapsed();
        common::record(&mut hist, took.as_nanos() as u64);
        movements = plan.movements.len();
        state.settle(&plan);
    }
    let run = common::Latency::of(&hist);
    let positions_per_s = positions as f64 / (run.p50 as f64 / 1e9);
    let encode_started = Instant::now();
    let hash = state.state_hash();
    let encode_s = encode_started.elapsed().as_secs_f64();
    let snapshot_bytes = state.encoded_len();
    let peak_rss = common::peak_rss_bytes();
    let wide = state.positions().wide_len();
    if args.json {
        println!(
            "{}",
            json!({
                "bench": "clearing",
                "machine": machine,
                "version": common::version(),
                "accounts": args.accounts,
                "positions": positions,
                "fill_s": fill_s,
                "run": run,
                "positions_per_s": positions_per_s,
                "movements_last_run": movements,
                "bytes_per_position_rss": bytes_per_position,
                "positions_wide": wide,
                "peak_rss_bytes": peak_rss,
                "snapshot_bytes": snapshot_bytes,
                "encode_s": encode_s,
                "state_hash": format!("{hash:016x}"),
            })
        );
        return Ok(());
    }
    println!(
        "bourse bench clearing ({}): one thread, in process",
        common::version()
    );
    println!(
        "{} accounts, {} positions (+ the house's) filled from {} trade events in {:.2} s ({:.0} events/s)",
        args.accounts,
        positions,
        n,
        fill_s,
        n as f64 / fill_s
    );
    println!(
        "resident memory of the state: {:.0} bytes per position ({} MB; {} positions held wide, beyond 64 bits)",
        bytes_per_position,
        rss_full.saturating_sub(rss_empty) >> 20,
        wide
    );
    println!("{}", common::latency_header());
    println!(
        "{}",
        common::latency_row(&format!("intermediate run ({} runs)", args.runs), &run)
    );
    println!(
        "run: {:.0} positions/s at the median ({} movements in the last run; the first pays, later ones pay only changes)",
        positions_per_s, movements
    );
    println!(
        "snapshot encoding: {} MB, encoded into the state hash {:016x} in {:.2} s",
        snapshot_bytes >> 20,
        hash,
        encode_s
    );
    println!("peak resident memory of the process: {} MB", peak_rss >> 20);
    Ok(())
}
