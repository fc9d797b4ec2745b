//! `bourse clearing run` against a three-node core: the run pays variation margin through the
//! sequenced path and writes its report; run again under the same id it resumes the saved
//! plan and applies nothing twice (the core's balances say so); the next run owes nothing
//! while no one trades. `bourse clearing serve` follows the same core, answers clearing data,
//! runs when `bourse clearing run --service` asks, and snapshots its state when stopped.

use std::net::SocketAddr;
use std::process::Command as Process;
use std::time::Duration;

use bourse_cluster::tokio;
use bourse_cluster::{Client, ClusterConfig, Node};
use bourse_core::*;
use bourse_engine::fixtures::{equity, future};

const BOURSE: &str = env!("CARGO_BIN_EXE_bourse");
const DEADLINE: Duration = Duration::from_secs(20);
const CASH_START: i128 = 1_000_000_0000;

async fn submit(client: &mut Client, body: CommandBody) -> Vec<Event> {
    client
        .submit_for_events(&Command::new(1_000, body), DEADLINE)
        .await
        .expect("applied")
        .1
}

fn order(account: u32, id: u64, side: Side, price: i64, qty: i64) -> CommandBody {
    CommandBody::NewOrder(NewOrder {
        firm: None,
        account: AccountId(account),
        cl_ord_id: ClOrdId(id),
        instrument: InstrumentId(1),
        side,
        ord_type: OrdType::Limit,
        price: Price(price),
        qty: Qty(qty),
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_qty: Qty(0),
    })
}

/// The balance as the core has it (a deposit of one unit answers with it).
async fn core_cash(client: &mut Client, account: u32) -> i128 {
    let deposit = CommandBody::Deposit {
        account: AccountId(account),
        amount: Cash(1),
    };
    match submit(client, deposit).await[..] {
        [Event::CashChanged { cash, .. }] => cash.0 - 1,
        ref other => panic!("a deposit answers with the balance: {other:?}"),
    }
}

fn clearing(args: &[&str]) -> String {
    let out = Process::new(BOURSE)
        .arg("clearing")
        .arg("run")
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "bourse clearing run {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

struct Venue {
    nodes: Vec<Node>,
    group: Vec<(u64, SocketAddr)>,
    node_list: String,
    instruments: std::path::PathBuf,
}

/// A three-node core where account 1 buys 4 at 99,000 from 2 and 2 at 100,200 from 3
/// (accounts of firms 1, 2, 3), and the instruments file clearing needs.
fn venue(rt: &tokio::runtime::Runtime, dir: &std::path::Path) -> Venue {
    let mut config = ClusterConfig::local(17, dir.join("nodes"), bourse_testkit::free_ports());
    config.fsync = bourse_cluster::FsyncSetting::Never;
    config.orders_max = 1024;
    config.accounts_max = 64;
    let nodes: Vec<Node> = rt.block_on(async {
        let mut nodes = Vec::new();
        for n in &config.nodes {
            nodes.push(Node::start(&config, n.id).await.unwrap());
        }
        nodes
    });
    let group: Vec<(u64, SocketAddr)> = config
        .nodes
        .iter()
        .map(|n| (n.id, n.addr.parse().unwrap()))
        .collect();
    let node_list = group
        .iter()
        .map(|n| n.1.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut trader = Client::new(group.clone(), 7, 1);
    rt.block_on(async {
        submit(
            &mut trader,
            CommandBody::AddInstrument(future(1, "FUT", 100_000)),
        )
        .await;
        for a in 1..=3 {
            let spec = AccountSpec {
                account: AccountId(a),
                firm: FirmId(a),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            };
            submit(&mut trader, CommandBody::AddAccount(spec)).await;
            let amount = Cash(CASH_START);
            submit(
                &mut trader,
                CommandBody::Deposit {
                    account: AccountId(a),
                    amount,
                },
            )
            .await;
        }
        // Account 1 buys 4 at 99,000 from 2 and 2 at 100,200 from 3.
        submit(&mut trader, order(2, 1, Side::Sell, 99_000, 4)).await;
        submit(&mut trader, order(1, 2, Side::Buy, 99_000, 4)).await;
        submit(&mut trader, order(3, 3, Side::Sell, 100_200, 2)).await;
        submit(&mut trader, order(1, 4, Side::Buy, 100_200, 2)).await;
    });
    let instruments = dir.join("instruments.json");
    std::fs::write(
        &instruments,
        serde_json::to_string(&[future(1, "FUT", 100_000)]).unwrap(),
    )
    .unwrap();
    Venue {
        nodes,
        group,
        node_list,
        instruments,
    }
}

#[test]
fn clearing_run_pays_margin_once_and_resumes_under_the_same_id() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let Venue {
        nodes,
        group,
        node_list,
        instruments,
    } = venue(&rt, dir.path());
    let runs = dir.path().join("runs");
    let out = dir.path().join("out");
    let common = [
        "--nodes",
        &node_list,
        "--instruments",
        instruments.to_str().unwrap(),
        "--dir",
        runs.to_str().unwrap(),
        "--last-trades",
        "1",
    ];
    let mut args = vec!["--intermediate", "--out", out.to_str().unwrap()];
    args.extend(common);
    let first = clearing(&args);
    // Account 3 sold at the settlement price: nothing to move.
    assert!(first.contains("movements 2 refused 0"), "{first}");
    assert!(runs.join("run-000001.json").exists());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["settlement_prices"]["1"], 100_200);
    let csv = std::fs::read_to_string(out.join("report.csv")).unwrap();
    assert_eq!(csv.lines().count(), 4, "a header and three accounts: {csv}");
    assert!(
        csv.contains("\n3,3,-2,0.0000,"),
        "account 3 holds -2: {csv}"
    );

    // Settled at 100,200: account 1 gains 1,200 × 4; 2 loses 1,200 × 4; 3 nothing.
    let expected = [(1, 4_800_0000i128), (2, -4_800_0000), (3, 0)];
    let check = |rt: &tokio::runtime::Runtime, checker: &mut Client, units: i128| {
        rt.block_on(async {
            for (a, vm) in expected {
                let cash = core_cash(checker, a).await;
                assert_eq!(cash, CASH_START + vm + units, "account {a}");
            }
        })
    };
    let mut checker = Client::new(group.clone(), 8, 1);
    check(&rt, &mut checker, 0);

    // The same run again (as after a crash): it resumes the saved plan, applies nothing.
    let mut again = vec!["--intermediate", "--run-id", "1"];
    again.extend(common);
    let resumed = clearing(&again);
    assert!(resumed.contains("resuming run 1"), "{resumed}");
    check(&rt, &mut checker, 1);

    // The next run: no trade since, nothing owed.
    let mut next = vec!["--end-of-day"];
    next.extend(common);
    let second = clearing(&next);
    assert!(second.contains("clearing run 2 (EndOfDay)"), "{second}");
    assert!(second.contains("movements 0"), "{second}");
    check(&rt, &mut checker, 2);

    rt.block_on(async {
        for n in nodes {
            n.shutdown().await;
        }
    });
}

#[test]
fn clearing_serve_runs_when_the_cli_asks_and_answers_clearing_data() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let v = venue(&rt, dir.path());
    let hash = bourse_auth::hash_password_with("op-pw", bourse_auth::HashCost::TEST_ONLY).unwrap();
    let listen = format!("127.0.0.1:{}", bourse_testkit::free_port());
    let fix_listen = format!("127.0.0.1:{}", bourse_testkit::free_port());
    let nodes: Vec<String> = v.group.iter().map(|n| format!("\"{}\"", n.1)).collect();
    let config = dir.path().join("clearing.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"cli\"\nlisten = \"{listen}\"\ncores = [[{}]]\ninstruments = \"instruments.json\"\n\
             state_dir = \"clearing\"\n[settlement]\nlast_trades = 1\n\
             [fix]\nlisten = \"{fix_listen}\"\n\
             [[operators]]\nname = \"op\"\npassword_hash = \"{}\"\nroles = [\"operator\"]\n",
            nodes.join(","),
            hash.as_str()
        ),
    )
    .unwrap();
    let mut serve = Process::new(BOURSE)
        .args(["clearing", "serve", "--config", config.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://{listen}");
    let admin = bourse_admin::AdminClient::new(&url)
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    // The service is up and has read the trades.
    wait_for_trades(&admin, 2);
    let out = run_intermediate(&url, "op-pw");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("clearing run 1 (Intermediate)"), "{text}");
    assert!(text.contains("movements 2 refused 0 pending 0"), "{text}");
    // A wrong password is refused, and says so.
    let refused = run_intermediate(&url, "wrong");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
    // No password at all: the service has operators, and the refusal says what to set.
    let bare = Process::new(BOURSE)
        .args([
            "clearing",
            "run",
            "--intermediate",
            "--service",
            &url,
            "--user",
            "op",
        ])
        .env_remove("BOURSE_CLEARING_PASSWORD")
        .output()
        .unwrap();
    assert!(!bare.status.success());
    let why = String::from_utf8_lossy(&bare.stderr).to_string();
    assert!(
        why.contains("401") && why.contains("BOURSE_CLEARING_PASSWORD"),
        "{why}"
    );
    // Clearing data: account 1 holds 6 lots and was paid 1,200 x 4 at 100,200.
    // (A node with credentials answers clearing data to them alone.)
    assert_eq!(admin.get("/v1/accounts/1").unwrap().status, 401);
    let account = admin
        .clone()
        .with_credentials("op", "op-pw")
        .get("/v1/accounts/1")
        .unwrap();
    assert_eq!(account.body["positions"][0]["qty"], 6, "{:?}", account.body);
    assert_eq!(account.body["variation_margin_paid"], "4800.0000");
    assert!(dir
        .path()
        .join("clearing/reports/run-000001/firm-1.csv")
        .exists());
    // The same over FIX: `bourse clearing positions` asks with RequestForPositions.
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let today = bourse_clearing::fix::business_date(now_ns, 0);
    let positions = Process::new(BOURSE)
        .args([
            "clearing",
            "positions",
            "--fix",
            &fix_listen,
            "--comp-id",
            "op",
            "--account",
            "1",
            "--date",
            &today,
        ])
        .env("BOURSE_CLEARING_PASSWORD", "op-pw")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&positions.stdout).to_string();
    assert!(
        positions.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&positions.stderr)
    );
    assert!(text.contains("TOT 6 0"), "{text}");
    assert!(text.contains("ITD"), "{text}");
    let refused = Process::new(BOURSE)
        .args([
            "clearing",
            "positions",
            "--fix",
            &fix_listen,
            "--comp-id",
            "op",
            "--account",
            "1",
            "--date",
            &today,
        ])
        .env("BOURSE_CLEARING_PASSWORD", "wrong")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(why.contains("invalid credentials"), "{why}");
    // Settlement dates: 1 buys 3 lots (30 shares) of an equity from 3 at 10.00; the next
    // run dates the obligations T+1 on the service's calendar (without a [schedule], Monday
    // to Friday in UTC), and `bourse clearing settlements` lists them on that day.
    let mut trader = Client::new(v.group.clone(), 8, 1);
    rt.block_on(async {
        submit(
            &mut trader,
            CommandBody::AddInstrument(equity(2, "EQ", 1_000)),
        )
        .await;
        let sell = CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(3),
            cl_ord_id: ClOrdId(10),
            instrument: InstrumentId(2),
            side: Side::Sell,
            ord_type: OrdType::Limit,
            price: Price(1_000),
            qty: Qty(3),
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        });
        submit(&mut trader, sell.clone()).await;
        let CommandBody::NewOrder(mut buy) = sell else {
            unreachable!()
        };
        buy.account = AccountId(1);
        buy.cl_ord_id = ClOrdId(11);
        buy.side = Side::Buy;
        let events = submit(&mut trader, CommandBody::NewOrder(buy)).await;
        assert!(events.iter().any(|e| matches!(e, Event::Trade { .. })));
    });
    let op = admin.clone().with_credentials("op", "op-pw");
    wait_for_trades(&op, 3);
    let out = run_intermediate(&url, "op-pw");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = op.get("/v1/runs/2/plan").unwrap().body;
    let trade_day =
        bourse_admin::schedule::day_of_date(plan["trade_date"].as_str().unwrap()).unwrap();
    let calendar = bourse_clearing::settlement::default_calendar();
    let t1 = bourse_admin::schedule::date_text(calendar.add_business_days(trade_day, 1));
    let dates: Vec<&str> = plan["obligations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["settlement_date"].as_str().unwrap())
        .collect();
    assert_eq!(dates, vec![t1.as_str(), t1.as_str()], "{plan}");
    let listed = Process::new(BOURSE)
        .args([
            "clearing",
            "settlements",
            "--service",
            &url,
            "--user",
            "op",
            "--date",
            &t1,
        ])
        .env("BOURSE_CLEARING_PASSWORD", "op-pw")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(
        listed.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(
        text.contains(&format!("settlement date {t1}: 2 lines")),
        "{text}"
    );
    assert!(
        text.contains("account 1 firm 1 EQ securities 30 cash -300.0000"),
        "{text}"
    );
    assert!(
        text.contains("account 3 firm 3 EQ securities -30 cash 300.0000"),
        "{text}"
    );
    // Stopped with SIGINT, it snapshots its state.
    let stopped = Process::new("kill")
        .args(["-INT", &serve.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    assert!(serve.wait().unwrap().success());
    let snapshots = std::fs::read_dir(dir.path().join("clearing/snapshots")).unwrap();
    assert!(snapshots
        .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
        .any(|name| name.ends_with(".snap")));
    rt.block_on(async {
        for n in v.nodes {
            n.shutdown().await;
        }
    });
}

/// Waits until the clearing service has read `trades` trades (a hang guard, not a timing).
fn wait_for_trades(client: &bourse_admin::AdminClient, trades: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !client
        .get("/v1/status")
        .is_ok_and(|r| r.body["trades"] == trades)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the service never read {trades} trades"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `bourse clearing run --intermediate` against the service at `url` as operator `op`.
fn run_intermediate(url: &str, password: &str) -> std::process::Output {
    Process::new(BOURSE)
        .args([
            "clearing",
            "run",
            "--intermediate",
            "--service",
            url,
            "--user",
            "op",
        ])
        .env("BOURSE_CLEARING_PASSWORD", password)
        .output()
        .unwrap()
}
