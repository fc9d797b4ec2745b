//! What an operator may ask of a running venue, as JSON: [`Action`] (one request to
//! `POST /v1/actions`) and [`NewAccount`] (one line of a bulk `POST /v1/accounts/bulk`).
//!
//! Every input refuses unknown fields, and [`Action::check`] refuses impossible values with a
//! message naming the field, before anything reaches a core. Which cores an action goes to
//! is decided in `service` from the venue's markets.

use bourse_core::*;
use serde::{Deserialize, Serialize};

/// The longest market name accepted in an action.
pub const MARKET_NAME_BYTES_MAX: usize = 64;
/// The most markets one account addition may name.
pub const MARKETS_PER_ACCOUNT_MAX: usize = 64;

/// One administrative action. Amounts are in cash units of 10^-4 (as in the engine's JSON
/// Lines: `1_000_0000` is 1,000.0000).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// Adds an instrument to one market's core.
    AddInstrument {
        market: String,
        instrument: Instrument,
    },
    /// Adds one account (to every market unless `markets` names some), with its cash.
    AddAccount(NewAccount),
    Deposit {
        market: String,
        account: AccountId,
        amount: Cash,
    },
    Withdraw {
        market: String,
        account: AccountId,
        amount: Cash,
    },
    SetCollateral {
        market: String,
        account: AccountId,
        amount: Cash,
    },
    /// Opens (or changes) a margin call on an account in one market: `amount` is the cash
    /// it must add; 0 closes the call. While one is open, the account's orders that would
    /// add to its exposure are refused (`MarginCallOpen`) and its deposits reduce the call.
    MarginCall {
        market: String,
        account: AccountId,
        amount: Cash,
    },
    /// The phase of one instrument (`instrument`), of every instrument of one market
    /// (`market`), or of the whole venue (neither).
    SetPhase {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        market: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instrument: Option<InstrumentId>,
        phase: Phase,
    },
    /// Engages or releases the kill switch of a firm or an account in every core.
    KillSwitch {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        firm: Option<FirmId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        account: Option<AccountId>,
        engaged: bool,
    },
    /// Ends the trading day of one market, or of every market.
    EndOfDay {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        market: Option<String>,
    },
}

/// One account to add: what `add_account` takes, and one line of a bulk addition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewAccount {
    pub account: AccountId,
    pub firm: FirmId,
    #[serde(default)]
    pub may_short: bool,
    #[serde(default)]
    pub stp: StpMode,
    #[serde(default)]
    pub stp_scope: StpScope,
    /// Cash deposited in each market's core where the account is new (0: none).
    #[serde(default)]
    pub cash: Cash,
    /// The markets to add it to; absent: every market.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markets: Option<Vec<String>>,
}

impl NewAccount {
    pub fn spec(&self) -> AccountSpec {
        AccountSpec {
            account: self.account,
            firm: self.firm,
            may_short: self.may_short,
            stp: self.stp,
            stp_scope: self.stp_scope,
        }
    }

    /// Checks the values the JSON form cannot: cash and market names.
    pub fn check(&self) -> Result<(), String> {
        if self.cash.0 < 0 || self.cash.0 > CASH_AMOUNT_MAX {
            return Err(format!(
                "cash: {} is outside 0..={CASH_AMOUNT_MAX}",
                self.cash.0
            ));
        }
        if let Some(markets) = &self.markets {
            if markets.is_empty() || markets.len() > MARKETS_PER_ACCOUNT_MAX {
                return Err(format!(
                    "markets: name 1 to {MARKETS_PER_ACCOUNT_MAX} markets, or leave it out for all"
                ));
            }
            for m in markets {
                check_market_name(m)?;
            }
        }
        Ok(())
    }
}

fn check_market_name(m: &str) -> Result<(), String> {
    if m.is_empty() || m.len() > MARKET_NAME_BYTES_MAX {
        return Err(format!(
            "market: a name of 1 to {MARKET_NAME_BYTES_MAX} bytes, not {m:?}"
        ));
    }
    Ok(())
}

fn check_amount(amount: Cash, zero_allowed: bool) -> Result<(), String> {
    let low = if zero_allowed { 0 } else { 1 };
    if amount.0 < low || amount.0 > CASH_AMOUNT_MAX {
        return Err(format!(
            "amount: {} is outside {low}..={CASH_AMOUNT_MAX}",
            amount.0
        ));
    }
    Ok(())
}

impl Action {
    /// The action's name, for the audit log and the metrics' label.
    pub fn name(&self) -> &'static str {
        match self {
            Action::AddInstrument { .. } => "add_instrument",
            Action::AddAccount(_) => "add_account",
            Action::Deposit { .. } => "deposit",
            Action::Withdraw { .. } => "withdraw",
            Action::SetCollateral { .. } => "set_collateral",
            Action::MarginCall { .. } => "margin_call",
            Action::SetPhase { .. } => "set_phase",
            Action::KillSwitch { .. } => "kill_switch",
            Action::EndOfDay { .. } => "end_of_day",
        }
    }

    /// Refuses what no core would accept, naming the field, before anything is submitted.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Action::AddInstrument { market, instrument } => {
                check_market_name(market)?;
                instrument
                    .validate()
                    .map_err(|why| format!("instrument: {why}"))
            }
            Action::AddAccount(a) => a.check(),
            Action::Deposit { market, amount, .. } | Action::Withdraw { market, amount, .. } => {
                check_market_name(market)?;
                check_amount(*amount, false)
            }
            Action::SetCollateral { market, amount, .. }
            | Action::MarginCall { market, amount, .. } => {
                check_market_name(market)?;
                check_amount(*amount, true)
            }
            Action::SetPhase {
                market, instrument, ..
            } => {
                if market.is_some() && instrument.is_some() {
                    return Err(
                        "set_phase: name an instrument, a market, or neither (the whole venue), not both"
                            .into(),
                    );
                }
                market.as_deref().map_or(Ok(()), check_market_name)
            }
            Action::KillSwitch { firm, account, .. } => {
                if firm.is_some() == account.is_some() {
                    return Err("kill_switch: name exactly one of firm and account".into());
                }
                Ok(())
            }
            Action::EndOfDay { market } => market.as_deref().map_or(Ok(()), check_market_name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_field_is_refused_with_its_name() {
        let e = serde_json::from_str::<Action>(
            r#"{"action":"deposit","market":"fx","account":1,"amount":5,"amout":6}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("amout"), "{e}");
        let e =
            serde_json::from_str::<NewAccount>(r#"{"account":1,"firm":2,"csh":5}"#).unwrap_err();
        assert!(e.to_string().contains("csh"), "{e}");
    }

    #[test]
    fn impossible_values_are_refused_naming_the_field() {
        let a = Action::KillSwitch {
            firm: None,
            account: None,
            engaged: true,
        };
        assert!(a.check().unwrap_err().contains("exactly one"));
        let a = Action::Withdraw {
            market: "fx".into(),
            account: AccountId(1),
            amount: Cash(0),
        };
        assert!(a.check().unwrap_err().starts_with("amount"));
        let a = Action::SetPhase {
            market: Some("fx".into()),
            instrument: Some(InstrumentId(1)),
            phase: Phase::Halted,
        };
        assert!(a.check().is_err());
        let n = NewAccount {
            account: AccountId(1),
            firm: FirmId(1),
            may_short: false,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
            cash: Cash(-1),
            markets: None,
        };
        assert!(n.check().unwrap_err().starts_with("cash"));
    }

    #[test]
    fn every_action_reads_back_what_it_writes() {
        let actions = [
            Action::SetPhase {
                market: None,
                instrument: Some(InstrumentId(3)),
                phase: Phase::Paused,
            },
            Action::KillSwitch {
                firm: Some(FirmId(7)),
                account: None,
                engaged: true,
            },
            Action::EndOfDay { market: None },
        ];
        for a in actions {
            let json = serde_json::to_string(&a).unwrap();
            assert_eq!(serde_json::from_str::<Action>(&json).unwrap(), a, "{json}");
        }
    }
}
