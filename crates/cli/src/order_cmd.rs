//! `bourse order`: order entry for a person at a terminal, over FIX 4.4 to `bourse gateway`.
//!
//! Every command logs on with a durable session store (`--store`), so sequence numbers carry
//! on from one command to the next and reports sent while no command ran arrive at the next
//! logon. The execution reports a command sees are also kept in `orders.tsv` in the store
//! directory (cancel and replace take an order's symbol and side from there). `list` asks the
//! gateway for the session's live orders (OrderMassStatusRequest, 35=AF) and shows its answer;
//! `status` asks for one order (OrderStatusRequest, 35=H).

use anyhow::{anyhow, bail, Context, Result};
use bourse_client::{FixClient, FixClientConfig, FixMessage};
use clap::{Args, Subcommand};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct OrderArgs {
    /// The gateway's FIX address.
    #[arg(long, default_value = "127.0.0.1:9878")]
    fix: SocketAddr,
    /// Our CompID (a `client_comp_id` of the gateway's config).
    #[arg(long)]
    sender: String,
    /// The gateway's CompID.
    #[arg(long, default_value = "BOURSE")]
    target: String,
    /// Session store and order list directory.
    #[arg(long, default_value = ".bourse-order")]
    store: PathBuf,
    /// How long to wait for the answers to a request.
    #[arg(long, default_value_t = 2000)]
    wait_ms: u64,
    /// A file whose first line is the session's password (Logon's Password, 554), for a
    /// session with a `password_hash`; read from a file so it stays off the command line.
    #[arg(long)]
    password_file: Option<PathBuf>,
    /// A file whose first line is a new password for the session: sent on Logon as
    /// NewPassword (925) with --password-file's, the gateway changes the session's password
    /// before it accepts the Logon (or refuses it, saying why).
    #[arg(long, requires = "password_file")]
    new_password_file: Option<PathBuf>,
    /// Connect over TLS, trusting the authorities of this PEM file (--fix then names the
    /// gateway's `fix_tls_listen`).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// The name the gateway's certificate must carry, with --tls-ca.
    #[arg(long, default_value = "localhost", requires = "tls_ca")]
    tls_name: String,
    #[command(subcommand)]
    command: OrderCommand,
}

#[derive(Subcommand)]
pub enum OrderCommand {
    /// Send a new order (a limit order with --price, a market order without).
    Send {
        #[arg(long)]
        symbol: String,
        /// buy or sell
        #[arg(long)]
        side: String,
        /// Quantity in units (a multiple of the instrument's lot).
        #[arg(long)]
        qty: i64,
        /// Limit price as a decimal ("101.25").
        #[arg(long)]
        price: Option<String>,
        /// day, gtc, ioc or fok
        #[arg(long, default_value = "day")]
        tif: String,
        #[arg(long)]
        account: Option<u32>,
        /// Client order id; default: derived from the clock.
        #[arg(long)]
        cl_ord_id: Option<String>,
    },
    /// Cancel an order by its client order id.
    Cancel {
        #[arg(long)]
        orig: String,
    },
    /// Change an order's price and/or quantity.
    Replace {
        #[arg(long)]
        orig: String,
        #[arg(long)]
        qty: Option<i64>,
        #[arg(long)]
        price: Option<String>,
    },
    /// Cancel every order of the session (or of one symbol).
    MassCancel {
        #[arg(long)]
        symbol: Option<String>,
    },
    /// Show the session's live orders as the gateway has them (and, with --all, the done
    /// orders this terminal saw).
    List {
        /// Include orders that are done (filled, cancelled, rejected), from this terminal's
        /// record.
        #[arg(long)]
        all: bool,
    },
    /// Ask the gateway for one order's status.
    Status {
        #[arg(long)]
        cl_ord_id: String,
    },
    /// Print execution reports as they arrive.
    Watch {
        /// Stop after this many seconds (default: run until killed).
        #[arg(long)]
        seconds: Option<u64>,
    },
}

/// What this terminal knows about one order.
#[derive(Clone, Debug, Default)]
struct Known {
    symbol: String,
    side: String,
    qty: String,
    price: String,
    status: String,
    leaves: String,
    cum: String,
    order_id: String,
}

fn load(path: &Path) -> BTreeMap<String, Known> {
    let mut map = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return map;
    };
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() == 9 {
            map.insert(
                f[0].to_string(),
                Known {
                    symbol: f[1].into(),
                    side: f[2].into(),
                    qty: f[3].into(),
                    price: f[4].into(),
                    status: f[5].into(),
                    leaves: f[6].into(),
                    cum: f[7].into(),
                    order_id: f[8].into(),
                },
            );
        }
    }
    map
}

fn save(path: &Path, map: &BTreeMap<String, Known>) -> Result<()> {
    let mut text = String::new();
    for (id, k) in map {
        text.push_str(&format!(
            "{id}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            k.symbol, k.side, k.qty, k.price, k.status, k.leaves, k.cum, k.order_id
        ));
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn field(m: &FixMessage, tag: u32) -> &str {
    FixClient::field(m, tag as bourse_fix::Tag).unwrap_or("")
}

fn status_name(code: &str) -> &'static str {
    match code {
        "0" => "new",
        "1" => "partially-filled",
        "2" => "filled",
        "4" => "cancelled",
        "8" => "rejected",
        "A" => "pending-new",
        "C" => "expired",
        _ => "?",
    }
}

fn live(status: &str) -> bool {
    matches!(status, "new" | "partially-filled" | "pending-new")
}

fn row(id: &str, k: &Known) {
    println!(
        "{:<20} {:<8} {:<5} {:>10} {:>10} {:<17} {:>10} {:>10} {:>10}",
        id, k.symbol, k.side, k.qty, k.price, k.status, k.leaves, k.cum, k.order_id
    );
}

/// Prints a report and records what it says about the order.
fn absorb(m: &FixMessage, orders: &mut BTreeMap<String, Known>) {
    match m.msg_type.as_str() {
        "8" => {
            let exec_type = field(m, 150);
            let cl = field(m, 11).to_string();
            let orig = field(m, 41).to_string();
            let status = status_name(field(m, 39));
            let mut line = format!(
                "exec {:<9} {} {} {} {} @ {} leaves {} cum {} order {}",
                match exec_type {
                    "I" => "status",
                    "0" => "new",
                    "F" => "trade",
                    "4" => "cancelled",
                    "5" => "replaced",
                    "8" => "rejected",
                    "C" => "expired",
                    _ => "?",
                },
                cl,
                field(m, 55),
                if field(m, 54) == "1" { "buy" } else { "sell" },
                field(m, 38),
                field(m, 44),
                field(m, 151),
                field(m, 14),
                field(m, 37)
            );
            if exec_type == "F" {
                line.push_str(&format!(" last {} @ {}", field(m, 32), field(m, 31)));
            }
            // A status answer says what the order is (also for one no longer live).
            if exec_type == "I" && field(m, 39) != "8" {
                line.push_str(&format!(" is {status}"));
            }
            if !field(m, 58).is_empty() {
                line.push_str(&format!(" ({})", field(m, 58)));
            }
            println!("{line}");
            // A status report about no order (unknown, or no open orders) records nothing.
            if exec_type == "I" && field(m, 39) == "8" {
                return;
            }
            // A cancel's report names the cancel request; the order is the OrigClOrdID.
            let key = match exec_type {
                "4" if !orig.is_empty() => orig.clone(),
                "5" => {
                    orders.remove(&orig);
                    cl.clone()
                }
                _ => cl.clone(),
            };
            let k = orders.entry(key).or_default();
            k.symbol = field(m, 55).into();
            k.side = if field(m, 54) == "1" {
                "buy".into()
            } else {
                "sell".into()
            };
            k.qty = field(m, 38).into();
            k.price = field(m, 44).into();
            k.status = status.into();
            k.leaves = field(m, 151).into();
            k.cum = field(m, 14).into();
            k.order_id = field(m, 37).into();
        }
        "9" => println!(
            "cancel/replace of {} refused: {}",
            field(m, 41),
            field(m, 58)
        ),
        "r" => println!(
            "mass cancel {}: {} orders{}",
            field(m, 11),
            field(m, 533),
            if field(m, 531) == "0" {
                format!(" refused: {}", field(m, 58))
            } else {
                String::new()
            }
        ),
        "j" => println!("request refused: {}", field(m, 58)),
        other => println!("message {other}"),
    }
}

/// A password file's first line (passwords stay off the command line).
fn first_line(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the password file {}", path.display()))?;
    let password = text.lines().next().unwrap_or("");
    if password.is_empty() {
        bail!("the password file {} is empty", path.display());
    }
    Ok(password.to_string())
}

pub fn run(args: OrderArgs) -> Result<()> {
    std::fs::create_dir_all(&args.store)
        .with_context(|| format!("cannot create {}", args.store.display()))?;
    let orders_path = args.store.join("orders.tsv");
    let mut orders = load(&orders_path);
    let mut cfg = FixClientConfig::new(args.fix, &args.sender, &args.target);
    cfg.store_dir = Some(args.store.join("session"));
    cfg.password = args.password_file.as_deref().map(first_line).transpose()?;
    cfg.new_password = args
        .new_password_file
        .as_deref()
        .map(first_line)
        .transpose()?;
    if let Some(ca) = &args.tls_ca {
        let tls =
            bourse_client::TlsClient::from_ca_file(ca, &args.tls_name).map_err(|e| anyhow!(e))?;
        cfg.tls = Some(tls);
    }
    let mut client =
        FixClient::connect(&cfg).with_context(|| format!("cannot log on to {}", args.fix))?;
    let wait = Duration::from_millis(args.wait_ms);
    let stamp = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    };
    let mut watch_until = Some(Instant::now() + wait);
    let list = match args.command {
        OrderCommand::List { all } => Some(all),
        _ => None,
    };
    match args.command {
        OrderCommand::Send {
            symbol,
            side,
            qty,
            price,
            tif,
            account,
            cl_ord_id,
        } => {
            let buy = match side.as_str() {
                "buy" | "b" => true,
                "sell" | "s" => false,
                _ => bail!("--side must be buy or sell"),
            };
            let tif = match tif.as_str() {
                "day" => '0',
                "gtc" => '1',
                "ioc" => '3',
                "fok" => '4',
                _ => bail!("--tif must be day, gtc, ioc or fok"),
            };
            let id = cl_ord_id.unwrap_or_else(|| format!("o{}", stamp()));
            client.new_order(&id, account, &symbol, buy, qty, price.as_deref(), tif)?;
            println!("sent {id}");
        }
        OrderCommand::Cancel { orig } => {
            let k = orders
                .get(&orig)
                .ok_or_else(|| anyhow!("order {orig} is not in this terminal's list"))?;
            let id = format!("c{}", stamp());
            client.cancel(&id, &orig, &k.symbol, k.side == "buy")?;
        }
        OrderCommand::Replace { orig, qty, price } => {
            let k = orders
                .get(&orig)
                .ok_or_else(|| anyhow!("order {orig} is not in this terminal's list"))?
                .clone();
            let qty = match qty {
                Some(q) => q,
                None => k
                    .qty
                    .parse()
                    .context("the order's quantity is unknown: give --qty")?,
            };
            let price = price.unwrap_or(k.price.clone());
            let id = format!("r{}", stamp());
            client.replace(&id, &orig, &k.symbol, k.side == "buy", qty, &price)?;
            println!("replace {orig} -> {id}");
        }
        OrderCommand::MassCancel { symbol } => {
            client.mass_cancel(&format!("m{}", stamp()), symbol.as_deref())?;
        }
        OrderCommand::List { .. } => {}
        OrderCommand::Status { ref cl_ord_id } => {
            let k = orders.get(cl_ord_id).cloned().unwrap_or_default();
            let side = match k.side.as_str() {
                "buy" => Some(true),
                "sell" => Some(false),
                _ => None,
            };
            let symbol = (!k.symbol.is_empty()).then_some(k.symbol.as_str());
            client.order_status(cl_ord_id, symbol, side, None)?;
        }
        OrderCommand::Watch { seconds } => {
            watch_until = seconds.map(|s| Instant::now() + Duration::from_secs(s));
        }
    }
    // Read until the wait is over (or forever for watch without --seconds).
    loop {
        if let Some(t) = watch_until {
            if Instant::now() >= t {
                break;
            }
        }
        match client.recv(Duration::from_millis(200))? {
            Some(m) => {
                absorb(&m, &mut orders);
                save(&orders_path, &orders)?;
            }
            None if !client.is_logged_on() => bail!("the gateway closed the session"),
            None => {}
        }
    }
    if let Some(all) = list {
        // The gateway's answer is what is live; it also corrects this terminal's record.
        let answers = client
            .live_orders(
                &format!("l{}", stamp()),
                None,
                wait.max(Duration::from_secs(2)),
            )
            .context("the gateway did not answer the order status request")?;
        let mut live_ids = Vec::new();
        for m in &answers {
            absorb(m, &mut orders);
            live_ids.push(field(m, 11).to_string());
        }
        // Orders this terminal thought live that the gateway no longer has ended while no
        // command ran to see their last report (or the gateway restarted).
        for (id, k) in orders.iter_mut() {
            if live(&k.status) && !live_ids.contains(id) {
                k.status = "done (unknown)".into();
            }
        }
        println!(
            "{:<20} {:<8} {:<5} {:>10} {:>10} {:<17} {:>10} {:>10} {:>10}",
            "cl_ord_id", "symbol", "side", "qty", "price", "status", "leaves", "cum", "order_id"
        );
        for id in &live_ids {
            if let Some(k) = orders.get(id) {
                row(id, k);
            }
        }
        if all {
            for (id, k) in &orders {
                if !live_ids.contains(id) {
                    row(id, k);
                }
            }
        }
    }
    save(&orders_path, &orders)?;
    client.logout(Duration::from_secs(2))?;
    Ok(())
}
