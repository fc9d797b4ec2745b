// Its own binary, outside tests/it: its #[global_allocator] would become every test's there.
//! A request's audit trailer costs the trading path nothing: reading the requests of a log
//! entry (what every replica does for every request it applies) allocates nothing, for
//! requests without a trailer and with one alike. A counting global allocator watches this
//! test's thread only.

use bourse_cluster::batch::BatchBuilder;
use bourse_cluster::{Audit, LogCommand};
use bourse_core::codec::encode_command;
use bourse_core::*;
use bourse_testkit::alloc::{count_allocations, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn new_order(k: u64) -> Command {
    Command::new(
        k,
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(1 + (k % 7) as u32),
            cl_ord_id: ClOrdId(k),
            instrument: InstrumentId(1),
            side: if k.is_multiple_of(2) {
                Side::Buy
            } else {
                Side::Sell
            },
            ord_type: OrdType::Limit,
            price: Price(10_000 + (k % 13) as i64),
            qty: Qty(1 + (k % 5) as i64),
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        }),
    )
}

#[test]
fn reading_an_entrys_requests_allocates_nothing_with_or_without_audit_trailers() {
    let audit = Audit::new("alice", "halt-sber-1").unwrap();
    let mut b = BatchBuilder::with_capacity(4_000);
    for k in 0..4_000u64 {
        let bytes = encode_command(&new_order(k));
        let trailer = k.is_multiple_of(500).then(|| audit.borrowed());
        b.push_encoded_audited(9, k + 1, &bytes, trailer).unwrap();
    }
    // As a replica gets it: the entry's bytes, framing checked once.
    let LogCommand::Batch(batch) = LogCommand::decode(b.finish().bytes()).unwrap() else {
        panic!("a batch")
    };

    let ((audited, bytes), allocations) = count_allocations(|| {
        let (mut audited, mut bytes) = (0u64, 0usize);
        for r in batch.requests() {
            bytes += std::hint::black_box(r.command).len();
            if let Some(a) = r.audit {
                audited += 1;
                bytes += a.operator.len() + a.request_id.len();
            }
        }
        (audited, bytes)
    });
    assert_eq!(audited, 8);
    assert!(bytes > 4_000);
    assert_eq!(allocations, 0, "allocations while reading the requests");
}
