//! The embedded store split into shards, each a recovery group of the
//! node's endpoint: a shard whose handler panics (or that the service puts
//! into recovery) is suspended, its items dropped — a command that failed
//! half-way may have left them inconsistent, and a cache may always miss,
//! never serve a wrong value — and brought back empty, while the other
//! shards keep serving. See `surelink`'s recovery groups.
//!
//! A key's shard is from its hash's bits 32.., mixed: the ring uses the
//! low bits, so a node's keys still spread over all its shards.

use bytes::{BufMut, BytesMut};

use surelink::{GroupConfig, GroupId, Routing};

use crate::store::{key_hash, Store, StoreStats};
use crate::text::Command;

/// Shards of a node's store unless configured.
pub const DEFAULT_SHARDS: usize = 8;
/// The most shards a node takes.
pub const MAX_SHARDS: usize = 256;

/// The shard of `key` among `n` (as [`Shards::shard_of`]).
pub fn shard_index(key: &[u8], n: usize) -> usize {
    // FNV's high bits differ little between short, similar keys: mixed
    // first (murmur3's finalizer).
    let mut h = key_hash(key) >> 32;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    usize::try_from(h % n.max(1) as u64).unwrap_or(0)
}

/// A node's store in shards.
#[derive(Debug)]
pub struct Shards {
    stores: Vec<Store>,
}

impl Shards {
    /// `n` shards (1..=[`MAX_SHARDS`]) sharing `bytes` equally.
    pub fn new(bytes: u64, n: usize) -> Shards {
        let n = n.clamp(1, MAX_SHARDS);
        let each = (bytes / n as u64).max(1);
        Shards {
            stores: (0..n).map(|_| Store::new(each)).collect(),
        }
    }

    /// How many shards.
    pub fn len(&self) -> usize {
        self.stores.len()
    }

    /// Whether there is none (never: at least one).
    pub fn is_empty(&self) -> bool {
        self.stores.is_empty()
    }

    /// The shard holding `key`.
    pub fn shard_of(&self, key: &[u8]) -> usize {
        shard_index(key, self.stores.len())
    }

    /// Shard `i`, if there is one.
    pub fn shard(&self, i: usize) -> Option<&Store> {
        self.stores.get(i)
    }

    /// The counters of every shard, summed.
    pub fn stats(&self) -> StoreStats {
        self.stores
            .iter()
            .map(Store::stats)
            .fold(StoreStats::default(), |a, b| StoreStats {
                curr_items: a.curr_items + b.curr_items,
                bytes: a.bytes + b.bytes,
                get_hits: a.get_hits + b.get_hits,
                get_misses: a.get_misses + b.get_misses,
                cmd_set: a.cmd_set + b.cmd_set,
            })
    }

    /// Drops every item of every shard.
    pub fn clear(&self) {
        for s in &self.stores {
            s.clear();
        }
    }

    /// Runs `cmd` as [`Store::apply`] does, each key on its shard: a
    /// multi-key `get` answers its keys in order, then one `END`;
    /// `flush_all` empties every shard.
    pub fn apply(&self, cmd: &Command, now: i64, out: &mut BytesMut) {
        match cmd {
            Command::Get { keys, cas, touch } => {
                for k in keys {
                    self.stores[self.shard_of(k)].get_into(k, *cas, *touch, now, out);
                }
                out.put_slice(b"END\r\n");
            }
            Command::MemLimit { mb, .. } => {
                let each = mb.saturating_mul(1 << 20) / self.stores.len() as u64;
                for s in &self.stores {
                    s.set_limit(each);
                }
                out.put_slice(b"OK\r\n");
            }
            Command::FlushAll { .. } => {
                for s in &self.stores[1..] {
                    s.apply(cmd, now, &mut BytesMut::new());
                }
                self.stores[0].apply(cmd, now, out);
            }
            _ => {
                let i = cmd.key().map_or(0, |k| self.shard_of(k));
                self.stores[i].apply(cmd, now, out);
            }
        }
    }

    /// One recovery group per shard, `shard-0` … (for
    /// `Config::executor.groups`).
    pub fn groups(n: usize) -> Vec<GroupConfig> {
        (0..n.clamp(1, MAX_SHARDS))
            .map(|i| GroupConfig::new(format!("shard-{i}")))
            .collect()
    }

    /// The group of a request as the proxy forwards it (one memcached
    /// command): its first key's shard; group 0 for a command without a
    /// key. A command that touches more than its group's shard — a
    /// multi-key read across shards, `flush_all`, `cache_memlimit`,
    /// `stats` — spans groups, so it keeps its place among the commands
    /// its proxy sent before and after it (a `get a b` after `set b`
    /// sees b). Cheap, from the first line: it runs on the session's
    /// reader.
    pub fn route(&self, body: &[u8]) -> Routing {
        let line = body
            .split(|&b| b == b'\r' || b == b'\n')
            .next()
            .unwrap_or_default();
        let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let first = words.next();
        let (key, multi) = match first {
            Some(b"flush_all" | b"stats" | b"cache_memlimit") => {
                return Routing::spanning(GroupId(0))
            }
            Some(b"version" | b"quit") | None => (None, false),
            // `gat <exptime> <key>…`
            Some(b"gat" | b"gats") => (words.nth(1), true),
            Some(b"get" | b"gets") => (words.next(), true),
            Some(_) => (words.next(), false),
        };
        // A meta command's key may be base64 (`b`): its shard is the
        // decoded key's.
        let is_meta = first.is_some_and(|w| w.len() == 2 && w[0] == b'm');
        let decoded = key
            .filter(|_| {
                is_meta
                    && line
                        .split(|&b| b == b' ')
                        .skip(2)
                        .any(|w| w.first() == Some(&b'b'))
            })
            .and_then(crate::text::meta_decode_key);
        let key = decoded.as_deref().or(key);
        let i = key.map_or(0, |k| self.shard_of(k));
        let group = GroupId(u16::try_from(i).unwrap_or(0));
        if multi && words.any(|k| self.shard_of(k) != i) {
            return Routing::spanning(group);
        }
        group.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{Limits, Parser};

    fn cmd(s: &str) -> Command {
        let mut b = BytesMut::from(s);
        Parser::new(Limits::default())
            .next(&mut b)
            .unwrap()
            .unwrap()
    }

    fn run(sh: &Shards, s: &str) -> String {
        let mut out = BytesMut::new();
        sh.apply(&cmd(s), 1_000, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    /// Keys spread over the shards; a multi-get across them answers in
    /// order with one END; a shard cleared loses its keys only; flush_all
    /// empties all; routing agrees with where a key lives.
    #[test]
    fn keys_live_in_their_shard_and_multi_gets_span_them() {
        let sh = Shards::new(1 << 20, 4);
        let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
        let mut used = std::collections::BTreeSet::new();
        for k in &keys {
            assert_eq!(run(&sh, &format!("set {k} 0 0 1\r\nv\r\n")), "STORED\r\n");
            used.insert(sh.shard_of(k.as_bytes()));
            let g = sh.route(format!("set {k} 0 0 1\r\nv\r\n").as_bytes());
            assert_eq!(usize::from(g.group.0), sh.shard_of(k.as_bytes()));
            assert!(!g.spans_groups);
        }
        assert_eq!(used.len(), 4, "64 keys reach every shard");
        let got = run(&sh, "get k0 k1 nope k2\r\n");
        assert_eq!(
            got,
            "VALUE k0 0 1\r\nv\r\nVALUE k1 0 1\r\nv\r\nVALUE k2 0 1\r\nv\r\nEND\r\n"
        );
        assert_eq!(sh.stats().curr_items, 64);
        let victim = sh.shard_of(b"k0");
        sh.shard(victim).unwrap().clear();
        assert_eq!(run(&sh, "get k0\r\n"), "END\r\n");
        let left = keys
            .iter()
            .filter(|k| sh.shard_of(k.as_bytes()) != victim)
            .count();
        assert_eq!(sh.stats().curr_items, left as u64);
        assert_eq!(run(&sh, "flush_all\r\n"), "OK\r\n");
        assert_eq!(sh.stats().curr_items, 0);
        assert_eq!(sh.route(b"flush_all\r\n"), Routing::spanning(GroupId(0)));
        assert_eq!(sh.route(b""), GroupId(0).into());
        // A multi-get spans groups only when its keys do.
        let same: Vec<&String> = keys
            .iter()
            .filter(|k| sh.shard_of(k.as_bytes()) == victim)
            .collect();
        let other = keys
            .iter()
            .find(|k| sh.shard_of(k.as_bytes()) != victim)
            .unwrap();
        let g = sh.route(format!("get {} {}\r\n", same[0], same[1]).as_bytes());
        assert!(!g.spans_groups);
        let g = sh.route(format!("gat 10 {} {other}\r\n", same[0]).as_bytes());
        assert_eq!(
            g,
            Routing::spanning(GroupId(u16::try_from(victim).unwrap()))
        );
    }

    /// memcached's largest default item (1 MiB) fits in a shard of a
    /// default node (64 MiB in 8 shards), whatever the cores.
    #[test]
    fn the_largest_item_fits_in_a_shard() {
        let sh = Shards::new(64 << 20, DEFAULT_SHARDS);
        let big = "x".repeat(1_048_000);
        assert_eq!(
            run(&sh, &format!("set big 0 0 {}\r\n{big}\r\n", big.len())),
            "STORED\r\n"
        );
        assert!(run(&sh, "get big\r\n").starts_with("VALUE big 0 1048000\r\n"));
    }
}
