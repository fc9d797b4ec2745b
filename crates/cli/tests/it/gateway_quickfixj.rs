//! QuickFIX/J 2.3.2 initiators against `bourse gateway`: the Maven project in
//! `tests/quickfixj` (built here; the first build downloads from Maven Central, later ones run
//! offline) drives two sessions through logon, a trade between them, replace, cancel, mass
//! cancel, an insufficient-collateral reject, a forced sequence gap (resend + gap fill),
//! HeartBtInt=1 with a TestRequest, and logout / restart from the persistent store with no
//! execution report missing or duplicated. See `Scenario.java` for each check.

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Java scenario must finish within this.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(180);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Builds the Java peer; returns its class path.
fn build_peer(project: &Path) -> String {
    let build = |offline: bool| {
        let mut cmd = Command::new("mvn");
        cmd.current_dir(project).arg("-q").arg("-B");
        if offline {
            cmd.arg("-o");
        }
        cmd.args([
            "-DskipTests",
            "package",
            "dependency:build-classpath",
            "-Dmdep.outputFile=target/classpath.txt",
        ]);
        cmd.status().is_ok_and(|s| s.success())
    };
    // Offline first (the cache from an earlier run); online only when something is missing.
    assert!(
        build(true) || build(false),
        "mvn could not build tests/quickfixj"
    );
    let deps =
        std::fs::read_to_string(project.join("target/classpath.txt")).expect("classpath.txt");
    format!(
        "{}:{}",
        project.join("target/classes").display(),
        deps.trim()
    )
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn quickfixj_initiators_trade_through_the_gateway() {
    run_scenario(None);
}

/// The same scenario over the gateway's TLS listener, every Logon with a password: QuickFIX/J
/// trusts the test's own certificate (rcgen, imported into a PKCS#12 trust store by keytool).
#[test]
fn quickfixj_initiators_trade_over_tls_with_passwords() {
    run_scenario(Some("qfj pass"));
}

/// Runs `Scenario.java` against `bourse gateway`; with a password, over TLS only, the
/// sessions' `password_hash` set and `tls_required`.
fn run_scenario(tls_password: Option<&str>) {
    assert!(
        have("java", "-version") && have("mvn", "-v"),
        "this test needs Java 17+ and Maven on PATH (Debian: apt-get install -y openjdk-17-jdk-headless maven)"
    );
    let project = repo_root().join("tests/quickfixj");
    let classpath = build_peer(&project);
    let dir = tempfile::tempdir().unwrap();
    let port = bourse_testkit::free_port();
    let (listen, session_extra, java_extra) = match tls_password {
        None => (
            format!("fix_listen = \"127.0.0.1:{port}\""),
            String::new(),
            Vec::new(),
        ),
        Some(password) => tls_setup(dir.path(), port, password),
    };
    let config = format!(
        r#"
[gateway]
{listen}
store_dir = "{store}"
throttle_msgs_per_s = 1000

[[instruments]]
instrument = 1
symbol = "SBER"
market = "equity"
price_scale = 2
tick = 1
lot_size = 1
band_bps = 2000
reference_price = 10000

[[accounts]]
account = 1
firm = 1
cash = 1000000000000
may_short = true

[[accounts]]
account = 2
firm = 2
cash = 1000000000000
may_short = true

[[fix_sessions]]
client_comp_id = "QA"
firm = 1
accounts = [1]
{session_extra}

[[fix_sessions]]
client_comp_id = "QB"
firm = 2
accounts = [2]
{session_extra}
"#,
        store = dir.path().join("gateway-store").display()
    );
    let config_path = dir.path().join("gateway.toml");
    std::fs::File::create(&config_path)
        .unwrap()
        .write_all(config.as_bytes())
        .unwrap();
    let gateway = Killed(
        Command::new(env!("CARGO_BIN_EXE_bourse"))
            .args(["gateway", "--config"])
            .arg(&config_path)
            .args(["--orders-max", "100000"])
            .stdout(Stdio::null())
            .spawn()
            .expect("start bourse gateway"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the gateway did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = dir.path().join("quickfixj.log");
    let mut peer = Killed(
        Command::new("java")
            .arg("-cp")
            .arg(&classpath)
            .arg("bourse.qfj.Scenario")
            .arg("127.0.0.1")
            .arg(port.to_string())
            .arg(dir.path().join("qfj-store"))
            .args(&java_extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start java"),
    );
    let deadline = Instant::now() + SCENARIO_TIMEOUT;
    let status = loop {
        if let Some(status) = peer.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the QuickFIX/J scenario did not finish in time"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = String::new();
    use std::io::Read;
    peer.0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    println!("{out}");
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: String = log_text
        .lines()
        .rev()
        .take(40)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        status.success() && out.contains("ALL OK"),
        "scenario failed:\n{out}\n--- log tail ---\n{tail}"
    );
    drop(gateway);
}

/// For the TLS run: a certificate and key for the gateway, a trust store holding the
/// certificate for QuickFIX/J, the `[gateway]` lines, the sessions' lines and Scenario's
/// extra arguments.
fn tls_setup(dir: &Path, port: u16, password: &str) -> (String, String, Vec<String>) {
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.join("gateway.crt");
    let key = dir.join("gateway.key");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    let trust = dir.join("trust.p12");
    let imported = Command::new("keytool")
        .args([
            "-importcert",
            "-noprompt",
            "-alias",
            "gateway",
            "-storetype",
            "PKCS12",
        ])
        .args(["-storepass", "changeit", "-file"])
        .arg(&cert)
        .arg("-keystore")
        .arg(&trust)
        .stdout(Stdio::null())
        .status()
        .expect("keytool (comes with the JDK)");
    assert!(imported.success(), "keytool could not make the trust store");
    let hash = bourse_auth::hash_password_with(password, bourse_auth::HashCost::TEST_ONLY).unwrap();
    let listen = format!(
        "fix_tls_listen = \"127.0.0.1:{port}\"\ntls_cert_path = \"{}\"\ntls_key_path = \"{}\"",
        cert.display(),
        key.display()
    );
    let session = format!("password_hash = \"{hash}\"\ntls_required = true");
    let args = vec![trust.display().to_string(), password.to_string()];
    (listen, session, args)
}
