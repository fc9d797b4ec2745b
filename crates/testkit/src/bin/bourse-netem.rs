//! A userspace netem for the namespace test bed (scripts/netbed.sh `impair`): this kernel has
//! no netem qdisc, so an iptables NFQUEUE rule in a host's namespace hands the packets it
//! matches to this program, which drops a share, holds the rest for a delay with jitter
//! (a share longer, so later packets pass them) and gives them back to the kernel.
//!
//!   bourse-netem --queue N --mark-bit B [--delay-us N] [--jitter-us N] [--loss-pct P]
//!                [--reorder-pct P] [--reorder-extra-us N] [--held-max N] [--seed N]
//!
//! A released packet gets mark bit B and is sent through the chain again (NF_REPEAT): the
//! rule that queued it skips packets with its bit, so the impairments of one host compose
//! (a fault's loss on top of a data centre's distance), each seeing a packet once.
//! Duplication is the kernel's (a TEE rule beside the queue rule), since a queued packet
//! cannot be cloned from here. At most `--held-max` packets are held; beyond that a packet is
//! dropped and counted apart from loss. SIGTERM or SIGINT ends it: everything held is
//! released at once, the queue unbound, and one line of counters printed to standard output.

use std::collections::BTreeSet;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

use bourse_testkit::netem::{Counters, Decision, Draws, Held, Impairment};
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;

/// The most packets `--held-max` may ask to hold (the slot index has 20 bits in [`Held`]).
const HELD_MAX_LIMIT: usize = 1 << 20;

struct Args {
    queue: u16,
    mark_bit: u32,
    link: Impairment,
    held_max: usize,
    seed: u64,
}

fn usage() -> ! {
    eprintln!(
        "usage: bourse-netem --queue N --mark-bit B [--delay-us N] [--jitter-us N] \
         [--loss-pct P] [--reorder-pct P] [--reorder-extra-us N] [--held-max N] [--seed N]"
    );
    std::process::exit(2)
}

fn parse_args() -> Result<Args, String> {
    let mut queue = None;
    let mut mark_bit = None;
    let mut link = Impairment {
        delay_us: 0,
        jitter_us: 0,
        loss_pct: 0.0,
        reorder_pct: 0.0,
        reorder_extra_us: 1_000,
    };
    let mut held_max = 10_000usize;
    let mut seed = std::process::id() as u64;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            usage();
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let int = |v: &str| -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("{flag} takes a whole number, got {v:?}"))
        };
        let pct = |v: &str| -> Result<f64, String> {
            v.parse()
                .map_err(|_| format!("{flag} takes a number of percent, got {v:?}"))
        };
        match flag.as_str() {
            "--queue" => {
                queue = Some(
                    u16::try_from(int(&value)?)
                        .map_err(|_| format!("--queue must be at most 65535, got {value}"))?,
                )
            }
            "--mark-bit" => {
                let b = int(&value)?;
                if b > 31 {
                    return Err(format!("--mark-bit must be within 0-31, got {b}"));
                }
                mark_bit = Some(b as u32)
            }
            "--delay-us" => link.delay_us = int(&value)?,
            "--jitter-us" => link.jitter_us = int(&value)?,
            "--loss-pct" => link.loss_pct = pct(&value)?,
            "--reorder-pct" => link.reorder_pct = pct(&value)?,
            "--reorder-extra-us" => link.reorder_extra_us = int(&value)?,
            "--held-max" => {
                held_max = int(&value)? as usize;
                if held_max == 0 || held_max > HELD_MAX_LIMIT {
                    return Err(format!(
                        "--held-max must be within 1-{HELD_MAX_LIMIT}, got {held_max}"
                    ));
                }
            }
            "--seed" => seed = int(&value)?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    link.validate()?;
    Ok(Args {
        queue: queue.ok_or("--queue is required")?,
        mark_bit: mark_bit.ok_or("--mark-bit is required")?,
        link,
        held_max,
        seed,
    })
}

/// The process's open sockets (to find the one `nfq` opens, which it does not expose, so that
/// the loop can sleep in `ppoll` until a packet or a deadline). Sockets only: listing the
/// directory opens a descriptor of its own, which must not be taken for the queue's.
fn open_sockets() -> BTreeSet<i32> {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("bourse-netem: {e}");
        usage()
    });
    if let Err(e) = run(&args) {
        eprintln!("bourse-netem: queue {}: {e}", args.queue);
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    // The signals that end the run arrive on a descriptor the loop polls, not in a handler.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .map_err(|e| format!("block SIGTERM: {e}"))?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("signalfd: {e}"))?;

    let before = open_sockets();
    let mut queue = nfq::Queue::open().map_err(|e| format!("open the netfilter queue: {e}"))?;
    let new: Vec<i32> = open_sockets().difference(&before).copied().collect();
    let [netlink_fd] = new[..] else {
        return Err(format!("cannot tell the queue's descriptor among {new:?}"));
    };
    queue
        .bind(args.queue)
        .map_err(|e| format!("bind (is another bourse-netem on it?): {e}"))?;
    queue
        .set_queue_max_len(args.queue, args.held_max as u32)
        .map_err(|e| format!("set the queue's length: {e}"))?;
    queue.set_nonblocking(true);
    // SAFETY: `netlink_fd` is the socket `queue` opened (the one descriptor that appeared
    // while it opened, in this single-threaded program) and `queue` outlives every use of the
    // borrow below: both live until the end of this function.
    #[allow(unsafe_code)]
    let netlink = unsafe { BorrowedFd::borrow_raw(netlink_fd) };

    let mark = 1u32 << args.mark_bit;
    let start = Instant::now();
    let now_us = || start.elapsed().as_micros() as u64;
    let mut draws = Draws::new(args.seed);
    let mut counters = Counters::default();
    let mut held: Held<nfq::Message> = Held::new(args.held_max);
    let release = |queue: &mut nfq::Queue, mut msg: nfq::Message| -> Result<(), String> {
        msg.set_nfmark(msg.get_nfmark() | mark);
        msg.set_verdict(nfq::Verdict::Repeat);
        queue.verdict(msg).map_err(|e| format!("verdict: {e}"))
    };
    loop {
        while let Some(msg) = held.pop_due(now_us()) {
            release(&mut queue, msg)?;
        }
        loop {
            let mut msg = match queue.recv() {
                Ok(msg) => msg,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(format!("receive: {e}")),
            };
            let now = now_us();
            match args.link.decide(now, &mut draws, &mut counters) {
                Decision::Drop => {
                    msg.set_verdict(nfq::Verdict::Drop);
                    queue.verdict(msg).map_err(|e| format!("verdict: {e}"))?;
                }
                Decision::Release { at_us, .. } if at_us <= now => release(&mut queue, msg)?,
                Decision::Release { at_us, .. } => {
                    if let Err(mut msg) = held.hold(at_us, msg) {
                        counters.dropped_full += 1;
                        msg.set_verdict(nfq::Verdict::Drop);
                        queue.verdict(msg).map_err(|e| format!("verdict: {e}"))?;
                    }
                }
            }
        }
        let timeout = held.next_due_us().map(|at| {
            let us = at.saturating_sub(now_us());
            TimeSpec::new((us / 1_000_000) as i64, ((us % 1_000_000) * 1_000) as i64)
        });
        let mut fds = [
            PollFd::new(netlink, PollFlags::POLLIN),
            PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN),
        ];
        match ppoll(&mut fds, timeout, None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(format!("poll: {e}")),
        }
        let broken = PollFlags::POLLNVAL | PollFlags::POLLERR | PollFlags::POLLHUP;
        if fds[0].revents().is_some_and(|r| r.intersects(broken)) {
            return Err(format!("the queue's socket failed: {:?}", fds[0].revents()));
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            break;
        }
    }
    // Ending: what is held goes out now rather than being lost with the program.
    let released_at_exit = held.len();
    while let Some(msg) = held.pop() {
        release(&mut queue, msg)?;
    }
    let _ = queue.unbind(args.queue);
    let c = counters;
    println!(
        "bourse-netem queue {}: queued {} delayed {} dropped {} reordered {} dropped_full {} \
         released_at_exit {released_at_exit}",
        args.queue, c.queued, c.delayed, c.dropped, c.reordered, c.dropped_full
    );
    Ok(())
}
