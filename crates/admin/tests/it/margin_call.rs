//! The `margin_call` action: through the service it opens a margin call on an account in
//! one market (orders that add exposure are then refused `MarginCallOpen`), 0 closes it, and
//! a bad amount or market is refused by name before anything reaches the core.

use crate::common;

use bourse_admin::{Action, AdminService};
use bourse_core::*;
use common::{funded_engine, order, EngineVenue};
use std::sync::Arc;

fn margin_call(account: u32, amount: i128) -> Action {
    Action::MarginCall {
        market: "futures".into(),
        account: AccountId(account),
        amount: Cash(amount),
    }
}

#[tokio::test]
async fn a_margin_call_refuses_orders_that_add_exposure_until_it_is_closed() {
    let venue = Arc::new(EngineVenue::new(funded_engine()));
    let dir = tempfile::tempdir().unwrap();
    let service =
        Arc::new(AdminService::new(venue.clone(), &dir.path().join("audit.jsonl"), None).unwrap());

    let answer = service
        .run("alice", "call-1", margin_call(1, 5_000_0000))
        .await;
    assert_eq!(answer.outcome(), "applied", "{}", answer.body);
    assert!(
        matches!(
            venue.applied.lock().unwrap().last(),
            Some(CommandBody::MarginCall {
                account: AccountId(1),
                amount: Cash(5_000_0000)
            })
        ),
        "the call reached the core as one MarginCall command"
    );
    let refused = order(&mut venue.engine.lock().unwrap(), 1, 1, 99_000);
    assert!(
        matches!(
            refused[0],
            Event::OrderRejected {
                reason: RejectReason::MarginCallOpen,
                ..
            }
        ),
        "{refused:?}"
    );

    let answer = service
        .run("alice", "call-1-closed", margin_call(1, 0))
        .await;
    assert_eq!(answer.outcome(), "applied", "{}", answer.body);
    let accepted = order(&mut venue.engine.lock().unwrap(), 1, 2, 99_000);
    assert!(
        matches!(accepted[0], Event::OrderAccepted { .. }),
        "{accepted:?}"
    );

    // Refused by name, nothing submitted.
    let submitted = venue.applied.lock().unwrap().len();
    let answer = service.run("alice", "call-bad", margin_call(1, -5)).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.body.to_string().contains("amount"),
        "{}",
        answer.body
    );
    let unknown_market = Action::MarginCall {
        market: "fx".into(),
        account: AccountId(1),
        amount: Cash(1),
    };
    let answer = service.run("alice", "call-fx", unknown_market).await;
    assert!(
        answer.body.to_string().contains("no market"),
        "{}",
        answer.body
    );
    assert_eq!(venue.applied.lock().unwrap().len(), submitted);
}
