//! Who sent the commands a core applied. The cores take commands from more than the gateways:
//! the admin API (an operator's deposit, a halt, the schedule's phase changes) and clearing
//! runs (cash movements) submit to the same replica groups. Each source submits under client
//! ids of its own, and a core's idempotency table says exactly how many requests each client
//! id applied (`bourse_cluster::ReplicatedState::applied_by_client`), so the report counts
//! every source apart and the cross-checks compare the gateways' forwarded count with what
//! the gateways' links alone applied.
//!
//! The client ids of core `c` of a local deployment, one range per source:
//!
//! - gateway `g`'s link: [`gateway_client_id`]`(g)`, from 1 (`start_gateways`);
//! - the setup clients: `SETUP_CLIENT_ID_BASE + CLIENT_IDS_PER_CORE c + k`, `k` up to
//!   `SETUP_CLIENTS` (`apply_setup`);
//! - the admin API: `ADMIN_CLIENT_ID_BASE + CLIENT_IDS_PER_CORE c + lane`, `lane` below
//!   `ADMIN_LANES` (`admin::VenueAdmin::new`);
//! - clearing runs: `bourse_clearing::run_client_id`, whose upper 16 bits are
//!   `bourse_clearing::run::CLEARING_CLIENT_ID_TAG`, far above the others.
//!
//! Any other id is a program the deployment does not know (a second `bourse admin serve`
//! numbered differently, a standalone gateway): counted as unknown, which a check wants 0.

use crate::{ADMIN_CLIENT_ID_BASE, ADMIN_LANES, CLIENT_IDS_PER_CORE};
use crate::{SETUP_CLIENTS, SETUP_CLIENT_ID_BASE};
use bourse_loadgen::AppliedBySource;
use std::collections::HashMap;

/// The client id of gateway `g`'s links to every core.
pub(crate) fn gateway_client_id(g: usize) -> u64 {
    1 + g as u64
}

/// The sources a core's commands come from (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Gateways,
    Admin,
    Clearing,
    Setup,
    Unknown,
}

/// Which source of a deployment with `gateways` gateways submits to core `core` under
/// `client_id`.
pub(crate) fn source_of(client_id: u64, core: usize, gateways: usize) -> Source {
    let in_block = |base: u64, size: u64| {
        let first = base + CLIENT_IDS_PER_CORE * core as u64;
        (first..first + size).contains(&client_id)
    };
    if (gateway_client_id(0)..gateway_client_id(gateways)).contains(&client_id) {
        Source::Gateways
    } else if bourse_clearing::run::run_of_client_id(client_id).is_some() {
        Source::Clearing
    } else if in_block(ADMIN_CLIENT_ID_BASE, ADMIN_LANES as u64) {
        Source::Admin
    } else if in_block(SETUP_CLIENT_ID_BASE, 1 + SETUP_CLIENTS as u64) {
        Source::Setup
    } else {
        Source::Unknown
    }
}

/// The commands core `core` applied since `base` by source: `now` and `base` are its
/// requests applied per client id (`applied_by_client`) at the end and after the setup.
pub(crate) fn applied_since(
    base: &HashMap<u64, u64>,
    now: impl IntoIterator<Item = (u64, u64)>,
    core: usize,
    gateways: usize,
) -> AppliedBySource {
    let mut out = AppliedBySource::default();
    for (client_id, applied) in now {
        let n = applied - base.get(&client_id).copied().unwrap_or(0);
        let slot = match source_of(client_id, core, gateways) {
            Source::Gateways => &mut out.gateways,
            Source::Admin => &mut out.admin,
            Source::Clearing => &mut out.clearing,
            Source::Setup => &mut out.setup,
            Source::Unknown => &mut out.unknown,
        };
        *slot += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_s_client_ids_are_told_apart_on_each_core() {
        let admin = |core: u64, lane: u64| ADMIN_CLIENT_ID_BASE + CLIENT_IDS_PER_CORE * core + lane;
        let setup = |core: u64, k: u64| SETUP_CLIENT_ID_BASE + CLIENT_IDS_PER_CORE * core + k;
        let cases = [
            (1, 0, Source::Gateways),
            (3, 2, Source::Gateways),
            (4, 2, Source::Unknown),
            (0, 0, Source::Unknown),
            (bourse_clearing::run_client_id(1, 0), 0, Source::Clearing),
            (bourse_clearing::run_client_id(77, 2), 2, Source::Clearing),
            (admin(0, 0), 0, Source::Admin),
            (admin(2, 1), 2, Source::Admin),
            // Another core's admin lane, or a lane the admin does not have, is nobody's here.
            (admin(1, 0), 2, Source::Unknown),
            (admin(2, ADMIN_LANES as u64), 2, Source::Unknown),
            (setup(1, 0), 1, Source::Setup),
            (setup(1, SETUP_CLIENTS as u64), 1, Source::Setup),
            (setup(1, 1 + SETUP_CLIENTS as u64), 1, Source::Unknown),
        ];
        for (client_id, core, expected) in cases {
            assert_eq!(
                source_of(client_id, core, 3),
                expected,
                "client {client_id:#x} on core {core}"
            );
        }
    }

    #[test]
    fn no_gateway_restart_reaches_the_setup_s_or_the_bulk_clients_ids() {
        use bourse_gateway::recovery::{link_client_id, LINK_EPOCH_MAX};
        let highest_link = link_client_id(u64::from(u32::MAX), LINK_EPOCH_MAX);
        assert!(highest_link < SETUP_CLIENT_ID_BASE);
        let highest_setup = SETUP_CLIENT_ID_BASE + CLIENT_IDS_PER_CORE * 1_000_000;
        assert!(highest_setup < bourse_cluster::admission::BULK_CLIENT_ID_MIN);
        assert!(bourse_cluster::admission::is_bulk_client(
            ADMIN_CLIENT_ID_BASE
        ));
        assert!(bourse_cluster::admission::is_bulk_client(
            bourse_clearing::run_client_id(1, 0)
        ));
        assert!(!bourse_cluster::admission::is_bulk_client(highest_link));
    }

    #[test]
    fn a_core_s_commands_since_the_setup_are_counted_by_source() {
        let clearing = bourse_clearing::run_client_id(4, 1);
        let admin = ADMIN_CLIENT_ID_BASE + CLIENT_IDS_PER_CORE + 1;
        let base = HashMap::from([(1, 500), (2, 20), (SETUP_CLIENT_ID_BASE + 1_001, 40)]);
        let now = [
            (1, 900),
            (2, 20),
            (SETUP_CLIENT_ID_BASE + 1_001, 40),
            (admin, 3),
            (clearing, 926),
            (99, 5),
        ];
        let counted = applied_since(&base, now, 1, 2);
        assert_eq!(
            counted,
            AppliedBySource {
                gateways: 400,
                admin: 3,
                clearing: 926,
                setup: 0,
                unknown: 5,
            }
        );
    }
}
