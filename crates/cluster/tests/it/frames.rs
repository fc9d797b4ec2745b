//! The node protocol's frames read as if from a hostile peer: arbitrary or mutated bytes never
//! panic the decoder, a frame over the limit is refused before it is read, an announced length
//! holds no memory until its bytes arrive, and well-formed frames decode to what was sent.

use bourse_cluster::net::{
    decode_message, encode_frame, read_frame_into, Request, Response, Tagged, FRAME_SIZE_BYTES_MAX,
};
use bourse_cluster::tokio;
use bourse_cluster::{Entry, LogId, Vote};
use openraft::raft::AppendEntriesRequest;
use proptest::prelude::*;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// Reads one frame from `bytes` into a fresh buffer.
fn read_one(bytes: &[u8]) -> (std::io::Result<bool>, Vec<u8>) {
    let mut reader = bytes;
    let mut body = Vec::new();
    let r = block_on(read_frame_into(&mut reader, &mut body));
    (r, body)
}

fn request(kind: u8, tag: u64, a: u64, b: u64, command: Vec<u8>) -> Tagged<Request> {
    let body = match kind % 9 {
        7 => {
            let prev = LogId::new_term_index(b % 1_000, a % 1_000_000);
            let entry = Entry {
                log_id: LogId::new_term_index(b % 1_000, a % 1_000_000 + 1),
                payload: openraft::EntryPayload::Blank,
            };
            Request::AppendStream(AppendEntriesRequest {
                vote: Vote::new_committed(b % 1_000, 1 + a % 3),
                prev_log_id: Some(prev),
                entries: if a.is_multiple_of(2) {
                    vec![entry]
                } else {
                    vec![]
                },
                leader_commit: Some(prev),
            })
        }
        0 => Request::Submit {
            client_id: a,
            request_seq: b,
            command,
        },
        5 => Request::SubmitAudited {
            client_id: a,
            request_seq: b,
            command,
            audit: bourse_cluster::Audit::new("operator-1", &format!("request-{tag}")).unwrap(),
        },
        1 => Request::Subscribe { from_index: a },
        2 => Request::LastSeq { client_id: a },
        3 => Request::Status,
        4 => Request::Instruments,
        6 => Request::Query(match a % 3 {
            0 => bourse_cluster::query::Query::Phases,
            1 => bourse_cluster::query::Query::Account { account: b as u32 },
            _ => bourse_cluster::query::Query::Book {
                instrument: b as u32,
            },
        }),
        _ => Request::StatusBrief,
    };
    Tagged { tag, body }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_either_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_message::<Tagged<Request>>(&bytes);
        let _ = decode_message::<Tagged<Response>>(&bytes);
        let (_, body) = read_one(&bytes);
        prop_assert!(body.len() <= bytes.len());
    }

    #[test]
    fn requests_come_back_as_sent_and_mutations_never_panic(
        kind in any::<u8>(),
        tag in any::<u64>(),
        a in any::<u64>(),
        b in any::<u64>(),
        command in proptest::collection::vec(any::<u8>(), 0..64),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let sent = request(kind, tag, a, b, command);
        let frame = encode_frame(&sent);
        let (r, body) = read_one(&frame);
        prop_assert!(r.unwrap());
        let got: Tagged<Request> = decode_message(&body).unwrap();
        prop_assert_eq!(format!("{got:?}"), format!("{sent:?}"));
        // The same frame with a few bytes changed: an error or some message, never a panic.
        let mut bad = frame.clone();
        for (at, x) in flips {
            let i = at % bad.len();
            bad[i] ^= x | 1;
        }
        let (r, body) = read_one(&bad);
        if let Ok(true) = r {
            let _ = decode_message::<Tagged<Request>>(&body);
        }
    }
}

#[test]
fn a_frame_over_the_limit_is_refused_before_its_body_is_read() {
    let mut bytes = (FRAME_SIZE_BYTES_MAX + 1).to_le_bytes().to_vec();
    bytes.extend_from_slice(&[0u8; 16]);
    let (r, body) = read_one(&bytes);
    let e = r.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("exceeds"), "{e}");
    assert!(body.is_empty());
}

#[test]
fn an_announced_length_holds_no_memory_until_its_bytes_arrive() {
    // A peer announces the largest frame and sends ten bytes, then closes.
    let mut bytes = FRAME_SIZE_BYTES_MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[7u8; 10]);
    let (r, body) = read_one(&bytes);
    assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
    assert_eq!(body.len(), 10);
    assert!(
        body.capacity() < 1 << 20,
        "{} bytes held for a frame that never came",
        body.capacity()
    );
}

#[test]
fn a_clean_end_between_frames_is_not_an_error() {
    let (r, _) = read_one(&[]);
    assert!(!r.unwrap());
}
