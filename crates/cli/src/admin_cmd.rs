//! `bourse admin ...`: an operator's commands against a running venue's admin API
//! (`docs/admin.md`). Each prints the API's JSON answer and exits non-zero unless the action
//! applied. The operator's password comes from `BOURSE_ADMIN_PASSWORD`, never from the
//! command line (other users could read it in the process list). Every action carries a
//! request id (`--request-id`, or one made from the time and the process id): sending the
//! same command again with the same id is answered from the first run, not applied twice.

use anyhow::{anyhow, bail, Context, Result};
use bourse_admin::AdminClient;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Args)]
pub struct AdminArgs {
    /// The admin API's address, as `bourse demo` prints it.
    #[arg(
        long,
        env = "BOURSE_ADMIN_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    url: String,
    /// For an https URL: the authority (PEM) that signed the admin API's certificate.
    #[arg(long, env = "BOURSE_ADMIN_CA")]
    ca: Option<PathBuf>,
    /// The operator's name (the password is read from BOURSE_ADMIN_PASSWORD).
    #[arg(long, env = "BOURSE_ADMIN_USER", default_value = "admin")]
    user: String,
    /// The request's id; the same id again is answered from the first run.
    #[arg(long)]
    request_id: Option<String>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Run the admin API as a process of its own, in front of separate `bourse node`
    /// processes (`docs/admin.md`); runs until interrupted.
    Serve {
        /// The service's config (TOML: listen, credentials_path, audit_log_path, [[cores]],
        /// optional [schedule]).
        #[arg(long)]
        config: PathBuf,
    },
    /// Every market's instruments with their phase, and the kill switches engaged.
    Instruments,
    /// One account's balances, positions and live orders in every market.
    Account { account: u32 },
    /// One instrument's order-level book (bids then asks, best first, then time), as the
    /// leader of its market's core holds it.
    Book { instrument: u32 },
    /// Add an instrument to a market; the definition as JSON (`docs/engine-jsonl.md`,
    /// `add_instrument` without `cmd` and `ts_ns`).
    AddInstrument {
        #[arg(long)]
        market: String,
        /// The instrument as a JSON object, or @FILE.
        #[arg(long)]
        json: String,
    },
    /// Add one account (to every market unless --market names some), with cash in each.
    AddAccount {
        #[arg(long)]
        account: u32,
        #[arg(long)]
        firm: u32,
        /// Cash per market, in units of 10^-4.
        #[arg(long, default_value_t = 0)]
        cash: i128,
        #[arg(long)]
        may_short: bool,
        #[arg(long)]
        market: Vec<String>,
    },
    /// Add accounts in bulk from an NDJSON file (one account object per line).
    AddAccounts {
        #[arg(long)]
        file: PathBuf,
    },
    /// Add cash to an account in one market (units of 10^-4).
    Deposit(CashArgs),
    /// Take cash from an account in one market.
    Withdraw(CashArgs),
    /// Set an account's cash in one market to the collateral allocated there.
    SetCollateral(CashArgs),
    /// Open a margin call on an account in one market: AMOUNT (units of 10^-4) is the cash
    /// it must add, 0 closes the call; until then its orders that add exposure are refused.
    MarginCall {
        account: u32,
        amount: i128,
        #[arg(long)]
        market: String,
    },
    /// Halt trading (of an instrument, a market, or the whole venue).
    Halt(PhaseArgs),
    /// Resume trading (phase open).
    Resume(PhaseArgs),
    /// Pause trading as a scheduled pause does (phase paused).
    Pause(PhaseArgs),
    /// Close trading for the day (phase closed).
    Close(PhaseArgs),
    /// Engage a kill switch: cancel every order of the firm or account in every core and
    /// refuse its new orders until released.
    Kill(TargetArgs),
    /// Release a kill switch.
    Release(TargetArgs),
    /// End the trading day (of one market, or every market).
    EndOfDay {
        #[arg(long)]
        market: Option<String>,
    },
}

#[derive(Args)]
pub struct CashArgs {
    #[arg(long)]
    market: String,
    #[arg(long)]
    account: u32,
    #[arg(long)]
    amount: i128,
}

#[derive(Args)]
pub struct PhaseArgs {
    #[arg(long, conflicts_with = "market")]
    instrument: Option<u32>,
    #[arg(long)]
    market: Option<String>,
}

#[derive(Args)]
pub struct TargetArgs {
    #[arg(long, conflicts_with = "account", required_unless_present = "account")]
    firm: Option<u32>,
    #[arg(long)]
    account: Option<u32>,
}

fn phase(action_phase: &str, a: &PhaseArgs) -> Value {
    let mut v = json!({ "action": "set_phase", "phase": action_phase });
    if let Some(i) = a.instrument {
        v["instrument"] = json!(i);
    }
    if let Some(m) = &a.market {
        v["market"] = json!(m);
    }
    v
}

fn cash(action: &str, a: &CashArgs) -> Value {
    json!({ "action": action, "market": a.market, "account": a.account, "amount": a.amount })
}

fn kill(engaged: bool, a: &TargetArgs) -> Value {
    let mut v = json!({ "action": "kill_switch", "engaged": engaged });
    if let Some(f) = a.firm {
        v["firm"] = json!(f);
    }
    if let Some(acc) = a.account {
        v["account"] = json!(acc);
    }
    v
}

pub fn run(args: AdminArgs) -> Result<()> {
    // The service needs no operator's password: it checks the operators'.
    if let AdminCommand::Serve { config } = &args.command {
        return crate::admin_serve::serve(config);
    }
    let password = std::env::var("BOURSE_ADMIN_PASSWORD")
        .context("set BOURSE_ADMIN_PASSWORD to the operator's password")?;
    let mut client = AdminClient::new(&args.url)
        .map_err(|e| anyhow!(e))?
        .with_credentials(&args.user, &password);
    if let Some(ca) = &args.ca {
        client = client.with_ca_file(ca).map_err(|e| anyhow!("--ca: {e}"))?;
    }
    let request_id = args.request_id.clone().unwrap_or_else(|| {
        let ns = bourse_admin::service::unix_ns();
        format!("cli-{}-{ns}", std::process::id())
    });
    let action = match &args.command {
        AdminCommand::Serve { config } => return crate::admin_serve::serve(config),
        AdminCommand::Instruments => return show(client.get("/v1/instruments")),
        AdminCommand::Account { account } => {
            return show(client.get(&format!("/v1/accounts/{account}")))
        }
        AdminCommand::Book { instrument } => {
            return show(client.get(&format!("/v1/instruments/{instrument}/book")))
        }
        AdminCommand::AddAccounts { file } => {
            let mut f =
                std::fs::File::open(file).with_context(|| format!("open {}", file.display()))?;
            let len = f.metadata()?.len();
            return show(client.bulk_accounts(&request_id, &mut f, len));
        }
        AdminCommand::AddInstrument { market, json: text } => {
            let text = match text.strip_prefix('@') {
                Some(path) => {
                    std::fs::read_to_string(path).with_context(|| format!("read {path}"))?
                }
                None => text.clone(),
            };
            let instrument: Value =
                serde_json::from_str(&text).context("the instrument is not JSON")?;
            json!({ "action": "add_instrument", "market": market, "instrument": instrument })
        }
        AdminCommand::AddAccount {
            account,
            firm,
            cash,
            may_short,
            market,
        } => {
            let mut v = json!({
                "action": "add_account", "account": account, "firm": firm,
                "cash": cash, "may_short": may_short,
            });
            if !market.is_empty() {
                v["markets"] = json!(market);
            }
            v
        }
        AdminCommand::Deposit(a) => cash("deposit", a),
        AdminCommand::Withdraw(a) => cash("withdraw", a),
        AdminCommand::SetCollateral(a) => cash("set_collateral", a),
        AdminCommand::MarginCall {
            account,
            amount,
            market,
        } => json!({
            "action": "margin_call", "market": market, "account": account, "amount": amount,
        }),
        AdminCommand::Halt(a) => phase("halted", a),
        AdminCommand::Resume(a) => phase("open", a),
        AdminCommand::Pause(a) => phase("paused", a),
        AdminCommand::Close(a) => phase("closed", a),
        AdminCommand::Kill(a) => kill(true, a),
        AdminCommand::Release(a) => kill(false, a),
        AdminCommand::EndOfDay { market } => match market {
            Some(m) => json!({ "action": "end_of_day", "market": m }),
            None => json!({ "action": "end_of_day" }),
        },
    };
    eprintln!("request id: {request_id}");
    show(client.action(&request_id, &action))
}

fn show(reply: Result<bourse_admin::client::Reply, String>) -> Result<()> {
    let reply = reply.map_err(|e| anyhow!(e))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&reply.body).unwrap_or_default()
    );
    if reply.status != 200 {
        bail!(
            "the admin API answered {} ({})",
            reply.status,
            reply.body["outcome"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}
