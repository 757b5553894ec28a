//! The embedded store of a cache node: items bounded in bytes with
//! eviction by `quick_cache` (CLOCK-Pro-like, scan resistant), and
//! memcached's semantics for every command on top — exptime, CAS uniques,
//! append/prepend, incr/decr (with memcached's in-place padding), touch.
//!
//! Reads take no lock. Writes to one key are serialized by a striped lock,
//! so `cas`, `incr` and `append` read and write atomically; two keys do
//! not contend unless they share a stripe.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;

use crate::text::{strtoull, Command, StoreOp};

/// memcached: an exptime up to 30 days is relative, beyond it absolute.
const RELATIVE_MAX: i64 = 60 * 60 * 24 * 30;

/// Accounting cost of an item beyond its key and value.
pub(crate) const ITEM_COST: u64 = 64;

/// Write stripes (a power of two).
const STRIPES: usize = 256;

/// One stored item. Held behind an `Arc`: a read clones a pointer, and
/// what reads change (last access, fetched) is in `state`, written in
/// place without re-inserting the item.
#[derive(Debug)]
pub(crate) struct Item {
    pub(crate) flags: u32,
    /// Unix seconds after which it is gone; 0 never.
    pub(crate) expires: i64,
    pub(crate) cas: u64,
    pub(crate) data: Bytes,
    /// Last access (Unix seconds) `<< STATE_BITS`, and the `FETCHED`,
    /// `TOKEN_SENT` and `STALE` bits.
    state: AtomicU64,
}

/// The item was read since it was stored.
pub(crate) const FETCHED: u64 = 1;
/// A meta get handed out the right to recache it (the `W` flag).
pub(crate) const TOKEN_SENT: u64 = 2;
/// A meta delete or invalidating set marked it stale (the `X` flag).
pub(crate) const STALE: u64 = 4;
/// Read a second time: its last access was stamped (memcached's ACTIVE).
const ACTIVE: u64 = 8;
/// Its key came base64-encoded (`ms … b`): shown that way.
pub(crate) const BINARY: u64 = 16;
const STATE_BITS: u32 = 5;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;

impl Item {
    pub(crate) fn new(flags: u32, expires: i64, cas: u64, data: Bytes, now: i64) -> Item {
        Item {
            flags,
            expires,
            cas,
            data,
            state: AtomicU64::new(stamp(now)),
        }
    }

    fn live(&self, now: i64) -> bool {
        self.expires == 0 || self.expires > now
    }

    /// The state bits.
    pub(crate) fn bits(&self) -> u64 {
        self.state.load(Ordering::Relaxed) & STATE_MASK
    }

    /// Unix second of the last access.
    pub(crate) fn accessed(&self) -> i64 {
        i64::try_from(self.state.load(Ordering::Relaxed) >> STATE_BITS).unwrap_or(0)
    }

    /// A read at `now`, as memcached's segmented LRU counts it: the first
    /// marks the item fetched, the second stamps its last access, later
    /// ones change nothing — so a hot key's readers only read the line.
    pub(crate) fn touch_read(&self, now: i64) {
        let _ = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                if s & FETCHED == 0 {
                    Some(s | FETCHED)
                } else if s & ACTIVE == 0 {
                    Some(stamp(now) | (s & STATE_MASK) | ACTIVE)
                } else {
                    None
                }
            });
    }

    /// Sets `bits` (under the key's stripe lock, or racing only readers).
    pub(crate) fn set_bits(&self, bits: u64) {
        self.state.fetch_or(bits, Ordering::Relaxed);
    }

    /// A copy to change and re-insert: the same state.
    pub(crate) fn copy(&self) -> Item {
        Item {
            flags: self.flags,
            expires: self.expires,
            cas: self.cas,
            data: self.data.clone(),
            state: AtomicU64::new(self.state.load(Ordering::Relaxed)),
        }
    }
}

fn stamp(now: i64) -> u64 {
    u64::try_from(now).unwrap_or(0) << STATE_BITS
}

#[derive(Clone)]
struct Weight;

impl quick_cache::Weighter<Bytes, Arc<Item>> for Weight {
    fn weight(&self, key: &Bytes, item: &Arc<Item>) -> u64 {
        key.len() as u64 + item.data.len() as u64 + ITEM_COST
    }
}

/// Counters of a store (memcached's names where there is one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Items held (expired ones included until touched or evicted).
    pub curr_items: u64,
    /// Bytes held, as counted against the limit.
    pub bytes: u64,
    /// `get` keys found.
    pub get_hits: u64,
    /// `get` keys not found.
    pub get_misses: u64,
    /// Storage commands run.
    pub cmd_set: u64,
}

/// Items in memory, bounded in bytes.
pub struct Store {
    items: quick_cache::sync::Cache<Bytes, Arc<Item>, Weight>,
    stripes: Box<[Mutex<()>]>,
    next_cas: AtomicU64,
    /// A delayed `flush_all`'s time less one (0: none): see [`Store::flush`].
    oldest_live: AtomicI64,
    get_hits: AtomicU64,
    get_misses: AtomicU64,
    cmd_set: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("stats", &self.stats())
            .finish()
    }
}

/// FNV-1a: a stable 64-bit hash of a key (the same in every process, so
/// proxies agree on the ring).
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// memcached's exptime as an absolute Unix time (0: never; in the past:
/// already expired).
pub(crate) fn expiry(exptime: i32, now: i64) -> i64 {
    let e = i64::from(exptime);
    if e < 0 {
        1
    } else if e == 0 {
        0
    } else if e <= RELATIVE_MAX {
        now + e
    } else {
        e
    }
}

impl Store {
    /// A store holding at most `bytes` (keys, values and 64 bytes per item).
    pub fn new(bytes: u64) -> Store {
        let estimated = usize::try_from(bytes / 256).unwrap_or(usize::MAX).max(16);
        // The cache splits its capacity over internal shards; an item
        // larger than one is refused. Each keeps at least 4 MiB, so the
        // largest item memcached takes by default (1 MiB) always fits —
        // the default (4 per core) would leave 256 KiB of a 64 MiB store
        // to each on a 64-core host.
        let parallel = std::thread::available_parallelism().map_or(1, usize::from) * 4;
        let internal = usize::try_from(bytes / (4 << 20))
            .unwrap_or(usize::MAX)
            .clamp(1, parallel);
        // Rounded down to a power of two (the cache rounds up).
        let internal = if internal.is_power_of_two() {
            internal
        } else {
            internal.next_power_of_two() / 2
        };
        let items = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(estimated)
            .weight_capacity(bytes.max(1))
            .shards(internal)
            .build()
            .map(|o| {
                quick_cache::sync::Cache::with_options(
                    o,
                    Weight,
                    quick_cache::DefaultHashBuilder::default(),
                    quick_cache::sync::DefaultLifecycle::default(),
                )
            })
            .unwrap_or_else(|_| {
                quick_cache::sync::Cache::with_weighter(estimated, bytes.max(1), Weight)
            });
        Store {
            items,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            next_cas: AtomicU64::new(1),
            oldest_live: AtomicI64::new(0),
            get_hits: AtomicU64::new(0),
            get_misses: AtomicU64::new(0),
            cmd_set: AtomicU64::new(0),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            curr_items: self.items.len() as u64,
            bytes: self.items.weight(),
            get_hits: self.get_hits.load(Ordering::Relaxed),
            get_misses: self.get_misses.load(Ordering::Relaxed),
            cmd_set: self.cmd_set.load(Ordering::Relaxed),
        }
    }

    /// Sets the store's bound, in bytes (`cache_memlimit`): items go
    /// until it holds.
    pub fn set_limit(&self, bytes: u64) {
        self.items.set_capacity(bytes.max(1));
    }

    /// Drops every item (what `flush_all` does).
    pub fn clear(&self) {
        self.items.clear();
    }

    pub(crate) fn cas_id(&self) -> u64 {
        self.next_cas.fetch_add(1, Ordering::Relaxed)
    }

    /// The item under `key` if it is live at `now`: not expired, and
    /// not flushed by a delayed `flush_all` whose time came.
    pub(crate) fn live(&self, key: &Bytes, now: i64) -> Option<Arc<Item>> {
        let oldest = self.oldest_live.load(Ordering::Relaxed);
        self.items
            .get(key)
            .filter(|i| i.live(now) && !(oldest != 0 && oldest <= now && i.accessed() <= oldest))
    }

    pub(crate) fn put(&self, key: &Bytes, item: Item) {
        self.items.insert(key.clone(), Arc::new(item));
    }

    pub(crate) fn put_arc(&self, key: &Bytes, item: Arc<Item>) {
        self.items.insert(key.clone(), item);
    }

    pub(crate) fn count_get(&self, hit: bool) {
        let c = if hit {
            &self.get_hits
        } else {
            &self.get_misses
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_set(&self) {
        self.cmd_set.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn remove(&self, key: &Bytes) {
        self.items.remove(key);
    }

    /// `flush_all <delay>`: items last written or read before `now +
    /// delay` go when that time comes (memcached's `oldest_live`); a
    /// delay of 0 or less empties the store now.
    pub fn flush(&self, delay: i32, now: i64) {
        if delay <= 0 {
            self.oldest_live.store(0, Ordering::Relaxed);
            self.items.clear();
        } else {
            self.oldest_live
                .store(expiry(delay, now) - 1, Ordering::Relaxed);
        }
    }

    /// Appends `key`'s `VALUE` block to `out` if it is held and live (a
    /// `get`'s answer for one key, without its `END`); counts the hit or
    /// miss. Written in place: one reservation, no formatting buffer (it
    /// runs once per key of every read).
    /// With `touch` (`gat`/`gats`) the item found first gets that exptime.
    pub fn get_into(
        &self,
        key: &Bytes,
        cas: bool,
        touch: Option<i32>,
        now: i64,
        out: &mut BytesMut,
    ) {
        let found = match touch {
            None => self.live(key, now),
            Some(t) => {
                let _g = self.lock(key);
                self.live(key, now).map(|old| {
                    let mut i = old.copy();
                    i.expires = expiry(t, now);
                    let i = Arc::new(i);
                    self.items.insert(key.clone(), i.clone());
                    i
                })
            }
        };
        let Some(i) = found else {
            self.get_misses.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.get_hits.fetch_add(1, Ordering::Relaxed);
        i.touch_read(now);
        let mut flags = itoa::Buffer::new();
        let mut len = itoa::Buffer::new();
        let mut unique = itoa::Buffer::new();
        let (flags, len) = (flags.format(i.flags), len.format(i.data.len()));
        let unique = if cas { unique.format(i.cas) } else { "" };
        // Two or three spaces and two CRLFs besides the fields: 5 at most.
        out.reserve(
            b"VALUE ".len()
                + key.len()
                + flags.len()
                + len.len()
                + unique.len()
                + 5
                + i.data.len()
                + 2,
        );
        out.put_slice(b"VALUE ");
        out.put_slice(key);
        out.put_u8(b' ');
        out.put_slice(flags.as_bytes());
        out.put_u8(b' ');
        out.put_slice(len.as_bytes());
        if cas {
            out.put_u8(b' ');
            out.put_slice(unique.as_bytes());
        }
        out.put_slice(b"\r\n");
        out.put_slice(&i.data);
        out.put_slice(b"\r\n");
    }

    /// Runs `cmd` at Unix time `now` and appends memcached's answer to
    /// `out` (also for `noreply`: the caller drops it). Commands the store
    /// does not run (`version`, `stats`, `quit`, replies) answer `ERROR`.
    pub fn apply(&self, cmd: &Command, now: i64, out: &mut BytesMut) {
        match cmd {
            Command::Get { keys, cas, touch } => {
                for k in keys {
                    self.get_into(k, *cas, *touch, now, out);
                }
                out.put_slice(b"END\r\n");
            }
            Command::Store {
                op,
                key,
                flags,
                exptime,
                data,
                cas,
                ..
            } => {
                self.cmd_set.fetch_add(1, Ordering::Relaxed);
                let answer = self.store(*op, key, *flags, *exptime, data, *cas, now);
                line(out, answer);
            }
            Command::Delete { key, .. } => {
                let _g = self.lock(key);
                let found = self.live(key, now).is_some();
                self.remove(key);
                line(out, if found { "DELETED" } else { "NOT_FOUND" });
            }
            Command::TooLarge { key, .. } => {
                let _g = self.lock(key);
                self.remove(key);
                line(out, "SERVER_ERROR object too large for cache");
            }
            Command::Arith {
                incr, key, delta, ..
            } => self.arith(*incr, key, *delta, now, out),
            Command::Touch { key, exptime, .. } => {
                let _g = self.lock(key);
                match self.live(key, now) {
                    Some(old) => {
                        let mut i = old.copy();
                        i.expires = expiry(*exptime, now);
                        self.put(key, i);
                        line(out, "TOUCHED");
                    }
                    None => line(out, "NOT_FOUND"),
                }
            }
            Command::FlushAll { delay, .. } => {
                self.flush(*delay, now);
                line(out, "OK");
            }
            Command::Meta(m) => self.meta(m, now, out),
            Command::MemLimit { mb, .. } => {
                self.set_limit(mb.saturating_mul(1 << 20));
                line(out, "OK");
            }
            Command::Reply { text, .. } => line(out, text),
            Command::Version | Command::Stats { .. } | Command::Noop | Command::Quit => {
                line(out, "ERROR")
            }
        }
    }

    pub(crate) fn lock(&self, key: &[u8]) -> parking_lot::MutexGuard<'_, ()> {
        // The hash's high bits: the ring uses the low ones.
        let i = (key_hash(key) >> 40) as usize & (STRIPES - 1);
        self.stripes[i].lock()
    }

    #[allow(clippy::too_many_arguments)]
    fn store(
        &self,
        op: StoreOp,
        key: &Bytes,
        flags: u32,
        exptime: i32,
        data: &Bytes,
        cas: u64,
        now: i64,
    ) -> &'static str {
        let _g = self.lock(key);
        let old = self.live(key, now);
        let fresh = |data: Bytes| Item::new(flags, expiry(exptime, now), self.cas_id(), data, now);
        let item = match (op, old) {
            (StoreOp::Set, _) => fresh(data.clone()),
            (StoreOp::Add, Some(_)) => return "NOT_STORED",
            (StoreOp::Add, None) => fresh(data.clone()),
            (StoreOp::Replace, None) => return "NOT_STORED",
            (StoreOp::Replace, Some(_)) => fresh(data.clone()),
            (StoreOp::Append | StoreOp::Prepend, None) => return "NOT_STORED",
            (StoreOp::Append | StoreOp::Prepend, Some(o)) => {
                let mut joined = BytesMut::with_capacity(o.data.len() + data.len());
                if op == StoreOp::Append {
                    joined.put_slice(&o.data);
                    joined.put_slice(data);
                } else {
                    joined.put_slice(data);
                    joined.put_slice(&o.data);
                }
                Item::new(o.flags, o.expires, self.cas_id(), joined.freeze(), now)
            }
            (StoreOp::Cas, None) => return "NOT_FOUND",
            (StoreOp::Cas, Some(o)) if o.cas != cas => return "EXISTS",
            (StoreOp::Cas, Some(_)) => fresh(data.clone()),
        };
        self.put(key, item);
        "STORED"
    }

    fn arith(&self, incr: bool, key: &Bytes, delta: u64, now: i64, out: &mut BytesMut) {
        let _g = self.lock(key);
        let Some(old) = self.live(key, now) else {
            return line(out, "NOT_FOUND");
        };
        let mut i = old.copy();
        // memcached reads the value with its "\r\n" (trailing whitespace
        // allowed), and refuses an empty one.
        let mut with_crlf = i.data.to_vec();
        with_crlf.extend_from_slice(b"\r\n");
        let value = match strtoull(&with_crlf) {
            Some(v) if !i.data.is_empty() => v,
            _ => {
                return line(
                    out,
                    "CLIENT_ERROR cannot increment or decrement non-numeric value",
                )
            }
        };
        let v = if incr {
            value.wrapping_add(delta)
        } else {
            value.saturating_sub(delta)
        };
        let text = v.to_string();
        // In place when it fits: memcached pads a shorter number with
        // spaces to the old length.
        let mut data = text.clone().into_bytes();
        if data.len() < i.data.len() {
            data.resize(i.data.len(), b' ');
        }
        i.data = Bytes::from(data);
        i.cas = self.cas_id();
        self.put(key, i);
        line(out, &text);
    }
}

fn line(out: &mut BytesMut, text: &str) {
    out.put_slice(text.as_bytes());
    out.put_slice(b"\r\n");
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
