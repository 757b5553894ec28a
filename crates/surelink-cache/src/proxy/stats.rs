//! The `stats` family, answered by the proxy from what it knows: its own
//! counters and settings. Subcommands about memcached's slab allocator
//! (`items`, `slabs`, `sizes`, `cachedump`) answer as an empty memcached
//! does — the proxy holds no items, and its nodes' stores have no slab
//! classes; docs/cache.md lists each difference.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;

use super::{Shared, VERSION};
use crate::text::strtoull;

/// The answer to `stats <args>`.
pub(super) fn answer(shared: &Shared, args: &[Bytes]) -> Bytes {
    let text: &'static str = match args.first().map(|a| &a[..]) {
        None => return general(shared),
        Some(b"settings") => return settings(shared),
        Some(b"items") | Some(b"conns") => "END\r\n",
        Some(b"slabs") => "STAT active_slabs 0\r\nSTAT total_malloced 0\r\nEND\r\n",
        Some(b"sizes") => "STAT sizes_status disabled\r\nEND\r\n",
        // memcached ends these two without `END`; sizes are never kept.
        Some(b"sizes_enable") | Some(b"sizes_disable") => "STAT sizes_status disabled\r\n",
        Some(b"cachedump") => cachedump(args),
        Some(b"reset") => {
            reset(shared);
            "RESET\r\n"
        }
        Some(b"detail") => match args.get(1).map(|a| &a[..]) {
            Some(b"on") | Some(b"off") => "OK\r\n",
            // Per-prefix counts are not kept.
            Some(b"dump") => "END\r\n",
            _ => "CLIENT_ERROR usage: stats detail on|off|dump\r\n",
        },
        Some(_) => "ERROR\r\n",
    };
    Bytes::from_static(text.as_bytes())
}

/// `stats cachedump <class> <limit>`: checked as memcached checks it;
/// there is nothing to list.
fn cachedump(args: &[Bytes]) -> &'static str {
    if args.len() < 3 {
        return "CLIENT_ERROR bad command line\r\n";
    }
    match (strtoull(&args[1]), strtoull(&args[2])) {
        (Some(id), Some(limit)) if u32::try_from(id).is_ok() && u32::try_from(limit).is_ok() => {
            if id >= 64 {
                "CLIENT_ERROR Illegal slab id\r\n"
            } else {
                "END\r\n"
            }
        }
        _ => "CLIENT_ERROR bad command line format\r\n",
    }
}

/// `stats reset`: the counters start again; gauges stay.
fn reset(shared: &Shared) {
    let s = &shared.stats;
    for c in [
        &s.total_connections,
        &s.rejected_connections,
        &s.rejected_per_addr,
        &s.idle_kicks,
        &s.reply_pauses,
        &s.cmd_get,
        &s.cmd_set,
        &s.cmd_touch,
        &s.get_hits,
        &s.get_misses,
        &s.node_errors,
        &s.ejections,
        &s.rerouted,
        &s.mended,
    ] {
        c.store(0, Relaxed);
    }
}

fn rows(out: &mut String, rows: &[(&str, String)]) {
    for (k, v) in rows {
        let _ = write!(out, "STAT {k} {v}\r\n");
    }
}

/// `stats`: the proxy's counters, under memcached's names where it has
/// them.
fn general(shared: &Shared) -> Bytes {
    let s = &shared.stats;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Relaxed).to_string();
    let mut out = String::new();
    rows(
        &mut out,
        &[
            ("pid", std::process::id().to_string()),
            ("uptime", shared.started.elapsed().as_secs().to_string()),
            ("time", now.to_string()),
            ("curr_connections", n(&s.curr_connections)),
            ("total_connections", n(&s.total_connections)),
            ("rejected_connections", n(&s.rejected_connections)),
            ("rejected_per_addr", n(&s.rejected_per_addr)),
            ("idle_kicks", n(&s.idle_kicks)),
            ("reply_bytes", n(&s.reply_bytes)),
            ("reply_pauses", n(&s.reply_pauses)),
            ("cmd_get", n(&s.cmd_get)),
            ("cmd_set", n(&s.cmd_set)),
            ("cmd_touch", n(&s.cmd_touch)),
            ("get_hits", n(&s.get_hits)),
            ("get_misses", n(&s.get_misses)),
            ("node_errors", n(&s.node_errors)),
            ("ejections", n(&s.ejections)),
            ("rerouted", n(&s.rerouted)),
            ("mended", n(&s.mended)),
            ("version", VERSION.to_string()),
        ],
    );
    out.push_str("END\r\n");
    Bytes::from(out)
}

/// `stats settings`: the proxy's own, under memcached's names (a subset
/// of memcached's list; each name means what it means there).
fn settings(shared: &Shared) -> Bytes {
    let c = &shared.cfg;
    let mut out = String::new();
    rows(
        &mut out,
        &[
            ("maxconns", c.max_clients.to_string()),
            ("tcpport", c.listen.port().to_string()),
            ("udpport", "0".into()),
            ("verbosity", "0".into()),
            ("evictions", "on".into()),
            ("cas_enabled", "yes".into()),
            ("binding_protocol", "ascii".into()),
            ("item_size_max", c.limits.max_item.to_string()),
            ("flush_enabled", "yes".into()),
            ("idle_timeout", c.idle_timeout.as_secs().to_string()),
        ],
    );
    out.push_str("END\r\n");
    Bytes::from(out)
}
