//! `bourse fix acceptor`: the FIX 4.4 session layer alone, with the echo application, for
//! conformance runs (the QuickFIX acceptance scripts) and for trying a FIX client against.

use anyhow::{bail, Context, Result};
use bourse_fix::{run_acceptor, AcceptorConfig};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args)]
pub struct AcceptorArgs {
    /// Answer application messages as QuickFIX's test server does (echo orders, reject the
    /// rest). Without it, every application message gets a BusinessMessageReject.
    #[arg(long)]
    echo: bool,
    /// Address to listen on; only loopback and addresses you own are sensible.
    #[arg(long, default_value = "127.0.0.1:9878")]
    listen: SocketAddr,
    #[arg(long, default_value = "ISLD")]
    sender_comp_id: String,
    #[arg(long, default_value = "TW")]
    target_comp_id: String,
    /// Directory of the durable session store (sequence numbers and sent messages).
    #[arg(long)]
    store: PathBuf,
    /// FIX 4.4 data dictionary in QuickFIX's XML format.
    #[arg(long)]
    dictionary: PathBuf,
    /// Reset sequence numbers when a connection drops, as the acceptance-test server does.
    /// Without it a restarted acceptor resumes the session from its store.
    #[arg(long)]
    reset_on_disconnect: bool,
    /// Print every message and session event to standard error.
    #[arg(long)]
    verbose: bool,
}

pub fn run(args: AcceptorArgs) -> Result<()> {
    if !args.dictionary.is_file() {
        bail!("dictionary {} is not a file", args.dictionary.display());
    }
    std::fs::create_dir_all(&args.store)
        .with_context(|| format!("cannot create the store directory {}", args.store.display()))?;
    let mut config = AcceptorConfig::new(
        args.listen,
        &args.sender_comp_id,
        &args.target_comp_id,
        args.store,
        args.dictionary,
    );
    config.echo = args.echo;
    config.reset_on_disconnect = args.reset_on_disconnect;
    config.verbose = args.verbose;
    eprintln!(
        "bourse fix acceptor: {} as {} for {} on {}{}",
        config.begin_string,
        config.sender_comp_id,
        config.target_comp_id,
        config.listen,
        if config.echo {
            ", echo application"
        } else {
            ""
        }
    );
    run_acceptor(config).context("the acceptor stopped")?;
    Ok(())
}
