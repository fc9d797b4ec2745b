//! `bourse bench capacity`: memory per account, per position and per resting order at the
//! seeds' scale, measured as the process's resident memory grows.

use super::common::{self, Machine};
use anyhow::{bail, Result};
use bourse_core::*;
use bourse_engine::{Engine, EngineConfig};
use clap::Args;
use serde_json::json;
use std::time::Instant;

#[derive(Args)]
pub struct CapacityArgs {
    /// Accounts to create.
    #[arg(long, default_value_t = 1_000_000)]
    accounts: u32,
    /// Positions per account (each in a different instrument).
    #[arg(long, default_value_t = 10)]
    positions_per_account: u32,
    /// Instruments (at least positions-per-account).
    #[arg(long, default_value_t = 100)]
    instruments: u32,
    /// Resting orders to add at the end.
    #[arg(long, default_value_t = 1_000_000)]
    orders: u32,
    #[arg(long)]
    json: bool,
}

pub fn capacity(args: CapacityArgs) -> Result<()> {
    if args.instruments == 0 || args.positions_per_account > args.instruments {
        bail!("--instruments must be at least --positions-per-account and positive");
    }
    if args.accounts == 0 {
        bail!("--accounts must be positive");
    }
    let mut engine = Engine::new(EngineConfig {
        orders_max: args.orders.max(1) + 16,
        accounts_max: args.accounts,
        instruments_max: args.instruments,
        levels_per_side_hint: 64,
        first_order_id: 1,
    });
    let mut events = Vec::with_capacity(64);
    let mut ts = 1u64;
    let mut apply = |engine: &mut Engine, body: CommandBody, events: &mut Vec<Event>| {
        ts += 1;
        events.clear();
        engine.apply(&Command::new(ts, body), events);
    };
    let t0 = Instant::now();
    let rss_empty = common::rss_bytes();
    for i in 0..args.instruments {
        apply(
            &mut engine,
            CommandBody::AddInstrument(bourse_engine::fixtures::equity(
                i + 1,
                &format!("I{i}"),
                100_000,
            )),
            &mut events,
        );
    }
    let rss_instruments = common::rss_bytes();
    for a in 0..args.accounts {
        apply(
            &mut engine,
            CommandBody::AddAccount(AccountSpec {
                account: AccountId(a + 1),
                firm: FirmId(a / 100 + 1),
                may_short: false,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            }),
            &mut events,
        );
        apply(
            &mut engine,
            CommandBody::Deposit {
                account: AccountId(a + 1),
                amount: Cash(1_000_000_0000),
            },
            &mut events,
        );
    }
    let rss_accounts = common::rss_bytes();
    // A position record is created the first time an account orders an instrument; an order
    // placed and cancelled leaves an empty position behind, as a day of trading would.
    for a in 0..args.accounts {
        for p in 0..args.positions_per_account {
            let instrument = InstrumentId((a + p) % args.instruments + 1);
            apply(
                &mut engine,
                CommandBody::NewOrder(NewOrder {
                    firm: None,
                    account: AccountId(a + 1),
                    cl_ord_id: ClOrdId(1),
                    instrument,
                    side: Side::Buy,
                    ord_type: OrdType::Limit,
                    price: Price(90_000),
                    qty: Qty(1),
                    tif: TimeInForce::Day,
                    expire_ts_ns: 0,
                    display_qty: Qty(0),
                }),
                &mut events,
            );
            let Some(id) = bourse_engine::fixtures::accepted_id(&events) else {
                bail!("capacity order rejected: {events:?}");
            };
            apply(
                &mut engine,
                CommandBody::Cancel(Cancel {
                    account: AccountId(a + 1),
                    cl_ord_id: ClOrdId(0),
                    target: OrderRef {
                        order_id: Some(id),
                        orig_cl_ord_id: None,
                    },
                }),
                &mut events,
            );
        }
    }
    let rss_positions = common::rss_bytes();
    for n in 0..args.orders {
        let a = n % args.accounts;
        apply(
            &mut engine,
            CommandBody::NewOrder(NewOrder {
                firm: None,
                account: AccountId(a + 1),
                cl_ord_id: ClOrdId(10 + n as u64),
                instrument: InstrumentId(n % args.instruments + 1),
                side: Side::Buy,
                ord_type: OrdType::Limit,
                price: Price(90_000 + (n as i64 / args.instruments as i64) % 9_000),
                qty: Qty(1),
                tif: TimeInForce::Gtc,
                expire_ts_ns: 0,
                display_qty: Qty(0),
            }),
            &mut events,
        );
    }
    let rss_orders = common::rss_bytes();
    let elapsed = t0.elapsed();
    if engine.live_orders() != args.orders as usize {
        bail!(
            "only {} of {} orders rest",
            engine.live_orders(),
            args.orders
        );
    }
    let positions = args.accounts as u64 * args.positions_per_account as u64;
    let per = |bytes: u64, n: u64| if n == 0 { 0.0 } else { bytes as f64 / n as f64 };
    let per_account = per(
        rss_accounts.saturating_sub(rss_instruments),
        args.accounts as u64,
    );
    let per_position = per(rss_positions.saturating_sub(rss_accounts), positions);
    let per_order = per(rss_orders.saturating_sub(rss_positions), args.orders as u64);
    let snapshot_t0 = Instant::now();
    let snapshot = engine.snapshot();
    let snapshot_ms = snapshot_t0.elapsed().as_millis() as u64;
    let result = json!({
        "bench": "capacity",
        "accounts": args.accounts,
        "positions": positions,
        "resting_orders": args.orders,
        "instruments": args.instruments,
        "bytes_per_account": per_account.round() as u64,
        "bytes_per_position": per_position.round() as u64,
        "bytes_per_resting_order": per_order.round() as u64,
        "rss_bytes": rss_orders,
        "rss_bytes_empty": rss_empty,
        "snapshot_bytes": snapshot.len(),
        "snapshot_ms": snapshot_ms,
        "build_seconds": elapsed.as_secs_f64(),
        "machine": Machine::this(),
        "version": common::version(),
    });
    if args.json {
        println!("{result}");
        return Ok(());
    }
    let gib = |b: f64| b / (1u64 << 30) as f64;
    println!("bourse bench capacity — memory measured as growth of resident memory (RSS)");
    println!(
        "  {} accounts, {} positions, {} resting orders over {} instruments, built in {:.1} s",
        common::count(args.accounts as u64),
        common::count(positions),
        common::count(args.orders as u64),
        args.instruments,
        elapsed.as_secs_f64()
    );
    println!(
        "  per account:        {per_account:>8.0} bytes   (4,000,000 accounts, SPECTRA: {:.2} GiB)",
        gib(per_account * 4e6)
    );
    println!(
        "  per position:       {per_position:>8.0} bytes   (100,000,000 positions, LTP: {:.2} GiB)",
        gib(per_position * 1e8)
    );
    println!(
        "  per resting order:  {per_order:>8.0} bytes   (1,000,000 orders: {:.2} GiB)",
        gib(per_order * 1e6)
    );
    println!(
        "  resident in all: {:.2} GiB; snapshot {:.1} MiB written in {} ms",
        gib(rss_orders as f64),
        snapshot.len() as f64 / (1 << 20) as f64,
        snapshot_ms
    );
    Ok(())
}
