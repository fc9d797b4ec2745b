//! The dashboard's admin panel: what operators did through the admin API.
//!
//! The admin service (`bourse_admin`) counts every request it answers on the registry (by
//! action and outcome), every request refused before it ran (by reason), and every refusal a
//! core gave an admin command (by reject reason), under the names in [`crate::names`]; and it
//! hands each audited request to [`AdminFeed::record`], which keeps the newest
//! [`ADMIN_RECENT_MAX`]. Once per tick [`AdminFeed::panel`] turns both into the frame's
//! `admin` part: actions per second by kind, outcomes, refusals by reason, and the last
//! audit entries (who, when, what, outcome). A process without an admin API has no panel.

use crate::metrics::Registry;
use crate::names;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// Audit entries the dashboard keeps and shows, newest first.
pub const ADMIN_RECENT_MAX: usize = 20;

/// One audited admin request as the dashboard shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AdminEntry {
    /// When the answer was given, Unix nanoseconds.
    pub ts_ns: u64,
    pub operator: String,
    pub request_id: String,
    pub action: String,
    /// `applied`, `rejected`, `invalid`, `unavailable`, `refused`, `conflict`, `ok`.
    pub outcome: String,
    /// The HTTP status answered.
    pub status: u16,
}

/// One row of the panel: a name, its rate over the last interval and its total.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdminRow {
    pub name: String,
    pub per_s: f64,
    pub total: u64,
}

/// The frame's admin part.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdminPanel {
    /// Requests answered by action (every outcome).
    pub actions: Vec<AdminRow>,
    /// Requests answered by outcome.
    pub outcomes: Vec<AdminRow>,
    /// Refusals by reason: before the request ran (`unauthenticated`, `unauthorised`), by the
    /// service (`invalid`, `conflict`, `unavailable`), and by a core (its reject reason).
    pub refusals: Vec<AdminRow>,
    /// The newest audit entries, newest first.
    pub recent: Vec<AdminEntry>,
}

/// Outcomes of answered requests that count as refusals by the service itself.
const SERVICE_REFUSALS: [&str; 3] = ["invalid", "conflict", "unavailable"];

#[derive(Default)]
struct FeedState {
    recent: VecDeque<AdminEntry>,
    /// Totals at the previous panel, by row key, for the rates.
    previous: BTreeMap<String, u64>,
}

/// The newest audit entries and the previous totals; see the module documentation.
#[derive(Default)]
pub struct AdminFeed {
    state: Mutex<FeedState>,
}

impl AdminFeed {
    /// Keeps `entry` as the newest, forgetting the oldest past [`ADMIN_RECENT_MAX`].
    pub fn record(&self, entry: AdminEntry) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.recent.len() >= ADMIN_RECENT_MAX {
            s.recent.pop_front();
        }
        s.recent.push_back(entry);
    }

    /// The panel for the interval of `interval_s` seconds now ending (0: the first, whose
    /// rates are 0); `None` while no admin request was counted or recorded.
    pub fn panel(&self, registry: &Registry, interval_s: f64) -> Option<AdminPanel> {
        let mut actions: BTreeMap<String, u64> = BTreeMap::new();
        let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
        let mut refusals: BTreeMap<String, u64> = BTreeMap::new();
        let requests = registry.counter_series(names::ADMIN_REQUESTS_TOTAL);
        for (labels, n) in &requests {
            let action = label(labels, "action");
            let outcome = label(labels, "outcome");
            *actions.entry(action.to_string()).or_default() += n;
            *outcomes.entry(outcome.to_string()).or_default() += n;
            if SERVICE_REFUSALS.contains(&outcome) {
                *refusals.entry(outcome.to_string()).or_default() += n;
            }
        }
        let refused = registry.counter_series(names::ADMIN_AUTH_REFUSED_TOTAL);
        let rejects = registry.counter_series(names::ADMIN_REJECTS_TOTAL);
        for (labels, n) in refused.iter().chain(&rejects) {
            *refusals
                .entry(label(labels, "reason").to_string())
                .or_default() += n;
        }
        let Ok(mut s) = self.state.lock() else {
            return None;
        };
        if requests.is_empty() && refused.is_empty() && rejects.is_empty() && s.recent.is_empty() {
            return None;
        }
        let mut rows = |kind: &str, totals: BTreeMap<String, u64>| -> Vec<AdminRow> {
            totals
                .into_iter()
                .map(|(name, total)| {
                    let key = format!("{kind}/{name}");
                    let before = s.previous.insert(key, total).unwrap_or(total);
                    let per_s = if interval_s > 0.0 {
                        total.saturating_sub(before) as f64 / interval_s
                    } else {
                        0.0
                    };
                    AdminRow { name, per_s, total }
                })
                .collect()
        };
        let actions = rows("action", actions);
        let outcomes = rows("outcome", outcomes);
        let refusals = rows("refusal", refusals);
        Some(AdminPanel {
            actions,
            outcomes,
            refusals,
            recent: s.recent.iter().rev().cloned().collect(),
        })
    }
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> &'a str {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map_or("", |(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64) -> AdminEntry {
        AdminEntry {
            ts_ns: n,
            operator: "alice".into(),
            request_id: format!("r{n}"),
            action: "deposit".into(),
            outcome: "applied".into(),
            status: 200,
        }
    }

    #[test]
    fn no_panel_until_an_admin_request_is_counted_or_recorded() {
        let r = Registry::new();
        let feed = AdminFeed::default();
        assert_eq!(feed.panel(&r, 1.0), None);
        feed.record(entry(1));
        assert_eq!(feed.panel(&r, 1.0).unwrap().recent, vec![entry(1)]);
    }

    #[test]
    fn the_panel_keeps_the_newest_entries_first_and_rates_by_action_outcome_and_refusal() {
        let r = Registry::new();
        let feed = AdminFeed::default();
        for n in 0..(ADMIN_RECENT_MAX as u64 + 5) {
            feed.record(entry(n));
        }
        let request = |action, outcome| {
            r.counter(
                names::ADMIN_REQUESTS_TOTAL,
                "",
                &[("action", action), ("outcome", outcome)],
            )
        };
        request("deposit", "applied").add(4);
        request("deposit", "invalid").add(1);
        request("kill_switch", "rejected").add(2);
        r.counter(
            names::ADMIN_AUTH_REFUSED_TOTAL,
            "",
            &[("reason", "unauthenticated")],
        )
        .add(3);
        r.counter(
            names::ADMIN_REJECTS_TOTAL,
            "",
            &[("reason", "unknown_account")],
        )
        .add(2);
        let first = feed.panel(&r, 0.0).unwrap();
        let recent: Vec<u64> = first.recent.iter().map(|e| e.ts_ns).collect();
        let newest = ADMIN_RECENT_MAX as u64 + 4;
        assert_eq!(recent, (5..=newest).rev().collect::<Vec<_>>());
        let totals = |rows: &[AdminRow]| -> Vec<(String, u64)> {
            rows.iter().map(|x| (x.name.clone(), x.total)).collect()
        };
        assert_eq!(
            totals(&first.actions),
            vec![("deposit".into(), 5), ("kill_switch".into(), 2)]
        );
        assert_eq!(
            totals(&first.outcomes),
            vec![
                ("applied".into(), 4),
                ("invalid".into(), 1),
                ("rejected".into(), 2)
            ]
        );
        assert_eq!(
            totals(&first.refusals),
            vec![
                ("invalid".into(), 1),
                ("unauthenticated".into(), 3),
                ("unknown_account".into(), 2)
            ]
        );
        assert!(first.actions.iter().all(|x| x.per_s == 0.0));
        // Over a 2 s interval, 6 more deposits are 3 per second; the others stood still.
        request("deposit", "applied").add(6);
        let second = feed.panel(&r, 2.0).unwrap();
        let rate = |name: &str| {
            second
                .actions
                .iter()
                .find(|x| x.name == name)
                .unwrap()
                .per_s
        };
        assert_eq!(rate("deposit"), 3.0);
        assert_eq!(rate("kill_switch"), 0.0);
    }

    #[test]
    fn the_dashboard_frame_carries_the_admin_panel() {
        let m = crate::Monitor::new(crate::MonitorConfig::default());
        let frame: serde_json::Value = serde_json::from_str(&crate::dashboard::tick(&m)).unwrap();
        assert!(frame["admin"].is_null(), "no admin API, no panel: {frame}");
        m.registry()
            .counter(
                names::ADMIN_REQUESTS_TOTAL,
                "",
                &[("action", "deposit"), ("outcome", "applied")],
            )
            .inc();
        m.admin().record(entry(7));
        let frame: serde_json::Value = serde_json::from_str(&crate::dashboard::tick(&m)).unwrap();
        let admin = &frame["admin"];
        assert_eq!(admin["actions"][0]["name"], "deposit");
        assert_eq!(admin["actions"][0]["total"], 1);
        assert_eq!(admin["recent"][0]["operator"], "alice");
        assert_eq!(admin["recent"][0]["request_id"], "r7");
        assert_eq!(admin["recent"][0]["outcome"], "applied");
    }
}
