//! `bourse auth hash-password`: the salted Argon2id hash of a password, as the configs store it
//! (`password_hash` of a FIX or binary session, an operator's entry). The password is read from
//! standard input, never from the command line, where other users could read it in the process
//! list and shells keep it in their history.

use anyhow::{bail, Context, Result};
use bourse_auth::HashCost;
use clap::{Args, Subcommand};
use std::io::Read;

#[derive(Subcommand)]
pub enum AuthCommand {
    /// Read a password from standard input (its first line; a trailing newline is not part of
    /// it) and print its salted Argon2id hash as a PHC string for a config's `password_hash`.
    HashPassword(HashPasswordArgs),
}

#[derive(Args)]
pub struct HashPasswordArgs {
    /// Argon2id memory cost in KiB (default: OWASP's 19 MiB).
    #[arg(long, default_value_t = HashCost::DEFAULT.memory_kib)]
    memory_kib: u32,
    /// Argon2id passes.
    #[arg(long, default_value_t = HashCost::DEFAULT.iterations)]
    iterations: u32,
    /// Argon2id lanes.
    #[arg(long, default_value_t = HashCost::DEFAULT.lanes)]
    lanes: u32,
}

pub fn run(command: AuthCommand) -> Result<()> {
    match command {
        AuthCommand::HashPassword(args) => hash_password(&args),
    }
}

fn hash_password(args: &HashPasswordArgs) -> Result<()> {
    let mut input = Vec::new();
    // One byte past the longest password and its line end is enough to tell "too long".
    let limit = (bourse_auth::PASSWORD_BYTES_MAX + 3) as u64;
    std::io::stdin()
        .take(limit)
        .read_to_end(&mut input)
        .context("reading the password from standard input")?;
    let text = String::from_utf8(input).context("the password is not UTF-8")?;
    let password = first_line(&text);
    if password.len() < text.trim_end_matches(['\r', '\n']).len() {
        bail!("standard input holds more than one line: give the password alone");
    }
    let cost = HashCost {
        memory_kib: args.memory_kib,
        iterations: args.iterations,
        lanes: args.lanes,
    };
    let hash = bourse_auth::hash_password_with(password, cost)?;
    println!("{hash}");
    Ok(())
}

/// The first line without its line end.
fn first_line(text: &str) -> &str {
    let line = text.split('\n').next().unwrap_or("");
    line.strip_suffix('\r').unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::first_line;

    #[test]
    fn the_line_end_is_not_part_of_the_password() {
        assert_eq!(first_line("pw\n"), "pw");
        assert_eq!(first_line("pw\r\n"), "pw");
        assert_eq!(first_line("pw"), "pw");
        assert_eq!(first_line(" p w \n"), " p w ");
    }
}
