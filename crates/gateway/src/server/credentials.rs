//! Passwords of sessions whose configuration holds a `password_hash`, checked off the event
//! loop.
//!
//! An Argon2id check costs tens of milliseconds by design; run on the loop, every Logon with a
//! known CompID and any password would stall every session for that long. So the loop hands
//! the check to one thread of its own (`bourse-gw-auth`) through a bounded queue
//! ([`CHECKS_PENDING_MAX`]; past it the Logon is refused at once as busy) and parks the
//! connection, still a stranger under the admission rules (quota, deadline), until the answer
//! comes back through the loop's waker. Bytes the client sends meanwhile are kept, at most
//! [`BYTES_WHILE_CHECKING_MAX`]. A wrong or missing password is answered (FIX: Logout with a
//! Text; binary: EstablishmentReject `BadCredentials`), counted as `bad_password` and logged.
//!
//! Once any session has a password, a stranger must not learn which CompIDs exist: a Logon
//! for an unknown session, or from an address its session does not allow, gets the answer a
//! wrong password gets, after the same work (a check against a decoy hash of the venue's own
//! cost). Only the operator's log and counters say what really happened. A known session's
//! refusal is numbered 1, as a stranger's is, and a `tls_required` session reached over plain
//! TCP is refused as a stranger is, so neither the number nor the text tells them apart.
//!
//! A FIX Logon may change its session's password (NewPassword, 925): the same thread checks
//! the old one, hashes the new one at the old hash's cost and writes it to the password store
//! (`crate::password_store`) before the Logon is accepted. Without a store, or when the store
//! cannot be written, the Logon is refused saying why, only after the old password was right.

use super::*;
use crate::password_store::{PasswordStore, SessionNames};
use bourse_auth::PasswordHashString;
use bourse_wire::order_entry::codec::establishment_reject_code::EstablishmentRejectCode;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};

/// Password checks queued or running at once; more Logons are refused as busy.
pub(super) const CHECKS_PENDING_MAX: usize = 32;
/// Bytes a connection may send after its Logon (Establish) while its password is checked.
pub(super) const BYTES_WHILE_CHECKING_MAX: usize = 64 * 1024;

struct Job {
    token: Token,
    hash: PasswordHashString,
    password: String,
    /// A password change asked for with the Logon: the session and the new password.
    change: Option<(SessionNames, String)>,
}

struct Done {
    token: Token,
    ok: bool,
    /// When a change was asked for and the password was right: the new hash, written to the
    /// store, or why it was not.
    changed: Option<Result<PasswordHashString, String>>,
}

/// Why a NewPassword is refused when the gateway has no password store.
const PASSWORDS_READ_ONLY: &str =
    "NewPassword (925) not applied: this venue's passwords are read-only (set by its operator)";

/// The checking thread's work: one check, and a change when asked for and the password is
/// right.
fn check(job: Job, store: &mut Option<PasswordStore>) -> Done {
    let ok = job.hash.verify(&job.password).is_ok();
    let changed = match job.change {
        Some((names, new_password)) if ok => Some(change(store, &job.hash, &names, &new_password)),
        _ => None,
    };
    Done {
        token: job.token,
        ok,
        changed,
    }
}

fn change(
    store: &mut Option<PasswordStore>,
    old: &PasswordHashString,
    names: &SessionNames,
    new_password: &str,
) -> Result<PasswordHashString, String> {
    let Some(store) = store.as_mut() else {
        return Err(PASSWORDS_READ_ONLY.into());
    };
    // The new hash costs what the operator chose for the old one.
    let hash = bourse_auth::hash_password_with(new_password, old.cost())
        .map_err(|e| format!("NewPassword (925) not applied: {e}"))?;
    store
        .set(names, hash.clone())
        .map_err(|e| format!("NewPassword (925) not applied: the password store failed ({e})"))?;
    Ok(hash)
}

/// What a parked connection was doing when its check started.
pub(super) enum Parked {
    /// A FIX Logon for session `slot`; `bytes` are the Logon and everything after it.
    Fix { slot: usize, bytes: Vec<u8> },
    /// A binary Establish for session `slot`.
    Binary {
        slot: usize,
        timestamp_ns: u64,
        keepalive_ms: u32,
    },
    /// A Logon or Establish refused whatever its password, checked against the decoy only so
    /// that its answer comes as late as a wrong password's.
    Stranger(Stranger),
}

/// Who a refused stranger claimed to be, for its answer and the operator's log.
pub(super) struct Stranger {
    /// The answer: a FIX Logout to these CompIDs, or a binary EstablishmentReject.
    pub(super) answer: StrangerAnswer,
    /// What really happened (the counter and the log line).
    pub(super) reason: DisconnectReason,
    pub(super) detail: String,
}

pub(super) enum StrangerAnswer {
    Fix { sender: String, target: String },
    Binary { timestamp_ns: u64 },
}

/// The checking thread and the connections waiting for it.
#[derive(Default)]
pub(super) struct Checks {
    worker: Option<(SyncSender<Job>, Receiver<Done>)>,
    pub(super) parked: HashMap<Token, Parked>,
    /// A configured session's hash: checking a stranger's password against it costs what a
    /// real check costs. Its result is never used. None: no session has a password.
    decoy: Option<PasswordHashString>,
}

impl Checks {
    /// Starts the checking thread when some session has a password; none: no thread.
    pub(super) fn start(
        config: &GatewayConfig,
        waker: Arc<Waker>,
        mut store: Option<PasswordStore>,
    ) -> Result<Checks, String> {
        let decoy = config
            .fix_sessions
            .iter()
            .find_map(|s| s.password_hash.clone())
            .or_else(|| {
                config
                    .binary_sessions
                    .iter()
                    .find_map(|s| s.password_hash.clone())
            });
        if decoy.is_none() {
            return Ok(Checks::default());
        }
        let (jobs, job_rx) = sync_channel::<Job>(CHECKS_PENDING_MAX);
        let (done_tx, done) = std::sync::mpsc::channel::<Done>();
        std::thread::Builder::new()
            .name("bourse-gw-auth".into())
            .spawn(move || {
                // Ends when the loop drops its sender (the gateway stopped).
                while let Ok(job) = job_rx.recv() {
                    if done_tx.send(check(job, &mut store)).is_err() {
                        return;
                    }
                    let _ = waker.wake();
                }
            })
            .map_err(|e| format!("cannot start the password checker: {e}"))?;
        Ok(Checks {
            worker: Some((jobs, done)),
            parked: HashMap::new(),
            decoy,
        })
    }

    /// Whether strangers are answered as wrong passwords are (some session has a password).
    pub(super) fn hides_sessions(&self) -> bool {
        self.decoy.is_some()
    }

    /// Queues a check of `password` against `hash` for `token`, parked as `parked`; hands
    /// `parked` back when the queue is full.
    fn submit(
        &mut self,
        token: Token,
        hash: &PasswordHashString,
        password: &str,
        change: Option<(SessionNames, String)>,
        parked: Parked,
    ) -> Result<(), Parked> {
        let Some((jobs, _)) = &self.worker else {
            return Err(parked);
        };
        let job = Job {
            token,
            hash: hash.clone(),
            password: password.to_string(),
            change,
        };
        match jobs.try_send(job) {
            Ok(()) => {
                self.parked.insert(token, parked);
                Ok(())
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(parked),
        }
    }

    fn try_done(&self) -> Option<Done> {
        self.worker
            .as_ref()
            .and_then(|(_, done)| done.try_recv().ok())
    }

    pub(super) fn is_parked(&self, token: Token) -> bool {
        self.parked.contains_key(&token)
    }
}

/// How a FIX Logon's credentials stand before any hash is computed.
pub(super) enum FixPassword {
    /// The session asks for none.
    NotRequired,
    /// To be checked; with the new password when the Logon asks for a change (925).
    Given {
        password: String,
        new_password: Option<String>,
    },
    /// Refused at once, with the Logout's text.
    Refused(DisconnectReason, &'static str),
}

pub(super) fn fix_password(raw: &RawMessage<'_>, required: bool) -> FixPassword {
    let new_password = raw.get_str(bourse_fix::tags::NEW_PASSWORD);
    if !required {
        if new_password.is_some() {
            return FixPassword::Refused(
                DisconnectReason::LogonRefused,
                "NewPassword (925) not applied: this session has no password to change",
            );
        }
        return FixPassword::NotRequired;
    }
    match raw.get_str(bourse_fix::tags::PASSWORD) {
        Some(p) if !p.is_empty() => FixPassword::Given {
            password: p.to_string(),
            new_password: new_password.map(str::to_string),
        },
        _ => FixPassword::Refused(
            DisconnectReason::BadPassword,
            "Password (554) required for this session",
        ),
    }
}

const FIX_WRONG_PASSWORD: &str = "Invalid password";
const CHECKS_BUSY: &str = "Too many logons being checked; try again";

impl Server {
    /// Refuses a stranger's FIX Logon (unknown CompIDs, or an address its session does not
    /// allow) as a wrong or missing password would be, when some session has a password;
    /// otherwise closes it without a word, as a FIX acceptor does. `reason` and `detail` are
    /// what the operator's counter and log say.
    pub(super) fn refuse_fix_stranger(
        &mut self,
        token: Token,
        raw: &RawMessage<'_>,
        reason: DisconnectReason,
        detail: String,
    ) {
        if !self.checks.hides_sessions() {
            return self.close_because(token, reason, detail);
        }
        let stranger = Stranger {
            answer: StrangerAnswer::Fix {
                sender: raw
                    .get_str(bourse_fix::tags::SENDER_COMP_ID)
                    .unwrap_or("")
                    .into(),
                target: raw
                    .get_str(bourse_fix::tags::TARGET_COMP_ID)
                    .unwrap_or("")
                    .into(),
            },
            reason,
            detail,
        };
        match fix_password(raw, true) {
            FixPassword::Given { password, .. } => self.check_stranger(token, &password, stranger),
            FixPassword::Refused(_, text) => self.answer_stranger(token, stranger, text),
            FixPassword::NotRequired => unreachable!("a password is asked of strangers"),
        }
    }

    /// Refuses a stranger's binary Establish as a wrong password would be (see
    /// [`Server::refuse_fix_stranger`]); without passwords in use, at once with the refusal's
    /// own code.
    pub(super) fn refuse_binary_stranger(
        &mut self,
        token: Token,
        timestamp_ns: u64,
        password: &[u8; 32],
        (reason, plain_code): (DisconnectReason, EstablishmentRejectCode),
        detail: String,
    ) {
        if !self.checks.hides_sessions() {
            let detail = format!("{detail}: EstablishmentReject {plain_code:?}");
            return self.binary_reject(token, timestamp_ns, plain_code, reason, &detail);
        }
        let given = bourse_wire::ascii_field(password).unwrap_or("");
        let stranger = Stranger {
            answer: StrangerAnswer::Binary { timestamp_ns },
            reason,
            detail,
        };
        if given.is_empty() {
            return self.answer_stranger(token, stranger, FIX_WRONG_PASSWORD);
        }
        let given = given.to_string();
        self.check_stranger(token, &given, stranger);
    }

    /// Parks a stranger behind a decoy check; a full queue answers it as busy, as it would a
    /// session.
    fn check_stranger(&mut self, token: Token, password: &str, stranger: Stranger) {
        let Some(decoy) = self.checks.decoy.clone() else {
            return self.answer_stranger(token, stranger, FIX_WRONG_PASSWORD);
        };
        if let Err(parked) =
            self.checks
                .submit(token, &decoy, password, None, Parked::Stranger(stranger))
        {
            let Parked::Stranger(stranger) = parked else {
                unreachable!("submit hands back what it was given")
            };
            self.answer_stranger(token, stranger, CHECKS_BUSY);
        }
    }

    /// Answers a stranger as a refused session is answered (FIX: a Logout with `text` from the
    /// CompIDs it named, reversed; binary: BadCredentials) and closes it, counted and logged
    /// as what it really was.
    fn answer_stranger(&mut self, token: Token, stranger: Stranger, text: &str) {
        let Stranger {
            answer,
            reason,
            detail,
        } = stranger;
        match answer {
            StrangerAnswer::Fix { sender, target } => {
                let bytes = self.fix_logout_bytes(&target, &sender, 1, text);
                self.send_and_close(token, bytes, reason, format!("{detail}: {text}"));
            }
            StrangerAnswer::Binary { timestamp_ns } => {
                let code = if text == CHECKS_BUSY {
                    EstablishmentRejectCode::ServerUnavailable
                } else {
                    EstablishmentRejectCode::BadCredentials
                };
                self.binary_reject(token, timestamp_ns, code, reason, &detail);
            }
        }
    }

    /// A FIX Logout with `text`, from `sender` to `target`, numbered `seq`.
    fn fix_logout_bytes(&self, sender: &str, target: &str, seq: u64, text: &str) -> Vec<u8> {
        let mut logout = OutMessage::new("5");
        logout.push(bourse_fix::tags::TEXT, text);
        logout.set_header(bourse_fix::tags::SENDER_COMP_ID, sender);
        logout.set_header(bourse_fix::tags::TARGET_COMP_ID, target);
        logout.set_header_display(bourse_fix::tags::MSG_SEQ_NUM, &seq);
        logout.set_header_display(
            bourse_fix::tags::SENDING_TIME,
            &bourse_fix::time::UtcTimestamp(self.now_ms as i64),
        );
        logout.encode("FIX.4.4")
    }

    /// Queues `bytes` for `token` and closes it once they are written.
    fn send_and_close(
        &mut self,
        token: Token,
        bytes: Vec<u8>,
        reason: DisconnectReason,
        detail: String,
    ) {
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.out.extend_from_slice(&bytes);
            conn.closing = true;
            conn.close_reason = reason;
            conn.close_detail = Some(detail);
            self.dirty.push(token);
        }
    }

    /// A FIX Logon for `slot` passed the CompID, address and in-use checks: checks its
    /// password, now (none required), later (parked), or refuses it.
    pub(super) fn fix_logon_credentials(
        &mut self,
        token: Token,
        slot: usize,
        password: FixPassword,
        all: Vec<u8>,
    ) {
        match password {
            FixPassword::NotRequired => self.fix_logon_accepted(token, slot, all),
            FixPassword::Refused(reason, text) => self.refuse_fix_logon(token, slot, reason, text),
            FixPassword::Given {
                password,
                new_password,
            } => {
                let session = &self.config.fix_sessions[slot];
                let Some(hash) = session.password_hash.clone() else {
                    return;
                };
                let names = (
                    session.client_comp_id.clone(),
                    session.gateway_comp_id.clone(),
                );
                let change = new_password.map(|p| (names, p));
                let parked = Parked::Fix { slot, bytes: all };
                if self
                    .checks
                    .submit(token, &hash, &password, change, parked)
                    .is_err()
                {
                    self.refuse_fix_logon(token, slot, DisconnectReason::LogonRefused, CHECKS_BUSY);
                }
            }
        }
    }

    /// The Logon for `slot` is accepted: the connection becomes the session and the session
    /// layer reads the Logon (and anything after it) from `bytes`.
    pub(super) fn fix_logon_accepted(&mut self, token: Token, slot: usize, bytes: Vec<u8>) {
        if self.fix[slot].conn.is_some() {
            let names = format!("SenderCompID {:?}", self.fix[slot].client_comp_id);
            return self.close_because(token, DisconnectReason::SessionInUse, names);
        }
        self.attach(token, slot);
        self.fix[slot].conn = Some(token);
        self.fix[slot].session.on_connect(self.now_ms as i64);
        self.fix_feed(slot, &bytes);
    }

    /// Answers a refused Logon with a Logout saying why, then closes the connection. The
    /// Logout is built here, not by the session layer: a stranger must not move the
    /// session's sequence numbers or reach its store. It is numbered 1, as a stranger's
    /// refusal is: the session's real next number would tell a prober the session exists
    /// (and how busy it is). A refused Logon starts no session, so the number binds nothing.
    pub(super) fn refuse_fix_logon(
        &mut self,
        token: Token,
        slot: usize,
        reason: DisconnectReason,
        text: &str,
    ) {
        let s = &self.fix[slot];
        let bytes = self.fix_logout_bytes(&s.gateway_comp_id, &s.client_comp_id, 1, text);
        let detail = format!("SenderCompID {:?}: {text}", s.client_comp_id);
        self.send_and_close(token, bytes, reason, detail);
    }

    /// A binary Establish for `slot` passed the other checks: checks its password (none
    /// required: established at once).
    pub(super) fn binary_establish_credentials(
        &mut self,
        token: Token,
        slot: usize,
        timestamp_ns: u64,
        keepalive_ms: u32,
        password: [u8; 32],
    ) {
        let Some(hash) = self.config.binary_sessions[slot].password_hash.clone() else {
            return self.binary_accept(token, slot, timestamp_ns, keepalive_ms);
        };
        let given = bourse_wire::ascii_field(&password).unwrap_or("");
        if given.is_empty() {
            return self.binary_reject(
                token,
                timestamp_ns,
                EstablishmentRejectCode::BadCredentials,
                DisconnectReason::BadPassword,
                "no password (Establish version 2's password field)",
            );
        }
        let parked = Parked::Binary {
            slot,
            timestamp_ns,
            keepalive_ms,
        };
        if self
            .checks
            .submit(token, &hash, given, None, parked)
            .is_err()
        {
            self.binary_reject(
                token,
                timestamp_ns,
                EstablishmentRejectCode::ServerUnavailable,
                DisconnectReason::LogonRefused,
                CHECKS_BUSY,
            );
        }
    }

    /// Takes the answers of finished checks and lets each parked connection on or out.
    pub(super) fn finish_checks(&mut self) {
        while let Some(done) = self.checks.try_done() {
            let Some(parked) = self.checks.parked.remove(&done.token) else {
                continue;
            };
            let token = done.token;
            let Some(conn) = self.conns.get_mut(&token) else {
                continue;
            };
            if conn.closing {
                continue;
            }
            let later = std::mem::take(&mut conn.inbuf);
            match parked {
                Parked::Stranger(stranger) => {
                    self.answer_stranger(token, stranger, FIX_WRONG_PASSWORD)
                }
                Parked::Fix { slot, mut bytes } => match (done.ok, done.changed) {
                    (true, Some(Err(why))) => {
                        let reason = DisconnectReason::LogonRefused;
                        self.refuse_fix_logon(token, slot, reason, &why);
                    }
                    (true, changed) => {
                        if let Some(Ok(hash)) = changed {
                            self.config.fix_sessions[slot].password_hash = Some(hash);
                            let who = &self.fix[slot].client_comp_id;
                            eprintln!("gateway: session {who} changed its password (NewPassword)");
                        }
                        bytes.extend_from_slice(&later);
                        self.fix_logon_accepted(token, slot, bytes);
                    }
                    (false, _) => self.refuse_fix_logon(
                        token,
                        slot,
                        DisconnectReason::BadPassword,
                        FIX_WRONG_PASSWORD,
                    ),
                },
                Parked::Binary {
                    slot,
                    timestamp_ns,
                    keepalive_ms,
                } => {
                    if done.ok && self.bin[slot].conn.is_none() {
                        self.binary_accept(token, slot, timestamp_ns, keepalive_ms);
                        self.on_binary_bytes(token, &later);
                    } else if done.ok {
                        self.binary_reject(
                            token,
                            timestamp_ns,
                            EstablishmentRejectCode::AlreadyEstablished,
                            DisconnectReason::SessionInUse,
                            "EstablishmentReject AlreadyEstablished",
                        );
                    } else {
                        self.binary_reject(
                            token,
                            timestamp_ns,
                            EstablishmentRejectCode::BadCredentials,
                            DisconnectReason::BadPassword,
                            "wrong password",
                        );
                    }
                }
            }
        }
    }

    /// Keeps bytes a parked connection sends while its password is checked; too many close
    /// it as oversized.
    pub(super) fn hold_while_checking(&mut self, token: Token, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if conn.inbuf.len() + bytes.len() > BYTES_WHILE_CHECKING_MAX {
            self.checks.parked.remove(&token);
            return self.close_because(
                token,
                DisconnectReason::Oversized,
                format!(
                    "more than {BYTES_WHILE_CHECKING_MAX} bytes while its password was checked"
                ),
            );
        }
        conn.inbuf.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logon(fields: &str) -> Vec<u8> {
        let body = format!("35=A\x0149=ALPHA\x0156=BOURSE\x0134=1\x0152=20260101-00:00:00\x0198=0\x01108=30\x01{fields}");
        let mut m = format!("8=FIX.4.4\x019={}\x01{body}", body.len()).into_bytes();
        let sum: u32 = m.iter().map(|&b| u32::from(b)).sum();
        m.extend_from_slice(format!("10={:03}\x01", sum % 256).as_bytes());
        m
    }

    fn judge(fields: &str, required: bool) -> String {
        let bytes = logon(fields);
        let raw = bourse_fix::decode(&bytes, None, 8192).unwrap();
        match fix_password(&raw, required) {
            FixPassword::NotRequired => "not required".into(),
            FixPassword::Given {
                password,
                new_password,
            } => format!("given {password} {new_password:?}"),
            FixPassword::Refused(r, _) => format!("refused {}", r.name()),
        }
    }

    #[test]
    fn a_logon_password_is_judged_before_any_hash_is_computed() {
        assert_eq!(judge("", false), "not required");
        assert_eq!(judge("554=x\x01", false), "not required");
        assert_eq!(judge("554=pw\x01", true), "given pw None");
        assert_eq!(judge("", true), "refused bad_password");
        assert_eq!(
            judge("554=pw\x01925=new\x01", true),
            "given pw Some(\"new\")"
        );
        // A change without the old password is refused as a missing password is.
        assert_eq!(judge("925=new\x01", true), "refused bad_password");
        assert_eq!(judge("925=new\x01", false), "refused logon_refused");
    }
}
